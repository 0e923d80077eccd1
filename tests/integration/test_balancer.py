"""The balancer (configsvr/balancer.py) on a real 3-shard cluster: with a 1 MB chunk size and a
short round interval a collection written through the router is split and spread over the
shards, nothing is lost, a change stream sees each insert once and no migration; balancer
commands' replies; removeShard drains to completed."""

from __future__ import annotations

import time
from typing import Any

import pymongo
import pytest
from bson import MaxKey, MinKey
from bson.int64 import Int64
from pymongo.errors import OperationFailure

pytestmark = pytest.mark.timeout(90)

PAD = "x" * 1200


def _fast_balancer(admin: Any, chunk_mb: int = 1) -> None:
    config = admin.client["config"]
    config.settings.update_one({"_id": "chunksize"}, {"$set": {"value": chunk_mb}}, upsert=True)
    config.settings.update_one({"_id": "balancer"},
                               {"$set": {"_shardsimRoundIntervalMs": 100}}, upsert=True)


def _wait(pred: Any, timeout: float = 45.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


def _sizes_by_shard(client: pymongo.MongoClient, ns: str) -> dict[str, int]:
    config = client["config"]
    uuid = config.collections.find_one({"_id": ns})["uuid"]
    out: dict[str, int] = {}
    for c in config.chunks.find({"uuid": uuid}):
        out[c["shard"]] = out.get(c["shard"], 0) + 1
    return out


def test_balancer_status_and_start_stop(cluster_factory) -> None:
    cluster = cluster_factory(shards=2)
    client = pymongo.MongoClient(cluster.router_uri)
    admin = client.admin
    st = admin.command("balancerStatus")
    assert st["mode"] == "full"  # on by default, as in 8.0
    assert st["inBalancerRound"] is False
    assert isinstance(st["numBalancerRounds"], Int64)
    admin.command("balancerStop")
    assert admin.command("balancerStatus")["mode"] == "off"
    doc = client.config.settings.find_one({"_id": "balancer"})
    assert doc["mode"] == "off" and doc["stopped"] is True
    admin.command("balancerStart")
    assert admin.command("balancerStatus")["mode"] == "full"
    # a round runs at once after balancerStart
    _wait(lambda: admin.command("balancerStatus")["numBalancerRounds"] >= 1, 10)
    with pytest.raises(OperationFailure) as e:
        admin.command("balancerCollectionStatus", "db.nope")
    assert e.value.code == 118
    with pytest.raises(OperationFailure) as e:
        admin.command("balancerCollectionStatus", "nodot")
    assert e.value.code == 73
    with pytest.raises(OperationFailure) as e:
        client.db.command("balancerStatus")
    assert e.value.code == 13
    client.close()


def test_balancer_spreads_collection_invisibly(cluster_factory) -> None:
    cluster = cluster_factory(shards=3)
    client = pymongo.MongoClient(cluster.router_uri)
    admin = client.admin
    admin.command("balancerStop")
    _fast_balancer(admin)
    admin.command("enableSharding", "bal", primaryShard="shard0")
    admin.command("shardCollection", "bal.c", key={"k": 1})
    coll = client.bal.c
    n = 8000
    with coll.watch(max_await_time_ms=200) as stream:
        for i in range(0, n, 500):
            coll.insert_many([{"_id": j, "k": j, "pad": PAD} for j in range(i, i + 500)])
        status = admin.command("balancerCollectionStatus", "bal.c")
        assert (status["balancerCompliant"], status["firstComplianceViolation"]) == \
            (False, "chunksImbalance")
        admin.command("balancerStart")
        _wait(lambda: admin.command("balancerCollectionStatus", "bal.c")["balancerCompliant"])
        by_shard = _sizes_by_shard(client, "bal.c")
        assert set(by_shard) == {"shard0", "shard1", "shard2"}, by_shard
        assert sum(by_shard.values()) >= 4  # chunks were split from the data
        seen: list[Any] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(seen) < n:
            ev = stream.try_next()
            if ev is not None:
                seen.append(ev)
        # and nothing after the inserts (no migration event)
        for _ in range(5):
            ev = stream.try_next()
            if ev is not None:
                seen.append(ev)
    assert [e["operationType"] for e in seen] == ["insert"] * n
    assert sorted(e["documentKey"]["_id"] for e in seen) == list(range(n))
    admin.command("flushRouterConfig")
    assert coll.count_documents({}) == n
    assert sorted(d["_id"] for d in coll.find({}, {"_id": 1})) == list(range(n))
    # every shard holds data directly
    for name in ("shard0", "shard1", "shard2"):
        direct = pymongo.MongoClient(f"mongodb://{cluster.shard(name).address}/",
                                     directConnection=True)
        assert direct.bal.c.estimated_document_count() > 0
        direct.close()
    client.close()


def test_remove_shard_drains_to_completed(cluster_factory) -> None:
    cluster = cluster_factory(shards=2)
    client = pymongo.MongoClient(cluster.router_uri)
    admin = client.admin
    admin.command("balancerStop")
    _fast_balancer(admin)
    admin.command("enableSharding", "dr", primaryShard="shard1")
    admin.command("shardCollection", "dr.c", key={"_id": "hashed"})
    client.dr.c.insert_many([{"_id": i} for i in range(300)])
    client.dr.u.insert_one({"_id": "unsharded"})
    admin.command("balancerStart")
    first = admin.command("removeShard", "shard1")
    assert first["state"] == "started" and first["dbsToMove"] == ["dr"]

    def drained() -> bool:
        r = admin.command("removeShard", "shard1")
        assert r["state"] == "ongoing"
        return r["remaining"]["chunks"] == 0

    _wait(drained)
    admin.command("movePrimary", "dr", to="shard0")
    done = admin.command("removeShard", "shard1")
    assert done["state"] == "completed"
    assert [s["_id"] for s in admin.command("listShards")["shards"]] == ["shard0"]
    assert client.dr.c.count_documents({}) == 300
    assert client.dr.u.find_one() == {"_id": "unsharded"}
    client.close()


def test_auto_merger_merges_contiguous_chunks(cluster_factory) -> None:
    cluster = cluster_factory(shards=2)
    client = pymongo.MongoClient(cluster.router_uri)
    admin = client.admin
    admin.command("enableSharding", "am", primaryShard="shard0")
    admin.command("shardCollection", "am.c", key={"k": 1})
    for m in (10, 20, 30):
        admin.command("split", "am.c", middle={"k": m})
    uuid = client.config.collections.find_one({"_id": "am.c"})["uuid"]
    assert client.config.chunks.count_documents({"uuid": uuid}) == 4
    client.config.settings.update_one({"_id": "balancer"}, {"$set": {
        "_shardsimRoundIntervalMs": 100, "_shardsimAutoMergerIntervalMs": 300}}, upsert=True)
    admin.command("balancerStart")
    _wait(lambda: client.config.chunks.count_documents({"uuid": uuid}) == 1, 20)
    chunk = client.config.chunks.find_one({"uuid": uuid})
    assert (chunk["min"], chunk["max"], chunk["shard"]) == ({"k": MinKey()}, {"k": MaxKey()},
                                                             "shard0")
    client.close()
