"""A few fault trials in ``make test`` (one per role and one per interrupted-migration
scenario, bounded; role ``txn`` kills a transaction's coordinator shard,
tests/faults/txn_trial.py); ``make faults`` runs 100 per role. Each trial kills one process of a durable cluster with ``kill -9`` during writes and a
change stream and checks every invariant of :mod:`.checkers`."""

from __future__ import annotations

import random

import pytest

from .checkers import Observed, ShardState, TxnObserved, check, check_shards, check_txn
from .harness import ROLES, run_trial
from .migration import SCENARIOS, run_scenario

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


def test_shard_checkers_catch_each_violation() -> None:
    """Each shard checker fails on the outcome it guards against (and only there)."""
    ev = {"operationType": "update", "documentKey": {"_id": 1}, "_id": {"_data": "a"}}

    def state(**kw: object) -> ShardState:
        base = dict(docs={"s0": [{"_id": 1, "n": 1}], "s1": [{"_id": 2, "n": 0}]},
                    owner=lambda d: "s0" if d["_id"] == 1 else "s1", acked={1: 1},
                    ids={1, 2}, events=[ev])
        base.update(kw)
        return ShardState(**base)  # type: ignore[arg-type]
    assert not any(check_shards(state()).values())
    orphan = state(docs={"s0": [{"_id": 1, "n": 1}], "s1": [{"_id": 2, "n": 0},
                                                             {"_id": 1, "n": 0}]})
    assert check_shards(orphan)["orphan"] and check_shards(orphan)["duplicate_copy"]
    assert check_shards(state(docs={"s0": [{"_id": 1, "n": 1}], "s1": []}))["duplicate_copy"]
    stale = state(docs={"s0": [{"_id": 1, "n": 0}], "s1": [{"_id": 2, "n": 0}]}, events=[])
    assert check_shards(stale)["lost_inc"]
    assert check_shards(state(docs={"s0": [{"_id": 1, "n": 2}], "s1": [{"_id": 2, "n": 0}]},
                              events=[ev, ev]))["doubled_inc"]
    assert check_shards(state(leftovers=["s1: range deletion"]))["leftover"]
    delete = {"operationType": "delete", "documentKey": {"_id": 1}, "_id": {"_data": "b"}}
    assert check_shards(state(events=[ev, delete]))["cleanup_event"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_one_interrupted_migration_trial(cluster_factory, scenario: str) -> None:
    """One trial per migration/resharding scenario (:mod:`.migration`)."""
    seed = random.SystemRandom().randrange(1, 10**6)
    cluster = cluster_factory(shards=2, durable=True)
    result = run_scenario(cluster, scenario, seed, ops=60)
    assert result.ok, (f"replay: python -m tests.faults --role {scenario} --seed {seed} "
                       f"--trials 1 --ops 60", result.violations)
    assert result.acked > 0 and result.events > 0
