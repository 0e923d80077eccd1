"""Collection validators and ``$listLocalSessions`` through the router of the shared cluster
(and on a shard): DocumentValidationFailure (121) with ``errInfo`` as mongod 8.0 builds it,
validation levels and actions, ``bypassDocumentValidation``, and the router's own session
cache."""

from __future__ import annotations

import pymongo
import pytest
from bson import Binary
from pymongo.errors import BulkWriteError, OperationFailure, WriteError

from shardsim.testing.helpers import split_over_two_shards

pytestmark = pytest.mark.timeout(120)


def _sharded(client: pymongo.MongoClient, db: str, coll: str) -> None:
    split_over_two_shards(client, f"{db}.{coll}", key="_id", middle=10)


SCHEMA = {"$jsonSchema": {"bsonType": "object", "required": ["name"],
                          "properties": {"name": {"bsonType": "string"},
                                         "age": {"bsonType": "int", "minimum": 0,
                                                 "description": "a non-negative int"}}}}


@pytest.mark.parametrize("sharded", [False, True])
def test_json_schema_validator_err_info(router_client: pymongo.MongoClient,
                                        sharded: bool) -> None:
    db = f"val_schema_{int(sharded)}"
    router_client.drop_database(db)
    router_client[db].create_collection("c", validator=SCHEMA)
    if sharded:
        _sharded(router_client, db, "c")
    c = router_client[db].c
    c.insert_many([{"_id": 1, "name": "a"}, {"_id": 11, "name": "b", "age": 3}])
    with pytest.raises(WriteError) as info:
        c.insert_one({"_id": 12, "age": -1})
    assert info.value.code == 121
    assert info.value.details["errmsg"] == "Document failed validation"
    err = info.value.details["errInfo"]
    assert err["failingDocumentId"] == 12
    assert err["details"] == {
        "operatorName": "$jsonSchema",
        "schemaRulesNotSatisfied": [
            {"operatorName": "properties", "propertiesNotSatisfied": [
                {"propertyName": "age", "description": "a non-negative int", "details": [
                    {"operatorName": "minimum", "specifiedAs": {"minimum": 0},
                     "reason": "comparison failed", "consideredValue": -1}]}]},
            {"operatorName": "required", "specifiedAs": {"required": ["name"]},
             "missingProperties": ["name"]}]}
    # an update on the second shard's chunk, and findAndModify, are checked too
    with pytest.raises(WriteError) as info:
        c.update_one({"_id": 11}, {"$set": {"name": 5}})
    detail = info.value.details["errInfo"]["details"]["schemaRulesNotSatisfied"][0]
    assert detail["propertiesNotSatisfied"][0]["details"] == [
        {"operatorName": "bsonType", "specifiedAs": {"bsonType": "string"},
         "reason": "type did not match", "consideredValue": 5, "consideredType": "int"}]
    with pytest.raises(OperationFailure) as info:
        c.find_one_and_update({"_id": 1}, {"$unset": {"name": ""}})
    assert info.value.code == 121
    assert info.value.details["errInfo"]["failingDocumentId"] == 1
    assert c.find_one({"_id": 1}) == {"_id": 1, "name": "a"}
    # bypassDocumentValidation lets it through
    c.insert_one({"_id": 13}, bypass_document_validation=True)
    c.update_one({"_id": 11}, {"$set": {"age": "x"}}, bypass_document_validation=True)
    assert c.count_documents({}) == 3


