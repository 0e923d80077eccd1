"""The fused CRUD fast path (``shard/change_stream/fast_crud.py``) emits exactly the bytes of the
general path (the pipeline list: Transform -> Event -> ``ChangeStreamCursor._emit`` ->
``encode_event``), over many varied oplog entries, for every stream shape that may use it, and
declines what it does not cover."""

from __future__ import annotations

import asyncio
import collections
import datetime
import copy
import random
import re

import bson
import pytest
from bson import (Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex,
                  Timestamp)
from bson.tz_util import FixedOffset, utc

from shardsim.core import resume_token as rt
from shardsim.shard.change_stream import fast_crud, open_cursor
from shardsim.core import change_stream_spec as spec_mod
from shardsim.shard.change_stream.cursor import RawEvent

from support.fakes import FakeShardNode as FakeNode

U1 = Binary(bytes(range(16)), 4)
U2 = Binary(bytes(range(16, 32)), 4)
U3 = Binary(bytes(range(32, 48)), 4)
WALL = datetime.datetime(2026, 1, 1, 12, 30, 45, 123456)


def _ids(rng: random.Random) -> list:
    return [
        0, 1, 7, 127, 128, 255, 256, 65535, 65536, 2**23, 2**24 + 3, 2**31 - 1, 2**31, 2**40,
        2**62, 2**63 - 1, -1, -128, -(2**31), -(2**31) - 1, -(2**63), rng.randint(1, 2**31 - 1),
        Int64(5), Int64(-9), 1.5, -0.0, 0.0, 2.0, 1e300, float("inf"), float("nan"),
        Decimal128("1.10"), Decimal128("-0"), ObjectId(), ObjectId(b"\x00" * 12), "", "a",
        "héllo ✓", "nul\x00inside", "x" * 300, True, False, None,
        {"a": 1, "b": {"c": [1, "x", None]}}, {"": 0}, [1, [2, 3]], [],
        Binary(b"\x01\x02", 0), Binary(bytes(16), 4), Binary(b"zz", 128), b"raw-bytes",
        datetime.datetime(1969, 12, 31, 23, 59, 59, 999999),
        Timestamp(5, 6), Regex("^a.*", "im"), MinKey(), MaxKey(), Code("x = 1"),
        Code("y", {"s": 1}),
    ]


def _doc(rng: random.Random, _id) -> dict:
    d = {"_id": _id}
    for k in rng.sample(["s", "n", "f", "nested", "arr", "when", "bin", "misc", "big", "ts"],
                        rng.randint(0, 6)):
        d[k] = {
            "s": "text ✓ " * rng.randint(0, 3),
            "n": rng.choice([0, -5, 2**40, Int64(3)]),
            "f": rng.choice([0.25, -1e-9, 3.0]),
            "nested": {"a": {"b": {"c": [1, {"d": None}, [True, False]]}}, "e": ObjectId()},
            "arr": [rng.randint(-9, 9) for _ in range(rng.randint(0, 5))],
            "when": rng.choice([WALL, datetime.datetime(2000, 2, 29, tzinfo=utc),
                                datetime.datetime(2020, 5, 5, 1, 2, 3, 4000,
                                                  tzinfo=FixedOffset(-90, "x"))]),
            "bin": Binary(bytes(range(rng.randint(0, 20))), rng.choice([0, 4, 5])),
            "misc": [MinKey(), MaxKey(), Regex("b+", "x"), re.compile("c", re.I), Code("z"),
                     Timestamp(1, 2), Decimal128("-7.000"), DBRef("coll", 5, "db"), None,
                     Binary(bytes(16), 3)],
            "big": "B" * rng.choice([0, 1000, 40000]),
            "ts": Timestamp(rng.randint(0, 2**32 - 1), rng.randint(0, 2**32 - 1)),
        }[k]
    return d


def _diff(rng: random.Random) -> dict:
    choices = [
        {"u": {"a": 1, "b.c": "dotted"}},
        {"i": {"new": [1, 2]}, "d": {"gone": False}},
        {"u": {"x": None}, "i": {"y": {"z": 1}}, "d": {"w": False, "1": False}},
        {"sa": {"a": True, "u0": "first", "l": 3}},
        {"sa": {"a": True, "s2": {"u": {"k": 1}}, "u5": [1]}},
        {"sa": {"a": True, "s1": {"a": True, "u0": 9, "l": 1}}},
        {"sn": {"u": {"deep": 1}, "sm": {"d": {"q": False}, "i": {"r": 2}}}},
        {"s0": {"u": {"num": 1}}, "u": {"top": WALL}},
        {},
    ]
    return rng.choice(choices)


