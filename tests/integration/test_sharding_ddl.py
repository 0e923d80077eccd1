"""The 8.0 sharding DDL through the router (router/commands/sharding_ddl.py, configsvr
resharding and metadata commands): replies, error codes, change events with and without
showExpandedEvents, and reshardCollection under concurrent writes."""

from __future__ import annotations

import threading
import time
from typing import Any

import pymongo
import pytest
from bson import MaxKey, MinKey
from pymongo.errors import OperationFailure

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ddl_cluster():
    from shardsim.tools.launcher import Cluster
    c = Cluster(shards=3)
    c.start()
    try:
        client = pymongo.MongoClient(c.router_uri)
        client.admin.command("balancerStop")  # chunk placement is the test's own here
        client.close()
        yield c
    finally:
        c.stop()


@pytest.fixture
def client(ddl_cluster):
    cl = pymongo.MongoClient(ddl_cluster.router_uri)
    yield cl
    cl.close()


def _code(fn: Any, *a: Any, **kw: Any) -> int:
    with pytest.raises(OperationFailure) as e:
        fn(*a, **kw)
    return e.value.code


def _drain(stream: Any, want: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(out) < want:
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
    for _ in range(3):
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
    return out


def test_reshard_collection_moves_data_and_changes_uuid(client) -> None:
    admin = client.admin
    admin.command("enableSharding", "rs1", primaryShard="shard0")
    admin.command("shardCollection", "rs1.c", key={"a": 1})
    coll = client.rs1.c
    coll.insert_many([{"_id": i, "a": i, "b": 999 - i} for i in range(1000)])
    old_uuid = client.config.collections.find_one({"_id": "rs1.c"})["uuid"]
    with coll.watch(show_expanded_events=True, max_await_time_ms=200) as expanded, \
            coll.watch(max_await_time_ms=200) as plain:
        assert admin.command("reshardCollection", "rs1.c", key={"b": 1})["ok"] == 1
        coll.insert_one({"_id": "after", "a": -1, "b": -1})
        ev_exp = _drain(expanded, 2)
        ev_plain = _drain(plain, 1)
    entry = client.config.collections.find_one({"_id": "rs1.c"})
    assert entry["key"] == {"b": 1} and entry["uuid"] != old_uuid
    shards = {c["shard"] for c in client.config.chunks.find({"uuid": entry["uuid"]})}
    assert shards == {"shard0", "shard1", "shard2"}
    assert client.config.chunks.count_documents({"uuid": old_uuid}) == 0
    assert coll.count_documents({}) == 1001
    assert coll.find_one({"_id": 7}) == {"_id": 7, "a": 7, "b": 992}
    assert [e["operationType"] for e in ev_exp] == ["reshardCollection", "insert"]
    desc = ev_exp[0]["operationDescription"]
    assert desc["reshardUUID"] == entry["uuid"] and desc["shardKey"] == {"b": 1}
    assert desc["oldShardKey"] == {"a": 1}
    assert ev_exp[0]["collectionUUID"] == old_uuid
    assert [e["operationType"] for e in ev_plain] == ["insert"]
    assert ev_plain[0]["documentKey"] == {"b": -1, "_id": "after"}
    # same key again: nothing to do
    admin.command("reshardCollection", "rs1.c", key={"b": 1})
    assert client.config.collections.find_one({"_id": "rs1.c"})["uuid"] == entry["uuid"]
    assert admin.command("checkMetadataConsistency")["cursor"]["firstBatch"] == []


def test_reshard_collection_under_concurrent_writes(client) -> None:
    admin = client.admin
    admin.command("enableSharding", "rs2", primaryShard="shard1")
    admin.command("shardCollection", "rs2.c", key={"a": 1})
    coll = client.rs2.c
    coll.insert_many([{"_id": i, "a": i, "b": -i} for i in range(2000)])
    stop = threading.Event()
    written: list[int] = []

    def writer() -> None:
        wc = pymongo.MongoClient(client.address[0], client.address[1], retryWrites=True)
        i = 10000
        while not stop.is_set():
            wc.rs2.c.insert_one({"_id": i, "a": i, "b": (i * 7919) % 2000 - 2000})
            wc.rs2.c.update_one({"_id": i - 9000}, {"$inc": {"n": 1}}) if i < 11000 else None
            written.append(i)
            i += 1
        wc.close()

    with coll.watch(max_await_time_ms=200) as stream:
        t = threading.Thread(target=writer)
        t.start()
        time.sleep(0.3)
        admin.command("reshardCollection", "rs2.c", key={"b": 1})
        time.sleep(0.3)
        stop.set()
        t.join(30)
        n_updates = sum(1 for i in written if i < 11000)
        events = _drain(stream, len(written) + n_updates, 30)
    assert len(written) > 10
    ids = set(range(2000)) | set(written)
    assert {d["_id"] for d in coll.find({}, {"_id": 1})} == ids
    assert coll.count_documents({}) == len(ids)
    inserts = [e["documentKey"]["_id"] for e in events if e["operationType"] == "insert"]
    assert sorted(inserts) == sorted(written)  # each write exactly once
    assert sum(1 for e in events if e["operationType"] == "update") == n_updates
    assert {e["operationType"] for e in events} <= {"insert", "update"}
    tokens = [e["_id"]["_data"] for e in events]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    for i in written:
        if i < 11000:
            assert coll.find_one({"_id": i - 9000})["n"] == 1
    # the writes after the commit went to every new owner, and the stream saw them
    entry = client.config.collections.find_one({"_id": "rs2.c"})
    assert len({c["shard"] for c in client.config.chunks.find({"uuid": entry["uuid"]})}) == 3


def test_reshard_errors(client) -> None:
    admin = client.admin
    client.rs3.plain.insert_one({"_id": 1})
    assert _code(admin.command, "reshardCollection", "rs3.plain", key={"x": 1}) == 118
    assert _code(admin.command, "reshardCollection", "nodot", key={"x": 1}) == 73
    admin.command("shardCollection", "rs3.s", key={"_id": 1})
    assert _code(admin.command, {"reshardCollection": "rs3.s"}) == 40414
    assert _code(client.rs3.command, "reshardCollection", "rs3.s", key={"x": 1}) == 13
    assert _code(admin.command, "moveCollection", "rs3.s", toShard="shard1") == 26
    assert _code(admin.command, "moveCollection", "rs3.nothere", toShard="shard1") == 26
    assert _code(admin.command, {"moveCollection": "rs3.plain"}) == 40414
    assert _code(admin.command, "moveCollection", "rs3.plain", toShard="nope") == 70
    assert _code(admin.command, "unshardCollection", "rs3.plain") == 118


def test_move_and_unshard_collection(client) -> None:
    admin = client.admin
    admin.command("enableSharding", "mv", primaryShard="shard0")
    client.mv.u.insert_many([{"_id": i} for i in range(50)])
    with client.mv.u.watch(max_await_time_ms=200, show_expanded_events=True) as stream:
        admin.command("moveCollection", "mv.u", toShard="shard2")
        client.mv.u.insert_one({"_id": "x"})
        events = _drain(stream, 2)
    assert [e["operationType"] for e in events] == ["reshardCollection", "insert"]
    assert events[0]["operationDescription"]["provenance"] == "moveCollection"
    entry = client.config.collections.find_one({"_id": "mv.u"})
    assert entry["unsplittable"] is True and entry["key"] == {"_id": 1}
    assert [c["shard"] for c in client.config.chunks.find({"uuid": entry["uuid"]})] == ["shard2"]
    assert client.mv.u.count_documents({}) == 51
    # sharded -> unsharded on the primary: untracked again
    admin.command("shardCollection", "mv.s", key={"k": "hashed"})
    client.mv.s.insert_many([{"_id": i, "k": i} for i in range(100)])
    admin.command("unshardCollection", "mv.s", toShard="shard0")
    assert client.config.collections.find_one({"_id": "mv.s"}) is None
    assert client.mv.s.count_documents({}) == 100
    assert admin.command("checkMetadataConsistency")["cursor"]["firstBatch"] == []


def test_refine_merge_allow_migrations(client) -> None:
    admin = client.admin
    admin.command("enableSharding", "rf", primaryShard="shard0")
    admin.command("shardCollection", "rf.c", key={"a": 1})
    coll = client.rf.c
    coll.insert_many([{"_id": i, "a": i % 10, "b": i} for i in range(100)])
    assert _code(admin.command, "refineCollectionShardKey", "rf.c", key={"a": 1, "b": 1}) == 72
    assert _code(admin.command, "refineCollectionShardKey", "rf.c", key={"b": 1}) == 72
    assert _code(admin.command, "refineCollectionShardKey", "rf.none", key={"b": 1}) == 118
    coll.create_index([("a", 1), ("b", 1)])
    with coll.watch(show_expanded_events=True, max_await_time_ms=200) as stream:
        admin.command("refineCollectionShardKey", "rf.c", key={"a": 1, "b": 1})
        coll.insert_one({"_id": "n", "a": 1, "b": 1})
        events = _drain(stream, 2)
    assert [e["operationType"] for e in events] == ["refineCollectionShardKey", "insert"]
    assert events[0]["operationDescription"] == {"shardKey": {"a": 1, "b": 1},
                                                 "oldShardKey": {"a": 1}}
    assert events[1]["documentKey"] == {"a": 1, "b": 1, "_id": "n"}
    uuid = client.config.collections.find_one({"_id": "rf.c"})["uuid"]
    chunk = client.config.chunks.find_one({"uuid": uuid})
    assert chunk["min"] == {"a": MinKey(), "b": MinKey()}
    assert chunk["max"] == {"a": MaxKey(), "b": MaxKey()}
    # mergeChunks
    admin.command("split", "rf.c", middle={"a": 3, "b": MinKey()})
    admin.command("split", "rf.c", middle={"a": 6, "b": MinKey()})
    assert client.config.chunks.count_documents({"uuid": uuid}) == 3
    admin.command("moveChunk", "rf.c", find={"a": 8, "b": 0}, to="shard1")
    assert _code(admin.command, "mergeChunks", "rf.c",
                 bounds=[{"a": MinKey(), "b": MinKey()}, {"a": MaxKey(), "b": MaxKey()}]) == 20
    assert _code(admin.command, "mergeChunks", "rf.c",
                 bounds=[{"a": MinKey(), "b": MinKey()}, {"a": 4, "b": MinKey()}]) == 20
    assert _code(admin.command, {"mergeChunks": "rf.c"}) == 40414
    admin.command("mergeChunks", "rf.c",
                  bounds=[{"a": MinKey(), "b": MinKey()}, {"a": 6, "b": MinKey()}])
    assert client.config.chunks.count_documents({"uuid": uuid}) == 2
    assert coll.count_documents({}) == 101
    # setAllowMigrations
    admin.command("setAllowMigrations", "rf.c", allowMigrations=False)
    assert client.config.collections.find_one({"_id": "rf.c"})["permitMigrations"] is False
    assert _code(admin.command, "moveChunk", "rf.c", find={"a": 0, "b": 0}, to="shard2") == 117
    assert _code(admin.command, "setAllowMigrations", "rf.c", allowMigrations=1) == 14
    assert _code(admin.command, "setAllowMigrations", "rf.none", allowMigrations=True) == 118
    admin.command("setAllowMigrations", "rf.c", allowMigrations=True)
    admin.command("moveChunk", "rf.c", find={"a": 0, "b": 0}, to="shard2")
    assert client.rf.command("checkMetadataConsistency")["cursor"]["firstBatch"] == []


def test_check_metadata_consistency_finds_misplaced(client, ddl_cluster) -> None:
    direct = pymongo.MongoClient(f"mongodb://{ddl_cluster.shard('shard2').address}/",
                                 directConnection=True)
    client.admin.command("enableSharding", "cm", primaryShard="shard0")
    client.cm.ok.insert_one({"_id": 1})
    direct.cm.stray.insert_one({"_id": 1})
    found = client.cm.command("checkMetadataConsistency")["cursor"]["firstBatch"]
    assert [(f["type"], f["details"]["namespace"]) for f in found] == \
        [("MisplacedCollection", "cm.stray")]
    direct.cm.stray.drop()
    direct.close()
    assert client.cm.command("checkMetadataConsistency")["cursor"]["firstBatch"] == []


def test_move_primary_moves_views(client, ddl_cluster) -> None:
    admin = client.admin
    admin.command("enableSharding", "mpv", primaryShard="shard0")
    client.mpv.src.insert_many([{"_id": i, "x": i} for i in range(5)])
    client.mpv.create_collection("big", viewOn="src", pipeline=[{"$match": {"x": {"$gte": 3}}}])
    with client.mpv.watch(max_await_time_ms=200) as stream:
        admin.command("movePrimary", "mpv", to="shard1")
        client.mpv.src.insert_one({"_id": 9, "x": 9})
        events = _drain(stream, 1)
    assert [e["operationType"] for e in events] == ["insert"]
    assert sorted(d["_id"] for d in client.mpv.big.find()) == [3, 4, 9]
    old = pymongo.MongoClient(f"mongodb://{ddl_cluster.shard('shard0').address}/",
                              directConnection=True)
    new = pymongo.MongoClient(f"mongodb://{ddl_cluster.shard('shard1').address}/",
                              directConnection=True)
    assert set(old.mpv.list_collection_names()) <= {"system.views"}
    info = new.mpv.list_collections(filter={"name": "big"}).next()
    assert info["type"] == "view" and info["options"]["viewOn"] == "src"
    old.close()
    new.close()


def test_commit_chunk_migration_checks_epoch_and_range(client, ddl_cluster) -> None:
    """``_configsvrCommitChunkMigration`` refuses a commit whose epoch changed (StaleEpoch,
    150) or whose range the donor does not own exactly (ConflictingOperationInProgress, 117),
    and changes nothing then; a real migration commits through it (``moveChunk``)."""
    from shardsim.core.protocol import configsvr as csrq
    admin = client.admin
    admin.command("enableSharding", "ccm", primaryShard="shard0")
    admin.command("shardCollection", "ccm.c", key={"a": 1})
    admin.command("split", "ccm.c", middle={"a": 10})
    entry = client.config.collections.find_one({"_id": "ccm.c"})
    before = list(client.config.chunks.find({"uuid": entry["uuid"]}).sort("min", 1))
    config = pymongo.MongoClient(f"mongodb://{ddl_cluster.config.address}/",
                                 directConnection=True)
    try:
        def commit(epoch: Any, lo: Any, hi: Any) -> None:
            config.admin.command(csrq.CommitChunkMigration(
                "ccm.c", "shard0", "shard1", {"min": {"a": lo}, "max": {"a": hi}},
                {"e": epoch}).to_command())
        assert _code(commit, entry["lastmodEpoch"], MinKey(), 5) == 117
        assert _code(commit, entry["lastmodEpoch"], 10, 20) == 117
        assert _code(commit, None, MinKey(), 10) == 150
        assert list(client.config.chunks.find({"uuid": entry["uuid"]}).sort("min", 1)) == before
    finally:
        config.close()
    client.ccm.c.insert_many([{"a": i} for i in range(20)])
    admin.command("moveChunk", "ccm.c", find={"a": 15}, to="shard1")
    owners = {c["min"]["a"] if not isinstance(c["min"]["a"], MinKey) else None: c["shard"]
              for c in client.config.chunks.find({"uuid": entry["uuid"]})}
    assert owners == {None: "shard0", 10: "shard1"}
    assert client.ccm.c.count_documents({}) == 20
