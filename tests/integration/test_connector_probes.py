"""CDC connectors run unmodified (issue 26): each test replays, with pymongo, the start-up,
snapshot and streaming calls one connector makes (read from its source; file and function
cited in the test's docstring) against one 3-shard in-process cluster, and checks what the
connector checks. ``/work/shared/reference/connectors-and-versions.md`` summarizes them;
``docs/connectors.md`` says how to point each connector at shardsim.

The tests share one cluster (module scope): ``shop.orders`` sharded on ``_id`` with chunks on
all three shards, ``shop.customers`` unsharded. The Kafka connector's test truncates an oplog,
so it runs last.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import pymongo
import pytest
from bson import MaxKey, MinKey, Timestamp
from pymongo.errors import OperationFailure

from shardsim.core import resume_token as rt
from shardsim.testing import ShardedCluster

N_ORDERS = 300
N_CUSTOMERS = 120


@pytest.fixture(scope="module")
def kit() -> Iterator[ShardedCluster]:
    with ShardedCluster(shards=3) as c:
        client = pymongo.MongoClient(c.uri)
        admin = client.admin
        admin.command("enableSharding", "shop")
        admin.command("shardCollection", "shop.orders", key={"_id": 1})
        for mid in (100, 200):
            admin.command("split", "shop.orders", middle={"_id": mid})
        names = c.shard_names
        admin.command("moveChunk", "shop.orders", find={"_id": 150}, to=names[1])
        admin.command("moveChunk", "shop.orders", find={"_id": 250}, to=names[2])
        client.shop.orders.insert_many([{"_id": i, "item": f"sku{i % 7}", "qty": i % 5,
                                         "tags": ["a", "b"][: i % 3]} for i in range(N_ORDERS)])
        client.shop.customers.insert_many([{"_id": i, "name": f"c{i}", "score": i * 1.5}
                                           for i in range(N_CUSTOMERS)])
        client.close()
        yield c


@pytest.fixture
def client(kit: ShardedCluster) -> Iterator[pymongo.MongoClient]:
    c: pymongo.MongoClient = pymongo.MongoClient(kit.uri, serverSelectionTimeoutMS=10000)
    try:
        yield c
    finally:
        c.close()


def _shard_client(kit: ShardedCluster, name: str) -> pymongo.MongoClient:
    return pymongo.MongoClient(kit.shard_address(name), directConnection=True,
                               serverSelectionTimeoutMS=10000)


def _next(stream: Any, n: int, tries: int = 50) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(tries):
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
            if len(out) == n:
                break
    return out


def _token_time(token: dict[str, Any]) -> Timestamp:
    """What Debezium's ``ResumeTokens.getTimestamp`` and Flink CDC's
    ``ResumeTokenUtils.decodeTimestamp`` read: byte 0x82, then a big-endian Timestamp."""
    raw = bytes.fromhex(token["_data"])
    assert raw[0] == 0x82
    return Timestamp(int.from_bytes(raw[1:5], "big"), int.from_bytes(raw[5:9], "big"))


# -- Debezium ---------------------------------------------------------------------------------
def test_debezium(client: pymongo.MongoClient) -> None:
    """Debezium's MongoDB connector (debezium/debezium, ``debezium-connector-mongodb``):

    * ``MongoDbConnector.validateConnection`` / ``connection/MongoDbConnectionContext``: the
      driver sees ``ClusterType.SHARDED`` (``hello.msg == "isdbgrid"``); ``listDatabases``
      nameOnly must list at least one database.
    * ``MongoDbConnectorTask`` reads ``config.shards`` (``_id``) to migrate old offsets.
    * ``MongoUtils.hello``: the reply's ``operationTime`` is the snapshot's start.
    * ``MongoDbSnapshotChangeEventSource``: ``listCollections`` names, then ``find`` with a
      batch size; ``MongoDbIncrementalSnapshotChangeEventSource``: the newest ``_id`` with
      ``sort {_id: -1} limit 1``, then chunks ``{_id: {$gt, $lte}}`` sorted, ``_id`` only.
    * ``ChangeStreamPipelineFactory`` + ``MongoDbStreamingChangeEventSource``: a cluster-wide
      ``watch`` whose pipeline matches the CRUD operation types, re-roots the event under
      ``{namespace: $concat(ns.db, ".", ns.coll), event: $$ROOT}``, filters the namespace by
      regex, re-roots back, caps ``$bsonSize`` of ``fullDocument``; ``updateLookup``,
      ``startAtOperationTime`` = the snapshot's time.
    * ``connection/MongoDbConnection.isValidResumeToken``: opening a stream with
      ``resumeAfter`` must fail on the initial ``aggregate`` for a token that is not in the
      stream; ``ResumeTokens.getTimestamp`` decodes the token's time.
    """
    hello = client.admin.command("hello")
    assert hello["msg"] == "isdbgrid" and isinstance(hello["operationTime"], Timestamp)
    start = hello["operationTime"]
    shards = [d["_id"] for d in client.config.shards.find({}, {"_id": 1})]
    assert len(shards) == 3
    dbs = client.admin.command("listDatabases", nameOnly=True)["databases"]
    assert "shop" in [d["name"] for d in dbs]
    assert {"orders", "customers"} <= set(client.shop.list_collection_names())
    assert len(list(client.shop.orders.find({}).batch_size(64))) == N_ORDERS
    newest = list(client.shop.orders.find().sort("_id", -1).limit(1))[0]["_id"]
    assert newest == N_ORDERS - 1
    chunk = list(client.shop.orders.find({"_id": {"$gt": 90, "$lte": 210}},
                                         {"_id": 1}).sort("_id", 1).limit(1024))
    assert [d["_id"] for d in chunk] == list(range(91, 211))

    pipeline = [
        {"$match": {"operationType": {"$in": ["insert", "update", "replace", "delete"]}}},
        {"$replaceRoot": {"newRoot": {"namespace": {"$concat": ["$ns.db", ".", "$ns.coll"]},
                                      "event": "$$ROOT"}}},
        {"$match": {"namespace": {"$regex": r"^shop\.orders$"}}},
        {"$replaceRoot": {"newRoot": "$event"}},
        {"$match": {"$expr": {"$lte": [{"$bsonSize": "$fullDocument"}, 1024]}}},
    ]
    client.shop.customers.insert_one({"_id": 1000})  # filtered out by the namespace regex
    client.shop.orders.insert_one({"_id": 1000, "item": "new"})
    client.shop.orders.update_one({"_id": 5}, {"$set": {"qty": 99}})
    client.shop.orders.insert_one({"_id": 1001, "big": "x" * 2000})  # over the $bsonSize cap
    with client.watch(pipeline, full_document="updateLookup", start_at_operation_time=start,
                      max_await_time_ms=100) as stream:
        events = _next(stream, 2)
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in events] == [
        ("insert", 1000), ("update", 5)]
    assert events[1]["fullDocument"]["qty"] == 99
    assert _token_time(events[0]["_id"]) == events[0]["clusterTime"]
    with client.watch(resume_after=events[0]["_id"], max_await_time_ms=100) as stream:
        assert stream.try_next() is not None  # a good token opens
    bogus = rt.event_token(Timestamp(start.time, start.inc), bytes(16), "insert",
                           {"_id": "never"})
    with pytest.raises(OperationFailure) as exc:
        client.watch(resume_after=bogus)  # the aggregate itself fails
    assert exc.value.code == 280


# -- Flink CDC --------------------------------------------------------------------------------
def test_flink_cdc(kit: ShardedCluster, client: pymongo.MongoClient) -> None:
    """Flink CDC's mongodb-cdc source (apache/flink-cdc,
    ``flink-connector-mongodb-cdc/.../source``):

    * ``utils/MongoUtils.getCurrentClusterTime``: ``isMaster`` on admin -> ``$clusterTime.
      clusterTime``; ``MongoUtils.getMongoVersion``: ``buildinfo`` (lower case) on ``config``.
    * ``assigners/splitters/MongoDBChunkSplitter``: ``collStats`` -> ``sharded``, ``count``,
      ``size``, ``avgObjSize``; ``ShardedSplitStrategy``: ``config.collections`` by ``_id``
      (``_id, uuid, dropped, key``), ``config.chunks`` by ``ns`` or ``uuid`` sorted by ``min``
      (``min, max, shard``); ``SplitVectorSplitStrategy``: ``splitVector`` (``keyPattern``,
      ``maxChunkSize`` MB) -> ``splitKeys``, and on a command error (mongos has none)
      ``SampleBucketSplitStrategy``: ``$sample`` + ``$bucketAuto {groupBy: "$_id"}``.
    * Streaming (``utils/MongoUtils.getChangeStreamIterable``): ``$addFields {_ns_: $concat}``
      + ``$match`` regex, ``startAfter``; ``utils/ResumeTokenUtils.decodeTimestamp``.
    """
    is_master = client.admin.command("isMaster")
    assert is_master["ismaster"] is True and is_master["msg"] == "isdbgrid"
    assert isinstance(is_master["$clusterTime"]["clusterTime"], Timestamp)
    assert client.config.command("buildinfo")["version"].startswith("8.0")

    n_orders = client.shop.orders.count_documents({})
    stats = client.shop.command("collStats", "orders")
    assert stats["sharded"] is True and stats["count"] == n_orders
    # summed from each shard's integer avgObjSize x count, as mongos does: close to size/count
    assert stats["avgObjSize"] == pytest.approx(stats["size"] / stats["count"], rel=0.05)
    assert stats["nchunks"] == 3 and set(stats["shards"]) == set(kit.shard_names)
    assert sum(s["count"] for s in stats["shards"].values()) == n_orders
    coll = client.config.collections.find_one({"_id": "shop.orders"},
                                               {"_id": 1, "uuid": 1, "dropped": 1, "key": 1})
    assert coll["key"] == {"_id": 1} and not coll.get("dropped")
    chunks = list(client.config.chunks.find(
        {"$or": [{"ns": "shop.orders"}, {"uuid": coll["uuid"]}]},
        {"min": 1, "max": 1, "shard": 1}).sort("min", 1))
    assert len(chunks) == stats["nchunks"]
    assert chunks[0]["min"] == {"_id": MinKey()} and chunks[-1]["max"] == {"_id": MaxKey()}
    assert all(a["max"] == b["min"] for a, b in zip(chunks, chunks[1:]))
    ranged = client.admin.command("dataSize", "shop.orders", keyPattern={"_id": 1},
                                  min={"_id": 90}, max={"_id": 210})  # over all three shards
    assert ranged["numObjects"] == 120 and ranged["size"] > 0 and "millis" in ranged

    plain = client.shop.command("collStats", "customers")
    assert plain["sharded"] is False and plain["primary"] in kit.shard_names
    assert plain["count"] == client.shop.customers.count_documents({})
    with pytest.raises(OperationFailure) as exc:  # mongos has no splitVector: fall back
        client.shop.command("splitVector", "shop.customers", keyPattern={"_id": 1},
                            maxChunkSize=1)
    assert exc.value.code == 59
    buckets = list(client.shop.customers.aggregate(
        [{"$sample": {"size": 60}}, {"$bucketAuto": {"groupBy": "$_id", "buckets": 4}}],
        allowDiskUse=True))
    assert len(buckets) == 4 and sum(b["count"] for b in buckets) == 60
    assert all(a["_id"]["max"] == b["_id"]["min"] for a, b in zip(buckets, buckets[1:]))
    primary = client.config.databases.find_one({"_id": "shop"})["primary"]
    with _shard_client(kit, primary) as shard:  # splitVector where it exists: on the shard
        keys = shard.shop.command("splitVector", "shop.customers", keyPattern={"_id": 1},
                                  maxChunkSizeBytes=1024)["splitKeys"]
    ids = [k["_id"] for k in keys]
    assert ids == sorted(ids) and len(ids) > 2 and 0 < ids[0] and ids[-1] < N_CUSTOMERS

    start = is_master["$clusterTime"]["clusterTime"]
    pipeline = [{"$addFields": {"_ns_": {"$concat": ["$ns.db", ".", "$ns.coll"]}}},
                {"$match": {"_ns_": {"$regex": r"^shop\.customers$"}}}]
    client.shop.customers.insert_one({"_id": 2000})
    with client.shop.watch(pipeline, start_at_operation_time=start,
                           max_await_time_ms=100) as stream:
        (ev,) = _next(stream, 1)
    assert ev["_ns_"] == "shop.customers" and ev["documentKey"] == {"_id": 2000}, (ev, start)
    assert _token_time(ev["_id"]) == ev["clusterTime"]
    client.shop.customers.insert_one({"_id": 2001})
    with client.shop.watch(pipeline, start_after=ev["_id"], max_await_time_ms=100) as stream:
        (after,) = _next(stream, 1)
    assert after["documentKey"] == {"_id": 2001}


def test_stats_of_the_config_database(client: pymongo.MongoClient) -> None:
    """``collStats``/``dbStats``/``dataSize`` of the ``config`` database go to the config
    server, as on mongos (its primary is ``config``); a splitter reading ``config.chunks``'
    size sees it."""
    stats = client.config.command("collStats", "chunks")
    assert stats["sharded"] is False and stats["primary"] == "config"
    assert stats["count"] == client.config.chunks.count_documents({})
    assert list(stats["shards"]) == ["config"]
    assert client.config.command("dbStats")["db"] == "config"
    assert client.admin.command("dataSize", "config.chunks")["numObjects"] == stats["count"]


# -- Airbyte ----------------------------------------------------------------------------------
def test_airbyte(kit: ShardedCluster, client: pymongo.MongoClient) -> None:
    """Airbyte's source-mongodb-v2 (airbytehq/airbyte,
    ``airbyte-integrations/connectors/source-mongodb-v2``):

    * ``MongoDbSource.check``: ``listCollections {authorizedCollections, nameOnly}`` per
      database, then the cluster type must be REPLICA_SET — true of a shard, which is where it
      must point (the router is SHARDED).
    * ``MongoUtil.getCollectionStatistics``: ``$collStats {storageStats: {}, count: {}}``;
      ``MongoUtil.getDiscoveredFields``: ``$sample``, ``$project`` of ``$arrayToObject`` over
      ``$map`` of ``$objectToArray: $$ROOT`` with ``$type``, ``$unwind``, ``$group``.
    * ``cdc/MongoDbResumeTokenHelper.getMostRecentResumeToken``: ``watch`` + ``tryNext`` +
      the postBatchResumeToken; ``cdc/MongoDbCdcInitializer``: the saved token is valid when
      a stream opens with it.
    """
    names = client.shop.command("listCollections", authorizedCollections=True,
                                nameOnly=True)["cursor"]["firstBatch"]
    assert {"orders", "customers"} <= {n["name"] for n in names}
    with _shard_client(kit, kit.shard_names[0]) as shard:
        hello = shard.admin.command("hello")
        assert hello["setName"] == kit.shard_names[0] and hello["isWritablePrimary"]
        assert "msg" not in hello

    per_shard = list(client.shop.orders.aggregate(
        [{"$collStats": {"storageStats": {}, "count": {}}}]))
    assert sorted(d["shard"] for d in per_shard) == sorted(kit.shard_names)
    assert sum(d["count"] for d in per_shard) == client.shop.orders.count_documents({})
    assert all(d["storageStats"]["count"] == d["count"] for d in per_shard)

    discovered = list(client.shop.orders.aggregate([
        {"$sample": {"size": 50}},
        {"$project": {"fields": {"$arrayToObject": {"$map": {
            "input": {"$objectToArray": "$$ROOT"}, "as": "each",
            "in": {"k": "$$each.k", "v": {"$type": "$$each.v"}}}}}}},
        {"$unwind": "$fields"},
        {"$group": {"_id": None, "fields": {"$addToSet": "$fields"}}},
    ], maxTimeMS=10000))
    shapes = discovered[0]["fields"]
    assert {"_id": "int", "item": "string", "qty": "int", "tags": "array"} in shapes

    with client.watch(max_await_time_ms=50) as stream:
        assert stream.try_next() is None
        token = stream.resume_token
    assert rt.is_high_water_mark(rt.decode(token))
    client.shop.orders.insert_one({"_id": 3000})
    with client.watch(resume_after=token, max_await_time_ms=100) as stream:
        (ev,) = _next(stream, 1)
    assert ev["documentKey"] == {"_id": 3000}


# -- Estuary ----------------------------------------------------------------------------------
def test_estuary(kit: ShardedCluster, client: pymongo.MongoClient) -> None:
    """Estuary's source-mongodb (estuary/connectors, ``source-mongodb``):

    * ``oplog.go``: ``serverStatus`` -> ``oplogTruncation.oplogMinRetentionHours`` (absent
      when not set, as on mongod), and ``local.oplog.rs`` ``findOne`` sorted
      ``{$natural: 1}`` at Validate and Pull — on each shard directly (a mongos refuses
      ``local``).
    * ``change_stream.go``: per-database streams with a ``$project`` of the fields it reads,
      a ``$match`` on ``ns``, ``$changeStreamSplitLargeEvent``, ``updateLookup``,
      ``fullDocumentBeforeChange: whenAvailable``; the postBatchResumeToken checkpointed after
      every ``TryNext``, resumed with ``resumeAfter``.
    """
    for name in kit.shard_names:
        with _shard_client(kit, name) as shard:
            status = shard.admin.command("serverStatus")
            trunc = status["oplogTruncation"]
            assert "oplogMinRetentionHours" not in trunc and "truncateCount" in trunc
            first = shard.local.oplog.rs.find_one(sort=[("$natural", 1)])
            assert isinstance(first["ts"], Timestamp)
            assert isinstance(shard.admin.command("hello")["operationTime"], Timestamp)
    pipeline = [{"$project": {"documentKey": 1, "operationType": 1, "fullDocument": 1,
                              "ns": 1, "clusterTime": 1, "fullDocumentBeforeChange": 1,
                              "splitEvent": 1}},
                {"$match": {"ns.coll": {"$in": ["orders"]}}},
                {"$changeStreamSplitLargeEvent": {}}]
    with client.shop.watch(pipeline, full_document="updateLookup",
                           full_document_before_change="whenAvailable",
                           max_await_time_ms=50) as stream:
        assert stream.try_next() is None
        checkpoint = stream.resume_token
    client.shop.orders.insert_many([{"_id": 4000 + i} for i in range(3)])
    seen: list[int] = []
    while len(seen) < 3:
        with client.shop.watch(pipeline, full_document="updateLookup",
                               full_document_before_change="whenAvailable",
                               resume_after=checkpoint, max_await_time_ms=100) as stream:
            ev = stream.try_next()
            if ev is not None:
                assert set(ev) <= {"_id", "documentKey", "operationType", "fullDocument",
                                   "ns", "clusterTime", "fullDocumentBeforeChange"}
                seen.append(ev["documentKey"]["_id"])
            checkpoint = stream.resume_token
    assert seen == [4000, 4001, 4002]


# -- MongoDB Kafka connector (last: it truncates an oplog) -----------------------------------
KAFKA_NOT_VALID = re.compile(r"(resume token|resume point).*(not found|does not exist|"
                             r"invalid resume token|no longer be in the oplog)")


def _kafka_change_stream_not_valid(exc: OperationFailure) -> bool:
    """``StartedMongoSourceTask.changeStreamNotValid``: a code of the list, or the message."""
    return exc.code in (260, 280, 286) or bool(KAFKA_NOT_VALID.search(
        str(exc.details.get("errmsg", "")).lower()))


def test_mongo_kafka(kit: ShardedCluster, client: pymongo.MongoClient) -> None:
    """The MongoDB Kafka connector (mongodb/mongo-kafka, ``src/main/java/com/mongodb/kafka/
    connect``):

    * ``util/ConnectionValidator``: ``connectionStatus {showPrivileges: true}`` ->
      ``authInfo.authenticatedUserPrivileges``, ``rolesInfo {showPrivileges,
      showBuiltinRoles}`` (source needs ``changeStream`` and ``find``);
      ``util/MongoClientHelper``: ``hello.maxWireVersion >= 13``.
    * ``source/MongoCopyDataManager``: before copying, a stream whose ``tryNext`` is empty
      gives the postBatchResumeToken; then per namespace an ``aggregate`` with the
      copy-existing ``$replaceRoot`` and ``allowDiskUse``; the stream later resumes with
      ``startAfter`` that token (``StartedMongoSourceTask.tryCreateCursor``).
    * ``StartedMongoSourceTask.changeStreamNotValid`` / ``tryCreateCursor`` key on codes and on
      mongod's ``errmsg`` text: 260, 280, 286 and 40415 as mongod words them.
    """
    assert client.admin.command("hello")["maxWireVersion"] >= 13
    status = client.admin.command("connectionStatus", showPrivileges=True)["authInfo"]
    assert set(status) >= {"authenticatedUsers", "authenticatedUserRoles",
                           "authenticatedUserPrivileges"}
    roles = client.shop.command({"rolesInfo": "read", "showPrivileges": True,
                                 "showBuiltinRoles": True})["roles"]
    actions = {a for p in roles[0]["privileges"] for a in p["actions"]}
    assert {"changeStream", "find"} <= actions

    with client.shop.orders.watch(max_await_time_ms=50) as stream:
        assert stream.try_next() is None
        before_copy = stream.resume_token
    client.shop.orders.insert_one({"_id": 5000, "during": "copy"})
    copied = list(client.shop.orders.aggregate([{"$replaceRoot": {"newRoot": {
        "_id": {"_id": "$_id", "copyingData": True}, "operationType": "insert",
        "ns": {"db": "shop", "coll": "orders"}, "documentKey": {"_id": "$_id"},
        "fullDocument": "$$ROOT"}}}], allowDiskUse=True))
    assert len(copied) >= N_ORDERS
    assert copied[0]["_id"]["copyingData"] is True
    assert copied[0]["fullDocument"]["_id"] == copied[0]["documentKey"]["_id"]
    with client.shop.orders.watch(start_after=before_copy, max_await_time_ms=100) as stream:
        (ev,) = _next(stream, 1)
    assert ev["documentKey"] == {"_id": 5000}

    with pytest.raises(OperationFailure) as exc:
        client.shop.command("aggregate", "orders", pipeline=[{"$changeStream": {"foo": 1}}],
                            cursor={})
    assert exc.value.code == 40415
    assert exc.value.details["errmsg"] == "BSON field '$changeStream.foo' is an unknown field."

    bogus = rt.event_token(ev["clusterTime"], bytes(16), "insert", {"_id": "never"})
    with pytest.raises(OperationFailure) as exc:
        client.shop.orders.watch(start_after=bogus)
    assert exc.value.code == 280 and _kafka_change_stream_not_valid(exc.value)
    assert exc.value.details["errmsg"].startswith(
        "cannot resume stream; the resume token was not found. {_data: \"")

    client.shop.create_collection("gone")
    with client.shop.gone.watch(max_await_time_ms=100) as stream:
        client.shop.drop_collection("gone")
        evs = _next(stream, 2)
    invalidate = evs[-1]
    assert invalidate["operationType"] == "invalidate"
    with pytest.raises(OperationFailure) as exc:
        client.shop.gone.watch(resume_after=invalidate["_id"])
    assert exc.value.code == 260 and exc.value.details["errmsg"] == (
        "Attempting to resume a change stream using 'resumeAfter' is not allowed from an "
        "invalidate notification")

    owner = client.config.chunks.find_one({"min": {"_id": MinKey()}})["shard"]
    client.shop.orders.insert_one({"_id": 5001})  # the newest entry survives truncation
    kit.truncate_oplog(owner, client.admin.command("ping")["operationTime"])
    with pytest.raises(OperationFailure) as exc:
        client.shop.orders.watch(start_after=before_copy)
    assert exc.value.code == 286 and _kafka_change_stream_not_valid(exc.value)
    assert exc.value.details["errmsg"] == ("Resume of change stream was not possible, as the "
                                           "resume point may no longer be in the oplog.")
