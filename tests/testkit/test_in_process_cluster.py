"""The in-process cluster (shardsim.testing): start/stop leave nothing behind, the asyncio
variant, and the faults on demand (pause, kill/restart, history loss, add/remove shard, no-op
interval, fail points, seeded choices)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from shardsim.testing.helpers import read_events, split_over_two_shards
from shardsim.testing import AsyncShardedCluster, ShardedCluster

pytestmark = pytest.mark.timeout(120)


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _refused(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return True
    return False


def _ping(address: str) -> None:
    """A hello over a raw socket (no pymongo threads): the member answers."""
    import bson
    from shardsim.core import wire
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(wire.encode_op_msg(bson.encode({"ping": 1, "$db": "admin"}), request_id=1))
        assert len(s.recv(4096)) > 16


def test_start_answers_and_stop_leaves_no_thread_socket_or_task() -> None:
    threads, fds = set(threading.enumerate()), _fds()
    c = ShardedCluster(shards=3)
    with c:
        addresses = [c.uri[len("mongodb://"):].rstrip("/"),
                     *(c.shard_address(n) for n in c.shard_names)]
        for a in addresses:
            _ping(a)
        assert c.shard_names == ["shard0", "shard1", "shard2"]
        assert any(t.name == "shardsim-testkit" for t in threading.enumerate())
    assert set(threading.enumerate()) <= threads  # (threads of earlier tests may end meanwhile)
    assert _fds() <= fds
    assert all(_refused(a) for a in addresses)


def test_pymongo_crud_and_listshards_through_the_router() -> None:
    with ShardedCluster(shards=2) as c:
        client = c.client()
        assert [s["_id"] for s in client.admin.command("listShards")["shards"]] == ["shard0", "shard1"]
        client.admin.command("shardCollection", "kit.c", key={"_id": "hashed"})
        client.kit.c.insert_many([{"_id": i} for i in range(100)])
        assert client.kit.c.count_documents({}) == 100
        per_shard = []
        for name in c.shard_names:
            with pymongo.MongoClient(f"mongodb://{c.shard_address(name)}/?directConnection=true") as d:
                per_shard.append(d.kit.c.count_documents({}))
        assert sum(per_shard) == 100 and all(per_shard)


def test_async_variant_with_async_with() -> None:
    async def main() -> list[Any]:
        async with AsyncShardedCluster(shards=2, seed=1) as c:
            client = pymongo.AsyncMongoClient(c.uri)
            try:
                await client.kit.a.insert_one({"_id": 1})
                docs = await client.kit.a.find().to_list()
            finally:
                await client.close()
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            assert left  # the cluster's own tasks run on this loop
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
        return docs

    assert asyncio.run(main()) == [{"_id": 1}]


def test_paused_shard_holds_the_merged_stream_back_until_resumed() -> None:
    with ShardedCluster(shards=2, noop_interval_ms=100) as c:
        client = c.client()
        primary, other = split_over_two_shards(client, "pz.c")
        coll = client.pz.c
        with coll.watch(max_await_time_ms=100) as stream:
            coll.insert_one({"x": -1})
            coll.insert_one({"x": 1})
            assert [e["fullDocument"]["x"] for e in read_events(stream, 2, 10)] == [-1, 1]
            c.pause_shard(other)
            # Writes to the running shard succeed; the one to the paused shard waits.
            for x in (-2, -3, -4):
                coll.insert_one({"x": x})
            blocked = threading.Thread(target=coll.insert_one, args=({"x": 2},))
            blocked.start()
            held = read_events(stream, 1, 1.5)
            assert held == []  # nothing written while the shard is paused is released
            assert blocked.is_alive()
            c.resume_shard(other)
            blocked.join(10)
            got = read_events(stream, 4, 10)
            assert sorted(e["fullDocument"]["x"] for e in got) == [-4, -3, -2, 2]
            assert [e["fullDocument"]["x"] for e in got if e["fullDocument"]["x"] < 0] == [-2, -3, -4]
            tokens = [e["_id"]["_data"] for e in got]
            assert tokens == sorted(tokens)  # in stream (cluster time) order


def test_kill_and_restart_a_durable_shard_mid_stream_loses_nothing() -> None:
    with ShardedCluster(shards=2, durable=True, noop_interval_ms=100) as c:
        client = c.client()
        primary, other = split_over_two_shards(client, "kr.c")
        coll = client.kr.c
        with coll.watch(max_await_time_ms=100) as stream:
            for i in range(1, 21):
                coll.insert_one({"_id": i, "x": i if i % 2 else -i})
            first = read_events(stream, 10, 10)
            c.kill_shard(other)
            c.restart_shard(other)
            assert coll.count_documents({}) == 20  # the restarted shard kept its documents
            for i in range(21, 41):
                coll.insert_one({"_id": i, "x": i if i % 2 else -i})
            rest = read_events(stream, 30, 20)
        got = [e["_id"] for e in first + rest]
        assert [e["documentKey"]["_id"] for e in first + rest] == list(range(1, 41))
        assert len({g["_data"] for g in got}) == 40
        assert [g["_data"] for g in got] == sorted(g["_data"] for g in got)


def test_truncated_history_gives_286_non_resumable() -> None:
    with ShardedCluster(shards=2) as c:
        client = c.client()
        primary, other = split_over_two_shards(client, "hl.c")
        coll = client.hl.c
        with coll.watch() as stream:
            coll.insert_one({"x": 1})
            token = read_events(stream, 1, 10)[0]["_id"]
        coll.insert_many([{"x": 2}, {"x": -2}])
        now = client.admin.command("ping")["$clusterTime"]["clusterTime"]
        removed = c.truncate_oplog(other, Timestamp(now.time, now.inc + 1))
        assert removed > 0
        with pytest.raises(OperationFailure) as info:
            with coll.watch(resume_after=token) as stream:
                stream.next()
        assert info.value.code == 286
        assert info.value.details["codeName"] == "ChangeStreamHistoryLost"
        assert info.value.has_error_label("NonResumableChangeStreamError")
        # An unknown shard name is a KeyError, not a silent no-op.
        with pytest.raises(KeyError):
            c.truncate_oplog("nope", now)


def test_add_and_remove_a_shard() -> None:
    with ShardedCluster(shards=1, seed=3) as c:
        client = c.client()
        client.admin.command("shardCollection", "ar.c", key={"x": 1})
        client.admin.command("split", "ar.c", middle={"x": 50})
        client.ar.c.insert_many([{"x": i} for i in range(100)])
        name = c.add_shard()
        assert name == "shard1" and c.shard_names == ["shard0", "shard1"]
        client.admin.command("moveChunk", "ar.c", find={"x": 60}, to=name)
        c.remove_shard("shard0")  # owns a chunk and is the database's primary: drained first
        assert [s["_id"] for s in client.admin.command("listShards")["shards"]] == ["shard1"]
        assert c.shard_names == ["shard1"]
        assert client.ar.c.count_documents({}) == 100


def test_noop_interval_is_periodic_noop_interval_secs() -> None:
    with ShardedCluster(shards=1, noop_interval_ms=60_000) as c:
        with pymongo.MongoClient(f"mongodb://{c.shard_address('shard0')}/?directConnection=true") as d:
            def noops() -> int:
                return d.local["oplog.rs"].count_documents({"op": "n", "o.msg": "periodic noop"})
            before = noops()
            time.sleep(0.3)
            assert noops() == before
            c.set_noop_interval(2000)
            assert d.admin.command("getParameter", 1, periodicNoopIntervalSecs=1)[
                "periodicNoopIntervalSecs"] == 2
            c.set_noop_interval(50, "shard0")
            time.sleep(0.5)
            assert noops() > before


def test_fail_points_and_seeded_choices() -> None:
    with ShardedCluster(shards=3, seed=11) as a, ShardedCluster(shards=3, seed=11) as b:
        picks = [a.pause_shard() for _ in range(5)]
        assert picks == [b.pause_shard() for _ in range(5)]
        for name in set(picks):
            a.resume_shard(name)
            b.resume_shard(name)
        client = a.client()
        a.configure_fail_point("router", "failCommand", {"times": 1},
                               {"failCommands": ["find"], "errorCode": 2})
        with pytest.raises(OperationFailure) as info:
            client.fp.c.find_one()
        assert info.value.code == 2
        assert client.fp.c.find_one() is None


def test_two_routers_in_process() -> None:
    """``ShardedCluster(routers=2)``: a chunk moved through one router; the other router, whose
    routing table is stale, is told StaleConfig by the shard, refreshes and writes to the new
    owner; both see the same documents."""
    import pymongo
    with ShardedCluster(shards=2, routers=2) as c:
        assert len(c.uris) == 2 and c.uris[0] == c.uri
        a, b = (pymongo.MongoClient(u) for u in c.uris)
        try:
            a.admin.command("enableSharding", "kit2", primaryShard="shard0")
            a.admin.command("shardCollection", "kit2.c", key={"x": 1})
            b.kit2.c.insert_one({"x": 1})
            a.admin.command("moveChunk", "kit2.c", find={"x": 1}, to="shard1")
            b.kit2.c.insert_one({"x": 2})
            assert sorted(d["x"] for d in a.kit2.c.find()) == [1, 2]
            direct = pymongo.MongoClient(c.shard_address("shard1"), directConnection=True)
            try:
                assert direct.kit2.c.count_documents({}) == 2
            finally:
                direct.close()
        finally:
            a.close()
            b.close()
