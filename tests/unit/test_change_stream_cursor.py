"""The change-stream cursor and the no-op writer against an in-memory oplog (no sockets):
batches, postBatchResumeToken / high-water marks in both promise modes, awaitData wake-ups,
``$sortKey`` for the router, invalidation closing the cursor, history lost while tailing."""

from __future__ import annotations

import asyncio
import time

import pytest
from bson import Binary, Timestamp

from shardsim.core import resume_token as rt
from shardsim.core.clock import ts_key
from shardsim.core.errors import MongoError
from shardsim.shard import noop_writer
from shardsim.shard.change_stream import open_cursor
from support.fakes import U1, FakeShardNode


def run(coro):
    return asyncio.run(coro)


def cursor(node, cs=None, rest=(), target="c", needs_merge=False):
    return open_cursor(node, "d", target, [{"$changeStream": cs or {}}, *rest], needs_merge=needs_merge)


def test_batches_and_pbrt_clock_mode():
    node = FakeShardNode()
    node.write("i", "d.c", {"_id": 0}, {"_id": 0})
    cur = cursor(node)

    async def go():
        b0 = await cur.fetch(0, None, first=True)
        assert b0.docs == [] and not b0.exhausted
        assert rt.is_high_water_mark(rt.decode(b0.post_batch_resume_token))
        for i in range(1, 6):
            node.write("i", "d.c", {"_id": i}, {"_id": i})
        node.write("i", "d.other", {"_id": 99}, {"_id": 99})
        b1 = await cur.fetch(2, 100, first=False)
        assert [d["documentKey"]["_id"] for d in b1.docs] == [1, 2]
        assert b1.post_batch_resume_token == dict(b1.docs[-1]["_id"])  # not promised past unread entries
        before = ts_key(node.clock.now())
        b2 = await cur.fetch(None, 100, first=False)
        assert [d["documentKey"]["_id"] for d in b2.docs] == [3, 4, 5]
        # scanned to the end: promise the cluster time + 1 tick (> the unrelated write), and
        # the clock moved there (the reply's $clusterTime covers its token: issue 26 item 3)
        p = rt.decode(b2.post_batch_resume_token)
        assert rt.is_high_water_mark(p) and ts_key(p.clusterTime) == before + 1
        assert ts_key(node.clock.now()) == before + 1
        node.clock.advance(Timestamp(2000, 5))
        b3 = await cur.fetch(None, 10, first=False)
        assert b3.docs == [] and rt.decode(b3.post_batch_resume_token).clusterTime == Timestamp(2000, 6)
        keys = [b.post_batch_resume_token["_data"] for b in (b0, b1, b2, b3)]
        assert keys == sorted(keys)
    run(go())


def test_pbrt_mongod_mode_follows_scanned_oplog():
    node = FakeShardNode("mongod")
    node.write("i", "d.c", {"_id": 0}, {"_id": 0})
    cur = cursor(node)

    async def go():
        b0 = await cur.fetch(0, None, first=True)
        node.clock.advance(Timestamp(5000, 1))  # gossip alone does not move the promise
        b1 = await cur.fetch(None, 10, first=False)
        assert b1.post_batch_resume_token == b0.post_batch_resume_token
        ts = node.write_noop({"msg": "periodic noop"})
        b2 = await cur.fetch(None, 10, first=False)
        assert b2.docs == [] and rt.decode(b2.post_batch_resume_token).clusterTime == ts
    run(go())


def test_await_data_wakes_only_for_matching_writes():
    node = FakeShardNode()
    cur = cursor(node)

    async def go():
        await cur.fetch(0, None, first=True)
        loop = asyncio.get_running_loop()
        loop.call_later(0.03, lambda: node.write("i", "d.other", {"_id": 1}, {"_id": 1}))
        t0 = time.monotonic()
        b = await cur.fetch(None, 150, first=False)
        assert b.docs == [] and time.monotonic() - t0 >= 0.14
        loop.call_later(0.03, lambda: node.write("i", "d.c", {"_id": 2}, {"_id": 2}))
        t0 = time.monotonic()
        b = await cur.fetch(None, 5000, first=False)
        assert [d["documentKey"]["_id"] for d in b.docs] == [2] and time.monotonic() - t0 < 2
    run(go())


def test_needs_merge_sort_key_and_topology_event_bypasses_user_stages():
    node = FakeShardNode()
    cur = cursor(node, rest=[{"$match": {"operationType": "delete"}}], needs_merge=True)

    async def go():
        await cur.fetch(0, None, first=True)
        node.write("d", "d.c", {"_id": 1})
        node.write("i", "d.c", {"_id": 2}, {"_id": 2})  # filtered by the user's $match
        node.write("n", "d.c", {"msg": "m"}, {"migrateChunkToNewShard": "d.c", "fromShardId": "a",
                                               "toShardId": "b"})
        b = await cur.fetch(None, 10, first=False)
        assert [d["operationType"] for d in b.docs] == ["delete", "migrateChunkToNewShard"]
        for d in b.docs:
            assert list(d.keys())[-1] == "$sortKey" and d["$sortKey"] == [d["_id"]]
    run(go())


def test_invalidate_closes_cursor_after_its_batch():
    node = FakeShardNode()
    cur = cursor(node)

    async def go():
        await cur.fetch(0, None, first=True)
        node.write("i", "d.c", {"_id": 1}, {"_id": 1})
        node.write("c", "d.$cmd", {"drop": "c"})
        node.write("i", "d.c", {"_id": 2}, {"_id": 2}, ui=Binary(b"\x09" * 16, 4))
        b = await cur.fetch(None, 10, first=False)
        assert [d["operationType"] for d in b.docs] == ["insert", "drop", "invalidate"]
        assert b.exhausted and b.post_batch_resume_token == dict(b.docs[-1]["_id"])
    run(go())


