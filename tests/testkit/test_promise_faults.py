"""The test kit's promise faults (shard/change_stream/promise_faults.py): a shard whose promises
are stalled or slow holds the merged stream back while it serves every command, and two shards
pinned at one cluster time write events the router orders by the rest of the resume token."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp

from shardsim.testing.helpers import read_events, split_over_two_shards, waiting_for
from shardsim.core.errors import MongoError
from shardsim.testing import ShardedCluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster() -> Any:
    with ShardedCluster(shards=2, seed=3, noop_interval_ms=200) as c:
        yield c


def latency_ms(coll: Any, stream: Any, x: int) -> float:
    """Insert-to-event latency through the router (ms) of one insert with ``x``."""
    start = time.monotonic()
    coll.insert_one({"x": x})
    got = read_events(stream, 1, 15)
    assert [e["fullDocument"]["x"] for e in got] == [x]
    return (time.monotonic() - start) * 1000


def test_stalled_promises_hold_the_stream_until_cleared(cluster: Any) -> None:
    client = cluster.client()
    primary, other = split_over_two_shards(client, "st.c")
    coll = client.st.c
    with coll.watch(max_await_time_ms=100) as stream:
        coll.insert_one({"x": -1})
        assert [e["fullDocument"]["x"] for e in read_events(stream, 1, 10)] == [-1]
        cluster.stall_promises(other)
        try:
            coll.insert_one({"x": -2})                    # on the primary: not released
            assert read_events(stream, 1, 1.5) == []
            # The stalled shard still serves commands (a read on it, through the router).
            assert coll.find_one({"x": {"$gte": 0}}) is None
            waiting, deadline = [], time.monotonic() + 10
            while other not in waiting and time.monotonic() < deadline:
                waiting = waiting_for(client, "st.c")
            assert waiting == [other]
            assert read_events(stream, 1, 0.5) == []             # still held
        finally:
            cluster.clear_promise_faults(other)
        start = time.monotonic()
        assert [e["fullDocument"]["x"] for e in read_events(stream, 1, 10)] == [-2]
        assert time.monotonic() - start < 3               # at once, not after an await period
        coll.insert_one({"x": -3})                        # promises flow again
        assert [e["fullDocument"]["x"] for e in read_events(stream, 1, 10)] == [-3]


def test_slow_promises_add_their_delay_to_the_latency(cluster: Any) -> None:
    client = cluster.client()
    primary, other = split_over_two_shards(client, "sl.c")
    coll = client.sl.c
    with coll.watch(max_await_time_ms=100) as stream:
        latency_ms(coll, stream, -100)                    # warm up
        base = statistics.median(latency_ms(coll, stream, -i) for i in range(1, 6))
        cluster.slow_promises(other, 300)
        try:
            slow = statistics.median(latency_ms(coll, stream, -i) for i in range(10, 15))
        finally:
            cluster.clear_promise_faults(other)
        after = statistics.median(latency_ms(coll, stream, -i) for i in range(20, 25))
    assert slow >= 280, (base, slow)
    assert 150 <= slow - base <= 2000, (base, slow)
    assert after < slow - 150, (base, slow, after)


def test_same_cluster_time_ties_two_shards_and_the_merge_orders_by_token(cluster: Any) -> None:
    client = cluster.client()
    primary, other = split_over_two_shards(client, "tie.c")
    coll = client.tie.c
    coll.insert_many([{"x": -1000}, {"x": 1000}])        # the collection exists on both
    with coll.watch(max_await_time_ms=100) as stream:
        ts = cluster.same_cluster_time(primary, other)
        # Written in the opposite of token order: other's x=1 first, then primary's x=-1
        # (same cluster time and collection: the documentKey decides, x=-1 first).
        coll.insert_one({"_id": "b", "x": 1})
        coll.insert_one({"_id": "a", "x": -1})
        got = read_events(stream, 2, 10)
        got += read_events(stream, 1, 1.0)                       # nothing more: once each
    assert [e["documentKey"]["_id"] for e in got] == ["a", "b"]
    assert [e["clusterTime"] for e in got] == [ts, ts]
    tokens = [e["_id"]["_data"] for e in got]
    assert tokens[0] < tokens[1]
    with pymongo.MongoClient(f"mongodb://{cluster.shard_address(other)}/?directConnection=true") \
            as direct:
        entry = direct.local["oplog.rs"].find_one({"o._id": "b"})
        assert entry["ts"] == ts


def test_fault_commands_check_their_input(cluster: Any) -> None:
    shard = cluster.shard_names[0]
    with pytest.raises(MongoError) as info:
        cluster.command(shard, {"_shardsimSetClusterTime": 1})
    assert info.value.code == 14
    with pytest.raises(MongoError) as info:
        cluster.command(shard, {"_shardsimSetClusterTime": Timestamp(1, 1)})  # in the past
    assert info.value.code == 2
    with pytest.raises(MongoError) as info:
        cluster.configure_fail_point(shard, "shardsimDelayPromise", "alwaysOn", {"delayMs": -1})
    assert info.value.code == 2
    reply = cluster.configure_fail_point(shard, "shardsimStallPromise", {"times": 1})
    assert reply["count"] == 0
    cluster.clear_promise_faults(shard)
    with pytest.raises(ValueError):
        cluster.same_cluster_time(shard, shard)
