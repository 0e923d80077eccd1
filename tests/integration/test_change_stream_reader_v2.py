"""The 9.0 v2 change-stream reader (router/change_stream/reader_v2.py, issue 27): cursors only on
the shards that own the collection (config.placementHistory), retargeted by control events that
are never returned; the v1 fallback when the placement history cannot answer;
ignoreRemovedShards. Each test runs a 3-shard cluster of the 9.0 profile."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp

from shardsim.testing import ShardedCluster


def _shard_cursors(cluster: ShardedCluster, ns: str) -> dict[str, int]:
    """Per shard: the change-stream cursors on ``ns`` it has open (idle, or in a getMore), from
    $currentOp on the shard (tests open one stream per namespace at a time)."""
    out = {}
    for name in cluster.shard_names:
        with pymongo.MongoClient("mongodb://" + cluster.shard_address(name) + "/",
                                 directConnection=True) as c:
            ops = list(c.admin.aggregate([{"$currentOp": {"idleCursors": True, "allUsers": True}}]))
        out[name] = len({(op.get("cursor") or {}).get("cursorId") for op in ops
                         if op.get("ns") == ns and (op.get("cursor") or {}).get("tailable")})
    return out


def _open(coll: Any, comment: str, **spec: Any) -> Any:
    return coll.aggregate([{"$changeStream": spec}], comment=comment, maxAwaitTimeMS=300)


def _read(stream: Any, n: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
    return out


def _until(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster() -> Any:
    with ShardedCluster(3, server_version="9.0") as c:
        yield c


def test_v2_opens_cursors_only_on_owning_shard(cluster: ShardedCluster) -> None:
    db = "v2_" + uuid.uuid4().hex[:6]
    with pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("enableSharding", db, primaryShard="shard1")
        coll = client[db].c
        coll.insert_one({"_id": 0})
        ns = f"{db}.c"
        with _open(coll, "v1-all") as s1:
            assert _shard_cursors(cluster, ns) == {"shard0": 1, "shard1": 1, "shard2": 1}
        _until(lambda: _shard_cursors(cluster, ns) == {"shard0": 0, "shard1": 0, "shard2": 0})
        start = client[db].command("ping")["operationTime"]
        with _open(coll, "v2-one", version="v2", startAtOperationTime=start) as s2:
            assert _shard_cursors(cluster, ns) == {"shard0": 0, "shard1": 1, "shard2": 0}
            with _open(coll, "v1-all", startAtOperationTime=start) as s1:
                coll.insert_one({"_id": 1})
                e2, e1 = _read(s2, 1), _read(s1, 1)
                assert [e["documentKey"] for e in e2] == [{"_id": 1}]
                assert e2[0]["_id"] == e1[0]["_id"]  # the same event, the same token


def test_v2_follows_chunk_migrations(cluster: ShardedCluster) -> None:
    db = "v2m_" + uuid.uuid4().hex[:6]
    ns = f"{db}.c"
    with pymongo.MongoClient(cluster.uri) as client:
        admin = client.admin
        admin.command("enableSharding", db, primaryShard="shard0")
        admin.command("shardCollection", ns, key={"_id": 1})
        coll = client[db].c
        with _open(coll, "v2-mig", version="v2", showExpandedEvents=True) as s:
            assert _shard_cursors(cluster, ns) == {"shard0": 1, "shard1": 0, "shard2": 0}
            admin.command("split", ns, middle={"_id": 0})
            admin.command("moveChunk", ns, find={"_id": 5}, to="shard1")
            coll.insert_many([{"_id": 5}, {"_id": -5}])
            evs = _read(s, 2)
            assert sorted(e["documentKey"]["_id"] for e in evs) == [-5, 5]
            _until(lambda: _shard_cursors(cluster, ns)["shard1"] == 1)
            # the last chunk leaves shard0: its cursor is closed
            admin.command("moveChunk", ns, find={"_id": -5}, to="shard2")
            coll.insert_one({"_id": -6})
            evs += _read(s, 1)
            assert evs[-1]["documentKey"] == {"_id": -6}
            _until(lambda: _shard_cursors(cluster, ns) == {"shard0": 0, "shard1": 1, "shard2": 1})
            ops = {e["operationType"] for e in evs}
            assert not ops & {"moveChunk", "namespacePlacementChanged", "migrateChunkToNewShard"}
            # the merged order is the token order, and the PBRT never goes back
            ids = [e["_id"]["_data"] for e in evs]
            assert ids == sorted(ids)
            assert s._post_batch_resume_token["_data"] >= ids[-1]


def test_v2_follows_move_primary(cluster: ShardedCluster) -> None:
    db = "v2p_" + uuid.uuid4().hex[:6]
    with pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("enableSharding", db, primaryShard="shard2")
        coll = client[db].c
        coll.insert_one({"_id": 0})
        with _open(coll, "v2-mp", version="v2") as s:
            ns = f"{db}.c"
            assert _shard_cursors(cluster, ns) == {"shard0": 0, "shard1": 0, "shard2": 1}
            client.admin.command("movePrimary", db, to="shard0")
            coll.insert_one({"_id": 1})
            assert [e["documentKey"] for e in _read(s, 1)] == [{"_id": 1}]
            _until(lambda: _shard_cursors(cluster, ns) == {"shard0": 1, "shard1": 0, "shard2": 0})


def test_v2_waits_for_the_database_on_the_config_server(cluster: ShardedCluster) -> None:
    db = "v2d_" + uuid.uuid4().hex[:6]
    with pymongo.MongoClient(cluster.uri) as client:
        coll = client[db].c
        client.admin.command("enableSharding", "v2_anchor_" + db)  # the history is initialised
        ns = f"{db}.c"
        with _open(coll, "v2-absent", version="v2") as s:
            assert _shard_cursors(cluster, ns) == {"shard0": 0, "shard1": 0, "shard2": 0}
            client.admin.command("enableSharding", db, primaryShard="shard1")
            coll.insert_one({"_id": 1})
            assert [e["documentKey"] for e in _read(s, 1)] == [{"_id": 1}]
            assert _shard_cursors(cluster, ns)["shard1"] == 1


def test_v2_before_placement_history_falls_back_to_v1(cluster: ShardedCluster) -> None:
    db = "v2f_" + uuid.uuid4().hex[:6]
    with pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("enableSharding", db, primaryShard="shard1")
        coll = client[db].c
        with _open(coll, "v2-old", version="v2", startAtOperationTime=Timestamp(1, 1)) as s:
            assert _shard_cursors(cluster, f"{db}.c") == {"shard0": 1, "shard1": 1, "shard2": 1}
            coll.insert_one({"_id": 1})
            assert [e["documentKey"] for e in _read(s, 1)] == [{"_id": 1}]


def test_version_v2_refused_before_82() -> None:
    with ShardedCluster(1, server_version="8.0") as c, pymongo.MongoClient(c.uri) as client:
        with pytest.raises(pymongo.errors.OperationFailure) as exc:
            client.db.c.aggregate([{"$changeStream": {"version": "v2"}}])
        assert exc.value.code == 40415


def test_ignore_removed_shards() -> None:
    with ShardedCluster(3, server_version="9.0") as cluster, \
            pymongo.MongoClient(cluster.uri) as client:
        admin = client.admin
        db = "v2r"
        ns = f"{db}.c"
        admin.command("enableSharding", db, primaryShard="shard0")
        admin.command("shardCollection", ns, key={"_id": 1})
        admin.command("split", ns, middle={"_id": 0})
        admin.command("moveChunk", ns, find={"_id": 1}, to="shard2")
        start = client[db].command("ping")["operationTime"]
        coll = client[db].c
        coll.insert_many([{"_id": -1}, {"_id": 1}, {"_id": -2}, {"_id": 2}])  # 1, 2 on shard2
        cluster.remove_shard("shard2")  # its chunk moves away, then the shard goes
        coll.insert_one({"_id": 3})
        with pytest.raises(pymongo.errors.OperationFailure) as exc:
            _open(coll, "strict", version="v2", startAtOperationTime=start)
        assert exc.value.code == 70  # ShardNotFound: the removed shard cannot be opened
        with _open(coll, "ignore", version="v2", ignoreRemovedShards=True,
                   startAtOperationTime=start) as s:
            evs = _read(s, 3)
            # shard2's events (1, 2) are lost; the other shards' are all there, in order
            assert [e["documentKey"]["_id"] for e in evs] == [-1, -2, 3]


def test_v2_database_stream(cluster: ShardedCluster) -> None:
    db = "v2db_" + uuid.uuid4().hex[:6]
    ns = f"{db}.s"
    with pymongo.MongoClient(cluster.uri) as client:
        admin = client.admin
        admin.command("enableSharding", db, primaryShard="shard2")
        admin.command("shardCollection", ns, key={"_id": 1})
        client[db].u.insert_one({"_id": 0})
        with client[db].aggregate([{"$changeStream": {"version": "v2"}}], maxAwaitTimeMS=300) as s:
            def targeted() -> dict[str, int]:
                return {k: _shard_cursors(cluster, f"{db}.$cmd.aggregate")[k] for k in cluster.shard_names}
            assert targeted() == {"shard0": 0, "shard1": 0, "shard2": 1}
            admin.command("split", ns, middle={"_id": 0})
            admin.command("moveChunk", ns, find={"_id": 5}, to="shard0")
            client[db].s.insert_many([{"_id": 5}, {"_id": -5}])
            client[db].u.insert_one({"_id": 1})
            evs = _read(s, 3)
            assert sorted((e["ns"]["coll"], e["documentKey"]["_id"]) for e in evs) == \
                [("s", -5), ("s", 5), ("u", 1)]
            _until(lambda: targeted() == {"shard0": 1, "shard1": 0, "shard2": 1})


def test_v2_resumes_after_an_event(cluster: ShardedCluster) -> None:
    db = "v2res_" + uuid.uuid4().hex[:6]
    with pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("enableSharding", db, primaryShard="shard0")
        coll = client[db].c
        with _open(coll, "v2-res", version="v2") as s:
            coll.insert_many([{"_id": 1}, {"_id": 2}])
            first = _read(s, 1)[0]
        with _open(coll, "v2-res2", version="v2", resumeAfter=first["_id"]) as s2:
            assert [e["documentKey"] for e in _read(s2, 1)] == [{"_id": 2}]
            assert _shard_cursors(cluster, f"{db}.c") == {"shard0": 1, "shard1": 0, "shard2": 0}


def test_v2_whole_cluster_stream() -> None:
    with ShardedCluster(3, server_version="9.0") as cluster, \
            pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("enableSharding", "wa", primaryShard="shard0")
        client.wa.c.insert_one({"_id": 0})
        with client.admin.aggregate([{"$changeStream": {"version": "v2", "allChangesForCluster": True}}],
                                    maxAwaitTimeMS=300) as s:
            assert _shard_cursors(cluster, "admin.$cmd.aggregate") == \
                {"shard0": 1, "shard1": 0, "shard2": 0}
            client.admin.command("enableSharding", "wb", primaryShard="shard2")  # a new database
            client.wb.c.insert_one({"_id": 1})
            client.wa.c.insert_one({"_id": 2})
            evs = _read(s, 2)
            assert sorted((e["ns"]["db"], e["documentKey"]["_id"]) for e in evs) == \
                [("wa", 2), ("wb", 1)]
            assert _shard_cursors(cluster, "admin.$cmd.aggregate") == \
                {"shard0": 1, "shard1": 0, "shard2": 1}