def _populate(node: FakeNode, n: int, seed: int) -> None:
    """Varied CRUD entries on several namespaces and UUIDs, with non-CRUD entries between."""
    rng = random.Random(seed)
    ids = _ids(rng)
    shared_wall = WALL
    for i in range(n):
        ns, ui = rng.choice([("d.c", U1), ("d.c", U1), ("d.c2", U2), ("d.c", U3), ("e.x", U2),
                             ("d.c", None), ("d.system.views", U3), ("config.y", U1)])
        _id = ids[i % len(ids)] if i < 2 * len(ids) else rng.choice(ids)
        key = {"_id": _id}
        if rng.random() < 0.3:  # shard key in o2 (and in the order mongod writes it)
            key = {"sk": rng.choice([1, "k", ObjectId(), 2.5]), "_id": _id}
        wall = rng.choice([shared_wall, shared_wall, WALL + datetime.timedelta(microseconds=i),
                           datetime.datetime(2026, 3, 1, tzinfo=FixedOffset(120, "y")),
                           datetime.datetime(2026, 1, 1, 12, 30, 45, 123999), None])
        extra = {"wall": wall}
        if rng.random() < 0.05:
            extra["fromMigrate"] = True
        if rng.random() < 0.05:
            extra.update(lsid={"id": Binary(bytes(16), 4)}, txnNumber=Int64(i), stmtId=0)
        r = rng.random()
        if r < 0.4:
            node.write("i", ns, _doc(rng, _id), key if rng.random() < 0.8 else None, ui=ui,
                       **extra)
        elif r < 0.6:
            node.write("u", ns, {"$v": 2, "diff": _diff(rng)}, key, ui=ui, **extra)
        elif r < 0.7:
            node.write("u", ns, _doc(rng, _id), key, ui=ui, **extra)  # replacement
        elif r < 0.8:
            node.write("d", ns, key, ui=ui, **extra)
        elif r < 0.85:
            node.write_noop({"msg": "periodic noop"})
        elif r < 0.9:
            node.write("c", "d.$cmd", {"applyOps": [
                {"op": "i", "ns": "d.c", "ui": U1, "o": {"_id": i}, "o2": {"_id": i}},
                {"op": "u", "ns": "d.c2", "ui": U2, "o": {"$v": 2, "diff": {"u": {"a": 1}}},
                 "o2": {"_id": 3}}]}, ui=None, lsid={"id": Binary(bytes(16), 4)},
                txnNumber=Int64(1))
        elif r < 0.93:
            node.write("c", "d.$cmd", {"createIndexes": "c", "v": 2, "key": {"a": 1},
                                       "name": "a_1"}, ui=U1)
        elif r < 0.96:
            # odd entries: a document that is not a dict (general path), one without _id
            node.write("i", ns, collections.OrderedDict(_doc(rng, _id)), key, ui=ui)
            node.write("i", ns, {"v": i}, None, ui=ui)
        else:
            node.write("u", ns, {"$v": 2, "diff": _diff(rng)}, None, ui=ui)  # no o2


def _drain(node, db, target, pipeline, needs_merge, general, batch_sizes=(0, 7, 50, 3, None)):
    """Every batch (raw events and postBatchResumeToken) of a fresh cursor; with ``general``
    the fast path is switched off. Also returns how many events the fast path emitted."""
    cur = open_cursor(node, db, target, pipeline, needs_merge=needs_merge)
    used = [0]
    if general:
        cur.fast = None
    elif cur.fast is not None:
        inner = cur.fast

        def counting(keys, entries, i, stop, need):
            j, made = inner(keys, entries, i, stop, need)
            assert j - i == made <= need
            used[0] += made
            return j, made
        cur.fast = counting

    async def go():
        out = []
        sizes = list(batch_sizes)
        first = True
        while True:
            bs = sizes.pop(0) if sizes else None
            b = await cur.fetch(bs, 0, first=first)
            first = False
            for d in b.docs:
                assert type(d) is RawEvent
            out.append(([d.raw for d in b.docs], b.post_batch_resume_token, b.exhausted))
            if b.exhausted or (not b.docs and bs != 0):
                return out
    return asyncio.run(go()), used[0]


STREAMS = [
    ("d", "c", {}),
    ("d", "c2", {}),
    ("d", 1, {}),
    ("admin", 1, {"allChangesForCluster": True}),
    ("d", 1, {"showMigrationEvents": True}),
]


