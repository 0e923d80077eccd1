"""Per-hop timeline of the insert-to-event latency of ``bench_promise_modes.py`` (``clock`` mode,
two idle shards): when each process receives and answers each message, as medians over the
samples, relative to the moment the client calls ``insert_one``.

Every role process is started with a ``sitecustomize`` (on ``PYTHONPATH``, written to a temporary
directory; the project's code is not changed) that wraps ``Server._respond`` (``in``/``out``:
a request parsed / its reply about to be written) and ``Connection._exchange`` (``->``/``<-``: a
command sent to another process / its reply read; ``Connection.write_request`` is a ``->`` too), recording ``time.monotonic_ns()`` (the same
clock in every process) and the thread's CPU time (``time.thread_time_ns()``) in memory; each process writes its records when it exits. The bench
records the client's own marks (``CLIENT insert done`` / ``CLIENT event``). A label seen twice
in one sample gets ``#2``; labels seen in fewer than half the samples are not shown.

After the timeline it prints, per process and command, the median CPU from the request's
``in`` to its ``out`` (the handler's own work, plus whatever the process's loop ran while the
handler awaited): a long wall time with little CPU there is waiting, not work.

Usage: ``python bench/bench_latency_trace.py [--samples N] [--gap-ms MS] [--show K]`` (``--show``
prints the full timeline of the first K samples; ``--steps`` also marks steps inside the
router: ``RouterChangeStreamCursor.fetch`` start/end, ``PromiseRequests._apply``,
``RouterChangeStream.schedule_getmores``). Figures only; the wrappers add a few µs per
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
    _cpu = time.thread_time_ns

    def _name(buf, start):
        end = buf.find(b"\0", start)
        return bytes(buf[start:end]).decode("latin-1") if end > start else "?"

    from shardsim.core import client as _client, server as _server

    _respond = _server.Server._respond

    async def _traced_respond(self, msg, conn):
        body = getattr(msg, "body", None)
        name = _name(body, 5) if isinstance(body, (bytes, bytearray, memoryview)) else "?"
        _REC.append((_ns(), _cpu(), "in", name))
        try:
            return await _respond(self, msg, conn)
        finally:
            _REC.append((_ns(), _cpu(), "out", name))

    _server.Server._respond = _traced_respond

    _exchange = _client.Connection._exchange

    async def _traced_exchange(self, msg):
        if msg is not None:  # None: written earlier by write_request
            _REC.append((_ns(), _cpu(), "->", self.port, _name(msg, 26)))
        try:
            return await _exchange(self, msg)
        finally:
            _REC.append((_ns(), _cpu(), "<-", self.port, ""))

    _client.Connection._exchange = _traced_exchange

    _write_request = _client.Connection.write_request

    def _traced_write_request(self, body):
        _REC.append((_ns(), _cpu(), "->", self.port, _name(body, 5)))
        return _write_request(self, body)

    _client.Connection.write_request = _traced_write_request

    # Steps inside a process (label "fn NAME start"/"fn NAME end"): the router's change-stream
    # getMore (fetch) and its promise replies applied; the shard's event building.
    def _wrap_steps():
        import asyncio, importlib
        steps = (("shardsim.router.change_stream.cursor", "RouterChangeStreamCursor", "fetch"),
                 ("shardsim.router.change_stream.promise_requests", "PromiseRequests", "_apply"),
                 ("shardsim.router.change_stream.cursor", "RouterChangeStream", "schedule_getmores"))
        for mod_name, cls_name, fn_name in steps:
            try:
                cls = getattr(importlib.import_module(mod_name), cls_name)
            except Exception:
                continue
            fn = getattr(cls, fn_name)
            label = f"{cls_name}.{fn_name}"
            if asyncio.iscoroutinefunction(fn):
                async def wrapped(*a, _fn=fn, _label=label, **k):
                    _REC.append((_ns(), _cpu(), "fn", _label + " start"))
                    try:
                        return await _fn(*a, **k)
                    finally:
                        _REC.append((_ns(), _cpu(), "fn", _label + " end"))
            else:
                def wrapped(*a, _fn=fn, _label=label, **k):
                    _REC.append((_ns(), _cpu(), "fn", _label))
                    return _fn(*a, **k)
            setattr(cls, fn_name, wrapped)

    if os.environ.get("SHARDSIM_LATENCY_TRACE_STEPS"):
        _wrap_steps()

    def _dump():
        with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "w") as f:
            for r in _REC:
                f.write(json.dumps(r) + "\n")

    atexit.register(_dump)
'''


def run(samples: int, gap_ms: float, show: int, steps: bool = False) -> None:
    tdir = tempfile.mkdtemp(prefix="shardsim-trace-")
    site = os.path.join(tdir, "site")
    out = os.path.join(tdir, "out")
    os.makedirs(site)
    os.makedirs(out)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "SHARDSIM_LATENCY_TRACE",
                                            "SHARDSIM_LATENCY_TRACE_STEPS")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, saved["PYTHONPATH"]) if p)
    os.environ["SHARDSIM_LATENCY_TRACE"] = out
    if steps:
        os.environ["SHARDSIM_LATENCY_TRACE_STEPS"] = "1"
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
                    records.append((r[0], proc, r[2:], r[1]))
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
    # CPU of the process's thread from a request's "in" to its "out" (us): the handler's own
    # work plus whatever else the process's loop ran while the handler awaited.
    cpu_in_out: dict[str, list[float]] = collections.defaultdict(list)
    for k, (t0, t1, t2) in enumerate(marks):
        seen: collections.Counter[str] = collections.Counter()
        lines = []
        opened: dict[tuple[str, str], int] = {}
        for t, proc, r, cpu in records[bisect.bisect_left(stamps, t0):bisect.bisect_right(stamps, t2)]:
            kind = r[0]
            if kind in ("in", "out"):
                label = f"{proc} {kind:3s} {r[1]}"
                if kind == "in":
                    opened[(proc, r[1])] = cpu
                elif (proc, r[1]) in opened:
                    cpu_in_out[f"{proc} {r[1]}"].append((cpu - opened.pop((proc, r[1]))) / 1000)
            elif kind == "fn":
                label = f"{proc} {r[1]}"
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
    print("CPU from a request's in to its out, medians (us; includes what the loop ran meanwhile)")
    for label, v in sorted(cpu_in_out.items()):
        if len(v) >= len(marks) / 2:
            print(f"{statistics.median(v):8.0f} us  {label}  (n={len(v)})")
    tot = sorted((t2 - t0) / 1e6 for t0, _, t2 in marks)
    print(f"insert-to-event p50 {tot[len(tot) // 2]:.2f} ms, p95 {tot[int(len(tot) * .95)]:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--gap-ms", type=float, default=250.0)
    ap.add_argument("--show", type=int, default=0)
    ap.add_argument("--steps", action="store_true",
                    help="also mark steps inside the router: its change-stream getMore (fetch), "
                         "promise replies applied, remote getMores scheduled")
    a = ap.parse_args()
    print(f"machine: {machine()}  load: {os.getloadavg()[0]:.2f}", flush=True)
    run(a.samples, a.gap_ms, a.show, a.steps)


if __name__ == "__main__":
    main()
