"""Issue 28, finding R2: the coordinator shard killed (``kill -9``, durable ``--dbpath``) during
two-phase commit, and the client's ``commitTransaction`` retried later, after the restarted
coordinator finished the coordination and deleted its document.

mongod 8.0 (``txn_two_phase_commit_cmds.cpp`` ``CoordinateCommitTransactionCmd``,
``transaction_coordinator_service.cpp`` ``coordinateCommit``): a coordinator that is no longer
in memory is never started again; the outcome is recovered from the coordinator shard's own
participant (``TransactionParticipant``, whose ``config.transactions`` record says
``committed`` across a restart). So the retry answers ok for a committed transaction and
NoSuchTransaction (251, TransientTransactionError) for an aborted one, and nothing is left
prepared anywhere. The outcome itself follows ``jstests/sharding/txn_two_phase_commit_failover.js``:
once the participant list is durable, a coordinator that comes back commits when every
participant still votes commit.

Three moments, held at mongod's own coordinator fail points, then ``kill -9``:

* ``before-decision`` (``hangBeforeWritingDecision``): every participant prepared, no decision
  written; restarted, the coordinator prepares again (``continueCommit`` re-runs phase one)
  and commits everywhere;
* ``after-decision`` (``hangBeforeWaitingForDecisionWriteConcern``): commit decision written,
  no participant told; restarted, it commits everywhere;
* ``after-local-commit`` (``hangWhileTargetingRemoteHost`` after the prepare phase): the
  coordinator's own participant committed, the other one still prepared; restarted, the other
  one commits too;
* ``after-abort-decision``: the other participant's transaction was aborted on it directly
  before the commit, so it cannot prepare; the coordinator persisted the abort decision
  (``hangBeforeWaitingForDecisionWriteConcern``); restarted, it aborts everywhere and the
  retry answers NoSuchTransaction with TransientTransactionError (running it again is safe).

After the delayed retry each shard is read directly: its ``config.transactions`` has no
prepared transaction, its oplog no prepare without a decision, the transaction's ``$inc`` is
applied exactly once (or not at all), and a plain write of the same documents goes through.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pymongo
import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from shardsim.core.client import Pool
from shardsim.tools.launcher import Cluster
from shardsim.testing.helpers import split_over_two_shards
from txn_kit import commit_in_background

MOMENTS = {
    # moment: (coordinator fail point, its mode, outcome)
    "before-decision": ("hangBeforeWritingDecision", "alwaysOn", "commit"),
    "after-decision": ("hangBeforeWaitingForDecisionWriteConcern", "alwaysOn", "commit"),
    "after-local-commit": ("hangWhileTargetingRemoteHost", {"skip": 1}, "commit"),
    "after-abort-decision": ("hangBeforeWaitingForDecisionWriteConcern", "alwaysOn", "abort"),
}


def _direct(cluster: Cluster, name: str) -> pymongo.MongoClient:
    proc = cluster.shard(name)
    return pymongo.MongoClient(proc.host, proc.port, directConnection=True,
                               serverSelectionTimeoutMS=10000, socketTimeoutMS=20000)


def _wait(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _oplog_count(cluster: Cluster, name: str, filt: dict[str, Any]) -> int:
    with _direct(cluster, name) as d:
        return d.local["oplog.rs"].count_documents(filt)


def _undecided_prepares(d: pymongo.MongoClient) -> list[Any]:
    """The prepare entries of a shard's oplog with no commit/abort entry pointing at them."""
    oplog = d.local["oplog.rs"]
    prepared = [e["ts"] for e in oplog.find({"o.prepare": True})]
    decided = {e["prevOpTime"]["ts"] for e in oplog.find(
        {"$or": [{"o.commitTransaction": 1}, {"o.abortTransaction": 1}]})}
    return [ts for ts in prepared if ts not in decided]


def _abort_directly(cluster: Cluster, name: str, session: Any) -> None:
    """abortTransaction of ``session``'s open transaction sent to shard ``name`` itself (as
    ``txn_two_phase_commit_failover.js`` makes a participant vote abort); pymongo would put its
    own lsid on the command, so shardsim's client sends it."""
    proc = cluster.shard(name)
    cmd = {"abortTransaction": 1, "lsid": session.session_id, "autocommit": False,
           "txnNumber": Int64(session._server_session.transaction_id)}

    async def run() -> None:
        pool = Pool(proc.host, proc.port)
        try:
            await pool.command("admin", cmd)
        finally:
            pool.close()
    asyncio.run(run())


