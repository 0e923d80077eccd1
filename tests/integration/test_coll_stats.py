"""``$collStats`` through the router of the shared cluster: one document per shard owning
the collection (``shard``, ``ns``, ``storageStats`` with capped sizes, ``count``), and
mongod's errors."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure

pytestmark = pytest.mark.timeout(120)


def test_coll_stats_unsharded_capped(router_client: pymongo.MongoClient) -> None:
    db = router_client["cs_capped"]
    router_client.drop_database("cs_capped")
    db.create_collection("c", capped=True, size=4096)
    db.c.insert_many([{"_id": i} for i in range(3)])
    docs = list(db.c.aggregate([{"$collStats": {"storageStats": {}, "count": {}}},
                                {"$project": {"capped": "$storageStats.capped",
                                              "maxSize": "$storageStats.maxSize",
                                              "n": "$storageStats.count", "count": 1,
                                              "shard": 1, "ns": 1, "_id": 0}}]))
    assert len(docs) == 1
    assert docs[0]["ns"] == "cs_capped.c"
    assert (docs[0]["capped"], docs[0]["maxSize"], docs[0]["n"], docs[0]["count"]) == \
        (True, 4096, 3, 3)
    shards = {s["_id"] for s in router_client.admin.command("listShards")["shards"]}
    assert docs[0]["shard"] in shards
    scaled = list(db.c.aggregate([{"$collStats": {"storageStats": {"scale": 1024}}}]))
    assert scaled[0]["storageStats"]["maxSize"] == 4 and \
        scaled[0]["storageStats"]["scaleFactor"] == 1024


def test_coll_stats_sharded_one_doc_per_shard(router_client: pymongo.MongoClient) -> None:
    router_client.drop_database("cs_sharded")
    router_client.admin.command("enableSharding", "cs_sharded")
    router_client.admin.command("shardCollection", "cs_sharded.c", key={"_id": 1})
    router_client.admin.command("split", "cs_sharded.c", middle={"_id": 10})
    primary = router_client.config.databases.find_one({"_id": "cs_sharded"})["primary"]
    other = next(s["_id"] for s in router_client.admin.command("listShards")["shards"]
                 if s["_id"] != primary)
    router_client.admin.command("moveChunk", "cs_sharded.c", find={"_id": 10}, to=other)
    coll = router_client.cs_sharded.c
    coll.insert_many([{"_id": i} for i in (1, 2, 11)])
    docs = list(coll.aggregate([{"$collStats": {"count": {}}}]))
    owners = {d["shard"]: d["count"] for d in docs}
    assert sum(owners.values()) == 3 and len(owners) == 2


def test_coll_stats_errors(router_client: pymongo.MongoClient) -> None:
    db = router_client["cs_errors"]
    router_client.drop_database("cs_errors")
    db.c.insert_one({"_id": 1})
    for pipeline, code in (([{"$collStats": 1}], 40166),
                           ([{"$collStats": {"bogus": {}}}], 40415),
                           ([{"$match": {}}, {"$collStats": {}}], 40602)):
        with pytest.raises(OperationFailure) as info:
            list(db.c.aggregate(pipeline))
        assert info.value.code == code, pipeline
