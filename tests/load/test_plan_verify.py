"""Plan generator (deterministic, valid document histories) and verifier (passes a correct
stream, names the first bad event of planted reorder/drop/duplicate faults)."""

from __future__ import annotations

import random

import pytest

from shardsim.tools.load.plan import (DELETE, INSERT, KEY_SPACE, UPDATE, Chunk, ChunkMap, Plan,
                                PlanSpec, batches, parse_mix, partition_by_shard, split_points)
from shardsim.tools.load.verify import Event, inject_fault, verify


def _spec(**kw):
    base = dict(ops=5000, seed=7, mix=parse_mix("insert=60,update=30,delete=10"),
                distribution="uniform", collections=2, doc_size=64)
    base.update(kw)
    return PlanSpec(**base)


def _stream(plan: Plan, shards: int = 3, seed: int = 0) -> list[Event]:
    """A correct merged stream: each shard's ops in plan order, interleaved at random (like
    independent shards), tokens increasing in delivery order."""
    cmap = ChunkMap([Chunk(c, lo, hi, f"s{i}") for c in range(plan.spec.collections)
                     for i, (lo, hi) in enumerate(zip([0] + split_points(shards),
                                                      split_points(shards) + [KEY_SPACE]))])
    parts = [list(v) for v in partition_by_shard(plan, cmap).values()]
    rng = random.Random(seed)
    out: list[Event] = []
    while any(parts):
        p = rng.choice([p for p in parts if p])
        seq = p.pop(0)
        kind = plan.kinds[seq]
        op = ("insert", "update", "delete")[kind]
        out.append(Event("82%016X" % (len(out) + 1), op, f"c{plan.colls[seq]}", plan.ids[seq],
                         seq if kind != DELETE else -1))
    return out


def test_same_seed_same_plan_and_different_seed_differs():
    a, b, c = Plan(_spec()), Plan(_spec()), Plan(_spec(seed=8))
    for attr in ("kinds", "colls", "ids", "prev", "version"):
        assert getattr(a, attr) == getattr(b, attr)
    assert a.ids != c.ids
    assert a.expected_final() == b.expected_final()


def test_plan_histories_are_valid_and_mix_respected():
    plan = Plan(_spec(ops=20000, distribution="zipf"))
    counts = plan.counts()
    assert sum(counts.values()) == 20000
    assert abs(counts["insert"] / 20000 - 0.6) < 0.03
    assert abs(counts["delete"] / 20000 - 0.1) < 0.03
    state: dict = {}
    for seq in range(len(plan)):
        key = (plan.colls[seq], plan.ids[seq])
        assert 0 <= plan.ids[seq] < KEY_SPACE
        if plan.kinds[seq] == INSERT:
            assert key not in state and plan.prev[seq] == -1  # ids never reused
            state[key] = seq
        else:
            assert state.get(key) == plan.prev[seq]  # targets a live doc; prev links history
            state[key] = seq
            if plan.kinds[seq] == DELETE:
                state[key] = None
    final = plan.expected_final()
    live = {k for k, v in state.items() if v is not None}
    assert sum(len(d) for d in final.values()) == len(live)


def test_zipf_is_skewed_uniform_is_not():
    def top_share(dist):
        plan = Plan(_spec(ops=20000, distribution=dist, collections=1, mix=parse_mix("insert=20,update=80")))
        hits: dict = {}
        for seq in range(len(plan)):
            if plan.kinds[seq] == UPDATE:
                hits[plan.ids[seq]] = hits.get(plan.ids[seq], 0) + 1
        top = sorted(hits.values(), reverse=True)[:10]
        return sum(top) / sum(hits.values())
    assert top_share("zipf") > 3 * top_share("uniform")


def test_parse_mix_errors():
    assert parse_mix("insert=1") == {"insert": 1.0, "update": 0.0, "delete": 0.0}
    for bad in ("insert=0,update=1", "foo=1", "insert", "insert=-1"):
        with pytest.raises(ValueError):
            parse_mix(bad)


def test_batches_keep_document_order():
    plan = Plan(_spec(ops=3000))
    seqs = list(range(len(plan)))
    pos: dict = {}
    n = 0
    for run in batches(plan, seqs, 100):
        for c, ss in run.items():
            kinds = [plan.kinds[s] for s in ss]
            assert kinds == sorted(kinds)  # at most three commands per collection
            for s in ss:
                pos[s] = n
                n += 1
    for s in seqs:
        if plan.prev[s] >= 0:
            assert pos[plan.prev[s]] < pos[s]


def test_verifier_passes_correct_stream_and_final_state():
    plan = Plan(_spec())
    events = _stream(plan)
    rep = verify(plan, events, final=plan.expected_final())
    assert rep.ok, rep.violation
    assert rep.matched == len(plan) and rep.final_checked


@pytest.mark.parametrize("fault", ["reorder", "drop", "duplicate"])
def test_verifier_catches_planted_fault_and_names_first_bad_event(fault):
    plan = Plan(_spec())
    events, desc = inject_fault(_stream(plan), fault, seed=3)
    assert desc
    rep = verify(plan, events)
    assert not rep.ok
    v = rep.violation
    if fault == "reorder":
        i = int(desc.split("#")[1].split()[0])
        assert v.kind == "token-order" and v.index == i + 1
        assert f"event #{i + 1} " in v.message
    elif fault == "duplicate":
        j = int(desc.rsplit("#", 1)[1])
        assert v.kind == "duplicate" and v.index == j
    else:
        assert v.kind in ("document-order", "missing")
        assert "never arrived" in v.message


def test_verifier_document_order_and_unplanned_and_final_mismatch():
    plan = Plan(_spec(ops=2000, collections=1))
    events = _stream(plan, shards=1)
    # move a document's update before its insert, but keep tokens increasing
    upd = next(i for i, e in enumerate(events) if e.op == "update")
    ins = next(i for i, e in enumerate(events) if e.op == "insert" and e.id == events[upd].id)
    moved = list(events)
    ev = moved.pop(upd)
    moved.insert(ins, ev)
    moved = [e._replace(token="82%016X" % (k + 1)) for k, e in enumerate(moved)]
    rep = verify(plan, moved)
    assert rep.violation.kind == "document-order" and rep.violation.index == ins
    assert f"arrived later as event #{ins + 1}" in rep.violation.message

    stray = list(events)
    stray[5] = stray[5]._replace(coll="other")
    assert verify(plan, stray).violation.kind == "unplanned"

    final = plan.expected_final()
    some = next(iter(final["c0"]))
    final["c0"][some] = dict(final["c0"][some], v=99)
    rep = verify(plan, events, final=final)
    assert rep.violation.kind == "final-state" and f"_id={some}" in rep.violation.message
