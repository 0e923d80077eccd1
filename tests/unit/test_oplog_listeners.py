"""The oplog's listener index: a write only calls the listeners (change-stream cursors) that
could match it, so idle streams on other namespaces cost nothing per write."""

from __future__ import annotations

import asyncio
import datetime

from bson import Timestamp

from shardsim.shard.change_stream import open_cursor
from shardsim.shard.oplog import Oplog
from support.fakes import FakeShardNode


def entry(inc, op="i", ns="d.c", **extra):
    e = {"op": op, "ns": ns, "o": {"_id": inc}, "ts": Timestamp(100, inc), "wall": datetime.datetime(2026, 1, 1)}
    e.update(extra)
    return e


def test_scoped_listeners_only_see_their_namespace_or_database():
    o = Oplog()
    by_ns, by_db, every = [], [], []
    o.add_listener(by_ns.append, ns="d.c")
    o.add_listener(by_db.append, db="d")
    o.add_listener(every.append)
    o.append(entry(1, ns="d.c"))
    o.append(entry(2, ns="d.other"))
    o.append(entry(3, ns="e.c"))
    o.append(entry(4, op="n", ns="", o={"msg": "periodic noop"}))
    o.append(entry(5, op="n", ns="d.c", o2={"shardCollection": "d.c"}))
    o.append(entry(6, op="c", ns="e.$cmd", o={"renameCollection": "e.a", "to": "d.c"}))
    o.append(entry(7, op="u", ns="d.c.x"))  # another collection whose name has the prefix
    assert [e["ts"].inc for e in by_ns] == [1, 5, 6]
    assert [e["ts"].inc for e in by_db] == [1, 2, 5, 6, 7]
    assert [e["ts"].inc for e in every] == [1, 2, 3, 4, 5, 6, 7]
    assert o.listener_count == 3


def test_remove_scoped_listener_and_register_once():
    o = Oplog()
    seen = []
    o.add_listener(seen.append, ns="d.c")
    o.add_listener(seen.append, ns="d.c")  # registered once
    o.append(entry(1))
    assert len(seen) == 1
    o.remove_listener(seen.append)
    o.remove_listener(seen.append)  # unknown: ignored
    o.append(entry(2))
    assert len(seen) == 1 and o.listener_count == 0 and o._by_ns == {}


class _Wake:
    """Stands in for the future a getMore parks on (``ChangeStreamCursor._wait``)."""

    def __init__(self):
        self._done = False

    def done(self):
        return self._done

    def set_result(self, _value):
        assert not self._done, "woken twice"
        self._done = True


def _waiting_cursor_with_counted_match(node, target, cs=None):
    """A cursor as if parked in a getMore (``_wake`` set), counting its filter's calls."""
    cur = open_cursor(node, "d", target, [{"$changeStream": cs or {}}])
    calls = []
    inner = cur.match

    def counted(e):
        calls.append(e["ns"])
        return inner(e)
    cur.match = counted
    cur._wake = _Wake()
    return cur, calls


def test_write_on_another_namespace_does_not_call_an_unrelated_cursor():
    node = FakeShardNode()
    coll_cur, coll_calls = _waiting_cursor_with_counted_match(node, "c")
    db_cur, db_calls = _waiting_cursor_with_counted_match(node, 1)
    for i in range(50):
        node.write("i", "d.other", {"_id": i}, {"_id": i})
        node.write("i", "x.c", {"_id": i}, {"_id": i})
    assert coll_calls == []
    assert db_calls == ["d.other"]  # same database: the stream looks (and wakes, then stops looking)
    assert not coll_cur._wake.done() and db_cur._wake.done()
    node.write("i", "d.c", {"_id": 1}, {"_id": 1})
    assert coll_calls == ["d.c"] and coll_cur._wake.done()
    coll_cur._wake = _Wake()
    node.write("c", "d.$cmd", {"drop": "c"})  # commands reach every cursor
    assert coll_calls == ["d.c", "d.$cmd"]
    asyncio.run(coll_cur.close())
    asyncio.run(db_cur.close())
    assert node.oplog.listener_count == 0


def test_mongod_mode_cursor_listens_to_every_entry():
    node = FakeShardNode(promise_mode="mongod")
    cur, calls = _waiting_cursor_with_counted_match(node, "c")
    node.write("i", "x.c", {"_id": 1}, {"_id": 1})
    assert calls == ["x.c"]
    asyncio.run(cur.close())
    assert node.oplog.listener_count == 0