def _moment_reached(cluster: Cluster, moment: str, coordinator: str, other: str) -> bool:
    if moment == "after-abort-decision":
        with _direct(cluster, coordinator) as d:
            doc = d.config.transaction_coordinators.find_one({})
        return doc is not None and (doc.get("decision") or {}).get("decision") == "abort"
    if _oplog_count(cluster, other, {"o.prepare": True}) == 0 or \
            _oplog_count(cluster, coordinator, {"o.prepare": True}) == 0:
        return False
    with _direct(cluster, coordinator) as d:
        doc = d.config.transaction_coordinators.find_one({})
    if moment == "before-decision":
        return doc is not None
    if moment == "after-decision":
        return doc is not None and doc.get("decision") is not None
    return _oplog_count(cluster, coordinator, {"o.commitTransaction": 1}) == 1


@pytest.mark.timeout(240)
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_delayed_commit_retry_after_coordinator_kill9(tmp_path, moment: str) -> None:
    fail_point, mode, outcome = MOMENTS[moment]
    with Cluster(shards=2, base_dir=str(tmp_path), durable=True, test_commands=True) as cluster:
        client = pymongo.MongoClient(cluster.router_uri, socketTimeoutMS=60000)
        coordinator, other = split_over_two_shards(client, "k.c")
        coll = client.k.c
        coll.insert_many([{"_id": -1, "x": -1, "v": 0}, {"_id": 1, "x": 1, "v": 0}])
        with _direct(cluster, coordinator) as d:
            d.admin.command("configureFailPoint", fail_point, mode=mode)
        s = client.start_session()
        s.start_transaction()
        coll.update_one({"_id": -1, "x": -1}, {"$inc": {"v": 1}}, session=s)
        coll.update_one({"_id": 1, "x": 1}, {"$inc": {"v": 1}}, session=s)
        if moment == "after-abort-decision":
            _abort_directly(cluster, other, s)
        t, _first_errors = commit_in_background(s)  # held at the fail point
        _wait(lambda: _moment_reached(cluster, moment, coordinator, other))
        cluster.shard(coordinator).kill()  # SIGKILL
        cluster.restart(cluster.shard(coordinator))
        t.join(120)
        assert not t.is_alive()
        with _direct(cluster, coordinator) as d:  # the restarted coordinator finished
            _wait(lambda: d.config.transaction_coordinators.count_documents({}) == 0)
        # the client's delayed retry of commitTransaction
        if outcome == "commit":
            s.commit_transaction()
        else:
            with pytest.raises(OperationFailure) as info:
                s.commit_transaction()
            assert info.value.code == 251
            assert info.value.has_error_label("TransientTransactionError")
        want = 1 if outcome == "commit" else 0
        for name, _id in ((coordinator, -1), (other, 1)):
            with _direct(cluster, name) as d:
                assert list(d.config.transactions.find({"state": "prepared"})) == []
                assert _undecided_prepares(d) == []
                assert d.k.c.find_one({"_id": _id})["v"] == want  # applied once, or not at all
                if outcome == "commit":
                    assert len(list(d.config.transactions.find({"state": "committed"}))) == 1
        # no second two-phase commit: at most the one prepare per shard
        assert _oplog_count(cluster, coordinator, {"o.prepare": True}) <= 1
        assert _oplog_count(cluster, other, {"o.prepare": True}) == (outcome == "commit")
        # other writers are not held by a leftover prepared transaction
        writer = pymongo.MongoClient(cluster.router_uri, socketTimeoutMS=10000)
        writer.k.c.update_one({"_id": -1, "x": -1}, {"$set": {"w": 1}})
        writer.k.c.update_one({"_id": 1, "x": 1}, {"$set": {"w": 1}})
        assert sorted(d["v"] for d in coll.find({"w": 1})) == [want, want]
        writer.close()
        s.end_session()
        client.close()