@pytest.mark.parametrize("needs_merge", [False, True])
@pytest.mark.parametrize("db,target,opts", STREAMS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fast_path_bytes_equal_general_path(seed, db, target, opts, needs_merge):
    node = FakeNode()
    node.write_noop({"msg": "initiating set"})
    start = node.clock.now()
    _populate(node, 400, seed)
    pipeline = [{"$changeStream": {"startAtOperationTime": start, **opts}}]
    # a client's own stream moves its shard's clock up to the promises it hands out: each
    # path starts from the same clock
    clock = copy.deepcopy(node.clock)
    general, _ = _drain(node, db, target, pipeline, needs_merge, general=True)
    node.clock = copy.deepcopy(clock)
    fast, used = _drain(node, db, target, pipeline, needs_merge, general=False)
    assert fast == general
    assert used > 20  # the fast path really ran
    assert sum(len(b[0]) for b in general) > used  # and the general path had its share


@pytest.mark.parametrize("needs_merge", [False, True])
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("kind", ["event", "hwm"])
def test_resumed_streams_match_general_path(kind, version, needs_merge):
    """Resuming from a v1 or v2 event token / high-water mark: the general path decides up to
    and at the resume point (v1 tokens there), the fast path after it."""
    node = FakeNode()
    node.write_noop({"msg": "initiating set"})
    _populate(node, 300, 7)
    entries = [e for e in node.oplog.entries_from(0)
               if e["op"] == "i" and e["ns"] == "d.c" and type(e["o"]) is dict
               and e.get("ui") is not None and not e.get("fromMigrate")]
    e = entries[len(entries) // 3]
    dk = e.get("o2") or {"_id": e["o"].get("_id")}
    if kind == "event":
        token = rt.event_token(e["ts"], bytes(e["ui"]), "insert", dk, version=version)
    else:
        token = rt.make_high_water_mark(e["ts"], version)
    for db, target, opts in (("d", "c", {}), ("d", 1, {})):
        pipeline = [{"$changeStream": {"resumeAfter": token, **opts}}]
        clock = copy.deepcopy(node.clock)  # each path from the same clock (see above)
        general, _ = _drain(node, db, target, pipeline, needs_merge, general=True)
        node.clock = copy.deepcopy(clock)
        fast, used = _drain(node, db, target, pipeline, needs_merge, general=False)
        node.clock = clock
        assert fast == general
        assert used > 10
        first = rt.decode(RawEvent(general[0][0][0] if general[0][0] else general[1][0][0])["_id"])
        if kind == "hwm" and version == 1:
            assert first.version == 1  # the event at the resume time keeps the token's version


def test_ineligible_streams_never_use_the_fast_path():
    for opts, rest in [({"fullDocument": "updateLookup"}, []),
                       ({"fullDocumentBeforeChange": "whenAvailable"}, []),
                       ({"showExpandedEvents": True}, []), ({"showRawUpdateDescription": True}, []),
                       ({"showCommitTimestamp": True}, []),
                       ({"$_generateV2ResumeTokens": False}, []),
                       ({}, [{"$match": {"operationType": "insert"}}]),
                       ({}, [{"$changeStreamSplitLargeEvent": {}}])]:
        spec = spec_mod.parse("d", "c", [{"$changeStream": opts}, *rest])
        assert not fast_crud.eligible(spec), opts
    assert fast_crud.eligible(spec_mod.parse("d", "c", [{"$changeStream": {}}], needs_merge=True))


@pytest.mark.parametrize("needs_merge", [False, True])
@pytest.mark.parametrize("_id", [1, "s"])
def test_runs_stop_before_oversized_and_unencodable_events(_id, needs_merge):
    """A run takes entries up to the first one it leaves to the general path: an event over
    the size limit, a document the C encoder refuses, an entry of another kind."""
    spec = spec_mod.parse("d", "c", [{"$changeStream": {}}], needs_merge=needs_merge)
    out = collections.deque()
    run = fast_crud.build(spec, out.append, RawEvent, 1000)

    def ins(i, pad, **extra):
        return {"op": "i", "ns": "d.c", "ui": U1, "o": {"_id": _id, "p": pad, **extra},
                "o2": {"_id": _id}, "ts": Timestamp(9, i), "wall": WALL}
    entries = [ins(1, "x"), ins(2, "y"), ins(3, "x" * 2000), ins(4, "z"),
               ins(5, "w", bad=object()), ins(6, "v"), {"op": "n", "ns": "d.c", "o": {},
                                                         "ts": Timestamp(9, 7)}, ins(8, "u")]
    keys = [(9 << 32) | e["ts"].inc for e in entries]
    assert run(keys, entries, 0, len(entries), 100) == (2, 2)
    assert run(keys, entries, 3, len(entries), 100) == (4, 1)
    assert run(keys, entries, 5, len(entries), 100) == (6, 1)
    assert run(keys, entries, 7, len(entries), 0) == (7, 0)
    assert run(keys, entries, 7, 7, 5) == (7, 0)
    assert run(keys, entries, 7, len(entries), 5) == (8, 1)
    assert [bson.decode(d.raw)["fullDocument"]["p"] for d, _, _ in out] == list("xyzvu")
    assert all(len(d.raw) == size < 1000 for d, _, size in out)


def test_token_doc_round_trip():
    for token in (rt.event_token(Timestamp(1, 2), bytes(16), "insert", {"_id": 5}),
                  rt.event_token(Timestamp(1, 2), None, "delete", {"_id": Int64(5), "k": 1.5})):
        tok = fast_crud.token_doc(token["_data"], bytes(token["_typeBits"])
                                  if "_typeBits" in token else None)
        assert bson.encode(token) == tok and fast_crud.token_from_doc(tok) == token
        assert type(fast_crud.token_from_doc(tok).get("_typeBits", Binary(b""))) is Binary


@pytest.mark.parametrize("limit_bytes", [1, 900, 5000, 20000])
def test_batches_are_as_full_as_the_byte_limit_allows(monkeypatch, limit_bytes):
    """``fetch`` (bulk or event by event) fills a batch while the array of events stays within
    the byte limit, and always returns at least one event."""
    from shardsim.shard.change_stream import cursor as cursor_mod
    monkeypatch.setattr(cursor_mod, "BATCH_BYTES_LIMIT", limit_bytes)
    node = FakeNode()
    node.write_noop({"msg": "initiating set"})
    start = node.clock.now()
    rng = random.Random(limit_bytes)
    for i in range(300):
        node.write("i", "d.c", {"_id": i, "p": "x" * rng.choice([0, 10, 100, 1000, 4000])},
                   {"_id": i})
    batches, _ = _drain(node, "d", "c", [{"$changeStream": {"startAtOperationTime": start}}],
                        False, general=False, batch_sizes=(0, 5, 1000, 3, None, None))
    raws = [r for b in batches for r in b[0]]
    assert len(raws) == 300
    arrays = [(bson.encode({"a": [RawEvent(r) for r in b[0]]}), b[0]) for b in batches if b[0]]
    for n, (enc, docs) in enumerate(arrays):
        array_bytes = len(enc) - 4 - 3 - 4 - 1 - 1  # the array's elements only
        assert len(docs) == 1 or array_bytes <= limit_bytes
        if n + 1 < len(arrays) and len(docs) not in (5, 3):  # a count limit did not end it
            nxt = arrays[n + 1][1][0]
            assert array_bytes + len(nxt) + len(str(len(docs))) + 2 > limit_bytes


def test_int_id_token_template_matches_generic_encoder():
    rng = random.Random(5)
    values = [1, 2, 63, 64, 127, 128, 255, 256, 2**15, 2**16 - 1, 2**16, 2**23, 2**24,
              2**30, 2**31 - 1] + [rng.randint(1, 2**31 - 1) for _ in range(300)]
    for v in values:
        ts = Timestamp(rng.randint(0, 2**32 - 1), rng.randint(0, 2**32 - 1))
        u = None if v % 5 == 0 else bytes(rng.randrange(256) for _ in range(16))
        op = rng.choice(["insert", "update", "replace", "delete"])
        n = ((v << 1).bit_length() + 7) >> 3
        data = rt.int_id_token_template(rt.event_mid_hex(u, op), n) % (
            (ts.time << 32) | ts.inc, v << 1)
        assert {"_data": data} == rt.event_token(ts, u, op, {"_id": v})


def test_oid_id_token_template_matches_generic_encoder():
    rng = random.Random(6)
    for i in range(200):
        oid = ObjectId(bytes(rng.randrange(256) for _ in range(12))) if i else ObjectId(bytes(12))
        ts = Timestamp(rng.randint(0, 2**32 - 1), rng.randint(0, 2**32 - 1))
        u = None if i % 5 == 0 else bytes(rng.randrange(256) for _ in range(16))
        op = rng.choice(["insert", "update", "replace", "delete"])
        data = rt.oid_id_token_template(rt.event_mid_hex(u, op)) % (
            (ts.time << 32) | ts.inc, oid.binary.hex().upper())
        assert {"_data": data} == rt.event_token(ts, u, op, {"_id": oid})
