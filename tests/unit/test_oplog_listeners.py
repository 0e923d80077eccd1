"""The oplog's listener index: a write only calls the listeners (change-stream cursors) that
could match it, so idle streams on other namespaces cost nothing per write."""

from __future__ import annotations

import asyncio
import datetime

from bson import Binary, Timestamp

from shardsim.clock import HybridLogicalClock
from shard.change_stream import open_cursor
from shard.oplog import Oplog, PreImages

U1 = Binary(bytes(range(16)), 4)


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


class FakeNode:
    def __init__(self, promise_mode="clock"):
        self.clock = HybridLogicalClock(wall=lambda: 1000.0)
        self.oplog = Oplog()
        self.pre_images = PreImages()
        self.options = {"promise_mode": promise_mode}

    def write(self, op, ns, o, o2=None):
        e = {"op": op, "ns": ns, "ui": U1, "o": o, "ts": self.clock.tick(),
             "wall": datetime.datetime(2026, 1, 1)}
        if o2 is not None:
            e["o2"] = o2
        self.oplog.append(e)


def _waiting_cursor_with_counted_match(node, target, cs=None):
    """A cursor as if parked in a getMore (``_wake`` set), counting its filter's calls."""
    cur = open_cursor(node, "d", target, [{"$changeStream": cs or {}}])
    calls = []
    inner = cur.match

    def counted(e):
        calls.append(e["ns"])
        return inner(e)
    cur.match = counted
    cur._wake = asyncio.Event()
    return cur, calls


def test_write_on_another_namespace_does_not_call_an_unrelated_cursor():
    node = FakeNode()
    coll_cur, coll_calls = _waiting_cursor_with_counted_match(node, "c")
    db_cur, db_calls = _waiting_cursor_with_counted_match(node, 1)
    for i in range(50):
        node.write("i", "d.other", {"_id": i}, {"_id": i})
        node.write("i", "x.c", {"_id": i}, {"_id": i})
    assert coll_calls == []
    assert db_calls == ["d.other"]  # same database: the stream looks (and wakes, then stops looking)
    assert not coll_cur._wake.is_set() and db_cur._wake.is_set()
    node.write("i", "d.c", {"_id": 1}, {"_id": 1})
    assert coll_calls == ["d.c"] and coll_cur._wake.is_set()
    coll_cur._wake = asyncio.Event()
    node.write("c", "d.$cmd", {"drop": "c"})  # commands reach every cursor
    assert coll_calls == ["d.c", "d.$cmd"]
    asyncio.run(coll_cur.close())
    asyncio.run(db_cur.close())
    assert node.oplog.listener_count == 0


def test_mongod_mode_cursor_listens_to_every_entry():
    node = FakeNode(promise_mode="mongod")
    cur, calls = _waiting_cursor_with_counted_match(node, "c")
    node.write("i", "x.c", {"_id": 1}, {"_id": 1})
    assert calls == ["x.c"]
    asyncio.run(cur.close())
    assert node.oplog.listener_count == 0
