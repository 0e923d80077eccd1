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
