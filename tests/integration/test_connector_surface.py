"""What CDC connectors met through the router and on shards (issue 26, items 3-5), on one
in-process cluster (``shardsim.testing.ShardedCluster``)."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure
from bson.timestamp import Timestamp

from shardsim.core.resume_token import token_ts_key
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


def test_repl_set_get_status_through_the_router_is_mongos_reply(cluster):
    """mongos: ``{info: "mongos", ok: 0, errmsg}`` without a code
    (``cluster_repl_set_get_status_cmd.cpp``); not CommandNotFound (59)."""
    client = cluster.client()
    with pytest.raises(OperationFailure) as exc:
        client.admin.command("replSetGetStatus")
    reply = exc.value.details
    assert reply["ok"] == 0 and reply["info"] == "mongos"
    assert reply["errmsg"] == "replSetGetStatus is not supported through mongos"
    assert "code" not in reply and "$clusterTime" in reply
    with pytest.raises(OperationFailure) as exc:
        client.test.command("replSetGetStatus")
    assert exc.value.code == 13


@pytest.mark.parametrize("op", ["find", "insert", "oplog", "listCollections", "drop"])
def test_the_local_database_through_the_router_is_refused(cluster, op):
    """mongos refuses every command on ``local``: IllegalOperation (20)
    (``ExecCommandClient::_prologue``)."""
    local = cluster.client().local
    run = {"find": lambda: local.startup_log.find_one(),
           "insert": lambda: local.x.insert_one({"a": 1}),
           "oplog": lambda: local.oplog.rs.find_one(sort=[("$natural", 1)]),
           "listCollections": lambda: local.list_collection_names(),
           "drop": lambda: local.x.drop()}[op]
    with pytest.raises(OperationFailure) as exc:
        run()
    assert exc.value.code == 20 and exc.value.details["codeName"] == "IllegalOperation"
    assert exc.value.details["errmsg"] == "Can't use 'local' database through mongos"


@pytest.mark.parametrize("where", ["router", "shard"])
def test_server_status_counts_connections_network_operations_and_asserts(cluster, where):
    client = cluster.client() if where == "router" else _direct(cluster, cluster.shard_names[1])
    try:
        before = client.admin.command("serverStatus")
        for key in ("connections", "network", "opcounters", "asserts"):
            assert key in before, key
        coll = client.ss[where]
        coll.insert_many([{"_id": i} for i in range(5)])
        coll.update_many({}, {"$set": {"a": 1}})
        coll.delete_one({"_id": 0})
        list(coll.find())
        with pytest.raises(OperationFailure):
            client.admin.command("noSuchCommandAtAll")
        extra = pymongo.MongoClient(client.address[0], client.address[1], directConnection=True)
        extra.admin.command("ping")
        after = client.admin.command("serverStatus")
        extra.close()
        ops_b, ops_a = before["opcounters"], after["opcounters"]
        assert ops_a["insert"] - ops_b["insert"] >= 5
        assert ops_a["update"] - ops_b["update"] >= 1
        assert ops_a["delete"] - ops_b["delete"] >= 1
        assert ops_a["query"] - ops_b["query"] >= 1
        assert ops_a["command"] - ops_b["command"] >= 2
        assert set(ops_a) == {"insert", "query", "update", "delete", "getmore", "command"}
        assert after["asserts"]["user"] - before["asserts"]["user"] >= 1
        assert set(after["asserts"]) == {"regular", "warning", "msg", "user", "tripwire", "rollovers"}
        conns = after["connections"]
        assert conns["current"] >= 2 and conns["totalCreated"] > before["connections"]["totalCreated"]
        assert conns["current"] + conns["available"] == \
            before["connections"]["current"] + before["connections"]["available"]
        net_b, net_a = before["network"], after["network"]
        assert net_a["bytesIn"] > net_b["bytesIn"] and net_a["bytesOut"] > net_b["bytesOut"]
        assert net_a["numRequests"] - net_b["numRequests"] >= 7
    finally:
        if where == "shard":
            client.close()
