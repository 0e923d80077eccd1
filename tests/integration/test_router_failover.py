"""A shard that goes down and comes back; shards added later; removeShard. Each test starts
its own cluster (``cluster_factory``) because it changes the topology."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure, PyMongoError, WriteError

pytestmark = pytest.mark.timeout(120)

NETWORK_CODES = {6, 89, 9001}
# A shard whose only member is down: the command that finds out gets the network error; once
# the router's monitor of the shard knows it, mongos waits defaultFindReplicaSetHostTimeoutMS
# for a primary and fails with FailedToSatisfyReadPreference (133) "Could not find host
# matching read preference { mode: "primary" } for set shard1" (RemoteCommandTargeterRS).
UNREACHABLE_CODES = NETWORK_CODES | {133}


def test_killed_shard_fails_fast_with_write_error_and_recovers(cluster_factory) -> None:
    cluster = cluster_factory(shards=2, durable=True)
    client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=10000)
    try:
        client.admin.command("shardCollection", "fo.c", key={"_id": "hashed"})
        coll = client.fo.c
        coll.insert_many([{"_id": i} for i in range(1000)])
        # how long a command waits for the dead shard's primary (mongos: 15 s)
        client.admin.command("setParameter", 1, defaultFindReplicaSetHostTimeoutMS=1000)
        victim = cluster.shard("shard1")
        victim.kill()

        # A write to the dead shard: mongos reports a child batch without a reply as a write
        # error with the network code ("Write results unavailable from <shard>",
        # batch_write_exec.cpp processErrorResponseFromLocal), never a top-level error; write
        # errors carry no RetryableWriteError label (the driver does not retry them).
        target = next(i for i in range(1000, 2000)
                      if _owner(client, "fo.c", {"_id": i}) == "shard1")
        with pytest.raises(WriteError) as info:
            coll.insert_one({"_id": target})
        assert info.value.code in UNREACHABLE_CODES
        assert ("Write results unavailable from shard1 :: caused by" in str(info.value) or
                "Write results unavailable from failing to target a host in the shard shard1 "
                ':: caused by :: Could not find host matching read preference { mode: "primary" '
                "} for set shard1" in str(info.value))
        assert not info.value.has_error_label("RetryableWriteError")
        # A read that needs every shard fails the same way instead of hanging.
        with pytest.raises(OperationFailure) as info:
            coll.count_documents({})
        assert info.value.code in UNREACHABLE_CODES
        # The router itself keeps answering.
        assert client.admin.command("ping")["ok"] == 1.0

        cluster.restart(victim)  # same port, same --dbpath
        assert coll.count_documents({}) == 1000
        coll.insert_one({"_id": target})
        assert coll.count_documents({}) == 1001
    finally:
        client.close()


def _owner(client: pymongo.MongoClient, ns: str, doc: dict) -> str:
    from shardsim.core.shard_key import Chunk, ChunkMap, KeyPattern
    entry = client.config.collections.find_one({"_id": ns})
    pattern = KeyPattern(entry["key"])
    cmap = ChunkMap(pattern, [Chunk(pattern.bound_to_key(c["min"]), pattern.bound_to_key(c["max"]),
                                    c["shard"]) for c in client.config.chunks.find({"uuid": entry["uuid"]})])
    return cmap.shard_for_doc(doc)


def test_add_shard_later_move_chunk_and_remove_shard(cluster_factory) -> None:
    cluster = cluster_factory(shards=1)
    client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=10000)
    try:
        client.admin.command("shardCollection", "grow.c", key={"x": 1})
        client.admin.command("split", "grow.c", middle={"x": 50})
        client.grow.c.insert_many([{"_id": i, "x": i} for i in range(100)])
        name = cluster.add_shard()
        assert name == "shard1"
        shards = client.admin.command("listShards")["shards"]
        assert [s["_id"] for s in shards] == ["shard0", "shard1"]
        client.admin.command("moveChunk", "grow.c", find={"x": 60}, to=name)
        with pymongo.MongoClient(f"mongodb://{cluster.shard(name).address}/?directConnection=true") as c:
            assert sorted(d["x"] for d in c.grow.c.find()) == list(range(50, 100))
            # recipient's clone inserts are internal to the migration
            clone = list(c.local["oplog.rs"].find({"ns": "grow.c", "op": "i"}))
            assert len(clone) == 50 and all(e.get("fromMigrate") for e in clone)
        assert client.grow.c.count_documents({}) == 100

        # removeShard while the shard owns chunks: draining starts, the shard stays (the
        # balancer is stopped, so this test moves the chunk itself; test_balancer.py drains).
        client.admin.command("balancerStop")
        reply = client.admin.command("removeShard", name)
        assert reply["state"] == "started"
        reply = client.admin.command("removeShard", name)
        assert reply["state"] == "ongoing" and reply["remaining"]["chunks"] == 1
        client.admin.command("moveChunk", "grow.c", find={"x": 60}, to="shard0")
        reply = client.admin.command("removeShard", name)
        assert reply["state"] == "completed"
        assert [s["_id"] for s in client.admin.command("listShards")["shards"]] == ["shard0"]
        with pytest.raises(PyMongoError) as info:
            client.admin.command("removeShard", "shard0")
        assert getattr(info.value, "code", None) == 20
        assert client.grow.c.count_documents({}) == 100
    finally:
        client.close()


def test_config_server_and_router_restarts(cluster_factory) -> None:
    cluster = cluster_factory(shards=2, durable=True)
    client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=10000)
    try:
        client.admin.command("shardCollection", "rs.c", key={"_id": "hashed"})
        client.rs.c.insert_many([{"_id": i} for i in range(100)])
        cluster.config.kill()
        # The router keeps routing with its cached catalog ...
        client.rs.c.insert_many([{"_id": i} for i in range(100, 200)])
        assert client.rs.c.count_documents({}) == 200
        # ... while catalog commands fail with a network error.
        with pytest.raises(OperationFailure) as info:
            client.admin.command("listShards")
        assert info.value.code in NETWORK_CODES
        cluster.restart(cluster.config)  # durable catalog comes back
        assert [s["_id"] for s in client.admin.command("listShards")["shards"]] == ["shard0", "shard1"]
        cluster.router.kill()
        cluster.restart(cluster.router)  # a new router loads the catalog at start
        client.rs.c.insert_one({"_id": 200})
        assert client.rs.c.count_documents({}) == 201
        entry = client.config.collections.find_one({"_id": "rs.c"})
        assert entry["key"] == {"_id": "hashed"}
    finally:
        client.close()
