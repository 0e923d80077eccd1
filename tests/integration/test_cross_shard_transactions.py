"""Cross-shard transactions through the router: two-phase commit, prepared-transaction oplog
entries, change events (lsid {id, uid}, txnNumber, nothing of aborted ones), and a
coordinator restart between its decision and its delivery."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from typing import Any

import pymongo
from bson import Binary

from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import read_events, split_over_two_shards

NO_AUTH_UID = hashlib.sha256(b"").digest()




def _shard_oplog(c: ShardedCluster, name: str) -> list[dict[str, Any]]:
    direct = pymongo.MongoClient(f"mongodb://{c.shard_address(name)}/?directConnection=true")
    try:
        return list(direct.local["oplog.rs"].find({"ns": "admin.$cmd"}))
    finally:
        direct.close()


def test_two_phase_commit_events_and_oplog() -> None:
    with ShardedCluster(shards=2) as c:
        client = c.client()
        primary, other = split_over_two_shards(client, "t.c")
        coll = client.t.c
        with coll.watch() as stream:
            with client.start_session() as s:
                with s.start_transaction():
                    coll.insert_one({"_id": 1, "x": -5}, session=s)
                    coll.insert_one({"_id": 2, "x": 5}, session=s)
                    coll.insert_one({"_id": 3, "x": -6}, session=s)
                # an aborted one leaves nothing
                s.start_transaction()
                coll.insert_one({"_id": 10, "x": -1}, session=s)
                coll.insert_one({"_id": 11, "x": 1}, session=s)
                s.abort_transaction()
            coll.insert_one({"_id": 99, "x": 0})
            events = read_events(stream, 4)
        ids = [e["documentKey"]["_id"] for e in events]
        assert sorted(ids[:3]) == [1, 2, 3] and ids[3] == 99
        assert ids.index(1) < ids.index(3)  # statement order within a shard
        tokens = [e["_id"]["_data"] for e in events]
        assert tokens == sorted(tokens)
        txn_events = [e for e in events if e["documentKey"]["_id"] != 99]
        for e in txn_events:
            assert set(e["lsid"]) == {"id", "uid"} and bytes(e["lsid"]["uid"]) == NO_AUTH_UID
            assert e["txnNumber"] == 1
        assert "lsid" not in events[-1]
        assert sorted(d["_id"] for d in coll.find()) == [1, 2, 3, 99]
        # The participants wrote a prepare entry and a commitTransaction entry.
        for name in (primary, other):
            cmds = [next(iter(e["o"])) for e in _shard_oplog(c, name)
                    if e.get("lsid", {}).get("id") == txn_events[0]["lsid"]["id"]]
            assert cmds[:2] == ["applyOps", "commitTransaction"], cmds
            prep = [e for e in _shard_oplog(c, name) if e["o"].get("prepare")][0]
            commit = [e for e in _shard_oplog(c, name) if "commitTransaction" in e["o"]][0]
            assert commit["prevOpTime"]["ts"] == prep["ts"]
            assert commit["o"]["commitTimestamp"] >= prep["ts"]
            aborts = [e for e in _shard_oplog(c, name) if "abortTransaction" in e["o"]]
            assert len(aborts) == 0  # the aborted transaction was never prepared


def test_snapshot_readers_see_transactions_atomically_and_stream_agrees() -> None:
    """Seeded: concurrent cross-shard transfers (committed and aborted) between documents on
    both shards keep the total constant for every snapshot reader; every committed
    transaction's events arrive once, per shard at one cluster time, nothing of aborted ones,
    tokens strictly increasing."""
    rnd = random.Random(1515)
    with ShardedCluster(shards=2) as c:
        client = c.client()
        split_over_two_shards(client, "bank.acct")
        coll = client.bank.acct
        ids = list(range(-4, 0)) + list(range(1, 5))
        coll.insert_many([{"_id": i, "x": i, "bal": 100} for i in ids])
        committed: dict[int, int] = {}
        aborted: set[int] = set()
        with coll.watch() as stream:
            with client.start_session() as s:
                for n in range(12):
                    a = rnd.choice(ids[:4])
                    b = rnd.choice(ids[4:])
                    amount = rnd.randint(1, 10)
                    s.start_transaction()
                    coll.update_one({"_id": a, "x": a}, {"$inc": {"bal": -amount}}, session=s)
                    coll.update_one({"_id": b, "x": b}, {"$inc": {"bal": amount}}, session=s)
                    tn = s._server_session.transaction_id
                    if rnd.random() < 0.3:
                        s.abort_transaction()
                        aborted.add(tn)
                    else:
                        s.commit_transaction()
                        committed[tn] = 2
                    total = sum(d["bal"] for d in coll.find())
                    assert total == 800
            events = read_events(stream, 2 * len(committed))
            assert read_events(stream, 1, timeout=1.0) == []
        tokens = [e["_id"]["_data"] for e in events]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
        seen: dict[int, list[dict[str, Any]]] = {}
        for e in events:
            seen.setdefault(int(e["txnNumber"]), []).append(e)
        assert set(seen) == set(committed) and not (set(seen) & aborted)
        for tn, evs in seen.items():
            assert len(evs) == 2
            assert all(isinstance(e["lsid"]["uid"], (bytes, Binary)) for e in evs)


def test_coordinator_restart_after_decision_finishes_the_commit(tmp_path) -> None:
    """kill -9 of the coordinator shard after its durable decision, before delivering it: the
    restarted coordinator commits on every participant and the stream shows the events."""
    with ShardedCluster(shards=2, dbpath=str(tmp_path)) as c:
        client = c.client()
        primary, other = split_over_two_shards(client, "k.c")
        coll = client.k.c
        node = c.cluster.node(primary)
        with coll.watch() as stream:
            c.configure_fail_point(primary, "hangBeforeWaitingForDecisionWriteConcern",
                                   "alwaysOn")
            s = client.start_session()
            s.start_transaction()
            coll.insert_one({"_id": 1, "x": -1}, session=s)
            coll.insert_one({"_id": 2, "x": 1}, session=s)

            def commit() -> None:
                try:
                    s.commit_transaction()
                except pymongo.errors.PyMongoError:
                    pass  # the coordinator died: the commit's result is unknown
            t = threading.Thread(target=commit)
            t.start()
            deadline = time.monotonic() + 10
            while not any(d.get("decision") for d in node.coordinators.documents()):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            c.kill_shard(primary)
            c.restart_shard(primary)
            t.join(30)
            deadline = time.monotonic() + 20
            while coll.count_documents({}) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert sorted(d["_id"] for d in coll.find()) == [1, 2]
            events = read_events(stream, 2)
        assert sorted(e["documentKey"]["_id"] for e in events) == [1, 2]


def test_participant_ahead_in_time_commits_later_as_in_mongod() -> None:
    """Each participant writes its commitTransaction entry at its own next cluster time
    (``TransactionParticipant::commitPreparedTransaction`` reserves a new oplog slot, at or
    after ``commitTimestamp``), and the unwind stage gives the events that entry's time. When
    one participant's commit is delayed (here a fail point holds it) while plain writes move
    its clock on, the plain events sort between the transaction's events in the merged stream,
    as on a real 8.0 cluster: change-stream consumers must not count on a cross-shard
    transaction's events being adjacent. Both participants commit at one commitTimestamp."""
    with ShardedCluster(shards=2) as c:
        client = c.client()
        primary, other = split_over_two_shards(client, "i.c")
        coll = client.i.c
        c.configure_fail_point(other, "failCommand", {"times": 1}, {
            "failCommands": ["commitTransaction"], "failInternalCommands": True,
            "blockConnection": True, "blockTimeMS": 1500})
        with coll.watch() as stream:
            s = client.start_session()
            s.start_transaction()
            coll.insert_one({"_id": "a", "x": -1}, session=s)
            coll.insert_one({"_id": "b", "x": 1}, session=s)
            t = threading.Thread(target=s.commit_transaction)
            t.start()
            deadline = time.monotonic() + 10
            while not [e for e in _shard_oplog(c, primary) if "commitTransaction" in e["o"]]:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert coll.find_one({"x": -1})["_id"] == "a"  # the router learns the primary's time
            for i in range(3):  # plain writes on the other participant, after that time
                coll.insert_one({"_id": f"p{i}", "x": 10 + i})
            t.join(30)
            events = read_events(stream, 5)
        order = [e["documentKey"]["_id"] for e in events]
        assert order == ["a", "p0", "p1", "p2", "b"], order
        a, b = events[0], events[-1]
        assert a["clusterTime"] < b["clusterTime"]
        assert (a["lsid"], a["txnNumber"]) == (b["lsid"], b["txnNumber"])
        commits = [e for name in (primary, other) for e in _shard_oplog(c, name)
                   if "commitTransaction" in e["o"]]
        assert len({e["o"]["commitTimestamp"] for e in commits}) == 1
        assert sorted(e["ts"] for e in commits) == [a["clusterTime"], b["clusterTime"]]


