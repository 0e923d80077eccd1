"""The cluster through its router, on the shared 3-shard ``cluster`` (tests/conftest.py):
mongos identity, sharding commands, targeted writes, merged reads, DDL on every owner, the
oplog entries of shardCollection and migrations, cluster time."""

from __future__ import annotations

import asyncio
from typing import Any

import pymongo
import pytest
from bson import MaxKey, MinKey
from pymongo.errors import BulkWriteError, OperationFailure

from shardsim.core.shard_key import ChunkMap, Chunk, KeyPattern
from shardsim.core.client import Connection
from shardsim.tools.launcher import Cluster

pytestmark = pytest.mark.timeout(120)


def direct(proc: Any) -> pymongo.MongoClient:
    return pymongo.MongoClient(f"mongodb://{proc.address}/?directConnection=true",
                               serverSelectionTimeoutMS=5000)


def chunk_map(client: pymongo.MongoClient, ns: str) -> ChunkMap:
    """The collection's chunks as the config server has them (read through the router)."""
    entry = client.config.collections.find_one({"_id": ns})
    assert entry is not None, f"{ns} is not in config.collections"
    pattern = KeyPattern(entry["key"])
    chunks = [Chunk(pattern.bound_to_key(c["min"]), pattern.bound_to_key(c["max"]), c["shard"])
              for c in client.config.chunks.find({"uuid": entry["uuid"]})]
    return ChunkMap(pattern, chunks)


def docs_by_shard(cluster: Cluster, db: str, coll: str) -> dict[Any, str]:
    """``_id`` -> the shard holding it, reading every shard directly."""
    where: dict[Any, str] = {}
    for proc in cluster.shards:
        with direct(proc) as c:
            for d in c[db][coll].find({}, {"_id": 1}):
                assert d["_id"] not in where, f"{d['_id']} is on {where[d['_id']]} and {proc.name}"
                where[d["_id"]] = proc.name
    return where


def oplog(proc: Any, query: dict[str, Any]) -> list[dict[str, Any]]:
    with direct(proc) as c:
        return list(c.local["oplog.rs"].find(query))


def test_router_identifies_as_mongos(router_client: pymongo.MongoClient) -> None:
    hello = router_client.admin.command("hello")
    assert hello["msg"] == "isdbgrid"
    assert "setName" not in hello and "hosts" not in hello
    assert hello["maxWireVersion"] == 25
    assert router_client.admin.command("buildInfo")["version"].startswith("8.0.")
    params = router_client.admin.command({"getParameter": "*"})
    assert params["enableTestCommands"] is True
    assert router_client.admin.command("serverStatus")["process"] == "mongos"
    opts = router_client.admin.command("getCmdLineOpts")
    assert "configDB" in opts["parsed"]["sharding"]
    assert router_client.admin.command("ping")["ok"] == 1.0
    router_client.admin.command("endSessions", [])


def test_list_shards_and_config_shards_in_config_oplog(cluster: Cluster,
                                                       router_client: pymongo.MongoClient) -> None:
    shards = router_client.admin.command("listShards")["shards"]
    assert [s["_id"] for s in shards] == ["shard0", "shard1", "shard2"]
    assert {s["host"].split("/", 1)[1] for s in shards} == {p.address for p in cluster.shards}
    # The catalog lives in ordinary collections on the config server: addShard was an insert
    # into config.shards in its oplog (what a change stream on config.shards sees).
    inserts = oplog(cluster.config, {"ns": "config.shards", "op": "i"})
    assert sorted(e["o"]["_id"] for e in inserts) == ["shard0", "shard1", "shard2"]


def test_hashed_collection_10000_docs_each_on_its_chunks_shard(
        cluster: Cluster, router_client: pymongo.MongoClient) -> None:
    db = router_client.hashed_db
    router_client.admin.command("shardCollection", "hashed_db.docs", key={"k": "hashed"})
    cmap = chunk_map(router_client, "hashed_db.docs")
    assert len(cmap.chunks) == 6 and set(cmap.shards()) == {"shard0", "shard1", "shard2"}
    docs = [{"_id": i, "k": f"key-{i}", "v": i % 7} for i in range(10_000)]
    db.docs.insert_many(docs)
    where = docs_by_shard(cluster, "hashed_db", "docs")
    assert len(where) == 10_000
    for d in docs:
        assert where[d["_id"]] == cmap.shard_for_doc(d)
    assert len(set(where.values())) == 3
    # Reads through the router are the union of the shards.
    assert db.docs.count_documents({}) == 10_000
    assert db.docs.count_documents({"v": 3}) == sum(1 for d in docs if d["v"] == 3)
    assert len(list(db.docs.find({}, batch_size=500))) == 10_000
    got = list(db.docs.find({"v": {"$lt": 2}}).sort("_id", -1).skip(5).limit(20))
    want = sorted((d for d in docs if d["v"] < 2), key=lambda d: -d["_id"])[5:25]
    assert got == want
    agg = list(db.docs.aggregate([{"$match": {"v": {"$gte": 5}}},
                                  {"$group": {"_id": "$v", "n": {"$sum": 1}}},
                                  {"$sort": {"_id": 1}}]))
    assert agg == [{"_id": v, "n": sum(1 for d in docs if d["v"] == v)} for v in (5, 6)]
    assert sorted(db.docs.distinct("v")) == list(range(7))
    # A targeted read (full shard key) is answered by the owning shard only.
    assert db.docs.find_one({"k": "key-42"})["_id"] == 42


