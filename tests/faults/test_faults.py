"""A few fault trials in ``make test`` (one per role and one per interrupted-migration
scenario, bounded; role ``txn`` kills a transaction's coordinator shard,
tests/faults/txn_trial.py; ``router-bulkwrite`` the router under bulk writes;
``shard-createindexes``/``shard-dropdatabase`` a shard under DDL, tests/faults/ddl_trial.py);
``make faults`` runs 100 per role. Each trial kills one process of a durable cluster with
``kill -9`` during writes and a change stream and checks every invariant of :mod:`.checkers`."""

from __future__ import annotations

import random

import pytest

from .checkers import (DdlObserved, FailoverObserved, Observed, ShardState, TxnObserved, check,
                       check_ddl, check_failover, check_shards, check_txn)
from .failover import FAILOVER_ROLES, new_cluster, run_failover_trial
from .harness import ROLES, needs_test_commands, run_trial
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


def test_mixed_workload_checkers_catch_each_violation() -> None:
    """Deletes, transactions and batches (the mixed workload, :mod:`.workload`): each checker
    fails on the outcome it guards against, and a clean outcome passes."""
    ev = lambda op, i, tok: {"operationType": op, "documentKey": {"_id": i},  # noqa: E731
                             "_id": {"_data": tok}}
    d, t = 1_000_000, 2_000_000
    good = Observed(acked_inserts={d, d + 1, t, t + 1}, acked_deletes={d},
                    acked_txns=[(t, t + 1)], docs={d + 1: {"_id": d + 1}, t: {"_id": t},
                                                   t + 1: {"_id": t + 1}},
                    events=[ev("insert", d, "a"), ev("delete", d, "b"), ev("insert", d + 1, "c"),
                            ev("insert", t + 1, "d"), ev("insert", t, "e")])
    assert not any(check(good).values()), check(good)  # a transaction's inserts: no order
    back = Observed(**{**good.__dict__, "docs": {**good.docs, d: {"_id": d}}})
    assert check(back)["lost_write"]  # an acknowledged delete undone (a stale copy)
    assert check(Observed(**{**good.__dict__, "events": good.events[:1] + good.events[2:]})
                 )["lost_event"]  # the delete's event missing
    torn = Observed(**{**good.__dict__, "docs": {d + 1: {"_id": d + 1}, t: {"_id": t}}})
    assert check(torn)["torn_txn"]
    half = Observed(**{**good.__dict__, "acked_txns": [], "ambiguous_txns": [(t, t + 1)],
                       "acked_inserts": {d, d + 1}, "ambiguous_inserts": {t, t + 1},
                       "docs": torn.docs})
    assert check(half)["torn_txn"]
    swapped = [good.events[1], good.events[0], *good.events[2:]]
    assert check(Observed(**{**good.__dict__, "events": swapped}))["reordered_event"]
    # router-bulkwrite: a batch's inserts, then its $incs
    batch = Observed(acked_inserts={0, 1}, acked_incs={0, 1}, batch=2,
                     docs={0: {"_id": 0, "n": 1}, 1: {"_id": 1, "n": 1}},
                     events=[ev("insert", 0, "a"), ev("insert", 1, "b"), ev("update", 0, "c"),
                             ev("update", 1, "d")])
    assert not any(check(batch).values())
    assert check(Observed(**{**batch.__dict__, "batch": 0}))["reordered_event"]


def test_stale_copy_and_ddl_checkers_catch_each_violation() -> None:
    """The router's view against the owners' copies, and each DDL checker."""
    base = dict(docs={"s0": [{"_id": 1, "n": 1}], "s1": [{"_id": 2}]},
                owner=lambda d: "s0" if d["_id"] == 1 else "s1", ids={1, 2})
    view = {1: {"_id": 1, "n": 1}, 2: {"_id": 2}}
    assert not check_shards(ShardState(**base, router_docs=view))["stale_copy"]  # type: ignore
    assert check_shards(ShardState(**base, router_docs={**view, 1: {"_id": 1, "n": 0}})  # type: ignore
                        )["stale_copy"]
    assert check_shards(ShardState(**base, router_docs={**view, 3: {"_id": 3}})  # type: ignore
                        )["stale_copy"]
    key = (("seq", 1),)
    good = DdlObserved(indexes={"s0": [(("_id", 1),), key], "s1": [key]}, owners={"s0", "s1"},
                       wanted=[key])
    assert not any(check_ddl(good).values())
    assert check_ddl(DdlObserved(error="NetworkTimeout"))["ddl_retry"]
    assert check_ddl(DdlObserved(inconsistencies=[{"type": "MisplacedCollection"}]))["metadata"]
    assert check_ddl(DdlObserved(indexes={"s0": [key], "s1": []}, owners={"s0", "s1"},
                                 wanted=[key]))["index_missing"]
    assert check_ddl(DdlObserved(left=["shard1: fdrop1 with ['u']"]))["db_left"]


@pytest.mark.parametrize("role", ROLES)
def test_one_fault_trial_per_role(cluster_factory, role: str) -> None:
    seed = random.SystemRandom().randrange(1, 10**6)
    cluster = cluster_factory(shards=2, durable=True, test_commands=needs_test_commands(role))
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


def test_failover_checkers_catch_each_violation() -> None:
    """An event of a rolled-back write, and a member that differs from its primary."""
    ev = {"operationType": "insert", "documentKey": {"_id": 9_000_001}, "_id": {"_data": "a"}}
    good = FailoverObserved(w1_sent={9_000_000, 9_000_001}, w1_acked={9_000_000},
                            rolled_back={9_000_000}, events=[ev])
    assert not any(check_failover(good).values())
    bad = FailoverObserved(**{**good.__dict__, "rolled_back": {9_000_001}})
    assert check_failover(bad)["rolled_back_event"]
    assert check_failover(FailoverObserved(diverged=["shard0 member h differs"])
                          )["member_diverged"]
    assert check_failover(FailoverObserved(stuck=["stepdown on shard0: NoPrimary"])
                          )["no_primary"]


@pytest.fixture(scope="module")
def replica_set_cluster():
    """One in-process cluster of 2 shards x 3 members for the failover trials (in memory:
    a killed member comes back empty and catches up from its sync source; ``make faults``
    runs them durable)."""
    cluster = new_cluster(seed=random.SystemRandom().randrange(1, 10**6), durable=False)
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("role", FAILOVER_ROLES)
def test_one_failover_trial_per_role(replica_set_cluster, role: str) -> None:
    """One bounded trial per failover role (:mod:`.failover`; ``make faults`` runs 100 each):
    about 4 s each on an idle 2-core machine."""
    seed = random.SystemRandom().randrange(1, 10**6)
    result = run_failover_trial(replica_set_cluster, role, seed, ops=10, transactions=True)
    assert result.ok, (f"replay: python -m tests.faults --role {role} --seed {seed} "
                       f"--trials 1 --ops 10", result.violations, result.notes)
    assert result.acked > 0 and result.events > 0
