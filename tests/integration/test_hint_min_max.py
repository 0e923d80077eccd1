"""``hint`` and ``min``/``max`` through the router of the shared cluster (sharded and
unsharded collections): valid names and key patterns accepted by every command that takes a
hint, unknown ones refused with mongod's BadValue (2), and the planner's min/max codes."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure, WriteError

pytestmark = pytest.mark.timeout(120)

BAD = "hint provided does not correspond to an existing index"


@pytest.fixture(params=[False, True], ids=["unsharded", "sharded"])
def coll(request: pytest.FixtureRequest,
         router_client: pymongo.MongoClient) -> pymongo.collection.Collection:
    db = f"hint_{request.param}"
    router_client.drop_database(db)
    c = router_client[db].c
    if request.param:
        router_client.admin.command("enableSharding", db)
        router_client.admin.command("shardCollection", f"{db}.c", key={"_id": 1})
        router_client.admin.command("split", f"{db}.c", middle={"_id": 5})
        primary = router_client.config.databases.find_one({"_id": db})["primary"]
        other = next(s["_id"] for s in router_client.admin.command("listShards")["shards"]
                     if s["_id"] != primary)
        router_client.admin.command("moveChunk", f"{db}.c", find={"_id": 5}, to=other)
    c.create_index([("x", 1)])
    c.create_index([("a", 1), ("b", -1)], name="ab")
    c.insert_many([{"_id": i, "x": i % 4, "a": i % 3, "b": i} for i in range(10)])
    return c


def test_valid_hints_are_accepted(coll: pymongo.collection.Collection) -> None:
    for hint in ("x_1", [("x", 1)], "ab", [("a", 1), ("b", -1)], [("$natural", 1)], "_id_"):
        assert len(list(coll.find({"x": 1}, hint=hint))) == 3
        assert coll.count_documents({"x": 1}, hint=hint) == 3
        agg_hint = hint if isinstance(hint, str) else dict(hint)  # pymongo sends it as is
        assert len(list(coll.aggregate([{"$match": {"x": 1}}], hint=agg_hint))) == 3
    coll.update_one({"_id": 1}, {"$set": {"y": 1}}, hint="x_1")
    coll.update_many({"x": 1}, {"$set": {"y": 2}}, hint=[("a", 1), ("b", -1)])
    assert coll.find_one_and_update({"_id": 2}, {"$set": {"y": 3}}, hint="ab")["_id"] == 2
    assert coll.delete_one({"_id": 9}, hint="x_1").deleted_count == 1
    assert coll.find_one_and_delete({"_id": 8}, hint=[("x", 1)])["_id"] == 8


def test_unknown_hint_is_bad_value(coll: pymongo.collection.Collection) -> None:
    for hint in ("nope", [("x", -1)], [("b", -1), ("a", 1)]):
        with pytest.raises(OperationFailure) as info:
            list(coll.find({}, hint=hint))
        assert info.value.code == 2 and BAD in str(info.value)
        with pytest.raises(OperationFailure) as info:
            coll.count_documents({}, hint=hint)
        assert info.value.code == 2
        with pytest.raises(OperationFailure) as info:
            list(coll.aggregate([], hint=hint if isinstance(hint, str) else dict(hint)))
        assert info.value.code == 2
        with pytest.raises(OperationFailure) as info:
            coll.find_one_and_update({"_id": 1}, {"$set": {"y": 1}}, hint=hint)
        assert info.value.code == 2
    with pytest.raises(WriteError) as winfo:
        coll.update_one({"_id": 1}, {"$set": {"y": 1}}, hint="nope")
    assert winfo.value.code == 2 and BAD in str(winfo.value)
    with pytest.raises(WriteError) as winfo:
        coll.delete_many({"x": 1}, hint="nope")
    assert winfo.value.code == 2
    assert coll.count_documents({"x": 1}) == 3  # nothing was deleted
    with pytest.raises(OperationFailure) as info:
        coll.database.command("find", coll.name, hint=5)
    assert info.value.code == 9


def test_min_max(coll: pymongo.collection.Collection) -> None:
    got = [d["_id"] for d in coll.find({}).min([("x", 1)]).max([("x", 3)]).hint("x_1")]
    assert sorted(got) == [1, 2, 5, 6, 9]
    got = [d["_id"] for d in coll.find({"b": {"$lt": 7}}).min([("a", 1)]).hint("ab")]
    assert sorted(got) == [1, 2, 4, 5]
    with pytest.raises(OperationFailure) as info:  # pymongo refuses it before sending
        coll.database.command("find", coll.name, min={"x": 1})
    assert info.value.code == 51173
    for cur, code in ((coll.find().min([("a", 1)]).hint("x_1"), 51174),
                      (coll.find().min([("x", 3)]).max([("x", 1)]).hint("x_1"), 51175)):
        with pytest.raises(OperationFailure) as info:
            list(cur)
        assert info.value.code == code
