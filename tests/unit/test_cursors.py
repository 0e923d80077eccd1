"""Cursor manager: batching, exhaustion, getMore namespace checks, killCursors (mongod semantics)."""

import asyncio

import pytest

from shardsim.core.cursors import CursorManager, ListCursor
from shardsim.core.errors import MongoError


def run(coro):
    return asyncio.run(coro)


def test_first_batch_default_101_then_rest():
    async def main():
        mgr = CursorManager()
        cur = ListCursor("db.c", [{"_id": i} for i in range(250)])
        first = await mgr.run_first_batch(cur, None)
        assert len(first["firstBatch"]) == 101 and first["id"] != 0 and first["ns"] == "db.c"
        more = await mgr.get_more(first["id"], "c", None, None)
        assert len(more["nextBatch"]) == 149 and more["id"] == 0
        with pytest.raises(MongoError) as err:
            await mgr.get_more(first["id"], "c", None, None)
        assert err.value.code == 43
    run(main())


def test_exhausted_first_batch_has_id_zero_and_is_not_registered():
    async def main():
        mgr = CursorManager()
        first = await mgr.run_first_batch(ListCursor("db.c", [{"a": 1}]), 10)
        assert first["id"] == 0 and len(mgr) == 0
    run(main())


def test_get_more_on_other_namespace_is_refused():
    async def main():
        mgr = CursorManager()
        first = await mgr.run_first_batch(ListCursor("db.c", [{"_id": i} for i in range(5)]), 2)
        with pytest.raises(MongoError) as err:
            await mgr.get_more(first["id"], "other", None, None)
        assert err.value.code == 13
    run(main())


def test_kill_cursors_reports_killed_and_not_found():
    async def main():
        mgr = CursorManager()
        first = await mgr.run_first_batch(ListCursor("db.c", [{"_id": i} for i in range(5)]), 2)
        reply = await mgr.kill([first["id"], 12345])
        assert reply["cursorsKilled"] == [first["id"]] and reply["cursorsNotFound"] == [12345]
        assert len(mgr) == 0
    run(main())


def test_batches_stop_before_16_mib():
    async def main():
        mgr = CursorManager()
        big = "x" * (5 * 1024 * 1024)
        first = await mgr.run_first_batch(ListCursor("db.c", [{"s": big} for _ in range(5)]), 100)
        assert len(first["firstBatch"]) == 3 and first["id"] != 0
    run(main())


def test_many_small_documents_keep_the_reply_under_16_mib():
    """Array keys of a big batch count toward the limit (router read-back of 500k docs)."""
    import bson

    async def main():
        mgr = CursorManager()
        docs = [{"_id": i, "s": i} for i in range(1_200_000)]
        first = await mgr.run_first_batch(ListCursor("db.c", docs), None)
        more = await mgr.get_more(first["id"], "c", None, None)
        reply = bson.encode({"cursor": more, "ok": 1.0})
        assert len(reply) <= 16 * 1024 * 1024 + 16 * 1024
        assert more["id"] != 0  # the rest is still there
    run(main())


class _Clock:
    """A fake monotonic clock for the maxTimeMS accounting (shardsim.core.cursors.clock)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _SlowCursor(ListCursor):
    """A ListCursor whose every fetch takes ``cost`` seconds of the fake clock."""

    def __init__(self, clock: _Clock, cost: float, n: int) -> None:
        super().__init__("db.c", [{"_id": i} for i in range(n)])
        self.clock = clock
        self.cost = cost
        self.closed = False

    async def fetch(self, batch_size, max_time_ms, *, first):
        self.clock.now += self.cost
        return await super().fetch(batch_size, max_time_ms, first=first)

    async def close(self):
        self.closed = True


def test_get_mores_run_within_what_the_commands_max_time_ms_left(monkeypatch):
    """Issue 31 (11): the originating command's maxTimeMS is shared by its cursor's getMores
    (getmore_cmd.cpp ``getLeftoverMaxTimeMicros``): once used up, MaxTimeMSExpired (50) and
    the cursor is gone; the time between getMores does not count."""
    from shardsim.core import cursors
    clock = _Clock()
    monkeypatch.setattr(cursors, "clock", clock)

    async def main():
        mgr = CursorManager()
        cur = _SlowCursor(clock, 0.030, 10)
        token = cursors.COMMAND_TIME_LIMIT.set((clock(), 0.100))  # find with maxTimeMS: 100
        try:
            first = await mgr.run_first_batch(cur, 2)
        finally:
            cursors.COMMAND_TIME_LIMIT.reset(token)
        assert abs(cur.max_time_left - 0.070) < 1e-9
        clock.now += 60  # idle between getMores: not counted
        more = await mgr.get_more(first["id"], "c", 2, None)
        assert len(more["nextBatch"]) == 2 and abs(cur.max_time_left - 0.040) < 1e-9
        more = await mgr.get_more(first["id"], "c", 2, None)
        assert abs(cur.max_time_left - 0.010) < 1e-9
        with pytest.raises(MongoError) as err:
            await mgr.get_more(first["id"], "c", 2, None)
        assert err.value.code == 50 and err.value.errmsg == "operation exceeded time limit"
        assert cur.closed and len(mgr) == 0
        with pytest.raises(MongoError) as err:
            await mgr.get_more(first["id"], "c", 2, None)
        assert err.value.code == 43
    run(main())


def test_a_command_past_its_max_time_ms_opens_no_cursor(monkeypatch):
    from shardsim.core import cursors
    clock = _Clock()
    monkeypatch.setattr(cursors, "clock", clock)

    async def main():
        mgr = CursorManager()
        cur = _SlowCursor(clock, 0.200, 10)
        token = cursors.COMMAND_TIME_LIMIT.set((clock(), 0.100))
        try:
            with pytest.raises(MongoError) as err:
                await mgr.run_first_batch(cur, 2)
        finally:
            cursors.COMMAND_TIME_LIMIT.reset(token)
        assert err.value.code == 50 and cur.closed and len(mgr) == 0
        # without maxTimeMS nothing is limited
        free = _SlowCursor(clock, 5.0, 10)
        first = await mgr.run_first_batch(free, 2)
        assert free.max_time_left is None
        more = await mgr.get_more(first["id"], "c", None, None)
        assert len(more["nextBatch"]) == 8
    run(main())


def test_cursor_ids_do_not_follow_the_global_random_state():
    """A process that seeds ``random`` (hypothesis does for every example) must not get the
    same cursor ids again: a router would take a late promise about a killed cursor for the
    new cursor that reused its id (found by tests/integration/test_router_change_stream_property.py:
    "postBatchResumeToken from shard0 went backwards", InternalError 1)."""
    import random

    async def main():
        ids = []
        for _ in range(2):
            random.seed(1234)
            mgr = CursorManager()
            ids.append(mgr.register(ListCursor("db.c", [])))
        assert ids[0] != ids[1]
    run(main())
