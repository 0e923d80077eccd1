"""Where the insert-to-event latency of ``bench_promise_modes.py`` (``clock`` mode, two idle
shards) goes: round trips after an idle gap vs back to back, and the insert-to-event latency
split into its insert and getMore halves.

One 3-shard cluster (``--promise-mode clock --noop-interval-ms 1000``); ``bench.lat`` is
sharded on ``{k: 1}`` and every write lands on the shard owning ``k: 0``. Each probe runs
``--samples`` times back to back (``b2b``) and with a random 0..``--gap-ms`` sleep before each
sample (``idle``, the situation of ``bench_promise_modes.py``):

- ``ping router`` / ``ping shard``: ``{ping: 1}`` through the router / directly to the written
  shard (pymongo round trip, no work on the server);
- ``insert shard``: ``insert_one`` directly on the shard (``bench.direct``, not watched);
- ``insert router (unwatched)``: ``insert_one`` through the router on ``bench.other`` (same
  shard, no change stream on it);
- ``insert router (watched)``: ``insert_one`` on ``bench.lat`` through the router while a
  watcher is open on it (the write path then also asks the idle shards for promises);
- ``event: insert`` / ``event: getMore`` / ``event: total``: the insert-to-event sample of
  ``bench_promise_modes.py`` split at the moment ``insert_one`` returns;
- ``event: waiting watcher``: the shape of a CDC connector. The watcher is its own process
  whose getMore is always waiting at the router (``for event in stream``, ``maxAwaitTimeMS``
  5000); this process inserts, and a sample is from just before ``insert_one`` to the watcher
  having the event (``time.monotonic_ns``, one clock for both processes). Its floor is about
  one insert round trip (the write travels client -> router -> shard, its event shard ->
  router -> client), so the ratio to the unwatched insert through the router is printed too.

Usage: ``python bench/bench_latency_breakdown.py [--samples N] [--gap-ms MS]``. Prints
p50/p95/p99 per probe (ms) with the router's CPU per call (its background CPU with no stream
open subtracted), the CPU and the write system calls (``/proc/PID/io`` ``syscw``:
one per message sent, about) per insert-to-event sample and process, and issue 30's ratios:
the event's p50/p99 against the idle ``ping router`` p50 measured in the same run (targets
<= 2x and <= 4x) and the router's CPU per sample (target < 0.7 ms); and the sample's own
floor: a sample is two client round trips in a row (``insert_one``, then the getMore that
fetches its event), so with no stream cost at all it takes an unwatched insert through the
router plus a ping (idle p50s of the same run), about 3x the ping alone. Figures only.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from typing import Callable

import pymongo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import cpu_seconds, insert_then_event, machine  # noqa: E402  (also puts the project root on sys.path)
from shardsim.tools.launcher import Cluster  # noqa: E402


# The waiting watcher (a process of its own): prints "ready" once its stream is open, then
# "<_id> <monotonic_ns>" per event received, until it has ``n`` of them.
WATCHER = r"""
import sys, time, pymongo
c = pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=10000)
n, got = int(sys.argv[2]), []
with c.bench.lat.watch(max_await_time_ms=5000) as stream:
    print("ready", flush=True)
    for ev in stream:
        got.append((ev["documentKey"]["_id"], time.monotonic_ns()))
        if len(got) >= n:
            break
print("\n".join(f"{i} {t}" for i, t in got), flush=True)
"""


def waiting_watcher_samples(uri: str, lat: pymongo.collection.Collection, n: int, gap_ms: float,
                            rng: random.Random, start: int) -> list[float]:
    """Seconds from just before ``insert_one({_id: i, k: 0})`` here to the event's arrival at
    a watcher process whose getMore waits at the router, for ``n`` samples with a random
    0..``gap_ms`` sleep before each."""
    proc = subprocess.Popen([sys.executable, "-c", WATCHER, uri, str(n)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # its first getMore is at the router
        sent: dict[int, int] = {}
        for i in range(start, start + n):
            time.sleep(rng.random() * gap_ms / 1000)
            sent[i] = time.monotonic_ns()
            lat.insert_one({"_id": i, "k": 0})
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    got = dict(map(int, ln.split()) for ln in out.splitlines() if ln.strip())
    assert sorted(got) == sorted(sent), "the watcher missed or doubled an event"
    return [(got[i] - sent[i]) / 1e9 for i in sent]


def write_calls(pid: int) -> int:
    """Write-family system calls ``pid`` has made so far (``/proc/PID/io`` ``syscw``; 0 where
    unreadable): a role process writes each message it sends with one."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for ln in f:
                if ln.startswith("syscw:"):
                    return int(ln.split()[1])
    except OSError:
        pass
    return 0