def test_history_lost_while_tailing():
    node = FakeShardNode(max_bytes=300, min_retention_s=0)
    cur = cursor(node)

    async def go():
        await cur.fetch(0, None, first=True)
        for i in range(20):  # far more than 300 bytes: the oplog truncates under the cursor
            node.write("i", "d.x", {"_id": i, "pad": "p" * 50}, {"_id": i})
        with pytest.raises(MongoError) as ei:
            await cur.fetch(None, 10, first=False)
        assert ei.value.code == 286
    run(go())


def test_resume_token_version_and_start_points():
    node = FakeShardNode()
    node.write("i", "d.c", {"_id": 1}, {"_id": 1})
    e2 = node.write("i", "d.c", {"_id": 2}, {"_id": 2})
    cur = cursor(node, {"startAtOperationTime": e2["ts"]})
    assert ts_key(rt.decode(cur.pbrt).clusterTime) == ts_key(e2["ts"])

    async def go():
        b = await cur.fetch(None, None, first=True)
        assert [d["documentKey"]["_id"] for d in b.docs] == [2]
    run(go())
    with pytest.raises(MongoError) as ei:
        cursor(node, {"startAtOperationTime": e2["ts"], "resumeAfter": rt.make_high_water_mark(e2["ts"])})
    assert ei.value.code == 40674


def test_noop_writer_writes_only_when_idle():
    node = FakeShardNode()

    async def go():
        task = noop_writer.start(node)
        first = next(node.oplog.entries_from(0))
        assert first["o"] == {"msg": "initiating set"}
        await asyncio.sleep(0.15)
        idle = [e for e in node.oplog.entries_from(0) if e["o"] == {"msg": "periodic noop"}]
        assert len(idle) >= 2
        n0 = len(node.oplog)
        for _ in range(10):  # busy: a write every 10 ms, no periodic noops
            node.write("i", "d.c", {"_id": time.monotonic()}, {"_id": 0})
            await asyncio.sleep(0.01)
        busy = [e for e in list(node.oplog.entries_from(0))[n0:] if e["op"] == "n"]
        noop_writer.stop(node)
        await asyncio.sleep(0)
        assert len(busy) <= 1 and task.cancelled() or task.done()
    run(go())


def test_failed_first_batch_releases_the_oplog_listener():
    from types import SimpleNamespace
    from shardsim.shard.change_stream import aggregate_change_stream
    from shardsim.core.cursors import CursorManager
    node = FakeShardNode()
    node.cursors = CursorManager()
    node.write("i", "d.c", {"_id": 1}, {"_id": 1})
    start = node.oplog.first_ts()
    req = SimpleNamespace(db="d", body={"aggregate": "c", "cursor": {},
                                        "pipeline": [{"$changeStream": {"startAtOperationTime": start}},
                                                     {"$project": {"_id": 0}}]})
    with pytest.raises(MongoError) as ei:
        run(aggregate_change_stream(node, req))
    assert ei.value.code == 280
    assert node.oplog._listeners == [] and len(node.cursors) == 0


def test_needs_merge_batch_vouches_for_its_sort_key_layout_only_when_true():
    # shardsim/cursors.py SORT_KEY_LAYOUT_FIELD: set only when every event of the batch starts
    # with _id (the router then skips re-checking each token's bytes); transaction events put
    # txnNumber/lsid first and a user $replaceRoot may move _id, so their batches go unmarked.
    import struct

    from bson import Int64
    from shardsim.core.cursors import SORT_KEY_LAYOUT_FIELD, SORT_KEY_SIZES_FIELD

    node = FakeShardNode()
    plain = cursor(node, needs_merge=True)
    direct = cursor(node)
    moved = cursor(node, rest=[{"$replaceRoot": {"newRoot": {"op": "$operationType", "_id": "$_id"}}}],
                   needs_merge=True)
    # not the fast path (a user stage): the same events, checked byte by byte before vouching
    general = cursor(node, rest=[{"$match": {"operationType": {"$ne": "update"}}}], needs_merge=True)

    async def go():
        for c in (plain, direct, moved, general):
            await c.fetch(0, None, first=True)
        node.write("i", "d.c", {"_id": 1}, {"_id": 1})
        node.write("d", "d.c", {"_id": 1})
        for c in (plain, general):
            b = await c.fetch(None, 10, first=False)
            assert len(b.docs) == 2 and b.extra[SORT_KEY_LAYOUT_FIELD] is True
            sizes = struct.unpack("<4i", b.extra[SORT_KEY_SIZES_FIELD])
            assert sizes == (*(len(d.raw) for d in b.docs), *(len(d["_id"].raw) for d in b.docs))
        assert (await direct.fetch(None, 10, first=False)).extra == {}
        b = await moved.fetch(None, 10, first=False)
        assert list(b.docs[0].keys())[:2] == ["op", "_id"] and b.extra == {}
        node.write("c", "d.$cmd", {"applyOps": [{"op": "i", "ns": "d.c", "ui": U1, "o": {"_id": 2},
                                                 "o2": {"_id": 2}}]},
                   ui=None, lsid={"id": Binary(bytes(16), 4)}, txnNumber=Int64(1))
        b = await plain.fetch(None, 10, first=False)
        assert list(b.docs[0].keys())[0] == "txnNumber" and b.extra == {}
        b = await plain.fetch(None, 10, first=False)  # nothing new: no events, no mark
        assert b.docs == [] and b.extra == {}
        node.write("c", "d.$cmd", {"drop": "c"})  # invalidate events go one by one: no mark
        b = await plain.fetch(None, 10, first=False)
        assert [d["operationType"] for d in b.docs] == ["drop", "invalidate"] and b.extra == {}
    run(go())
