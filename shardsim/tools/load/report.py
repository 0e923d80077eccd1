"""Figures of a load run: metrics, the rich table, the JSON result and the PNG plot.

Latency is measured from the wall-clock time the writing partition got the bulk write's
acknowledgement to the time the watcher received the event (both on this machine's clock;
slightly negative values are possible when an event overtakes its own acknowledgement).
Promise lag is wall-clock time minus the seconds of a shard's postBatchResumeToken when
sampled (cluster time has 1 s resolution, so ~0.5 s is the floor for a busy shard).
"""

from __future__ import annotations

import json
import math
from array import array
from typing import Any, Sequence

from shardsim.tools.load.plan import Plan
from shardsim.tools.load.verify import OP_CODES, DELETE, Event
from shardsim.tools.load.watch import ShardSample
from shardsim.tools.load.writer import WriteResult


def percentile(sorted_vals: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` in [0, 100] of already sorted values (None if empty)."""
    if not sorted_vals:
        return None
    k = min(len(sorted_vals) - 1, max(0, math.ceil(q / 100 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def ack_times(plan: Plan, results: Sequence[WriteResult]) -> array:
    """seq → wall-clock time its bulk write was acknowledged (0.0 if never)."""
    acks = array("d", bytes(8 * len(plan)))
    for r in results:
        for t, raw in r.acks:
            seqs = array("q")
            seqs.frombytes(raw)
            for s in seqs:
                acks[s] = t
    return acks


def event_seq(plan: Plan, ev: Event) -> int:
    """The plan op an event delivers (-1 if none)."""
    if ev.op == "delete":
        try:
            c = plan.spec.collection_names.index(ev.coll)
        except ValueError:
            return -1
        return plan.deletes.get((c, ev.id), -1)
    if OP_CODES.get(ev.op) is not None and 0 <= ev.seq < len(plan):
        return ev.seq
    return -1


def latencies_ms(plan: Plan, events: Sequence[Event], acks: array) -> list[float]:
    """Sorted write-ack → delivery latencies (ms) of the events that name an acked op."""
    out = []
    for ev in events:
        s = event_seq(plan, ev)
        if s >= 0 and acks[s] > 0 and ev.recv > 0:
            out.append((ev.recv - acks[s]) * 1000.0)
    out.sort()
    return out


def compute(plan: Plan, results: Sequence[WriteResult], events: Sequence[Event],
            samples: Sequence[ShardSample], planned_per_shard: dict[str, int],
            waits: Any = None) -> dict[str, Any]:
    """The run's figures (a JSON-ready dict). ``waits`` (a
    :class:`shardsim.tools.load.watch.WaitSampler`, optional) adds ``held_back``: per remote, the
    sampled seconds it held delivery back (``seconds``), the one that did so longest
    (``longest``, or None), the number of samples and the sampler's error."""
    starts = [r.start for r in results if r.ops]
    ends = [r.end for r in results if r.ops]
    written = sum(r.ops for r in results)
    t0 = min(starts) if starts else 0.0
    write_s = (max(ends) - t0) if ends else 0.0
    acks = ack_times(plan, results)
    lat = latencies_ms(plan, events, acks)
    recvs = [e.recv for e in events if e.recv > 0]
    deliver_s = (max(recvs) - t0) if recvs and t0 else 0.0
    shards = {}
    for smp in samples:
        lags = sorted(w - secs for w, secs, _ in smp.samples)
        shards[smp.shard] = {
            "planned_ops": planned_per_shard.get(smp.shard, 0),
            "oplog_events": smp.events,
            "promise_lag_s_mean": (sum(lags) / len(lags)) if lags else None,
            "promise_lag_s_p99": percentile(lags, 99),
            "promise_lag_s_max": lags[-1] if lags else None,
            "samples": len(smp.samples),
            "error": smp.error,
        }
    return {
        "ops_written": written,
        "write_seconds": write_s,
        "ops_per_s_written": written / write_s if write_s > 0 else None,
        "events_delivered": len(events),
        "deliver_seconds": deliver_s,
        "events_per_s_delivered": len(events) / deliver_s if deliver_s > 0 else None,
        "latency_ms": {"p50": percentile(lat, 50), "p95": percentile(lat, 95),
                       "p99": percentile(lat, 99), "max": lat[-1] if lat else None,
                       "count": len(lat)},
        "shards": shards,
        "held_back": None if waits is None else {
            "seconds": dict(sorted(waits.held_s.items())),
            "longest": (waits.longest() or (None,))[0],
            "samples": waits.samples, "interval_s": waits.interval, "error": waits.error},
        "t0": t0,
    }


def _fmt(v: Any, spec: str = ",.0f") -> str:
    return "—" if v is None else format(v, spec)


def table(figures: dict[str, Any], verdict: str, ok: bool):
    """A rich Table (or Group) summarising ``figures``."""
    from rich.console import Group
    from rich.table import Table

    main = Table(title="shardsim load", show_header=True)
    main.add_column("figure")
    main.add_column("value", justify="right")
    main.add_row("ops written", _fmt(figures["ops_written"]))
    main.add_row("ops/s written", _fmt(figures["ops_per_s_written"]))
    main.add_row("events delivered", _fmt(figures["events_delivered"]))
    main.add_row("events/s delivered", _fmt(figures["events_per_s_delivered"]))
    lat = figures["latency_ms"]
    for q in ("p50", "p95", "p99"):
        main.add_row(f"ack→delivery latency {q} (ms)", _fmt(lat[q], ",.1f"))
    held = figures.get("held_back")
    if held is not None:
        longest = held["longest"]
        main.add_row("held delivery back longest",
                     "nothing held" if longest is None and not held["error"] else
                     f"{longest} ({held['seconds'][longest]:.1f} s sampled)" if longest else
                     f"— ({held['error']})")
    if "spark_startup_s" in figures:
        main.add_row("Spark start-up (s)", _fmt(figures["spark_startup_s"], ".1f"))
    main.add_row("verdict", f"[{'green' if ok else 'bold red'}]{verdict}[/]")
    per = Table(title="per shard", show_header=True)
    for col in ("shard", "planned ops", "oplog events", "promise lag mean (s)", "promise lag max (s)"):
        per.add_column(col, justify="right" if col != "shard" else "left")
    for name, s in sorted(figures["shards"].items()):
        per.add_row(name, _fmt(s["planned_ops"]), _fmt(s["oplog_events"]),
                    _fmt(s["promise_lag_s_mean"], ".2f"), _fmt(s["promise_lag_s_max"], ".2f"))
    return Group(main, per)


def write_json(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=str)


def plot(path: str, t0: float, samples: Sequence[ShardSample], events: Sequence[Event],
         results: Sequence[WriteResult], router_hwm: Sequence[tuple[float, int, int]] = ()) -> None:
    """PNG: per-shard (and router) high-water mark over time, and written/delivered counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    base = int(t0)
    for smp in samples:
        if smp.samples:
            ax1.step([w - t0 for w, _, _ in smp.samples], [s - base for _, s, _ in smp.samples],
                     where="post", label=f"{smp.shard} promise")
    if router_hwm:
        ax1.step([w - t0 for w, _, _ in router_hwm], [s - base for _, s, _ in router_hwm],
                 where="post", label="router high-water mark", linestyle="--", color="black")
    ax1.set_ylabel("cluster time (s since start)")
    ax1.set_title("high-water marks (postBatchResumeToken)")
    ax1.legend(loc="upper left", fontsize="small")
    recv = sorted(e.recv - t0 for e in events if e.recv > 0)
    if recv:
        step = max(1, len(recv) // 5000)  # a few thousand points draw the same curve
        idx = list(range(0, len(recv), step)) + [len(recv) - 1]
        ax2.plot([recv[i] for i in idx], [i + 1 for i in idx], label="delivered events (watcher 0)")
    acks = sorted((t - t0, len(raw) // 8) for r in results for t, raw in r.acks)
    if acks:
        total = 0
        xs, ys = [], []
        for t, n in acks:
            total += n
            xs.append(t)
            ys.append(total)
        ax2.plot(xs, ys, label="acknowledged writes")
    ax2.set_xlabel("seconds since the writers started")
    ax2.set_ylabel("count")
    ax2.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["compute", "table", "write_json", "plot", "percentile", "DELETE"]