def pct(s: list[float], p: float) -> float:
    """The ``p`` percentile (nearest rank) of sorted ``s``."""
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


def line(name: str, xs: list[float]) -> str:
    s = sorted(xs)
    return (f"{name:34s} p50 {pct(s, 50) * 1000:6.2f}  p95 {pct(s, 95) * 1000:6.2f}  "
            f"p99 {pct(s, 99) * 1000:6.2f}  max {s[-1] * 1000:6.2f} ms")


def probe(fn: Callable[[int], None], n: int, gap_ms: float, rng: random.Random,
          start: int) -> list[float]:
    """Seconds per call of ``fn(i)`` for ``i`` in ``start..start+n``; sleeps a random
    0..``gap_ms`` before each call (none when ``gap_ms`` is 0)."""
    out = []
    for i in range(start, start + n):
        if gap_ms:
            time.sleep(rng.random() * gap_ms / 1000)
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--gap-ms", type=float, default=250.0)
    ap.add_argument("--event-only", action="store_true",
                    help="only the insert-to-event probe (and the idle router ping and unwatched "
                         "insert it is compared with)")
    ap.add_argument("--idle-s", type=float, default=10.0,
                    help="seconds of no writes to measure the background CPU")
    a = ap.parse_args()
    print(f"machine: {machine()}  load: {os.getloadavg()[0]:.2f}", flush=True)
    rng = random.Random(7)
    with Cluster(shards=3, shard_args=["--promise-mode", "clock", "--noop-interval-ms", "1000"]) as cluster:
        client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=10000)
        try:
            client.admin.command({"shardCollection": "bench.lat", "key": {"k": 1}})
            client.admin.command({"shardCollection": "bench.other", "key": {"k": 1}})
            lat, other = client.bench.lat, client.bench.other
            lat.insert_one({"_id": -1, "k": 0})
            other.insert_one({"_id": -1, "k": 0})
            direct = None
            for p in cluster.shards:  # the shard that owns k: 0 (it holds the document)
                c = pymongo.MongoClient(f"mongodb://{p.address}/?directConnection=true")
                if direct is None and c.bench.other.find_one({"_id": -1}) is not None:
                    direct = c
                else:
                    c.close()
            assert direct is not None
            direct.admin.command("ping")
            direct.bench.direct.insert_one({"_id": -1})
            pids = [p.pid for p in cluster.processes if p.pid]
            n, g = a.samples, a.gap_ms
            cpu0 = cpu_seconds(pids)
            probes: list[tuple[str, Callable[[int], None]]] = [
                ("ping router", lambda i: client.admin.command("ping")),
                ("ping shard", lambda i: direct.admin.command("ping")),
                ("insert shard", lambda i: direct.bench.direct.insert_one({"_id": i})),
                ("insert router (unwatched)", lambda i: other.insert_one({"_id": i, "k": 0})),
            ]
            nxt = 0
            ping_idle = insert_idle = None
            router_pid = next(p.pid for p in cluster.processes if p.name == "router")
            # the router's background CPU with no stream open, to subtract from its CPU per call
            bg0, tb = cpu_seconds([router_pid]), time.perf_counter()
            time.sleep(a.idle_s / 2)
            bg_rate = (cpu_seconds([router_pid]) - bg0) / (time.perf_counter() - tb)
            for name, fn in ((probes[0], probes[3]) if a.event_only else probes):
                for label, gap in ((("idle", g),) if a.event_only else (("b2b", 0.0), ("idle", g))):
                    c0, w0 = cpu_seconds([router_pid]), time.perf_counter()
                    xs = probe(fn, n, gap, rng, nxt)
                    per_call = (cpu_seconds([router_pid]) - c0
                                - bg_rate * (time.perf_counter() - w0)) / n * 1e6
                    nxt += n
                    print(line(f"{name} {label}", xs) + f"  router CPU/call {per_call:5.0f} us",
                          flush=True)
                    if name == "ping router" and label == "idle":
                        ping_idle = pct(sorted(xs), 50)
                    if name == "insert router (unwatched)" and label == "idle":
                        insert_idle = pct(sorted(xs), 50)
            with lat.watch(max_await_time_ms=1000) as stream:
                stream.try_next()
                for label, gap in (() if a.event_only else (("b2b", 0.0), ("idle", g))):
                    xs = probe(lambda i: lat.insert_one({"_id": i, "k": 0}), n, gap, rng, nxt)
                    nxt += n
                    print(line(f"insert router (watched) {label}", xs), flush=True)
                    got = 0
                    while got < n:  # drain the events of those inserts
                        if stream.try_next() is not None:
                            got += 1
                # Background CPU (no-op writer, catalog refresh, idle getMores) with the watcher
                # open and no writes, to subtract from the per-sample figures.
                idle0 = {p.name: cpu_seconds([p.pid]) for p in cluster.processes}
                t_idle = time.perf_counter()
                time.sleep(a.idle_s)
                t_idle = time.perf_counter() - t_idle
                idle_rate = {p.name: (cpu_seconds([p.pid]) - idle0[p.name]) / t_idle
                             for p in cluster.processes}
                ins, gm, tot = [], [], []
                per_proc0 = {p.name: cpu_seconds([p.pid]) for p in cluster.processes}
                writes0 = {p.name: write_calls(p.pid) for p in cluster.processes}
                t_run = time.perf_counter()
                for i in range(nxt, nxt + n):
                    time.sleep(rng.random() * g / 1000)
                    t0, t1, t2 = insert_then_event(lat, stream, i)
                    ins.append(t1 - t0)
                    gm.append(t2 - t1)
                    tot.append(t2 - t0)
                cpu1 = cpu_seconds(pids)
                t_run = time.perf_counter() - t_run
                per_proc = {p.name: (cpu_seconds([p.pid]) - per_proc0[p.name]
                                     - idle_rate[p.name] * t_run) / n * 1e6
                            for p in cluster.processes}
                writes = {p.name: (write_calls(p.pid) - writes0[p.name]) / n
                          for p in cluster.processes}
                print(line("event: insert (idle)", ins))
                print(line("event: getMore (idle)", gm))
                print(line("event: total (idle)", tot))
                print("CPU per insert-to-event sample, background subtracted (us): "
                      + ", ".join(f"{k} {v:.0f}" for k, v in per_proc.items()))
                print("write system calls per sample (background included): "
                      + ", ".join(f"{k} {v:.1f}" for k, v in writes.items()))
                st = sorted(tot)
                if ping_idle:
                    print(f"issue 30: event p50 / ping router idle p50 = {pct(st, 50) / ping_idle:.2f}x "
                          f"(target <= 2x), p99 / ping p50 = {pct(st, 99) / ping_idle:.2f}x (target <= 4x); "
                          f"router CPU per sample {per_proc.get('router', 0) / 1000:.2f} ms (target < 0.7)")
                if ping_idle and insert_idle:
                    # A sample is two client round trips in a row (the insert, then the getMore
                    # that fetches its event), so its floor is an unwatched insert plus a ping.
                    floor = insert_idle + ping_idle
                    print(f"sample floor (insert router unwatched idle p50 + ping router idle p50) "
                          f"{floor * 1000:.2f} ms = {floor / ping_idle:.2f}x the ping; "
                          f"event p50 / floor = {pct(st, 50) / floor:.2f}x, p99 / floor = "
                          f"{pct(st, 99) / floor:.2f}x")
                # The connector's shape: a watcher process whose getMore waits at the router
                # (this process's stream closed first: one stream, as in the samples above).
                stream.close()
                c0, w0 = cpu_seconds([router_pid]), time.perf_counter()
                ww = waiting_watcher_samples(cluster.router_uri, lat, n, g, rng, nxt + n)
                per_sample = (cpu_seconds([router_pid]) - c0 - (idle_rate["router"])
                              * (time.perf_counter() - w0)) / n * 1e6
                print(line("event: waiting watcher (idle)", ww)
                      + f"  router CPU/sample {per_sample:5.0f} us", flush=True)
                sw = sorted(ww)
                if ping_idle and insert_idle:
                    print(f"waiting watcher: event p50 / ping router idle p50 = "
                          f"{pct(sw, 50) / ping_idle:.2f}x, p99 / ping p50 = "
                          f"{pct(sw, 99) / ping_idle:.2f}x; event p50 / insert router "
                          f"(unwatched) idle p50 = {pct(sw, 50) / insert_idle:.2f}x")
                print("background CPU with the watcher open and no writes (ms/s): "
                      + ", ".join(f"{k} {v * 1000:.1f}" for k, v in idle_rate.items()))
                print(f"cluster CPU during the probes: {cpu1 - cpu0:.2f} s "
                      f"(load now {os.getloadavg()[0]:.2f})")
            direct.close()
        finally:
            client.close()


if __name__ == "__main__":
    main()
