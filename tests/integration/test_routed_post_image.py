"""``fullDocument: "updateLookup"`` finds the document where it lives now (issue 16, item 5):
the shard that wrote the event looks the document up on the shard owning its chunk, as
mongod's ``ShardServerProcessInterface::lookupSingleDocument`` runs a routed find."""

from __future__ import annotations

from typing import Any

import pymongo


def test_update_lookup_follows_a_migrated_chunk(cluster_factory: Any) -> None:
    cluster = cluster_factory(shards=2)
    client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=10000)
    try:
        admin = client.admin
        admin.command("enableSharding", "pl", primaryShard="shard0")
        admin.command("shardCollection", "pl.c", key={"k": 1})
        coll = client.pl.c
        coll.insert_many([{"_id": i, "k": i, "v": 0} for i in range(10)])
        with coll.watch(full_document="updateLookup", max_await_time_ms=100) as stream:
            for i in range(10):
                coll.update_one({"k": i}, {"$set": {"v": 1}})
            # Every document moves to shard1 before the stream reads the events written on
            # shard0: the look-up must follow the chunk.
            admin.command("moveChunk", "pl.c", find={"k": 0}, to="shard1")
            got = []
            for _ in range(100):
                ev = stream.try_next()
                if ev is not None:
                    got.append(ev)
                if len(got) == 10:
                    break
        assert [e["documentKey"]["_id"] for e in got] == list(range(10))
        assert [e["fullDocument"] for e in got] == [{"_id": i, "k": i, "v": 1} for i in range(10)]
        s0 = pymongo.MongoClient(f"mongodb://127.0.0.1:{cluster.shard('shard0').port}/",
                                 directConnection=True)
        try:
            assert s0.pl.c.count_documents({}) == 0  # really gone from the shard of the events
        finally:
            s0.close()
    finally:
        client.close()
