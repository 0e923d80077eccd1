"""The seeded simulation of the router's merge (tests/sim): shards with skewed clocks, oplog
holes, random reply delays, new shards and resumed streams; every third seed runs the data
shards on the real shard change-stream cursor (``real_shard.py``). The bar: every seed with no
order violation, no loss, no duplicate, no premature release (600 + 150 + 50 seeds here, ~20 s;
``python tests/sim/run.py --seeds 1000`` sweeps more). A failure names its seeds and how to
replay them (``--seed N``, see conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from sim.real_shard import RealShard
from sim.world import World, replay_hint, run_seed


def sweep(replay_seed: int | None, seeds: range, **kw: Any) -> dict[int, list[str]]:
    """Run ``seeds`` (or only ``replay_seed``) with the World arguments ``kw``; the violations
    of the failing seeds, each printed with its replay command."""
    bad = {}
    for seed in ([replay_seed] if replay_seed is not None else seeds):
        try:
            res = run_seed(seed, **kw)
        except Exception as exc:  # noqa: BLE001 - a crash is a failing seed, named with its replay
            bad[seed] = [f"crashed: {exc!r}"]
            print(f"seed {seed}: crashed: {exc!r}\n  {replay_hint(seed, **kw)}")
            continue
        assert res.events > 0 and res.returned > 0, replay_hint(seed, **kw)
        if replay_seed is not None:
            print(f"seed {seed}: {res.events} events, {res.streams} streams, "
                  f"{res.returned} returned, violations: {res.violations}")
        if res.violations:
            bad[seed] = res.violations
            print(f"seed {seed}: {res.violations[:3]}\n  {replay_hint(seed, **kw)}")
    return bad


def failures(bad: dict[int, list[str]], **kw: Any) -> str:
    """An assertion message naming every failing seed and how to replay the first."""
    if not bad:
        return ""
    first = min(bad)
    return (f"{len(bad)} seeds with violations: {sorted(bad)[:20]}; seed {first}: "
            f"{bad[first][:3]}; {replay_hint(first, **kw)} "
            f"(or python -m pytest tests/sim --seed {first})")


def test_clock_mode_no_violation(replay_seed):
    bad = sweep(replay_seed, range(600), mode="clock")
    assert bad == {}, failures(bad, mode="clock")


def test_mongod_promise_mode_no_violation(replay_seed):
    bad = sweep(replay_seed, range(150), mode="mongod")
    assert bad == {}, failures(bad, mode="mongod")


def test_more_shards_and_additions(replay_seed):
    kw = {"shards": 5, "add_shards": 3, "writes": 120, "resumes": 3}
    bad = sweep(replay_seed, range(50), **kw)
    assert bad == {}, failures(bad, **kw)


def test_checker_finds_an_unsafe_promise(replay_seed):
    # A shard promising its clock while a lower write is still in flight breaks ordering; the
    # simulation must notice (this keeps the checkers honest), on the model shards and on the
    # real shard cursor alike (seeds 2, 5, ...: the cursor reads the raw clock, real_shard.py).
    if replay_seed is not None:
        pytest.skip("a sweep over 90 seeds: not replayed one seed at a time")
    bad = [s for s in range(90) if run_seed(s, mode="unsafe-clock").violations]
    assert len([s for s in bad if s % 3 != 2]) > 10
    assert len([s for s in bad if s % 3 == 2]) > 10


def test_real_shards_run_the_shard_cursor(replay_seed):
    # Seeds 2 and 5 (promise replies, Blocks on 5... see world.py) run the real cursor: it
    # answered getMores, woke parked getMores on oplog appends and promise requests, and gave
    # promise replies; the streams returned the real shard's events, checked clean.
    if replay_seed is not None:
        pytest.skip("checks two fixed seeds")
    counts = {"getmores": 0, "wakes": 0, "promises": 0}
    for seed in (2, 5):
        world = World(seed)
        res = world.run()
        assert world.real and res.violations == [], replay_hint(seed)
        shards = world.shards
        assert shards and all(isinstance(sh, RealShard) for sh in shards)
        assert res.returned >= res.events > 0
        for sh in shards:
            for k in counts:
                counts[k] += getattr(sh, k)
        # every event a stream returned is a real insert on a real shard's oplog
        logged = {e["o"]["_id"] for sh in shards for e in sh.node.oplog.entries_from(0)
                  if e["op"] == "i"}
        assert {e.meta["_id"] for st in world.streams for e in st.returned} <= logged
    assert all(counts.values()), counts
    assert World(3).real is False
    forced = World(3, real_shards=True)
    assert forced.real and isinstance(forced.shards[0], RealShard)
    forced.loop.close()


def test_deterministic(replay_seed):
    # 77 runs real shards (77 % 3 == 2), 3 the model
    for seed in ([replay_seed] if replay_seed is not None else [3, 77]):
        a, b = World(seed), World(seed)
        ra, rb = a.run(), b.run()
        assert (ra.events, ra.returned, ra.violations) == (rb.events, rb.returned, rb.violations)
        assert [[e.key for e in st.returned] for st in a.streams] == \
            [[e.key for e in st.returned] for st in b.streams]
