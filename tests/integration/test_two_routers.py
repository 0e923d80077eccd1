"""Two routers on one cluster (issue 16, item 7; the compose cluster runs the same pair as
``router``/``router2``): a change stream opened on one router resumes on the other, and a
database created through one mongos is read at once through the other (the second router
reloads its catalog on the miss instead of answering "empty")."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest

pytestmark = pytest.mark.timeout(120)


def test_stream_opened_on_one_router_resumes_on_the_other(cluster_factory: Any) -> None:
    cluster = cluster_factory(shards=2, routers=2)
    a, b = (pymongo.MongoClient(u, serverSelectionTimeoutMS=10000) for u in cluster.router_uris)
    try:
        a.admin.command("enableSharding", "tr", primaryShard="shard0")
        a.admin.command("shardCollection", "tr.c", key={"x": 1})
        a.admin.command("split", "tr.c", middle={"x": 0})
        a.admin.command("moveChunk", "tr.c", find={"x": 0}, to="shard1")
        with a.tr.c.watch(max_await_time_ms=200) as stream:
            a.tr.c.insert_many([{"x": i} for i in range(-3, 3)])
            first = [stream.next() for _ in range(3)]
            token = stream.resume_token
        b.tr.c.insert_many([{"x": i} for i in range(3, 6)])
        with b.tr.c.watch(resume_after=token, max_await_time_ms=200) as resumed:
            rest = [resumed.next() for _ in range(6)]
        seen = [e["fullDocument"]["x"] for e in first + rest]
        assert sorted(seen) == list(range(-3, 6))
        tokens = [e["_id"]["_data"] for e in first + rest]
        assert all(p < q for p, q in zip(tokens, tokens[1:]))
    finally:
        a.close()
        b.close()


def test_database_made_on_one_router_is_read_on_the_other(cluster_factory: Any) -> None:
    cluster = cluster_factory(shards=2, routers=2)
    hosts = cluster.routers_uri.split("//", 1)[1].rstrip("/").split(",")
    assert len(hosts) == 2 and len(set(hosts)) == 2
    a = pymongo.MongoClient(f"mongodb://{hosts[0]}/", directConnection=True)
    b = pymongo.MongoClient(f"mongodb://{hosts[1]}/", directConnection=True)
    try:
        assert b.admin.command("hello")["msg"] == "isdbgrid"
        a.fresh_db.c.insert_many([{"_id": i} for i in range(5)])
        assert b.fresh_db.c.count_documents({}) == 5
        assert [d["_id"] for d in b.fresh_db.c.find().sort("_id", 1)] == [0, 1, 2, 3, 4]
        assert len(list(b.fresh_db.c.aggregate([{"$match": {}}]))) == 5
    finally:
        a.close()
        b.close()


def test_router_that_knows_no_shard_reloads_before_answering() -> None:
    """A router whose catalog was loaded before the shards were added (and not refreshed
    since) reloads it before routing, as ``ShardRegistry::getAllShardIds`` reloads an empty
    registry: a delete on a new database answers ``n: 0`` instead of ShardNotFound (70)."""
    from shardsim.testing import ShardedCluster

    with ShardedCluster(shards=2, routers=2) as c:
        router = c.cluster.node("router1")

        async def forget_shards() -> None:  # on the cluster's loop: no refresh between
            router._refresher.cancel()
            router.catalog._shards = {}
            router.catalog._shard_docs = []
        c._call(forget_shards())
        client = pymongo.MongoClient(c.uris[1])
        try:
            assert client.fresh.c.delete_many({}).deleted_count == 0
            assert client.fresh2.c.find_one() is None
        finally:
            client.close()
        assert router.catalog.shards()


def test_delete_through_a_router_that_has_not_seen_the_database() -> None:
    """A database made through one router (primary shard1) and a deleteMany through another
    that has not refreshed since: it reloads its catalog on the miss and deletes on the
    database's primary (was: the first shard, deleting nothing)."""
    from shardsim.testing import ShardedCluster

    with ShardedCluster(shards=2, routers=2) as c:
        router = c.cluster.node("router1")

        async def stop_refreshing() -> None:
            router._refresher.cancel()
        c._call(stop_refreshing())
        a, b = pymongo.MongoClient(c.uris[0]), pymongo.MongoClient(c.uris[1])
        try:
            a.admin.command("enableSharding", "seen", primaryShard="shard1")
            a.seen.c.insert_many([{"_id": 1}, {"_id": 2}])
            assert b.seen.c.delete_many({}).deleted_count == 2
            assert a.seen.c.count_documents({}) == 0
        finally:
            a.close()
            b.close()
