"""Per-hop timeline of the insert-to-event latency of ``bench_promise_modes.py`` (``clock`` mode,
two idle shards): when each process receives and answers each message, as medians over the
samples, relative to the moment the client calls ``insert_one``.

Every role process is started with a ``sitecustomize`` (on ``PYTHONPATH``, written to a temporary
directory; the project's code is not changed) that wraps ``Server._respond`` (``in``/``out``:
a request parsed / its reply about to be written) and ``Connection._exchange`` (``->``/``<-``: a
command sent to another process / its reply read; ``Connection.write_request`` is a ``->`` too), recording ``time.monotonic_ns()`` (the same
clock in every process) in memory; each process writes its records when it exits. The bench
records the client's own marks (``CLIENT insert done`` / ``CLIENT event``). A label seen twice
in one sample gets ``#2``; labels seen in fewer than half the samples are not shown.

Usage: ``python bench/bench_latency_trace.py [--samples N] [--gap-ms MS] [--show K]`` (``--show``
prints the full timeline of the first K samples). Figures only; the wrappers add a few µs per
message.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import glob
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

import pymongo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import insert_then_event, machine  # noqa: E402  (also puts the project root on sys.path)
from shardsim.tools.launcher import Cluster  # noqa: E402

SITECUSTOMIZE = r'''
import atexit, json, os, time
_DIR = os.environ.get("SHARDSIM_LATENCY_TRACE")
if _DIR:
    _REC = []
    _ns = time.monotonic_ns

    def _name(buf, start):
        end = buf.find(b"\0", start)
        return bytes(buf[start:end]).decode("latin-1") if end > start else "?"

    from shardsim.core import client as _client, server as _server

    _respond = _server.Server._respond

    async def _traced_respond(self, msg, conn):
        body = getattr(msg, "body", None)
        name = _name(body, 5) if isinstance(body, (bytes, bytearray, memoryview)) else "?"
        _REC.append((_ns(), "in", name))
        try:
            return await _respond(self, msg, conn)
        finally:
            _REC.append((_ns(), "out", name))

    _server.Server._respond = _traced_respond

    _exchange = _client.Connection._exchange

    async def _traced_exchange(self, msg):
        if msg is not None:  # None: written earlier by write_request
            _REC.append((_ns(), "->", self.port, _name(msg, 26)))
        try:
            return await _exchange(self, msg)
        finally:
            _REC.append((_ns(), "<-", self.port, ""))

    _client.Connection._exchange = _traced_exchange

    _write_request = _client.Connection.write_request

    def _traced_write_request(self, body):
        _REC.append((_ns(), "->", self.port, _name(body, 5)))
        return _write_request(self, body)

    _client.Connection.write_request = _traced_write_request

    def _dump():
        with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "w") as f:
            for r in _REC:
                f.write(json.dumps(r) + "\n")

    atexit.register(_dump)
'''


def run(samples: int, gap_ms: float, show: int) -> None:
    tdir = tempfile.mkdtemp(prefix="shardsim-trace-")
    site = os.path.join(tdir, "site")
    out = os.path.join(tdir, "out")
    os.makedirs(site)
    os.makedirs(out)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "SHARDSIM_LATENCY_TRACE")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, saved["PYTHONPATH"]) if p)
    os.environ["SHARDSIM_LATENCY_TRACE"] = out
    marks = []
    rng = random.Random(7)
    try:
        with Cluster(shards=3, shard_args=["--promise-mode", "clock", "--noop-interval-ms", "1000"]) as cluster:
            names = {p.pid: p.name for p in cluster.processes}
            ports = {p.port: p.name for p in cluster.processes}
            client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=10000)
            try:
                client.admin.command({"shardCollection": "bench.lat", "key": {"k": 1}})
                coll = client.bench.lat
                coll.insert_one({"_id": -1, "k": 0})
                with coll.watch(max_await_time_ms=1000) as stream:
                    stream.try_next()
                    for i in range(samples):
                        time.sleep(rng.random() * gap_ms / 1000)
                        marks.append(insert_then_event(coll, stream, i, time.monotonic_ns))
            finally:
                client.close()
        records = []
        for path in glob.glob(os.path.join(out, "*.jsonl")):
            proc = names.get(int(os.path.basename(path).split(".")[0]), "?")
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    records.append((r[0], proc, r[1:]))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tdir, ignore_errors=True)
    records.sort()
    stamps = [r[0] for r in records]
    per_label: dict[str, list[float]] = collections.defaultdict(list)
    for k, (t0, t1, t2) in enumerate(marks):
        seen: collections.Counter[str] = collections.Counter()
        lines = []
        for t, proc, r in records[bisect.bisect_left(stamps, t0):bisect.bisect_right(stamps, t2)]:
            kind = r[0]
            if kind in ("in", "out"):
                label = f"{proc} {kind:3s} {r[1]}"
            else:
                label = f"{proc} {kind} {ports.get(r[1], r[1])} {r[2]}".rstrip()
            seen[label] += 1
            if seen[label] > 1:
                label += f" #{seen[label]}"
            per_label[label].append((t - t0) / 1000)
            lines.append(f"{(t - t0) / 1000:8.0f} us  {label}")
        per_label["CLIENT insert done"].append((t1 - t0) / 1000)
        per_label["CLIENT event"].append((t2 - t0) / 1000)
        if k < show:
            print(f"--- sample {k}: insert {(t1 - t0) / 1000:.0f} us, event {(t2 - t0) / 1000:.0f} us")
            print("\n".join(lines))
    print(f"medians over {len(marks)} samples (us after insert_one is called; n = samples with it)")
    rows = sorted((statistics.median(v), label, len(v)) for label, v in per_label.items()
                  if len(v) >= len(marks) / 2)
    for med, label, n in rows:
        print(f"{med:8.0f} us  {label}  (n={n})")
    tot = sorted((t2 - t0) / 1e6 for t0, _, t2 in marks)
    print(f"insert-to-event p50 {tot[len(tot) // 2]:.2f} ms, p95 {tot[int(len(tot) * .95)]:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--gap-ms", type=float, default=250.0)
    ap.add_argument("--show", type=int, default=0)
    a = ap.parse_args()
    print(f"machine: {machine()}  load: {os.getloadavg()[0]:.2f}", flush=True)
    run(a.samples, a.gap_ms, a.show)


if __name__ == "__main__":
    main()