def test_ranged_collection_split_move_and_targeting(cluster: Cluster,
                                                    router_client: pymongo.MongoClient) -> None:
    admin = router_client.admin
    admin.command("enableSharding", "ranged_db", primaryShard="shard0")
    admin.command("shardCollection", "ranged_db.docs", key={"x": 1})
    admin.command("split", "ranged_db.docs", middle={"x": 3000})
    admin.command("split", "ranged_db.docs", middle={"x": 6000})
    admin.command("moveChunk", "ranged_db.docs", find={"x": 4000}, to="shard1")
    admin.command("moveChunk", "ranged_db.docs", find={"x": 9000}, to="shard2")
    cmap = chunk_map(router_client, "ranged_db.docs")
    assert [(c.min, c.max, c.shard) for c in cmap.chunks] == [
        ((MinKey(),), (3000,), "shard0"), ((3000,), (6000,), "shard1"),
        ((6000,), (MaxKey(),), "shard2")]
    coll = router_client.ranged_db.docs
    coll.insert_many([{"_id": i, "x": i} for i in range(10_000)], ordered=False)
    where = docs_by_shard(cluster, "ranged_db", "docs")
    assert all(where[i] == cmap.find((i,)).shard for i in range(10_000))
    # Single-document writes go to the owning shard; multi writes are broadcast.
    assert coll.update_one({"x": 4500}, {"$set": {"tag": "a"}}).modified_count == 1
    assert coll.update_many({"x": {"$in": list(range(0, 10_000, 1000))}},
                            {"$set": {"tag": "m"}}).modified_count == 10
    assert coll.count_documents({"tag": "m"}) == 10
    assert coll.replace_one({"x": 7}, {"x": 7, "r": True}).modified_count == 1
    assert coll.find_one({"x": 7}) == {"_id": 7, "x": 7, "r": True}
    res = coll.update_one({"x": 20_000}, {"$set": {"u": 1}}, upsert=True)
    assert res.upserted_id is not None and where.get(res.upserted_id) is None
    # deleteOne without the shard key finds the shard holding a match.
    assert coll.delete_one({"_id": 5555}).deleted_count == 1
    assert coll.delete_many({"x": {"$gte": 9990}}).deleted_count == 11
    assert coll.count_documents({}) == 10_000 + 1 - 1 - 11
    doc = coll.find_one_and_update({"x": 100}, {"$inc": {"n": 1}},
                                   return_document=pymongo.ReturnDocument.AFTER)
    assert doc["n"] == 1
    # Migration oplog entries: the recipient (no chunk before) got migrateChunkToNewShard on
    # the donor; clone inserts and donor deletes are fromMigrate.
    shard0 = cluster.shard("shard0")
    noops = oplog(shard0, {"op": "n", "o2.migrateChunkToNewShard": "ranged_db.docs"})
    assert {(e["o2"]["fromShardId"], e["o2"]["toShardId"]) for e in noops} == {
        ("shard0", "shard1"), ("shard0", "shard2")}
    assert all(e["ui"] == router_client.config.collections.find_one(
        {"_id": "ranged_db.docs"})["uuid"] for e in noops)


def test_shard_collection_writes_noop_on_primary_and_same_uuid_everywhere(
        cluster: Cluster, router_client: pymongo.MongoClient) -> None:
    router_client.admin.command("enableSharding", "sc_db", primaryShard="shard1")
    router_client.sc_db.create_collection("c")
    router_client.admin.command("shardCollection", "sc_db.c", key={"_id": "hashed"})
    entry = router_client.config.collections.find_one({"_id": "sc_db.c"})
    uuids = []
    for proc in cluster.shards:
        with direct(proc) as c:
            infos = list(c.sc_db.list_collections(filter={"name": "c"}))
            uuids.append(infos[0]["info"]["uuid"])
    assert all(u == entry["uuid"] for u in uuids)
    primary = cluster.shard("shard1")
    noop = oplog(primary, {"op": "n", "o2.shardCollection": "sc_db.c"})
    assert len(noop) == 1
    assert noop[0]["o"] == {"msg": {"shardCollection": "sc_db.c"}}
    assert noop[0]["o2"]["shardKey"] == {"_id": "hashed"} and noop[0]["ui"] == entry["uuid"]
    # The create on the other shards is internal (fromMigrate), only the primary's is visible.
    for proc in cluster.shards:
        creates = oplog(proc, {"op": "c", "ns": "sc_db.$cmd", "o.create": "c"})
        assert len(creates) == 1
        assert creates[0].get("fromMigrate", False) == (proc.name != "shard1")


