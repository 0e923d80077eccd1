"""Views on a real shard process, through pymongo (MongoDB 8.0 semantics).

A view is a document of ``<db>.system.views`` (``{_id: "db.view", viewOn, pipeline}``); the
oplog sees only CRUD entries on that collection, and change streams (database/cluster level,
``showExpandedEvents``) turn them into ``create``/``modify``/``drop`` events on the view.
"""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure

pytestmark = pytest.mark.timeout(120)


def _oplog(client: pymongo.MongoClient, ns: str) -> list[dict]:
    return list(client.local["oplog.rs"].find({"ns": ns}).sort("$natural", 1))


def test_view_lifecycle_reads_writes_and_oplog(shard, shard_client):
    client = shard_client(shard)
    db = client.vdb
    db.src.insert_many([{"_id": i, "x": i, "kind": "even" if i % 2 == 0 else "odd"}
                        for i in range(6)])
    db.command({"create": "evens", "viewOn": "src", "pipeline": [{"$match": {"kind": "even"}}]})

    # listCollections shape (list_collections.cpp): views after collections.
    infos = {i["name"]: i for i in db.list_collections()}
    assert infos["evens"] == {"name": "evens", "type": "view",
                              "options": {"viewOn": "src",
                                          "pipeline": [{"$match": {"kind": "even"}}]},
                              "info": {"readOnly": True}}
    assert infos["system.views"]["type"] == "collection"
    assert "evens" in db.list_collection_names()

    # Reads run the view pipeline over the source first.
    assert [d["_id"] for d in db.evens.find({}, sort=[("_id", 1)])] == [0, 2, 4]
    assert [d["_id"] for d in db.evens.find({"x": {"$gt": 0}}, sort=[("x", -1)], limit=1)] == [4]
    assert list(db.evens.find({}, {"x": 1, "_id": 0}, sort=[("x", 1)])) == \
        [{"x": 0}, {"x": 2}, {"x": 4}]
    assert db.evens.count_documents({}) == 3
    assert db.evens.estimated_document_count() == 3
    assert sorted(db.evens.distinct("x")) == [0, 2, 4]
    agg = list(db.evens.aggregate([{"$group": {"_id": None, "s": {"$sum": "$x"}}}]))
    assert agg == [{"_id": None, "s": 6}]

    # A view on a view unfolds both pipelines.
    db.create_collection("bigEvens", viewOn="evens", pipeline=[{"$match": {"x": {"$gte": 2}}}])
    assert [d["_id"] for d in db.bigEvens.find().sort("_id", 1)] == [2, 4]

    # Writes are refused per statement with CommandNotSupportedOnView.
    with pytest.raises(OperationFailure) as exc:
        db.evens.insert_one({"x": 10})
    assert exc.value.code == 166
    assert "Namespace vdb.evens is a view, not a collection" in str(exc.value)
    for call in (lambda: db.evens.update_one({}, {"$set": {"y": 1}}),
                 lambda: db.evens.delete_many({}),
                 lambda: db.evens.find_one_and_update({}, {"$set": {"y": 1}}),
                 lambda: db.evens.create_index("x")):
        with pytest.raises(OperationFailure) as exc:
            call()
        assert exc.value.code == 166
    assert db.src.count_documents({}) == 6

    # Conflicts: NamespaceExists; an identical re-create is a no-op.
    db.command({"create": "evens", "viewOn": "src", "pipeline": [{"$match": {"kind": "even"}}]})
    with pytest.raises(OperationFailure) as exc:
        db.command({"create": "evens", "viewOn": "src", "pipeline": []})
    assert exc.value.code == 48
    with pytest.raises(OperationFailure) as exc:
        db.command({"create": "src", "viewOn": "other"})
    assert exc.value.code == 48
    with pytest.raises(OperationFailure) as exc:
        db.command({"create": "evens"})
    assert exc.value.code == 48
    with pytest.raises(OperationFailure) as exc:  # a cycle through collMod
        db.command({"collMod": "evens", "viewOn": "bigEvens", "pipeline": []})
    assert exc.value.code == 93

    # $changeStream may not define a view, and a view cannot be watched.
    with pytest.raises(OperationFailure) as exc:
        db.command({"create": "cs", "viewOn": "src", "pipeline": [{"$changeStream": {}}]})
    assert exc.value.code == 167
    with pytest.raises(OperationFailure) as exc:
        db.evens.watch()
    assert exc.value.code == 166

    # A view over a missing collection is allowed and reads nothing.
    db.command({"create": "ghost", "viewOn": "nothing_here"})
    assert list(db.ghost.find()) == []
    assert db.ghost.count_documents({}) == 0

    # collMod rewrites the definition.
    db.command({"collMod": "evens", "viewOn": "src", "pipeline": [{"$match": {"kind": "odd"}}]})
    assert [d["_id"] for d in db.evens.find().sort("_id", 1)] == [1, 3, 5]
    assert db.evens.options() == {"viewOn": "src", "pipeline": [{"$match": {"kind": "odd"}}]}

    # Drop removes the view only.
    db.drop_collection("ghost")
    assert "ghost" not in db.list_collection_names()
    assert db.src.count_documents({}) == 6

    # The oplog holds what mongod writes: the system.views creation, then CRUD entries on it.
    entries = _oplog(client, "vdb.system.views")
    assert [e["op"] for e in entries] == ["i", "i", "i", "u", "d"]
    assert entries[0]["o"] == {"_id": "vdb.evens", "viewOn": "src",
                               "pipeline": [{"$match": {"kind": "even"}}]}
    assert entries[0]["o2"] == {"_id": "vdb.evens"}
    assert entries[3]["o"] == {"_id": "vdb.evens", "viewOn": "src",
                               "pipeline": [{"$match": {"kind": "odd"}}]}
    assert entries[4]["o"] == {"_id": "vdb.ghost"}
    assert len({e["ui"] for e in entries}) == 1
    creates = [e["o"] for e in client.local["oplog.rs"].find({"ns": "vdb.$cmd", "op": "c"})]
    assert sum(1 for c in creates if c.get("create") == "system.views") == 1
    assert not any(c.get("create") in ("evens", "bigEvens", "ghost") for c in creates)


