"""CRUD server behaviour through the router of the shared 3-shard ``cluster`` (and, for the
input checks, directly on one of its shards): MongoDB 8.0's ``bulkWrite`` command across
sharded and unsharded namespaces, ``let`` variables, ``$getField``/``$setField``, ``$type``
by name and number, and mongod's codes for bad input."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure

pytestmark = pytest.mark.timeout(120)


def _code(client: pymongo.MongoClient, db: str, cmd: dict[str, Any]) -> int:
    with pytest.raises(OperationFailure) as info:
        client[db].command(cmd)
    return info.value.code


def _sharded(client: pymongo.MongoClient, db: str, coll: str) -> None:
    client.admin.command("enableSharding", db)
    client.admin.command("shardCollection", f"{db}.{coll}", key={"k": 1})
    for split in (10, 20):
        client.admin.command("split", f"{db}.{coll}", middle={"k": split})
    shards = [s["_id"] for s in client.admin.command("listShards")["shards"]]
    for i, split in enumerate((10, 20)):
        client.admin.command("moveChunk", f"{db}.{coll}", find={"k": split},
                             to=shards[(i + 1) % len(shards)])


@pytest.mark.parametrize("target", ["router", "shard"])
def test_input_checks_give_mongods_codes(router_client: pymongo.MongoClient,
                                         first_shard_client: pymongo.MongoClient,
                                         target: str) -> None:
    client = router_client if target == "router" else first_shard_client
    db = f"crud_checks_{target}"
    client[db].c.insert_one({"_id": 1})
    assert _code(client, db, {"insert": "c", "documents": []}) == 16
    assert _code(client, db, {"update": "c", "updates": []}) == 16
    assert _code(client, db, {"insert": "c", "documents": [{}], "ordered": "yes"}) == 14
    for wc, code in (({"w": -1}, 9), ({"w": "nosuchtag"}, 79), ({"wtimeout": "x"}, 14)):
        assert _code(client, db, {"insert": "c", "documents": [{}], "writeConcern": wc}) == code
    assert _code(client, db, {"find": "c", "skip": -1}) == 51024
    for mt in (2 ** 31, 1.5, -1):
        assert _code(client, db, {"find": "c", "maxTimeMS": mt}) == 2
    assert _code(client, db, {"aggregate": "c", "cursor": {},
                              "pipeline": [{"$match": {}}, {"$changeStream": {}}]}) == 40602
    # the valid forms still work
    client[db].command({"insert": "c", "documents": [{"_id": 2}],
                        "writeConcern": {"w": "majority", "wtimeout": 1000}})
    client[db].command({"find": "c", "maxTimeMS": 2 ** 31 - 1})
    assert client[db].c.count_documents({}) == 2


def test_bulk_write_across_sharded_and_unsharded(router_client: pymongo.MongoClient) -> None:
    db = "crud_bulk"
    router_client.drop_database(db)
    _sharded(router_client, db, "s")
    router_client[db].u.insert_one({"_id": "keep", "v": 0})
    ops = [{"insert": 0, "document": {"_id": i, "k": i * 5}} for i in range(6)]  # 3 shards
    ops += [{"insert": 1, "document": {"_id": "u1"}},
            {"update": 0, "filter": {"k": {"$gte": 10}}, "updateMods": {"$inc": {"n": 1}},
             "multi": True},
            {"update": 1, "filter": {"_id": "new"}, "updateMods": {"$set": {"v": 1}},
             "upsert": True},
            {"delete": 0, "filter": {"k": 0}},
            {"insert": 1, "document": {"_id": "keep"}},  # duplicate key
            {"delete": 1, "filter": {}, "multi": True}]
    reply = router_client.admin.command({
        "bulkWrite": 1, "ops": ops, "ordered": False,
        "nsInfo": [{"ns": f"{db}.s"}, {"ns": f"{db}.u"}]})
    assert (reply["nInserted"], reply["nMatched"], reply["nModified"], reply["nUpserted"],
            reply["nDeleted"], reply["nErrors"]) == (7, 4, 4, 1, 4, 1)
    items = reply["cursor"]["firstBatch"]
    assert reply["cursor"]["ns"] == "admin.$cmd.bulkWrite" and reply["cursor"]["id"] == 0
    assert [it["idx"] for it in items] == list(range(len(ops)))
    assert items[8]["upserted"] == {"_id": "new"} and items[8]["n"] == 1
    assert items[10]["ok"] == 0 and items[10]["code"] == 11000
    assert items[10]["codeName"] == "DuplicateKey"
    assert items[11] == {"ok": 1.0, "idx": 11, "n": 3}
    assert router_client[db].s.count_documents({"n": 1}) == 4
    assert router_client[db].u.count_documents({}) == 0
    # ordered: stops at the first error; errorsOnly: only the failed op is reported
    reply = router_client.admin.command({
        "bulkWrite": 1, "errorsOnly": True, "nsInfo": [{"ns": f"{db}.s"}],
        "ops": [{"insert": 0, "document": {"_id": 1, "k": 5}},
                {"insert": 0, "document": {"_id": 100, "k": 100}}]})
    assert reply["nErrors"] == 1 and reply["nInserted"] == 0
    assert [it["idx"] for it in reply["cursor"]["firstBatch"]] == [0]
    assert router_client[db].s.count_documents({"_id": 100}) == 0


def test_bulk_write_request_errors(router_client: pymongo.MongoClient) -> None:
    ns = [{"ns": "crud_bulk_err.c"}]
    assert _code(router_client, "crud_bulk_err", {"bulkWrite": 1, "ops": [{"insert": 0,
                                                  "document": {}}], "nsInfo": ns}) == 13
    assert _code(router_client, "admin", {"bulkWrite": 1, "ops": [], "nsInfo": ns}) == 16
    assert _code(router_client, "admin", {"bulkWrite": 1, "nsInfo": ns,
                                          "ops": [{"insert": 3, "document": {}}]}) == 2
    assert _code(router_client, "admin", {"bulkWrite": 1, "nsInfo": ns, "ordered": 1,
                                          "ops": [{"insert": 0, "document": {}}]}) == 14


def test_bulk_write_retry_applies_nothing_twice(router_client: pymongo.MongoClient) -> None:
    db = "crud_bulk_retry"
    router_client.drop_database(db)
    with router_client.start_session() as s:
        cmd = {"bulkWrite": 1, "nsInfo": [{"ns": f"{db}.c"}], "lsid": s.session_id,
               "txnNumber": 7,
               "ops": [{"insert": 0, "document": {"_id": 1}},
                       {"update": 0, "filter": {"_id": 1}, "updateMods": {"$inc": {"n": 1}}}]}
        first = router_client.admin.command(cmd, session=None)
        again = router_client.admin.command(cmd, session=None)
    assert first["nInserted"] == again["nInserted"] == 1
    assert again["nModified"] == 1 and again["nErrors"] == 0
    assert router_client[db].c.find_one({"_id": 1}) == {"_id": 1, "n": 1}


def test_let_get_field_set_field_and_type_codes(router_client: pymongo.MongoClient) -> None:
    coll = router_client.crud_let.c
    coll.drop()
    coll.insert_many([{"_id": 1, "a.b": 5}, {"_id": 2, "a.b": 7}, {"_id": None}])
    found = list(coll.find({"$expr": {"$eq": [{"$getField": "a.b"}, "$$x"]}}, let={"x": 7}))
    assert found == [{"_id": 2, "a.b": 7}]
    coll.update_one({"_id": 1}, [{"$replaceWith": {"$setField": {
        "field": {"$literal": "$price"}, "input": "$$ROOT", "value": "$$p"}}}], let={"p": 9})
    assert coll.find_one({"_id": 1}) == {"_id": 1, "a.b": 5, "$price": 9}
    assert coll.count_documents({"_id": {"$type": "null"}}) == 1
    assert coll.count_documents({"_id": {"$type": 10}}) == 1
    with pytest.raises(OperationFailure) as info:
        list(coll.find({"$expr": {"$eq": ["$_id", "$$undefined"]}}))
    assert info.value.code == 17276


def test_collation_strengths(router_client: pymongo.MongoClient) -> None:
    coll = router_client.crud_collation.c
    coll.drop()
    coll.insert_many([{"_id": 1, "x": "ping"}, {"_id": 2, "x": "PING"}, {"_id": 3, "x": "píng"}])
    case_insensitive = {"locale": "en_US", "strength": 2}
    assert coll.count_documents({"x": "Ping"}, collation=case_insensitive) == 2
    assert coll.count_documents({"x": "Ping"}, collation={"locale": "fr", "strength": 1}) == 3
    assert coll.count_documents({"x": "Ping"}, collation={"locale": "simple"}) == 0
    assert coll.distinct("x", collation=case_insensitive) == ["ping", "píng"]
    assert [d["_id"] for d in coll.aggregate([{"$match": {"x": "PING"}}],
                                             collation=case_insensitive)] == [1, 2]
    assert coll.delete_many({"x": "PiNg"}, collation=case_insensitive).deleted_count == 2
    with pytest.raises(OperationFailure) as info:
        coll.find_one({}, collation={"strength": 2})
    assert info.value.code == 40414


def test_out_and_merge_with_sharded_input_and_output(router_client: pymongo.MongoClient) -> None:
    db = "crud_out_merge"
    router_client.drop_database(db)
    _sharded(router_client, db, "src")
    _sharded(router_client, db, "dst")
    router_client[db].src.insert_many([{"_id": i, "k": i * 5, "v": i} for i in range(6)])
    router_client[db].dst.insert_one({"_id": 0, "k": 0, "old": True})
    router_client[db].src.aggregate([{"$match": {"v": {"$gte": 1}}}, {"$out": "plain"}])
    assert sorted(d["_id"] for d in router_client[db].plain.find()) == [1, 2, 3, 4, 5]
    router_client[db].src.aggregate([{"$project": {"k": 1, "v": 1}},
                                     {"$merge": {"into": "dst", "on": ["k", "_id"]}}])
    assert router_client[db].dst.count_documents({}) == 6
    assert router_client[db].dst.find_one({"_id": 0}) == {"_id": 0, "k": 0, "old": True, "v": 0}
    with pytest.raises(OperationFailure) as info:
        router_client[db].src.aggregate([{"$out": "dst"}])
    assert info.value.code == 28769
