"""Collections and indexes created inside a transaction through the router (MongoDB 4.4+,
``create_indexes_cmd.cpp``, ``create_collection.cpp``, ``op_observer_impl.cpp``): invisible to
other clients until the commit, gone after an abort, the rules and codes (263, 72, 112), the
commit's applyOps and the change events with and without showExpandedEvents."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure

from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import read_events


@pytest.fixture(scope="module")
def cluster() -> Any:
    with ShardedCluster(shards=2) as c:
        yield c



def _primary_oplog(c: ShardedCluster, client: pymongo.MongoClient, db: str) -> list[dict]:
    primary = client.config.databases.find_one({"_id": db})["primary"]
    direct = pymongo.MongoClient(f"mongodb://{c.shard_address(primary)}/?directConnection=true")
    try:
        return list(direct.local["oplog.rs"].find())
    finally:
        direct.close()


def test_created_collection_and_index_exist_only_from_commit(cluster: ShardedCluster) -> None:
    client, other = cluster.client(), cluster.client()
    db = client.ddl1
    db.command("dropDatabase")
    db.seed.insert_one({"_id": 0})  # the database exists, with its primary shard
    with client.start_session() as s:
        s.start_transaction()
        db.create_collection("c", session=s)
        db.c.create_index("x", name="x_1", session=s)
        db.c.insert_one({"_id": 1, "x": 1}, session=s)
        assert list(db.c.find({}, session=s)) == [{"_id": 1, "x": 1}]  # its own writes
        assert "c" not in other.ddl1.list_collection_names()
        assert list(other.ddl1.c.find()) == []
        with pytest.raises(OperationFailure) as err:
            other.ddl1.command("listIndexes", "c")
        assert err.value.code == 26
        s.commit_transaction()
    assert "c" in other.ddl1.list_collection_names()
    assert list(other.ddl1.c.find()) == [{"_id": 1, "x": 1}]
    assert [i["name"] for i in other.ddl1.c.list_indexes()] == ["_id_", "x_1"]


def test_aborted_creation_leaves_nothing(cluster: ShardedCluster) -> None:
    client = cluster.client()
    db = client.ddl2
    db.command("dropDatabase")
    db.seed.insert_one({"_id": 0})
    before = len(_primary_oplog(cluster, client, "ddl2"))
    with client.start_session() as s:
        s.start_transaction()
        db.implicit.insert_one({"_id": 1}, session=s)  # implicit create
        db.create_collection("explicit", session=s)
        db.idx.create_index("y", session=s)  # implicit create by createIndexes
        s.abort_transaction()
    assert sorted(db.list_collection_names()) == ["seed"]
    assert len(_primary_oplog(cluster, client, "ddl2")) == before  # no entry at all
    # the names are free again, outside a transaction too
    db.create_collection("explicit")
    assert "explicit" in db.list_collection_names()


def test_rules_and_codes(cluster: ShardedCluster) -> None:
    client = cluster.client()
    db = client.ddl3
    db.command("dropDatabase")
    db.existing.insert_one({"_id": 0})
    db.existing.create_index("a", name="a_1")
    with client.start_session() as s:
        s.start_transaction()
        # the same index again is no new index: allowed on an existing collection
        reply = db.command({"createIndexes": "existing",
                            "indexes": [{"key": {"a": 1}, "name": "a_1"}]}, session=s)
        assert reply["note"] == "all indexes already exist"
        with pytest.raises(OperationFailure) as err:
            db.existing.create_index("b", session=s)
        assert err.value.code == 263 and "existing collection" in str(err.value)
        assert "TransientTransactionError" not in (err.value.details or {}).get("errorLabels", [])
        s.abort_transaction()
    with client.start_session() as s:
        s.start_transaction()
        db.fresh.insert_one({"_id": 1}, session=s)
        with pytest.raises(OperationFailure) as err:
            db.fresh.create_index("b", session=s)
        assert err.value.code == 263 and "non-empty collection" in str(err.value)
        s.abort_transaction()
    with client.start_session() as s:
        s.start_transaction()
        with pytest.raises(OperationFailure) as err:
            db.create_collection("v", viewOn="existing", pipeline=[], session=s)
        assert err.value.code == 263
        s.abort_transaction()
    for cmd in ({"create": "snap"}, {"createIndexes": "snap", "indexes": [
            {"key": {"a": 1}, "name": "a_1"}]}):
        with client.start_session() as s:
            s.start_transaction(read_concern=pymongo.read_concern.ReadConcern("snapshot"))
            db.existing.find_one({}, session=s)  # an earlier statement: still refused
            with pytest.raises(OperationFailure) as err:
                db.command(cmd, session=s)
            assert err.value.code == 72
            with pytest.raises(OperationFailure) as err:
                db.existing.find_one({}, session=s)
            assert err.value.code == 251  # the failed statement aborted it
            s.abort_transaction()
    assert "snap" not in db.list_collection_names()
    reply = None
    with client.start_session() as s:
        s.start_transaction()
        db.create_collection("twice", session=s)
        reply = db.command({"createIndexes": "twice",
                            "indexes": [{"key": {"k": 1}, "name": "k_1"}]}, session=s)
        s.commit_transaction()
    assert reply["createdCollectionAutomatically"] is True
    assert (reply["numIndexesBefore"], reply["numIndexesAfter"]) == (1, 2)


def test_concurrent_create_is_a_write_conflict_at_commit(cluster: ShardedCluster) -> None:
    client, other = cluster.client(), cluster.client()
    db = client.ddl4
    db.command("dropDatabase")
    db.seed.insert_one({"_id": 0})
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": "txn"}, session=s)
        other.ddl4.create_collection("c")  # outside: does not see the uncommitted one
        other.ddl4.c.insert_one({"_id": "outside"})
        with pytest.raises(OperationFailure) as err:
            s.commit_transaction()
        assert err.value.code == 112
        assert "TransientTransactionError" in err.value.details.get("errorLabels", [])
    assert list(db.c.find()) == [{"_id": "outside"}]


def test_cross_shard_write_transaction_cannot_create(cluster: ShardedCluster) -> None:
    client = cluster.client()
    shards = [s["_id"] for s in client.admin.command("listShards")["shards"]]
    for name, shard in (("ddl5a", shards[0]), ("ddl5b", shards[1])):
        client[name].command("dropDatabase")
        client.admin.command("enableSharding", name, primaryShard=shard)
        client[name].seed.insert_one({"_id": 0})
    with client.start_session() as s:
        s.start_transaction()
        client.ddl5a.create_collection("n", session=s)
        client.ddl5b.seed.insert_one({"_id": 1}, session=s)
        with pytest.raises(OperationFailure) as err:
            s.commit_transaction()
        assert err.value.code == 263
    assert "n" not in client.ddl5a.list_collection_names()
    assert client.ddl5b.seed.count_documents({}) == 1
    with client.start_session() as s:  # one writing shard, the other only read: commits
        s.start_transaction()
        client.ddl5a.create_collection("n", session=s)
        assert client.ddl5b.seed.find_one({"_id": 0}, session=s) == {"_id": 0}
        s.commit_transaction()
    assert "n" in client.ddl5a.list_collection_names()


def test_commit_applyops_and_change_events(cluster: ShardedCluster) -> None:
    client = cluster.client()
    db = client.ddl6
    db.command("dropDatabase")
    db.seed.insert_one({"_id": 0})
    with db.watch(show_expanded_events=True) as expanded, db.watch() as plain:
        with client.start_session() as s:
            s.start_transaction()
            db.create_collection("c", session=s)
            db.c.create_index("x", name="x_1", session=s)
            db.c.insert_one({"_id": 1, "x": 1}, session=s)
            s.commit_transaction()
            lsid = s.session_id
        db.seed.insert_one({"_id": "marker"})
        evs = read_events(expanded, 4)
        plain_evs = read_events(plain, 2)
    assert [e["operationType"] for e in evs] == ["create", "createIndexes", "insert", "insert"]
    create, index, insert = evs[:3]
    uuid = create["collectionUUID"]
    assert create["ns"] == {"db": "ddl6", "coll": "c"} and create["nsType"] == "collection"
    assert create["operationDescription"] == {"idIndex": {"v": 2, "key": {"_id": 1},
                                                          "name": "_id_"}}
    assert index["operationDescription"] == {"indexes": [{"v": 2, "key": {"x": 1},
                                                          "name": "x_1"}]}
    for e in (create, index, insert):
        assert e["lsid"]["id"] == lsid["id"] and e["txnNumber"] == 1
        assert e["clusterTime"] == create["clusterTime"]  # the commit's applyOps entry
        assert e["collectionUUID"] == uuid
    assert create["_id"]["_data"] < index["_id"]["_data"] < insert["_id"]["_data"]
    # without showExpandedEvents only the insert (its txnOpIndex still counts the DDL ops)
    assert [e["operationType"] for e in plain_evs] == ["insert", "insert"]
    assert plain_evs[0]["_id"] == insert["_id"]
    entries = [e for e in _primary_oplog(cluster, client, "ddl6")
               if e.get("op") == "c" and "applyOps" in e.get("o", {})]
    ops = entries[-1]["o"]["applyOps"]
    assert [(op["op"], op["ns"]) for op in ops] == [("c", "ddl6.$cmd"), ("c", "ddl6.$cmd"),
                                                    ("i", "ddl6.c")]
    assert ops[0]["o"] == {"create": "c", "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
    assert ops[1]["o"] == {"createIndexes": "c", "v": 2, "key": {"x": 1}, "name": "x_1"}
    assert ops[0]["ui"] == ops[1]["ui"] == ops[2]["ui"]
    assert entries[-1]["lsid"]["id"] == lsid["id"]
    assert not [e for e in _primary_oplog(cluster, client, "ddl6")
                if e.get("ns") == "ddl6.$cmd" and e.get("o", {}).get("create") == "c"]
