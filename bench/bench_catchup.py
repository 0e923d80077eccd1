"""Merged catch-up read of a 3-shard backlog through the router vs reading one shard directly,
and vs what the client and the loopback themselves cost for the same events.

Inserts N documents spread over 3 shards, then reads the whole backlog as a change stream
started at the cluster time before the inserts: (a) through the router (merged, N events),
(b) directly from one shard (its N/3 events), (c) the pymongo client's own decode ceiling
(``bson.decode_all`` of the same events' raw BSON, best of ``--ceiling-reps`` timings; the
events are the router's own bytes) and (d) the replay floor: the same pymongo read
(``watch()`` + ``try_next()`` per event, as (a)) from a stub server in its own process that
answers with the router's events pre-encoded (``bench/_replay_server.py``: no work per
event), i.e. what the client and the loopback cost. Prints events/s, ratios against (b), and
(c) is also timed in the read's batches (10,000 events per ``decode_all``, as the client
decodes each reply; one ``decode_all`` of the whole backlog keeps every document alive and pays
the cyclic GC's passes over them). Prints
(a) as a fraction of (c) and (d) (issue 30: (a) >= 0.8x (c)), and (d) / (c): the most of the
ceiling a ``try_next()`` consumer reaches with no server work, i.e. the bound this client loop
puts on (a) / (c).
Targets: issue 7: (a) >= 100,000 events/s on a 2-core machine; issue 30: (a) >= 0.8x (c).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import bson
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from _common import (DB, cluster_time, cpu_seconds, direct_client, insert_backlog, machine, ratio,
                     read_events, spread_collection, spread_ids)
from shardsim.tools.launcher import Cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--reads", type=int, default=3, help="router reads of the same backlog")
    ap.add_argument("--ceiling-reps", type=int, default=3,
                    help="timings of the decode ceiling and the replay floor (best one counts)")
    args = ap.parse_args()
    print(f"# bench_catchup  {machine()}  load {os.getloadavg()[0]:.2f}")
    with Cluster(shards=3) as cluster:
        client = MongoClient(cluster.router_uri)
        shards = spread_collection(client)
        hosts = {s.name: s.address for s in cluster.shards}
        start = cluster_time(client)
        ids = spread_ids(args.events)
        secs = insert_backlog(client[DB].c0, ids)
        print(f"backlog: {len(ids):,} inserts in {secs:.1f} s")
        pids = {"router": cluster.router.proc.pid,
                **{s.name: s.proc.pid for s in cluster.shards}}
        rates = []
        for i in range(args.reads):
            before = {k: cpu_seconds([p]) for k, p in pids.items()}
            c0 = time.process_time()
            got_r, t_r = read_events(client[DB], len(ids), start_at_operation_time=start)
            client_cpu = time.process_time() - c0
            cpu = {k: cpu_seconds([p]) - before[k] for k, p in pids.items()}
            rates.append(got_r / t_r)
            per_ev = 1e6 / max(got_r, 1)
            print(f"router read {i + 1}: {got_r:,} events in {t_r:.2f} s = {got_r / t_r:,.0f} ev/s; "
                  f"CPU us/event: client {client_cpu * per_ev:.1f}, router {cpu['router'] * per_ev:.1f}, "
                  f"shards {sum(v for k, v in cpu.items() if k != 'router') * per_ev:.1f}")
        t_r = got_r / statistics.median(rates)
        per_shard = len(ids) // len(shards)
        sh = direct_client(hosts[shards[0]])
        got_d, t_d = read_events(sh[DB], per_shard, start_at_operation_time=start)
        # The router's own event bytes, all of them (a RawBSONDocument client keeps them as sent).
        raw_client = MongoClient(cluster.router_uri, document_class=RawBSONDocument)
        events = []
        with raw_client[DB].watch(start_at_operation_time=start, batch_size=10000) as s:
            while len(events) < len(ids):
                ev = s.try_next()
                if ev is not None:
                    events.append(ev.raw)
        raw_client.close()
        raw = b"".join(events)
        # (c) client decode ceiling: the best of several timings of decoding them all; and
        # (c') the same decode in the read's batches (10,000 events per decode_all, each batch
        # dropped before the next, as the client decodes each reply): one decode_all of the
        # whole backlog keeps every document alive, and the cyclic GC's passes over them can
        # make it slower than the read itself.
        t_c = min(_timed(bson.decode_all, raw) for _ in range(args.ceiling_reps))
        batches = [b"".join(events[i:i + 10000]) for i in range(0, len(events), 10000)]
        t_cb = min(_timed(_decode_batches, batches) for _ in range(args.ceiling_reps))
        # (d) replay floor: the same pymongo read from a server that does no work per event.
        rate_p = replay_floor(raw, len(events), args.ceiling_reps)
        rate_r, rate_d, rate_c = got_r / t_r, got_d / t_d, len(events) / t_c
        rate_cb = len(events) / t_cb
        print(f"router merged catch-up : {got_r:>8,} events in {t_r:6.2f} s = {rate_r:>10,.0f} ev/s "
              f"({ratio(rate_r, rate_d)} of direct; median of {args.reads} reads)")
        print(f"one shard direct (base): {got_d:>8,} events in {t_d:6.2f} s = {rate_d:>10,.0f} ev/s (1.00x)")
        print(f"pymongo decode ceiling : {len(events):>8,} events in {t_c:6.2f} s = {rate_c:>10,.0f} ev/s "
              f"({ratio(rate_c, rate_d)} of direct; best of {args.ceiling_reps})")
        print(f"decode ceiling, by batch: {len(events):>6,} events in {t_cb:6.2f} s = {rate_cb:>10,.0f} ev/s "
              f"({ratio(rate_cb, rate_d)} of direct; 10,000 per decode_all, best of {args.ceiling_reps})")
        print(f"replay floor (client + loopback, no server work): {rate_p:>10,.0f} ev/s "
              f"({ratio(rate_p, rate_d)} of direct; best of {args.ceiling_reps})")
        print(f"router / decode ceiling = {rate_r / rate_c:.2f}x (issue 30 target >= 0.80x); "
              f"router / replay floor = {rate_r / rate_p:.2f}x")
        # What a watch() + try_next() consumer reaches with no server work at all: the bound on
        # "router / decode ceiling" for this client loop (the router cannot beat the stub).
        print(f"router / decode ceiling by batch = {rate_r / rate_cb:.2f}x")
        print(f"replay floor / decode ceiling = {rate_p / rate_c:.2f}x, / decode ceiling by batch = "
              f"{rate_p / rate_cb:.2f}x (the most this client loop allows of each ceiling); "
              f"load {os.getloadavg()[0]:.2f}")


def _decode_batches(batches: list[bytes]) -> None:
    """``bson.decode_all`` of each batch in turn, each result dropped before the next."""
    for b in batches:
        bson.decode_all(b)


def _timed(fn, *a) -> float:
    t = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t


def replay_floor(raw: bytes, n: int, reps: int) -> float:
    """Events/s of the best of ``reps`` reads of ``raw``'s ``n`` events through pymongo's
    ``watch()`` from ``bench/_replay_server.py`` (10,000 events per reply, as the router's
    batches here)."""
    with tempfile.NamedTemporaryFile(suffix=".bson", delete=False) as f:
        f.write(raw)
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, os.path.join(here, "_replay_server.py"), f.name,
                             f"{DB}.c0", "10000"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        host = line.strip().rsplit(" ", 1)[-1]
        c = MongoClient(f"mongodb://{host}/?directConnection=true")
        best = 0.0
        for _ in range(reps):
            got, secs = read_events(c[DB].c0, n)
            best = max(best, got / secs)
        c.close()
        return best
    finally:
        proc.terminate()
        proc.wait(10)
        os.unlink(f.name)


if __name__ == "__main__":
    main()
