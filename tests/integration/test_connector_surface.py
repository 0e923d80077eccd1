"""What CDC connectors met through the router and on shards (issue 26, items 3-5), on one
in-process cluster (``shardsim.testing.ShardedCluster``)."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp

from shardsim.resume_token import token_ts_key
from shardsim.testing import ShardedCluster


@pytest.fixture(scope="module")
def cluster() -> Any:
    with ShardedCluster(shards=2, seed=3) as c:
        yield c


def _direct(cluster: Any, name: str) -> pymongo.MongoClient:
    return pymongo.MongoClient(f"mongodb://{cluster.shard_address(name)}/?directConnection=true",
                               serverSelectionTimeoutMS=5000)


def _pbrt_time(stream: Any) -> Timestamp:
    key = token_ts_key(stream.resume_token["_data"])
    return Timestamp(key >> 32, key & 0xFFFFFFFF)


@pytest.mark.parametrize("where", ["router", "shard"])
def test_an_idle_streams_token_time_is_a_valid_after_cluster_time(cluster, where):
    """The postBatchResumeToken of an idle stream is never past the ``$clusterTime`` of the
    reply that carries it, so ``afterClusterTime`` at its time is accepted (was 72)."""
    client = cluster.client() if where == "router" else _direct(cluster, cluster.shard_names[0])
    try:
        client.cct[where].insert_one({"_id": 1})
        with client.cct[where].watch(max_await_time_ms=100) as stream:
            for _ in range(3):
                assert stream.try_next() is None
                ts = _pbrt_time(stream)
                reply = client.cct.command({"find": where, "readConcern": {"afterClusterTime": ts}})
                assert reply["ok"] == 1.0
                assert reply["$clusterTime"]["clusterTime"] >= ts
    finally:
        if where == "shard":
            client.close()
