"""A few fault trials in ``make test`` (one per role, bounded; role ``txn`` kills a
transaction's coordinator shard, tests/faults/txn_trial.py); ``make faults`` runs 100 per
role. Each trial kills one process of a durable cluster with ``kill -9`` during writes and a
change stream and checks every invariant of :mod:`.checkers`."""

from __future__ import annotations

import random

import pytest

from .checkers import Observed, TxnObserved, check, check_txn
from .harness import ROLES, run_trial

pytestmark = pytest.mark.timeout(120)


def test_checkers_catch_each_violation() -> None:
    """Each checker fails on the outcome it guards against (and only there)."""
    ev = lambda op, i, tok: {"operationType": op, "documentKey": {"_id": i},  # noqa: E731
                             "_id": {"_data": tok}}
    good = Observed(acked_inserts={0, 1}, acked_incs={0, 1},
                    docs={0: {"_id": 0, "n": 1}, 1: {"_id": 1, "n": 1}},
                    events=[ev("insert", 0, "a"), ev("update", 0, "b"),
                            ev("insert", 1, "c"), ev("update", 1, "d")])
    assert not any(check(good).values())
    lost = Observed(**{**good.__dict__, "docs": {0: {"_id": 0, "n": 1}}})
    assert check(lost)["lost_write"]
    doubled = Observed(**{**good.__dict__, "docs": {0: {"_id": 0, "n": 2}, 1: {"_id": 1, "n": 1}}})
    assert check(doubled)["doubled_write"]
    assert check(Observed(**{**good.__dict__, "events": good.events[:3]}))["lost_event"]
    assert check(Observed(**{**good.__dict__, "events": good.events + good.events[-1:]})
                 )["duplicated_event"]
    swapped = [good.events[0], good.events[2], good.events[1], good.events[3]]
    assert check(Observed(**{**good.__dict__, "events": swapped}))["reordered_event"]


@pytest.mark.parametrize("role", ROLES)
def test_one_fault_trial_per_role(cluster_factory, role: str) -> None:
    seed = random.SystemRandom().randrange(1, 10**6)
    cluster = cluster_factory(shards=2, durable=True, test_commands=role == "txn")
    result = run_trial(cluster, role, seed, ops=60)
    assert result.ok, (f"replay: python -m tests.faults --role {role} --seed {seed} "
                       f"--trials 1 --ops 60", result.violations)
    assert result.acked > 0 and (role == "txn" or result.events > 0)


def test_txn_checkers_catch_each_violation() -> None:
    """Each ``txn`` checker fails on the outcome it guards against (and only there)."""
    def shard(docs: dict, prepared: list | None = None, undecided: list | None = None) -> dict:
        return {"docs": docs, "prepared": prepared or [], "undecided": undecided or []}
    committed = {"a": shard({-1: {"v": 1}, -2: {}}), "b": shard({1: {"v": 1}, 2: {}})}
    good = TxnObserved(retry={"ok": True}, first={"ok": False, "code": 6, "errmsg": "net"},
                       shards=committed)
    assert not any(check_txn(good).values())
    half = {"a": committed["a"], "b": shard({1: {"v": 0}})}
    assert check_txn(TxnObserved(good.retry, good.first, half))["txn_all_or_nothing"]
    twice = {"a": shard({-1: {"v": 2}, -2: {}}), "b": committed["b"]}
    assert check_txn(TxnObserved(good.retry, good.first, twice))["txn_applied_once"]
    rerun = {"ok": False, "code": 251, "labels": ["TransientTransactionError"], "errmsg": ""}
    assert check_txn(TxnObserved(rerun, good.first, committed))["txn_answer"]
    internal = {"ok": False, "code": 1, "errmsg": "KeyError: 'prepareTimestamp'"}
    assert check_txn(TxnObserved(good.retry, internal, committed))["txn_answer"]
    left = {"a": shard({-1: {"v": 0}}, undecided=["ts"]), "b": shard({1: {"v": 0}})}
    assert check_txn(TxnObserved(rerun, good.first, left))["txn_prepared_left"]
    assert check_txn(TxnObserved(good.retry, good.first, committed, ["blocked"])
                     )["txn_writer_blocked"]