def test_ddl_reaches_every_owner(cluster: Cluster, router_client: pymongo.MongoClient) -> None:
    router_client.admin.command("shardCollection", "ddl_db.c", key={"_id": "hashed"})
    coll = router_client.ddl_db.c
    coll.insert_many([{"_id": i, "a": i} for i in range(100)])
    coll.create_index("a")
    for proc in cluster.shards:
        with direct(proc) as c:
            assert "a_1" in c.ddl_db.c.index_information()
    coll.drop_index("a_1")
    for proc in cluster.shards:
        with direct(proc) as c:
            assert "a_1" not in c.ddl_db.c.index_information()
    coll.drop()
    assert router_client.config.collections.find_one({"_id": "ddl_db.c"}) is None
    for proc in cluster.shards:
        with direct(proc) as c:
            assert "c" not in c.ddl_db.list_collection_names()
    # Only one shard's drop entry is visible to change streams.
    visible = [e for p in cluster.shards
               for e in oplog(p, {"op": "c", "ns": "ddl_db.$cmd", "o.drop": "c"})
               if not e.get("fromMigrate")]
    assert len(visible) == 1


def test_unsharded_collection_lives_on_primary_and_rename(cluster: Cluster,
                                                          router_client: pymongo.MongoClient) -> None:
    router_client.admin.command("enableSharding", "plain_db", primaryShard="shard2")
    router_client.plain_db.a.insert_many([{"_id": i} for i in range(10)])
    assert docs_by_shard(cluster, "plain_db", "a") == {i: "shard2" for i in range(10)}
    router_client.admin.command("renameCollection", "plain_db.a", to="plain_db.b")
    assert router_client.plain_db.list_collection_names() == ["b"]
    assert router_client.plain_db.b.count_documents({}) == 10
    assert "plain_db" in router_client.list_database_names()
    router_client.drop_database("plain_db")
    assert "plain_db" not in router_client.list_database_names()


def test_bulk_write_errors_carry_client_indexes(router_client: pymongo.MongoClient) -> None:
    router_client.admin.command("shardCollection", "bulk_db.c", key={"_id": "hashed"})
    coll = router_client.bulk_db.c
    coll.insert_many([{"_id": i} for i in range(10)])
    with pytest.raises(BulkWriteError) as info:
        coll.insert_many([{"_id": 100}, {"_id": 3}, {"_id": 101}])
    details = info.value.details
    assert details["nInserted"] == 1
    assert [(e["index"], e["code"]) for e in details["writeErrors"]] == [(1, 11000)]
    with pytest.raises(BulkWriteError) as info:
        coll.insert_many([{"_id": 200}, {"_id": 4}, {"_id": 201}, {"_id": 5}, {"_id": 202}],
                         ordered=False)
    details = info.value.details
    assert details["nInserted"] == 3
    assert [(e["index"], e["code"]) for e in details["writeErrors"]] == [(1, 11000), (3, 11000)]
    assert coll.count_documents({}) == 10 + 1 + 3


def test_retryable_write_is_not_applied_twice(cluster: Cluster,
                                              router_client: pymongo.MongoClient) -> None:
    router_client.admin.command("shardCollection", "retry_db.c", key={"_id": "hashed"})
    import uuid
    from bson import Binary
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
    cmd = {"insert": "c", "documents": [{"_id": i} for i in range(20)], "ordered": True,
           "lsid": lsid, "txnNumber": 1}
    upd = {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}],
           "lsid": lsid, "txnNumber": 2}

    async def run() -> list[dict[str, Any]]:
        host, port = cluster.router.host, cluster.router.port
        conn = Connection(host, port)
        try:
            return [await conn.command("retry_db", cmd), await conn.command("retry_db", cmd),
                    await conn.command("retry_db", upd), await conn.command("retry_db", upd)]
        finally:
            conn.close()

    first, again, u1, u2 = asyncio.run(run())
    assert first["n"] == 20 and again["n"] == 20 and "writeErrors" not in again
    assert u1["nModified"] == 1 and u2["nModified"] == 1
    assert router_client.retry_db.c.count_documents({}) == 20
    assert router_client.retry_db.c.find_one({"_id": 1})["n"] == 1


