"""Cluster-time limits (``vector_clock.cpp``): gossip beyond ``maxAcceptableLogicalClockDriftSecs``
is refused with 205 and moves nothing; no tick passes 2**31 - 1; the ``$clusterTime`` shape check;
a durable commit that fails is an error reply and is rolled back, never an exit."""

from __future__ import annotations

import asyncio

import pytest
from bson import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.core.clock import DEFAULT_MAX_DRIFT_S, MAX_TIME_VALUE, HybridLogicalClock
from shardsim.core.cluster_time import parse_gossip
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError
from shardsim.shard.node import ShardNode

NOW = 1_700_000_000


def test_gossip_beyond_the_drift_limit_is_refused_and_moves_nothing():
    clock = HybridLogicalClock(lambda: NOW)
    clock.advance(Timestamp(NOW + DEFAULT_MAX_DRIFT_S, 3))  # exactly at the limit: accepted
    assert clock.now() == Timestamp(NOW + DEFAULT_MAX_DRIFT_S, 3)
    for ts in (Timestamp(NOW + DEFAULT_MAX_DRIFT_S + 1, 1), Timestamp(2**31, 1),
               Timestamp(2**32 - 1, 2**32 - 1)):
        with pytest.raises(MongoError) as err:
            clock.advance(ts)
        assert err.value.code == 205 and err.value.code_name == "ClusterTimeFailsRateLimiter"
        assert clock.now() == Timestamp(NOW + DEFAULT_MAX_DRIFT_S, 3)
        assert clock.try_advance(ts) is False


def test_gossip_past_the_maximum_value_fails_40484_even_within_the_drift():
    clock = HybridLogicalClock(lambda: MAX_TIME_VALUE)
    with pytest.raises(MongoError) as err:
        clock.advance(Timestamp(MAX_TIME_VALUE, MAX_TIME_VALUE + 1))
    assert err.value.code == 40484


def test_tick_never_passes_the_maximum_value():
    clock = HybridLogicalClock(lambda: 0, start=Timestamp(MAX_TIME_VALUE, MAX_TIME_VALUE - 1))
    assert clock.tick() == Timestamp(MAX_TIME_VALUE, MAX_TIME_VALUE)
    with pytest.raises(MongoError) as err:
        clock.tick()
    assert err.value.code == 40482
    assert clock.now() == Timestamp(MAX_TIME_VALUE, MAX_TIME_VALUE)


def test_increment_overflow_moves_to_the_next_second():
    clock = HybridLogicalClock(lambda: 10, start=Timestamp(10, MAX_TIME_VALUE))
    assert clock.tick() == Timestamp(11, 1)


def test_restore_is_not_rate_limited_but_bounded():
    clock = HybridLogicalClock(lambda: NOW)
    clock.restore(Timestamp(NOW + 10 * DEFAULT_MAX_DRIFT_S, 1))
    assert clock.now().time == NOW + 10 * DEFAULT_MAX_DRIFT_S
    with pytest.raises(MongoError) as err:
        clock.restore(Timestamp(2**31, 0))
    assert err.value.code == 40483


@pytest.mark.parametrize("ct, code, text", [
    (5, 14, "'VectorClockComponents.$clusterTime' is the wrong type 'int', expected type 'object'"),
    ({}, 40414, "'VectorClockComponents.$clusterTime.clusterTime' is missing"),
    ({"clusterTime": "x"}, 14, "expected type 'timestamp'"),
    ({"clusterTime": Timestamp(1, 1), "signature": 1}, 14, "expected type 'object'"),
    ({"clusterTime": Timestamp(1, 1), "signature": {"keyId": 0}}, 40414, "signature.hash'"),
    ({"clusterTime": Timestamp(1, 1), "signature": {"hash": "h", "keyId": 0}}, 14, "'binData'"),
    ({"clusterTime": Timestamp(1, 1), "signature": {"hash": Binary(b"\0" * 20, 5), "keyId": 0}},
     14, "wrong binData type 'MD5', expected type 'general'"),
    ({"clusterTime": Timestamp(1, 1), "signature": {"hash": Binary(b"\0" * 20)}}, 40414, "keyId"),
    ({"clusterTime": Timestamp(1, 1), "signature": {"hash": Binary(b"\0" * 20), "keyId": "k"}},
     14, "expected types '[long, int, decimal, double]'"),
    ({"clusterTime": Timestamp(1, 1), "signature": {"hash": Binary(b"\0" * 3), "keyId": 0}},
     140, "Unsupported SHA1Block hash length: 3"),
])
def test_cluster_time_shape_check(ct, code, text):
    with pytest.raises(MongoError) as err:
        parse_gossip({"ping": 1, "$clusterTime": ct})
    assert err.value.code == code and text in err.value.errmsg


def test_well_formed_cluster_time_parses():
    ts = Timestamp(5, 6)
    assert parse_gossip({"$clusterTime": {"clusterTime": ts}}) == ts
    assert parse_gossip({"$clusterTime": {"clusterTime": ts, "x": 1, "signature": {
        "hash": Binary(b"\0" * 20), "keyId": Int64(0)}}}) == ts
    assert parse_gossip({"ping": 1}) is None
    with pytest.raises(MongoError) as err:
        parse_gossip({"$configTime": 1})
    assert err.value.code == 14


def _req(name: str, body: dict) -> Request:
    body = {name: body.pop(name), **body, "$db": body.get("$db", "app")}
    return Request(name, body["$db"], body, ConnectionInfo(1))


def test_failed_durable_commit_is_an_error_reply_and_rolled_back(tmp_path):
    node = ShardNode(shard_name="d0", options={"dbpath": str(tmp_path / "d0")})

    async def main() -> None:
        ok = await node.run_command(_req("insert", {"insert": "c", "documents": [{"_id": 1}]}))
        assert ok["ok"] == 1
        node.durable.conn.execute("PRAGMA query_only=1")  # every write to SQLite now fails
        bad = await node.run_command(_req("insert", {"insert": "c", "documents": [{"_id": 2}]}))
        assert bad["ok"] == 0 and bad["code"] == 8 and bad["codeName"] == "UnknownError"
        assert "readonly database (SQLITE_READONLY)" in bad["errmsg"]
        assert "Error" not in bad["errmsg"] and "Traceback" not in bad["errmsg"]
        ping = await node.run_command(_req("ping", {"ping": 1}))  # still serving
        assert ping["ok"] == 1
        # the failed write is gone (aborted, as a WiredTiger transaction), not kept for later
        assert [d["_id"] for d in node.storage.get("app", "c").docs.values()] == [1]
        node.durable.conn.execute("PRAGMA query_only=0")
        ok = await node.run_command(_req("insert", {"insert": "c", "documents": [{"_id": 3}]}))
        assert ok["ok"] == 1

    asyncio.run(main())
    node.durable.close()
    again = ShardNode(shard_name="d0", options={"dbpath": str(tmp_path / "d0")})
    coll = again.storage.get("app", "c")
    assert sorted(d["_id"] for d in coll.docs.values()) == [1, 3]  # the failed write never was
    again.durable.close()