# -- the scan index ------------------------------------------------------------------------------

def _expected(entries, ns=None, db=None):
    def keep(e):
        if e["op"] == "c":
            return True
        if ns is not None:
            return e["ns"] == ns
        return bool(e["ns"]) and e["ns"].partition(".")[0] == db
    return [e["ts"].inc for e in entries if keep(e)]


def test_scoped_entries_from_matches_a_filtered_full_scan_across_truncation():
    import random
    rnd = random.Random(7)
    o = Oplog(max_bytes=1 << 62)
    written = []
    namespaces = ["d.c", "d.other", "e.c", "d.c2", ""]
    for inc in range(1, 6001):
        ns = rnd.choice(namespaces)
        op = "n" if ns == "" else rnd.choice(["i", "u", "d", "n", "c"])
        e = entry(inc, op=op, ns=(ns.partition(".")[0] + ".$cmd") if op == "c" else ns)
        o.append(e)
        written.append(e)
    for scope in ({"ns": "d.c"}, {"db": "d"}, {"ns": "never.written"}):
        got = [k & 0xFFFFFFFF for k, _ in o.scoped_entries_from(0, **scope)]
        assert got == _expected(written, **scope)
        start = (100 << 32) | 3000
        got = [e["ts"].inc for _, e in o.scoped_entries_from(start, **scope)]
        assert got == _expected(written[2999:], **scope)
    # A suspended iterator survives truncation + compaction and sees later appends.
    it = o.scoped_entries_from(0, ns="d.c")
    first = [next(it)[1]["ts"].inc for _ in range(3)]
    o.max_bytes = 0  # truncate everything but the newest entry (compacts the arrays)
    o.truncate()
    assert o._index_gen > 0
    o.max_bytes = 1 << 62
    o.append(entry(7000, ns="d.c"))
    o.append(entry(7001, ns="e.c"))
    rest = [e["ts"].inc for _, e in it]
    assert first == _expected(written, ns="d.c")[:3]
    assert rest[-1] == 7000 and 7001 not in rest and all(i >= 6000 for i in rest)
    assert all(len(a) <= 2 for a in o._ns_pos.values())


def test_idle_stream_getmore_skips_unrelated_writes_and_still_promises_the_end():
    node = FakeShardNode(promise_mode="mongod")
    cur = open_cursor(node, "d", "idle", [{"$changeStream": {}}])
    calls = []
    inner = cur.match
    cur.match = lambda e: calls.append(e["ns"]) or inner(e)

    async def go():
        await cur.fetch(0, None, first=True)
        for i in range(500):
            node.write("i", "d.busy", {"_id": i}, {"_id": i})
        node.write("c", "d.$cmd", {"create": "x"})
        b = await cur.fetch(None, 0, first=False)
        assert b.docs == []
        assert calls == ["d.$cmd"]  # only the command; the 500 inserts were never looked at
        from shardsim.core import resume_token as rt
        p = rt.decode(b.post_batch_resume_token)  # mongod mode: HWM of the newest entry
        assert rt.is_high_water_mark(p) and p.clusterTime == node.oplog.last_ts()
        node.write("i", "d.idle", {"_id": 1}, {"_id": 1})
        b = await cur.fetch(None, 0, first=False)
        assert [d["documentKey"]["_id"] for d in b.docs] == [1]
        await cur.close()

    asyncio.run(go())


def test_truncation_calls_no_cursor_and_history_loss_is_still_detected():
    from shardsim.core.errors import MongoError
    node = FakeShardNode()
    node.oplog.max_bytes = 2000
    curs = [open_cursor(node, "d", f"c{i}", [{"$changeStream": {}}]) for i in range(20)]
    assert node.oplog.truncated_callbacks == []  # a write at the size cap costs nothing per cursor

    async def go():
        for c in curs:
            await c.fetch(0, None, first=True)
        for i in range(50):
            node.write("i", "d.c0", {"_id": i, "pad": "p" * 50}, {"_id": i})
        assert node.oplog.truncated_through > 0
        try:
            await curs[0].fetch(None, 0, first=False)
        except MongoError as exc:
            assert exc.code == 286
        else:
            raise AssertionError("expected ChangeStreamHistoryLost")
        for c in curs:
            await c.close()

    asyncio.run(go())
