"""Issue 28 without sockets: ``$regex`` with a match budget and ``maxTimeMS`` as a deadline
(:mod:`shardsim.core.regex_limits`, :mod:`shardsim.core.max_time`), large messages decoded and encoded a
slice at a time and refused before authentication from their command name
(:mod:`shardsim.core.large_messages`)."""

from __future__ import annotations

import asyncio
import datetime
import re
import time

import bson
import pytest
from bson import Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp

from shardsim.core import large_messages, max_time, wire
from shardsim.core.client import _encode
from shardsim.core.commands import ConnectionInfo
from shardsim.core.errors import MongoError
from shardsim.core.node import decode
from shardsim.core.query import matches, select_paced
from shardsim.shard.node import ShardNode


def test_regex_matches_like_before_for_ordinary_patterns() -> None:
    doc = {"s": "Hello World", "l": ["x", "abc"], "n": 5}
    assert matches({"s": {"$regex": "^hello", "$options": "i"}}, doc)
    assert not matches({"s": {"$regex": "^hello"}}, doc)
    assert matches({"s": Regex("world$", "i")}, doc)
    assert matches({"s": re.compile("o W")}, doc)
    assert matches({"l": {"$regex": "b"}}, doc)
    assert matches({"l": {"$in": [re.compile("^a"), "zz"]}}, doc)
    assert not matches({"n": {"$regex": "5"}}, doc)
    assert matches({"s": {"$regex": "hello.world", "$options": "s"}}, {"s": "hello\nworld"})
    assert not matches({"s": {"$regex": "hello.world"}}, {"s": "hello\nworld"})
    assert matches({"s": {"$not": re.compile("^z")}}, doc)


def test_a_backtracking_regex_is_no_match_within_its_budget() -> None:
    """mongod 8.0: a match that stops at PCRE2's match limit counts as no match."""
    doc = {"s": "a" * 30 + "!"}
    t0 = time.perf_counter()
    assert not matches({"s": {"$regex": "(a|a)+$"}}, doc)
    assert time.perf_counter() - t0 < 1.0  # unbounded, this pattern runs for minutes
    assert not matches({"s": {"$regex": "(a+)+$"}}, doc)
    assert matches({"s": {"$regex": "(a+)+!$"}}, doc)


def test_max_time_ms_is_checked_per_document_and_inside_a_regex() -> None:
    async def scan(filt: dict, max_ms: int) -> list:
        with max_time.deadline_scope(max_ms):
            return await select_paced(_Coll(200), filt)

    assert len(asyncio.run(scan({"s": {"$regex": "^a"}}, 60_000))) == 200
    with pytest.raises(MongoError) as err:
        asyncio.run(scan({"s": {"$regex": "(a|a)+$"}}, 20))
    assert (err.value.code, err.value.code_name) == (50, "MaxTimeMSExpired")
    assert err.value.errmsg == "operation exceeded time limit"


def test_a_deadline_is_the_operations_own_not_its_child_tasks() -> None:
    async def main() -> tuple:
        with max_time.deadline_scope(1):
            child = asyncio.ensure_future(asyncio.sleep(0.01, result="child"))
            await asyncio.sleep(0.005)
            own = max_time.remaining()
            await child
            return own, await asyncio.create_task(_remaining())

    own, in_child = asyncio.run(main())
    assert own is not None and own < 0 and in_child is None


async def _remaining() -> float | None:
    return max_time.remaining()


class _Coll:
    def __init__(self, n: int) -> None:
        self.docs = {i: {"_id": i, "s": "a" * 30 + "!"} for i in range(n)}


VALUES = {"i": 1, "l": Int64(2), "d": 1.5, "dec": Decimal128("1.25"), "s": "x" * 40,
          "b": True, "n": None, "t": Timestamp(1, 2), "dt": datetime.datetime(2020, 1, 2),
          "oid": ObjectId(), "r": Regex("a", "i"), "c": Code("f"), "cs": Code("g", {"x": 1}),
          "bin": bson.Binary(b"\x01\x02", 0), "uuid": bson.Binary(b"0" * 16, 4),
          "min": MinKey(), "max": MaxKey(), "ref": DBRef("c", 1), "e": {}, "ea": []}


def test_sliced_decode_and_encode_give_the_whole_document() -> None:
    doc = {"insert": "c", "documents": [dict(VALUES, _id=i) for i in range(3000)],
           "nested": {"deep": list(range(50_000)), "k": {"x": "y" * 100_000}},
           "big": {f"f{i}": i for i in range(20_000)}, "$db": "x"}
    raw = bson.encode(doc)
    assert len(raw) > 10 * large_messages.SLICE_BYTES
    got = large_messages.decode_sliced(raw)
    assert got == decode(raw) and list(got) == list(decode(raw))
    assert large_messages.encode_sliced(decode(raw), _encode) == _encode(decode(raw))
    with pytest.raises(MongoError) as err:
        large_messages.decode_sliced(raw[:-3000] + b"\x07" * 3000)
    assert err.value.code == 22


def _node(auth: bool) -> ShardNode:
    return ShardNode(options={"auth": auth, "key": "k" * 20 if auth else None})


def test_a_large_message_before_authentication_is_refused_from_its_name() -> None:
    body = bson.encode({"insert": "c", "$db": "x"})
    msg = wire.encode_op_msg(body, sequences={"documents": [b"\x05\x00\x00\x00\x00"] * 10})
    header = wire.parse_header(msg)
    conn = ConnectionInfo(id=1, peer="127.0.0.1:1")
    assert large_messages.command_name(wire.OP_MSG, msg[16:]) == "insert"
    refusal = large_messages.pre_auth_refusal(_node(True), header, msg[16:], conn)
    assert refusal is not None and not refusal.fatal
    assert (refusal.error.code, refusal.error.errmsg) == \
        (13, "Command insert requires authentication")
    assert large_messages.pre_auth_refusal(_node(False), header, msg[16:], conn) is None
    for name in ("hello", "saslStart", "isMaster", "ismaster", "noSuchCommand"):
        other = wire.encode_op_msg(bson.encode({name: 1, "$db": "admin", "pad": "x" * 10}))
        assert large_messages.pre_auth_refusal(_node(True), wire.parse_header(other),
                                               other[16:], conn) is None


def test_a_paced_sort_gives_the_order_of_a_single_sort() -> None:
    import random
    from shardsim.core import query
    rnd = random.Random(7)
    choices = [1, 2.5, "x", None, Int64(2), "y", 7, [3, 1], [0, 9], True]
    docs = [{"_id": i, "a": rnd.choice(choices), "b": rnd.randint(0, 40)}
            for i in range(query._PACED_SORT_MIN + 3000)]
    for spec in ({"a": 1}, {"a": -1}, {"b": 1, "a": -1}, {"b": -1, "_id": 1}):
        want = [d["_id"] for d in query.sort_docs(docs, spec)]
        assert [d["_id"] for d in asyncio.run(query.sort_docs_paced(docs, spec))] == want
    with pytest.raises(MongoError) as err:
        asyncio.run(query.sort_docs_paced(docs, {"a": 2}))
    assert err.value.code == 15975
