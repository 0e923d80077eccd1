"""Why a stream waits: ``$currentOp`` through the router lists each router change-stream cursor
with its remotes and ``waitingFor`` (shardsim's ``changeStream`` sub-document), and answers
options and errors as mongod's ``document_source_current_op.cpp``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from shardsim.testing.helpers import change_stream_ops, read_events, split_over_two_shards
from shardsim.testing import ShardedCluster

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster() -> Any:
    with ShardedCluster(shards=2, seed=7) as c:
        yield c


def test_paused_shard_is_named_in_waiting_for_and_events_arrive_in_order(cluster: Any) -> None:
    client = cluster.client()
    primary, other = split_over_two_shards(client, "why.orders")
    orders = client.why.orders
    with orders.watch(max_await_time_ms=100) as stream:
        cid = stream._cursor.cursor_id  # the router cursor's id (what $currentOp reports)
        cluster.pause_shard(other)
        orders.insert_one({"_id": 1, "x": -1})            # running shard
        blocked = threading.Thread(target=lambda: orders.insert_one({"_id": 2, "x": 1}))
        blocked.start()                                   # waits for the paused shard
        orders.insert_one({"_id": 3, "x": -3})
        assert read_events(stream, 1, 1.0) == []                 # held back
        deadline, entry = time.monotonic() + 10, None
        while time.monotonic() < deadline:
            entries = change_stream_ops(client, cursor_id=cid)
            cs = entries[0]["changeStream"] if entries else None
            if cs and other in cs["waitingFor"] and cs["heldEvent"] is not None and \
                    sum(r["bufferedEvents"] for r in cs["remotes"]) >= 1:
                entry = entries[0]
                break
            time.sleep(0.05)
        if entry is None:
            cluster.resume_shard(other)
            blocked.join(10)
        assert entry is not None, change_stream_ops(client)
        cs = entry["changeStream"]
        assert primary not in cs["waitingFor"]
        assert entry["type"] in ("idleCursor", "op") and entry["ns"] == "why.orders"
        assert entry["cursor"]["tailable"] and entry["cursor"]["awaitData"]
        assert entry["cursor"]["originatingCommand"]["aggregate"] == "orders"
        remotes = {r["name"]: r for r in cs["remotes"]}
        assert set(remotes) == {primary, other, "config"}
        # its first event, held (the ARM asks a remote for more only once its buffer is empty)
        assert remotes[primary]["bufferedEvents"] == 1
        assert remotes[other]["bufferedEvents"] == 0
        assert remotes[other]["postBatchResumeToken"]["_data"] < cs["heldEvent"]["_data"]
        assert remotes[other]["lagMillis"] % 1000 == 0 and remotes[other]["lagMillis"] >= 0
        assert remotes[primary]["host"] == cluster.shard_address(primary)
        assert remotes[primary]["state"] == "PRIMARY"  # the router's monitor's view of it
        cluster.resume_shard(other)
        blocked.join(10)
        events = read_events(stream, 3, 10)
    # _id 2 was applied only when its shard answered again: after _id 3
    assert [e["documentKey"]["_id"] for e in events] == [1, 3, 2]
    tokens = [e["_id"]["_data"] for e in events]
    assert tokens == sorted(tokens)


def test_nothing_waits_when_idle_and_counts_are_kept(cluster: Any) -> None:
    client = cluster.client()
    coll = client.why.idle
    coll.insert_one({"x": 0})
    with coll.watch(max_await_time_ms=50) as stream:
        cid = stream._cursor.cursor_id
        coll.insert_many([{"x": i} for i in range(3)])
        assert len(read_events(stream, 3, 10)) == 3
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            cs = change_stream_ops(client, cursor_id=cid)[0]
            if not cs["changeStream"]["waitingFor"]:
                break
            time.sleep(0.05)
        assert cs["changeStream"]["waitingFor"] == []
        assert cs["changeStream"]["heldEvent"] is None
        assert cs["cursor"]["nDocsReturned"] >= 3 and cs["cursor"]["nBatchesReturned"] >= 2
    assert change_stream_ops(client, cursor_id=cid) == []              # closed: gone


def test_without_local_ops_the_shards_answer_for_themselves(cluster: Any) -> None:
    client = cluster.client()
    with client.why.other.watch():
        entries = list(client.admin.aggregate([{"$currentOp": {"idleCursors": True}}]))
    assert entries and {e["shard"] for e in entries} <= set(cluster.shard_names)
    assert all("changeStream" not in e for e in entries)   # shard cursors: no merge there
    assert all(e["type"] in ("idleCursor", "op") for e in entries)


@pytest.mark.parametrize("stage, code", [
    ({"$currentOp": 1}, 14),
    ({"$currentOp": {"idleCursors": 1}}, 9),
    ({"$currentOp": {"nope": True}}, 9),
])
def test_bad_options_get_mongod_errors(cluster: Any, stage: dict, code: int) -> None:
    client = cluster.client()
    with pytest.raises(OperationFailure) as info:
        list(client.admin.aggregate([stage]))
    assert info.value.code == code


def test_current_op_needs_admin_and_aggregate_1(cluster: Any) -> None:
    client = cluster.client()
    with pytest.raises(OperationFailure) as info:
        client.why.command("aggregate", 1, pipeline=[{"$currentOp": {}}], cursor={})
    assert info.value.code == 73


def test_load_wait_sampler_names_the_paused_shard(cluster: Any) -> None:
    from shardsim.tools.load.watch import WaitSampler
    client = cluster.client()
    primary, other = split_over_two_shards(client, "waits.c")
    coll = client.waits.c
    sampler = WaitSampler(cluster.uri, "waits", interval=0.05)
    with coll.watch(max_await_time_ms=100) as stream:
        sampler.start()
        cluster.pause_shard(other)
        try:
            coll.insert_one({"x": -1})
            read_events(stream, 1, 0.6)                          # held: the paused shard promised nothing
        finally:
            cluster.resume_shard(other)
        assert len(read_events(stream, 1, 10)) == 1
        sampler.stop()
        sampler.join(5)
    assert sampler.error is None
    assert sampler.longest() is not None and sampler.longest()[0] == other, sampler.held_s
