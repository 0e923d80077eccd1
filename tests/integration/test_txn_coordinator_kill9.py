"""``kill -9`` of the coordinator shard's process during two-phase commit, on a durable
process cluster (``shardsim.tools.launcher.Cluster``), held at mongod's own fail points:

* between every participant's prepare and the persisted decision
  (``hangBeforeWritingDecision``): restarted, the coordinator sends the prepares again
  (``TransactionCoordinator::continueCommit`` re-runs phase one for a document without a
  decision), every participant still holds the transaction prepared, and it commits
  (``jstests/sharding/txn_two_phase_commit_failover.js``: a coordinator failing over after its
  participant list is durable commits when every participant votes commit);
* after the persisted commit decision, before its delivery
  (``hangBeforeWaitingForDecisionWriteConcern``): restarted, it commits on every participant.

Either way the data and the change stream through the router agree: all of the transaction or
none of it, never half."""

from __future__ import annotations

import time
from typing import Any

import pymongo
import pytest

from shardsim.tools.launcher import Cluster
from shardsim.testing.helpers import read_events, split_over_two_shards
from txn_kit import commit_in_background


def _direct(cluster: Cluster, name: str) -> pymongo.MongoClient:
    proc = cluster.shard(name)
    return pymongo.MongoClient(proc.host, proc.port, directConnection=True,
                               serverSelectionTimeoutMS=10000)


def _wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _prepared_everywhere(cluster: Cluster, names: tuple[str, str]) -> bool:
    for name in names:
        with _direct(cluster, name) as d:
            if d.local["oplog.rs"].count_documents({"o.prepare": True}) == 0:
                return False
    return True


def _decision(cluster: Cluster, name: str) -> Any:
    with _direct(cluster, name) as d:
        doc = d.config.transaction_coordinators.find_one({})
        return doc and doc.get("decision")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fail_point,decided", [
    ("hangBeforeWritingDecision", False),
    ("hangBeforeWaitingForDecisionWriteConcern", True),
])
def test_kill9_coordinator_during_two_phase_commit(tmp_path, fail_point: str,
                                                   decided: bool) -> None:
    with Cluster(shards=2, base_dir=str(tmp_path), durable=True, test_commands=True) as cluster:
        client = pymongo.MongoClient(cluster.router_uri)
        primary, other = split_over_two_shards(client, "k.c")
        coll = client.k.c
        coll.insert_many([{"_id": -1, "x": -1, "v": 0}, {"_id": 1, "x": 1, "v": 0}])
        with _direct(cluster, primary) as d:  # the first participant coordinates
            d.admin.command("configureFailPoint", fail_point, mode="alwaysOn")
        with coll.watch() as stream:
            s = client.start_session()
            s.start_transaction()
            coll.update_one({"_id": -1, "x": -1}, {"$set": {"v": 1}}, session=s)
            coll.update_one({"_id": 1, "x": 1}, {"$set": {"v": 1}}, session=s)
            t, _errors = commit_in_background(s)  # blocks in the two-phase commit
            _wait(lambda: _prepared_everywhere(cluster, (primary, other)))
            if decided:
                _wait(lambda: _decision(cluster, primary) is not None)
                assert _decision(cluster, primary)["decision"] == "commit"
            else:
                assert _decision(cluster, primary) is None
            cluster.shard(primary).kill()  # SIGKILL
            cluster.restart(cluster.shard(primary))
            t.join(60)
            _wait(lambda: sorted(d["v"] for d in coll.find()) == [1, 1])
            with _direct(cluster, primary) as d:
                _wait(lambda: d.config.transaction_coordinators.count_documents({}) == 0)
            coll.update_one({"_id": 1, "x": 1}, {"$set": {"w": 1}})  # no longer locked
            events = read_events(stream, 3)
            assert read_events(stream, 1, timeout=1.0) == []
        got = [(e["documentKey"]["_id"], "lsid" in e) for e in events]
        assert sorted(got) == sorted([(-1, True), (1, True), (1, False)])
        assert events[-1]["updateDescription"]["updatedFields"] == {"w": 1}
        client.close()
