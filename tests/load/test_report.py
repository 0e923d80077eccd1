"""Figures of a load run from synthetic inputs: percentiles, ack→delivery latency, token
times, chunk routing, and that the plot and JSON are written."""

from __future__ import annotations

import json
from array import array

from shardsim.tools.load.plan import Chunk, ChunkMap, Plan, PlanSpec
from shardsim.tools.load.report import compute, percentile, plot, write_json
from shardsim.tools.load.verify import Event
from shardsim.tools.load.watch import ShardSample, token_time
from shardsim.tools.load.writer import WriteResult
from shardsim.core.resume_token import make_high_water_mark
from bson.timestamp import Timestamp


def test_percentile_nearest_rank():
    vals = list(range(1, 101))
    assert percentile(vals, 50) == 50 and percentile(vals, 99) == 99 and percentile(vals, 100) == 100
    assert percentile([], 50) is None


def test_token_time_reads_cluster_time_of_real_tokens():
    tok = make_high_water_mark(Timestamp(1700000000, 42))
    assert token_time(tok) == (1700000000, 42)
    assert token_time({"_data": "00"}) is None and token_time(None) is None


def test_chunk_map_routes_ranges():
    cm = ChunkMap([Chunk(0, -(1 << 63), 100, "a"), Chunk(0, 100, 200, "b"), Chunk(0, 200, 1 << 63, "c")])
    assert [cm.shard_of(0, k) for k in (0, 99, 100, 199, 200, 10**9)] == ["a", "a", "b", "b", "c", "c"]
    assert cm.shards == ["a", "b", "c"]


def test_compute_latency_and_plot(tmp_path):
    plan = Plan(PlanSpec(ops=100, seed=3))
    seqs = array("q", range(100))
    res = [WriteResult("s0", ops=100, start=1000.0, end=1001.0, acks=[(1000.5, seqs.tobytes())])]
    events = []
    for s in range(100):
        kind = plan.kinds[s]
        op = ("insert", "update", "delete")[kind]
        events.append(Event("82%016X" % (s + 1), op, "c0", plan.ids[s], s if kind != 2 else -1,
                            1000.5 + 0.010))
    smp = ShardSample("s0", [(1000.0, 999, 1), (1001.0, 1000, 5)], events=100)
    fig = compute(plan, res, events, [smp], {"s0": 100})
    assert fig["ops_written"] == 100 and fig["events_delivered"] == 100
    assert abs(fig["latency_ms"]["p50"] - 10.0) < 0.01 and fig["latency_ms"]["count"] == 100
    assert abs(fig["shards"]["s0"]["promise_lag_s_mean"] - 1.0) < 1e-9
    png, js = tmp_path / "p.png", tmp_path / "r.json"
    plot(str(png), fig["t0"], [smp], events, res, [(1000.2, 1000, 1)])
    write_json(str(js), {"figures": fig})
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(js.read_text())["figures"]["ops_written"] == 100


def test_wait_sampler_accounts_held_time_and_report_names_the_longest():
    from shardsim.tools.load.report import table
    from shardsim.tools.load.watch import WaitSampler
    w = WaitSampler("mongodb://unused", "load", interval=0.5)
    held = {"_data": "82AA"}
    w.sample([{"ns": "load.c0", "changeStream": {"heldEvent": held, "waitingFor": ["s1", "config"]}}])
    w.sample([{"ns": "load.c1", "changeStream": {"heldEvent": held, "waitingFor": ["s1"]}},
              {"ns": "other.c", "changeStream": {"heldEvent": held, "waitingFor": ["s0"]}}])
    w.sample([{"ns": "load.c0", "changeStream": {"heldEvent": None, "waitingFor": ["s0"]}}])
    assert w.held_s == {"s1": 1.0, "config": 0.5} and w.longest() == ("s1", 1.0)
    plan = Plan(PlanSpec(ops=10, seed=1))
    fig = compute(plan, [], [], [], {}, waits=w)
    assert fig["held_back"]["longest"] == "s1" and fig["held_back"]["samples"] == 3
    from rich.console import Console
    console = Console(width=200, record=True)
    console.print(table(fig, "PASS", True))
    text = console.export_text()
    assert "held delivery back longest" in text and "s1 (1.0 s sampled)" in text