def test_view_change_stream_events(shard, shard_client):
    client = shard_client(shard)
    db = client.csv
    db.base.insert_one({"_id": 1})
    with db.watch(show_expanded_events=True) as stream, \
            client.watch(show_expanded_events=True) as cluster_stream, \
            db.watch() as plain_stream, db.base.watch(show_expanded_events=True) as coll_stream:
        db.command({"create": "v", "viewOn": "base", "pipeline": [{"$project": {"_id": 1}}]})
        db.command({"collMod": "v", "viewOn": "base", "pipeline": []})
        db.drop_collection("v")
        db.base.insert_one({"_id": 2})
        events = [stream.next() for _ in range(4)]
        cluster_events = [cluster_stream.next() for _ in range(4)]
        plain = plain_stream.next()
        coll_event = coll_stream.next()
    assert [e["operationType"] for e in events] == ["create", "modify", "drop", "insert"]
    create, modify, drop = events[:3]
    assert list(create) == ["_id", "operationType", "clusterTime", "wallTime", "ns",
                            "operationDescription", "nsType"]
    assert create["ns"] == {"db": "csv", "coll": "v"}
    assert create["operationDescription"] == {"viewOn": "base",
                                              "pipeline": [{"$project": {"_id": 1}}]}
    assert create["nsType"] == "view"
    assert modify["operationDescription"] == {"viewOn": "base", "pipeline": []}
    assert "collectionUUID" not in modify
    assert drop["ns"] == {"db": "csv", "coll": "v"} and "operationDescription" not in drop
    assert [e["_id"] for e in cluster_events] == [e["_id"] for e in events]
    # Without showExpandedEvents, and on a collection stream, view definitions are not events.
    assert plain["operationType"] == "insert"
    assert coll_event["operationType"] == "insert"
    # Resuming after the view's create event continues with the modify.
    with db.watch(show_expanded_events=True, resume_after=create["_id"]) as resumed:
        assert resumed.next()["_id"] == modify["_id"]


def test_durable_shard_keeps_views(shard_process, shard_client, tmp_path):
    dbpath = tmp_path / "data"
    dbpath.mkdir()
    proc = shard_process("shardV", str(dbpath))
    client = shard_client(proc)
    client.d.src.insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}])
    client.d.command({"create": "v", "viewOn": "src", "pipeline": [{"$match": {"a": 2}}]})
    client.close()
    proc.stop()
    proc2 = shard_process("shardV", str(dbpath))
    client2 = shard_client(proc2)
    infos = {i["name"]: i for i in client2.d.list_collections()}
    assert infos["v"]["type"] == "view"
    assert list(client2.d.v.find()) == [{"_id": 2, "a": 2}]
    with pytest.raises(OperationFailure) as exc:
        client2.d.v.insert_one({"a": 3})
    assert exc.value.code == 166