def test_query_operator_validator_and_levels(router_client: pymongo.MongoClient) -> None:
    db = "val_query"
    router_client.drop_database(db)
    router_client[db].c.insert_many([{"_id": 1, "x": "s"}, {"_id": 2, "x": 7}])
    router_client[db].command("collMod", "c", validator={"x": {"$type": "string"}})
    c = router_client[db].c
    with pytest.raises(OperationFailure) as info:
        c.find_one_and_update({"_id": 1}, {"$set": {"x": 1}})
    assert info.value.code == 121
    assert info.value.details["errInfo"] == {
        "failingDocumentId": 1,
        "details": {"operatorName": "$type", "specifiedAs": {"x": {"$type": "string"}},
                    "reason": "type did not match", "consideredValue": 1,
                    "consideredType": "int"}}
    # several fields: an implicit $and reporting the failing clauses
    router_client[db].command("collMod", "c", validator={"x": {"$type": "string"},
                                                         "y": {"$gt": 0}})
    with pytest.raises(BulkWriteError) as binfo:
        c.insert_many([{"_id": 3, "x": "a", "y": 1}, {"_id": 4, "x": "b"}])
    err = binfo.value.details["writeErrors"][0]
    assert (err["index"], err["code"]) == (1, 121)
    assert err["errInfo"]["details"] == {
        "operatorName": "$and",
        "clausesNotSatisfied": [{"index": 1, "details": {
            "operatorName": "$gt", "specifiedAs": {"y": {"$gt": 0}},
            "reason": "field was missing"}}]}
    # moderate: an already invalid document may be updated, a valid one may not turn invalid
    router_client[db].command("collMod", "c", validator={"x": {"$type": "string"}},
                              validationLevel="moderate")
    c.update_one({"_id": 2}, {"$set": {"x": 8}})
    with pytest.raises(WriteError):
        c.update_one({"_id": 1}, {"$set": {"x": 8}})
    # warn: the write goes through
    router_client[db].command("collMod", "c", validationAction="warn")
    c.update_one({"_id": 1}, {"$set": {"x": 9}})
    assert c.find_one({"_id": 1}) == {"_id": 1, "x": 9}
    opts = router_client[db].c.options()
    assert (opts["validationLevel"], opts["validationAction"]) == ("moderate", "warn")


def test_bad_validator_options_are_refused(router_client: pymongo.MongoClient) -> None:
    db = router_client["val_bad"]
    router_client.drop_database("val_bad")
    for opts, code in (({"validator": 1}, 14), ({"validationLevel": "sometimes"}, 2),
                       ({"validationAction": "shout"}, 2),
                       ({"validator": {"$jsonSchema": {"bogus": 1}}}, 9),
                       ({"validator": {"$jsonSchema": {"bsonType": "nosuchtype"}}}, 2)):
        with pytest.raises(OperationFailure) as info:
            db.command("create", "c", **opts)
        assert info.value.code == code, opts


def test_list_local_sessions(router_client: pymongo.MongoClient,
                             first_shard_client: pymongo.MongoClient) -> None:
    for client in (router_client, first_shard_client):
        with client.start_session() as s:
            client.admin.command("ping", session=s)
            docs = list(client.admin.aggregate([{"$listLocalSessions": {}}], session=s))
            mine = [d for d in docs if d["_id"]["id"] == s.session_id["id"]]
            assert len(mine) == 1
            assert isinstance(mine[0]["_id"]["uid"], bytes) and \
                len(mine[0]["_id"]["uid"]) == 32
            assert "lastUse" in mine[0]
            docs = list(client.admin.aggregate(
                [{"$listLocalSessions": {"allUsers": True}}, {"$limit": 1},
                 {"$project": {"_id": 0, "d": {"$literal": 1}}}]))
            assert docs == [{"d": 1}]
            none = list(client.admin.aggregate(
                [{"$listLocalSessions": {"users": [{"user": "nobody", "db": "admin"}]}}]))
            assert none == []
        # any database with {aggregate: 1} (mongod checks isCollectionlessAggregateNS only)
        assert list(client.test.aggregate([{"$listLocalSessions": {"allUsers": True}},
                                           {"$limit": 1}, {"$count": "n"}])) == [{"n": 1}]
        with pytest.raises(OperationFailure) as info:
            list(client.test.coll.aggregate([{"$listLocalSessions": {}}]))
        assert info.value.code == 73
        with pytest.raises(OperationFailure) as info:
            list(client.admin.aggregate([{"$listLocalSessions": {"allUsers": True,
                                                                  "users": []}}]))
        assert info.value.code == 50705
    assert Binary  # the uid is BinData subtype 0 on the wire (decoded as bytes)
