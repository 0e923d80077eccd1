"""Only the primary of a term writes oplog entries of its own (replica-set shards).

A member that stepped down must never append an entry it did not fetch: it would carry the
new term and a ``ts`` the new primary may give one of its own entries, so the two oplogs would
hold different entries under the same optime and the fetcher could not see that they diverged
(a secondary chaining from the old primary then skipped the new primary's entry: the failover
trial ``--role stepdown --seed 910046`` lost an update on two members and from the stream).
The transaction coordinator did that: a two-phase commit still running on a stepped-down
primary wrote its decision there (mongod interrupts it, ``TransactionCoordinatorService::
onStepDown``, and ``repl::logOp`` refuses a write on a non-primary, ``oplog.cpp``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import bson
import pymongo
import pytest

from shardsim.core.errors import MongoError
from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import split_over_two_shards

from txn_kit import commit_in_background

MAJORITY = pymongo.WriteConcern("majority", wtimeout=20000)


@pytest.fixture(scope="module")
def cluster():
    with ShardedCluster(shards=2, members=3, seed=910046) as c:
        yield c


def wait_for(cond: Any, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def optimes(cluster: ShardedCluster, host: str) -> dict[Any, Any]:
    """``ts`` -> the BSON of the entry, for every entry of member ``host``'s oplog."""
    oplog = cluster.member_node(host).oplog
    return {e["ts"]: bson.encode(e) for e in list(oplog.entries_from(0))}


def test_a_stepped_down_primary_refuses_to_log_an_entry(cluster: ShardedCluster) -> None:
    """The old primary's own writes after a stepdown: NotWritablePrimary (10107), its oplog
    unchanged (before: the no-op was appended with the new term)."""
    shard = cluster.shard_names[0]
    old = cluster.step_down(shard, 1)
    node = cluster.member_node(old)

    async def write() -> tuple[int, int, Any]:
        before = node.oplog.latest_key
        try:
            node.write_noop({"msg": "not the primary's"})
            err = None
        except MongoError as exc:
            err = exc.code
        return before, node.oplog.latest_key, err

    wait_for(lambda: not node.repl.writable and node.repl.core.role != "leader", 10,
             "the old primary to be a follower")
    before, after, err = cluster._call(write())
    assert err == 10107
    assert after == before


def test_a_coordinator_stepped_down_mid_commit_writes_nothing_and_the_commit_completes(
        cluster: ShardedCluster) -> None:
    """The coordinator shard's primary steps down between the prepares and its decision
    (``hangBeforeWritingDecision``), and the fail point is released: the old primary's
    coordination was interrupted, so it appends no entry of its own; the driver's retried
    commit completes on the new primary (which recovered the coordination), and every member
    of the shard ends with the primary's oplog and documents."""
    client = cluster.client()
    coll = client.get_database("sdw", write_concern=MAJORITY).c
    coord_shard, other = split_over_two_shards(client, "sdw.c")
    coll.insert_many([{"_id": -1, "x": -1, "v": 0}, {"_id": 1, "x": 1, "v": 0}])
    old = cluster.primary_of(coord_shard)
    node = cluster.member_node(old)
    own: list[Any] = []  # entries the old primary appends that it did not fetch

    def listener(entry: dict[str, Any]) -> None:
        if not node.repl.writable and not node.repl._applying:
            own.append(entry)

    async def fail_point(mode: Any) -> None:
        node.coordinators.hang_before_decision.configure(mode, None)

    cluster._call(fail_point("alwaysOn"))
    try:
        s = client.start_session()
        s.start_transaction(write_concern=MAJORITY)
        coll.update_one({"_id": -1, "x": -1}, {"$set": {"v": 1}}, session=s)
        coll.update_one({"_id": 1, "x": 1}, {"$set": {"v": 1}}, session=s)
        t, errors = commit_in_background(s)  # the coordinator hangs before its decision
        other_primary = cluster.member_node(cluster.primary_of(other))
        wait_for(lambda: node.sessions.prepared() and other_primary.sessions.prepared(), 20,
                 "both participants prepared")
        wait_for(lambda: node.coordinators.hang_before_decision.entered > 0, 20,
                 "the coordinator at hangBeforeWritingDecision")
        cluster._call(_add_listener(node, listener))
        cluster.step_down(coord_shard, 2)
    finally:
        cluster._call(fail_point("off"))
    t.join(60)
    assert not t.is_alive()
    assert errors == []
    assert sorted((d["_id"], d["v"]) for d in coll.find()) == [(-1, 1), (1, 1)]
    time.sleep(0.5)  # an interrupted coordination would have written its decision by now
    cluster._call(_remove_listener(node, listener))
    assert [(e["ts"], e["ns"]) for e in own] == []
    primary = cluster.primary_of(coord_shard)
    want = optimes(cluster, primary)
    for host in cluster.members_of(coord_shard):
        got = optimes(cluster, host)
        assert {ts: v for ts, v in got.items() if ts in want and want[ts] != v} == {}, host
        assert set(got) <= set(want), host
    wait_for(lambda: all(
        sorted(map(bson.encode, cluster.member_node(h).storage.get("sdw", "c").docs.values()))
        == sorted(map(bson.encode,
                      cluster.member_node(primary).storage.get("sdw", "c").docs.values()))
        for h in cluster.members_of(coord_shard)), 20, "every member to have the documents")


async def _add_listener(node: Any, cb: Any) -> None:
    node.oplog.add_listener(cb)


async def _remove_listener(node: Any, cb: Any) -> None:
    node.oplog.remove_listener(cb)
    await asyncio.sleep(0)


def test_an_oplog_fetch_waiting_on_a_member_that_left_secondary_answers_13436(
        cluster: ShardedCluster) -> None:
    """A fetch that waited for new entries (``maxAwaitTimeMS``) on a member that meanwhile
    left PRIMARY/SECONDARY (a rollback started) is answered NotPrimaryOrSecondary (13436), as
    one that arrives then is, and the member keeps serving (before: a Python exception, logged
    with its traceback, became the reply)."""
    from shardsim.core.protocol.repl import fetch_command
    from shardsim.core.repl.member_state import MemberState
    from shardsim.core.repl.messages import FetchRequest

    shard = cluster.shard_names[1]
    primary = cluster.primary_of(shard)
    node = cluster.member_node(primary)
    secondary = next(h for h in cluster.members_of(shard) if h != primary)
    snode = cluster.member_node(secondary)
    wait_for(lambda: snode.repl.core.applied == node.repl.core.applied, 10, "the secondary")

    async def fetch_then_leave() -> Any:
        from shardsim.core.protocol.repl import optime_doc
        repl = snode.repl
        core = repl.core
        for _ in range(20):  # a periodic no-op can end the wait first: ask again
            cmd = fetch_command(FetchRequest(2, core.term, core.applied, 10))
            cmd["maxAwaitTimeMS"] = 5000
            cmd["lastKnownCommitted"] = optime_doc(core.commit_point)
            task = asyncio.ensure_future(repl.serve_fetch(cmd))
            await asyncio.sleep(0.05)
            if not task.done():
                break
            await task
        else:
            raise AssertionError("the fetch never waited")
        saved = core.state
        core.state = MemberState.ROLLBACK          # what a rollback's start does to the state
        repl._wake_fetchers()
        try:
            await task
            return None
        except MongoError as exc:
            return exc.code, exc.code_name
        finally:
            core.state = saved

    assert cluster._call(fetch_then_leave()) == (13436, "NotPrimaryOrSecondary")