def test_decision_is_sent_again_until_the_participant_acknowledges_it() -> None:
    """The other participant fails the coordinator's commitTransaction twice with an error that
    is neither a network error nor a vote-abort one (failCommand UnknownError 8): the
    coordinator sends the decision again until it is acknowledged (``sendDecisionToShard``
    always retries), so when the client's commit returns, that participant has committed and
    holds nothing prepared."""
    with ShardedCluster(shards=2) as c:
        client = c.client()
        primary, other = split_over_two_shards(client, "u.c")
        coll = client.u.c
        coll.insert_many([{"_id": -1, "x": -1, "v": 0}, {"_id": 1, "x": 1, "v": 0}])
        c.configure_fail_point(other, "failCommand", {"times": 2},
                               {"failCommands": ["commitTransaction"], "errorCode": 8})
        with client.start_session() as s:
            with s.start_transaction():
                coll.update_one({"_id": -1, "x": -1}, {"$inc": {"v": 1}}, session=s)
                coll.update_one({"_id": 1, "x": 1}, {"$inc": {"v": 1}}, session=s)
        assert c.cluster.node(other).sessions.prepared() == []
        direct = pymongo.MongoClient(f"mongodb://{c.shard_address(other)}/?directConnection=true")
        try:
            assert direct.u.c.find_one({"_id": 1})["v"] == 1
            assert list(direct.config.transactions.find({"state": "prepared"})) == []
        finally:
            direct.close()
        assert sorted(d["v"] for d in coll.find()) == [1, 1]
