"""Collection/index management and read concern through the router of a 3-shard cluster:
search index commands (31082), createIndexes/listIndexes on every owning shard, collMod's 359
violations passed on, snapshot reads pinned to one atClusterTime across shards,
checkMetadataConsistency, tailable cursors on a capped collection."""

from __future__ import annotations

import pymongo
import pytest
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern

pytestmark = pytest.mark.timeout(60)


def test_search_index_commands_through_the_router(router_client: pymongo.MongoClient) -> None:
    coll = router_client.mgmt_db.search
    for call in (lambda: coll.create_search_index({"definition": {"mappings": {}}}),
                 lambda: coll.drop_search_index("x"),
                 lambda: coll.update_search_index("x", {}),
                 lambda: list(coll.list_search_indexes())):
        with pytest.raises(OperationFailure) as info:
            call()
        assert info.value.code == 31082 and "Atlas" in str(info.value)


def test_indexes_on_every_owning_shard_and_coll_mod_violations(
        router_client: pymongo.MongoClient) -> None:
    admin = router_client.admin
    admin.command("shardCollection", "mgmt_db.sharded", key={"k": 1})
    admin.command("split", "mgmt_db.sharded", middle={"k": 0})
    admin.command("moveChunk", "mgmt_db.sharded", find={"k": 5}, to="shard1")
    coll = router_client.mgmt_db.sharded
    coll.insert_many([{"_id": 1, "k": 1, "x": 1}, {"_id": 2, "k": 2, "x": 1}])  # shard1
    coll.create_index("x")
    assert "x_1" in coll.index_information()
    db = router_client.mgmt_db
    db.command({"collMod": "sharded", "index": {"keyPattern": {"x": 1}, "prepareUnique": True}})
    with pytest.raises(OperationFailure) as info:
        coll.insert_one({"_id": 3, "k": 3, "x": 1})
    assert info.value.code == 11000
    with pytest.raises(OperationFailure) as info:
        db.command({"collMod": "sharded", "index": {"keyPattern": {"x": 1}, "unique": True}})
    # shard1's CannotConvertIndexToUnique, its violations passed on by the router
    assert info.value.code == 359
    assert info.value.details["violations"] == [{"ids": [1, 2]}]
    coll.drop()


def test_snapshot_reads_through_the_router(router_client: pymongo.MongoClient) -> None:
    coll = router_client.mgmt_db.snap
    coll.drop()
    coll.insert_many([{"_id": 1, "x": 11}, {"_id": 2, "x": 11}])
    with router_client.start_session(snapshot=True) as s:
        assert [d["x"] for d in coll.find({}, session=s)] == [11, 11]
        at = s._snapshot_time
        assert isinstance(at, Timestamp)
        coll.update_one({"_id": 1}, {"$set": {"x": 12}})
        assert sorted(d["x"] for d in coll.find({}, session=s)) == [11, 11]
        assert coll.distinct("x", session=s) == [11]
    assert sorted(d["x"] for d in coll.find({})) == [11, 12]
    snap = coll.with_options(read_concern=ReadConcern("snapshot"))
    with pytest.raises(OperationFailure) as info:
        router_client.mgmt_db.command({"listCollections": 1, "readConcern": {"level": "snapshot"}})
    assert info.value.code == 72
    assert len(list(snap.find({}))) == 2


def test_check_metadata_consistency_and_tailable_capped_cursor(
        router_client: pymongo.MongoClient) -> None:
    db = router_client.mgmt_db
    db.drop_collection("capped")
    db.create_collection("capped", capped=True, size=4096)
    db.capped.insert_many([{"_id": 1}, {"_id": 2}])
    reply = db.command({"checkMetadataConsistency": 1})
    assert reply["cursor"]["firstBatch"] == [] and reply["cursor"]["id"] == 0
    with pytest.raises(OperationFailure) as info:
        router_client.get_database("no_such_db_mgmt").command({"checkMetadataConsistency": 1})
    assert info.value.code == 26
    cursor = db.capped.find({}, cursor_type=pymongo.CursorType.TAILABLE, batch_size=1)
    assert cursor.next()["_id"] == 1
    assert cursor.next()["_id"] == 2
    with pytest.raises(StopIteration):  # an empty batch: the tailable cursor stays open
        cursor.next()
    assert cursor.alive
    db.capped.insert_one({"_id": 3})
    assert cursor.next()["_id"] == 3
    cursor.close()
    with pytest.raises(OperationFailure) as info:
        list(router_client.mgmt_db.snap.find({}, cursor_type=pymongo.CursorType.TAILABLE))
    assert info.value.code == 2
