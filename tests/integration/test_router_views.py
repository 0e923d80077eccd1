"""Views through the router (shared ``cluster`` fixture): created on the database's primary
shard, read there when the source is unsharded, and re-run over the sharded source by the router
(the shard's ``resolvedView`` answer, code 169) when the source is sharded."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure

pytestmark = pytest.mark.timeout(180)


def test_view_on_unsharded_collection(router_client: pymongo.MongoClient) -> None:
    db = router_client.rview_plain
    db.drop_collection("v")
    db.drop_collection("src")
    db.src.insert_many([{"_id": i, "k": i % 3} for i in range(9)])
    db.create_collection("v", viewOn="src", pipeline=[{"$match": {"k": 0}}])
    info = next(db.list_collections(filter={"name": "v"}))
    assert info == {"name": "v", "type": "view",
                    "options": {"viewOn": "src", "pipeline": [{"$match": {"k": 0}}]},
                    "info": {"readOnly": True}}
    assert [d["_id"] for d in db.v.find().sort("_id", 1)] == [0, 3, 6]
    assert db.v.count_documents({"_id": {"$gt": 0}}) == 2
    assert list(db.v.aggregate([{"$group": {"_id": "$k", "n": {"$sum": 1}}}])) == \
        [{"_id": 0, "n": 3}]
    with pytest.raises(OperationFailure) as exc:
        db.v.insert_one({"k": 0})
    assert exc.value.code == 166
    with pytest.raises(OperationFailure) as exc:
        with db.v.watch() as stream:
            stream.try_next()
    assert exc.value.code == 166
    db.drop_collection("v")
    assert "v" not in db.list_collection_names()


def test_view_on_sharded_collection(router_client: pymongo.MongoClient) -> None:
    admin = router_client.admin
    name = "rview_sharded"
    db = router_client[name]
    admin.command("enableSharding", name)
    admin.command("shardCollection", f"{name}.src", key={"x": 1})
    admin.command("split", f"{name}.src", middle={"x": 0})
    primary = router_client.config.databases.find_one({"_id": name})["primary"]
    other = next(s["_id"] for s in admin.command("listShards")["shards"] if s["_id"] != primary)
    admin.command("moveChunk", f"{name}.src", find={"x": 5}, to=other)
    db.src.insert_many([{"_id": i, "x": i - 5, "even": i % 2 == 0} for i in range(10)])
    db.command({"create": "evens", "viewOn": "src", "pipeline": [{"$match": {"even": True}}]})

    # Both shards' documents are seen through the view.
    xs = [d["x"] for d in db.evens.find({}, {"_id": 0, "x": 1}).sort("x", 1)]
    assert xs == [-5, -3, -1, 1, 3]
    assert [d["x"] for d in db.evens.find({"x": {"$gt": -4}}).sort("x", -1).skip(1).limit(2)] \
        == [1, -1]
    assert db.evens.count_documents({}) == 5
    assert db.evens.estimated_document_count() == 5
    assert sorted(db.evens.distinct("x")) == [-5, -3, -1, 1, 3]
    total = list(db.evens.aggregate([{"$group": {"_id": None, "s": {"$sum": "$x"}}}]))
    assert total == [{"_id": None, "s": -5}]
    # Small batches work through the router's cursor.
    cursor = db.evens.find(batch_size=2).sort("x", 1)
    assert len(list(cursor)) == 5


def test_view_create_event_through_router(router_client: pymongo.MongoClient) -> None:
    db = router_client.rview_events
    db.base.insert_one({"_id": 1})
    with db.watch(show_expanded_events=True) as stream:
        db.command({"create": "vv", "viewOn": "base", "pipeline": []})
        db.drop_collection("vv")
        first, second = stream.next(), stream.next()
    assert first["operationType"] == "create"
    assert first["ns"] == {"db": "rview_events", "coll": "vv"}
    assert first["operationDescription"] == {"viewOn": "base", "pipeline": []}
    assert second["operationType"] == "drop"
    assert second["ns"] == {"db": "rview_events", "coll": "vv"}
