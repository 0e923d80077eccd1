"""Each checker catches the violation it is about (on hand-made worlds), so a green sweep means
something; and a failing sweep names its seed and how to replay it."""

from __future__ import annotations

from types import SimpleNamespace

from shardsim.core.errors import MongoError

from sim.checkers import (check_all, completeness, no_stream_error, order, pbrt_covers_batch,
                          pbrt_monotonic, pbrt_never_passed, release_after_promises)
from sim.test_sim import failures


def key(n: int) -> tuple:
    return (f"82{n:016X}", n)


def ev(n: int) -> SimpleNamespace:
    return SimpleNamespace(key=key(n))


def world(returned, pbrts=(), releases=None, expected=None, error=None):
    st = SimpleNamespace(sid=0, returned=[ev(n) for n in returned], pbrts=list(pbrts),
                         releases=[(key(n), key(f) if f is not None else None)
                                   for n, f in (releases or [])], error=error)
    exp = [ev(n) for n in (returned if expected is None else expected)]
    return SimpleNamespace(streams=[st], expected=lambda s: exp)


def test_a_correct_stream_passes_every_checker():
    w = world([1, 2, 3], pbrts=[(key(0), 0), (key(3), 3)], releases=[(1, 2), (2, 3), (3, 3)])
    assert check_all(w) == []


def test_each_checker_finds_its_violation():
    assert order.check(world([1, 3, 2], expected=[1, 2, 3]))
    assert completeness.check(world([1, 3], expected=[1, 2, 3]))
    assert completeness.check(world([1, 2, 2, 3], expected=[1, 2, 3]))
    assert release_after_promises.check(world([1, 2], releases=[(1, 1), (2, 1)]))
    assert release_after_promises.check(world([1], releases=[(1, None)]))
    assert pbrt_monotonic.check(world([], pbrts=[(key(5), 0), (key(4), 0)]))
    assert pbrt_covers_batch.check(world([1, 2], pbrts=[(key(1), 2)]))
    assert pbrt_never_passed.check(world([1, 2], pbrts=[(key(2), 1)]))
    failed = world([1], error=MongoError(280, "cannot resume stream"))
    assert no_stream_error.check(failed) and check_all(failed) == no_stream_error.check(failed)


def test_failure_message_names_the_seed_and_the_replay_command():
    msg = failures({12: ["stream 0: order violation"]}, mode="mongod")
    assert "seed=12" in msg and "run.py --seed 12 --mode mongod" in msg
    assert "python -m pytest tests/sim --seed 12" in msg