def test_single_shard_transaction(router_client: pymongo.MongoClient) -> None:
    router_client.admin.command("enableSharding", "txn_db")
    coll = router_client.txn_db.c
    coll.insert_one({"_id": 0})
    with router_client.start_session() as s:
        with s.start_transaction():
            coll.insert_one({"_id": 1}, session=s)
            coll.update_one({"_id": 0}, {"$set": {"t": 1}}, session=s)
        with pytest.raises(OperationFailure):
            with s.start_transaction():
                coll.insert_one({"_id": 2}, session=s)
                raise OperationFailure("abort me")
    assert sorted(d["_id"] for d in coll.find()) == [0, 1]
    assert coll.find_one({"_id": 0})["t"] == 1


def test_operation_time_not_behind_last_write(router_client: pymongo.MongoClient) -> None:
    db = router_client.optime_db
    with router_client.start_session(causal_consistency=True) as s:
        db.c.insert_one({"x": 1}, session=s)
        write_time = s.operation_time
        ping_time = router_client.admin.command("ping")["operationTime"]
    assert write_time is not None and ping_time >= write_time


def test_shard_collection_errors(router_client: pymongo.MongoClient) -> None:
    router_client.admin.command("shardCollection", "err_db.c", key={"a": 1})
    # same key again: ok; another key: AlreadyInitialized
    router_client.admin.command("shardCollection", "err_db.c", key={"a": 1})
    with pytest.raises(OperationFailure) as info:
        router_client.admin.command("shardCollection", "err_db.c", key={"b": 1})
    assert info.value.code == 23
    with pytest.raises(OperationFailure) as info:
        router_client.admin.command("shardCollection", "err_db.d", key={"a": "hashed"}, unique=True)
    assert info.value.code == 2
    with pytest.raises(OperationFailure) as info:
        router_client.admin.command("moveChunk", "err_db.c", find={"a": 1}, to="nope")
    assert info.value.code == 70


def test_writes_during_migrations_are_not_lost(cluster: Cluster,
                                               router_client: pymongo.MongoClient) -> None:
    import threading
    admin = router_client.admin
    admin.command("enableSharding", "mig_db", primaryShard="shard0")
    admin.command("shardCollection", "mig_db.c", key={"x": 1})
    admin.command("split", "mig_db.c", middle={"x": 0})
    coll = router_client.mig_db.c
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for b in range(40):
                coll.insert_many([{"x": (i if i % 2 else -i), "b": b} for i in range(b * 50 + 1, b * 50 + 51)])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    for to in ("shard1", "shard2", "shard0", "shard1"):
        admin.command("moveChunk", "mig_db.c", find={"x": 1}, to=to)
    t.join(60)
    assert not errors
    assert coll.count_documents({}) == 2000
    cmap = chunk_map(router_client, "mig_db.c")
    where = docs_by_shard(cluster, "mig_db", "c")
    assert len(where) == 2000
    for d in coll.find():
        assert where[d["_id"]] == cmap.shard_for_doc(d)


def test_move_primary_moves_unsharded_collections_quietly(
        cluster: Cluster, router_client: pymongo.MongoClient) -> None:
    admin = router_client.admin
    admin.command("enableSharding", "mp_db", primaryShard="shard0")
    db = router_client.mp_db
    db.a.insert_many([{"_id": i, "v": i} for i in range(100)])
    db.a.create_index("v")
    admin.command("shardCollection", "mp_db.s", key={"_id": "hashed"})
    uuid_a = next(db.list_collections(filter={"name": "a"}))["info"]["uuid"]
    admin.command("movePrimary", "mp_db", to="shard1")
    assert router_client.config.databases.find_one({"_id": "mp_db"})["primary"] == "shard1"
    assert docs_by_shard(cluster, "mp_db", "a") == {i: "shard1" for i in range(100)}
    with direct(cluster.shard("shard1")) as c:
        assert next(c.mp_db.list_collections(filter={"name": "a"}))["info"]["uuid"] == uuid_a
        assert "v_1" in c.mp_db.a.index_information()
        assert "s" in c.mp_db.list_collection_names()
    db.a.insert_one({"_id": 100})
    assert docs_by_shard(cluster, "mp_db", "a")[100] == "shard1"
    assert db.a.count_documents({}) == 101
    # Nothing of the move is visible to change streams.
    for proc in cluster.shards[:2]:
        moved = oplog(proc, {"ns": {"$in": ["mp_db.a", "mp_db.$cmd"]}, "$or": [
            {"op": "i", "o._id": {"$lt": 100}, "fromMigrate": True},
            {"op": "c", "o.drop": "a"}]})
        assert all(e.get("fromMigrate") for e in moved) and moved
