"""Property tests (hypothesis) of the wire codec and command parsing, and BSON limits at the
door (issue 17, item 3).

- Random and garbled bytes fed to :class:`shardsim.core.wire.MessageReader` never raise anything but
  its documented :class:`~shardsim.core.wire.ProtocolError` (an impossible header length); every
  framed message parses to an OpMsg, an OpQuery or a BadMessage carrying a MongoError.
- A parsed message, turned into a command and run on an in-process shard, always gets a reply
  that encodes as BSON and carries no Python exception text (no InternalError, no traceback,
  no exception class name).
- Nesting: beyond 201 levels a message is refused with Overflow (15) like ``validateBSON``;
  an insert beyond 180 levels gets Overflow (15) like ``fixDocumentForInsert``; 180 levels are
  stored and the collection stays usable (count, aggregate).
"""

from __future__ import annotations

import asyncio
import re
import struct

import bson
import pytest
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardsim.core import wire
from shardsim.core.bson_limits import MAX_USER_STORAGE_DEPTH
from shardsim.core.commands import ConnectionInfo
from shardsim.core.errors import MongoError
from shardsim.core.server import request_from_op_msg, request_from_op_query
from shardsim.shard.node import ShardNode

PY_TEXT = re.compile(r"Traceback|RecursionError|ValueError|KeyError|TypeError|IndexError|"
                     r"AttributeError|OverflowError|UnicodeDecodeError|struct\.error|"
                     r"NoneType|object has no attribute|not subscriptable|unhashable")

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def nest(levels: int, leaf: object = 1) -> dict:
    """A document with ``levels`` levels of objects (the document itself is level 1)."""
    doc: dict = {"a": leaf}
    for _ in range(levels - 1):
        doc = {"a": doc}
    return doc


def op_msg(body: dict, sequences: dict[str, list[dict]] | None = None) -> bytes:
    payload = struct.pack("<I", 0) + b"\x00" + bson.encode(body)
    for name, docs in (sequences or {}).items():
        seq = name.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        payload += b"\x01" + struct.pack("<i", 4 + len(seq)) + seq
    return struct.pack("<iiii", 16 + len(payload), 7, 0, wire.OP_MSG) + payload


def frames(data: bytes) -> list[wire.Message]:
    reader = wire.MessageReader()
    reader.feed(data)
    return list(reader.messages())


# -- values and commands -------------------------------------------------------------------
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**31, 2**31 - 1),
    st.integers(-2**63, 2**63 - 1).map(Int64), st.floats(allow_nan=True),
    st.text(max_size=8), st.binary(max_size=8),
    st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["a", "b", "_id", "$set", "$gt", "q", "u", "$match"]),
                    inner, max_size=3)), max_leaves=12)
COMMANDS = ["insert", "update", "delete", "find", "aggregate", "count", "distinct", "ping",
            "findAndModify", "getMore", "killCursors", "createIndexes", "hello", "listIndexes"]
FIELDS = ["documents", "updates", "deletes", "filter", "pipeline", "cursor", "query", "key",
          "sort", "limit", "batchSize", "ordered", "$clusterTime", "lsid", "txnNumber",
          "collection", "indexes", "maxTimeMS", "update", "new", "upsert"]
commands = st.builds(
    lambda name, arg, extra: {name: arg, **extra, "$db": "fuzz"},
    st.sampled_from(COMMANDS), st.one_of(st.just("c"), scalars),
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=4))


@pytest.fixture(scope="module")
def node() -> ShardNode:
    return ShardNode(shard_name="fuzz")


def run(node: ShardNode, msg: wire.Message) -> dict:
    """The reply a server sends for ``msg`` (as shardsim.core.server._respond builds it)."""
    async def go() -> dict:
        if isinstance(msg, wire.BadMessage):
            return msg.error.to_reply()
        try:
            req = (request_from_op_msg if isinstance(msg, wire.OpMsg)
                   else request_from_op_query)(msg, ConnectionInfo(1))
        except MongoError as exc:
            return exc.to_reply()
        return await node.run_command(req)
    return asyncio.run(go())


def assert_clean(reply: dict) -> None:
    bson.encode(reply)  # encodes as BSON
    if not reply.get("ok"):
        assert reply.get("codeName") != "InternalError", reply
        assert isinstance(reply.get("code"), int), reply
    text = repr({k: v for k, v in reply.items() if k not in ("cursor",)})
    assert not PY_TEXT.search(text), reply


# -- the codec -----------------------------------------------------------------------------
@SETTINGS
@given(st.binary(max_size=600))
def test_random_bytes_never_escape_the_codec(data):
    try:
        msgs = frames(data)
    except wire.ProtocolError:
        return
    for m in msgs:
        assert isinstance(m, (wire.OpMsg, wire.OpQuery, wire.BadMessage))


@SETTINGS
@given(commands, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
       st.integers(0, 10_000))
def test_garbled_op_msg_parses_or_gets_a_mongo_error(node, cmd, flips, cut):
    data = bytearray(op_msg(cmd))
    for at, byte in flips:
        if 4 <= at < len(data):  # keep the length field: a bad one is the documented close
            data[at % len(data)] = byte
    if cut % 3 == 0:
        body_len = len(data) - 16
        del data[16 + (cut % max(body_len, 1)):]
        data[0:4] = struct.pack("<i", len(data))
    try:
        msgs = frames(bytes(data))
    except wire.ProtocolError:
        return
    for m in msgs:
        assert isinstance(m, (wire.OpMsg, wire.OpQuery, wire.BadMessage))
        if isinstance(m, wire.BadMessage):
            assert isinstance(m.error, MongoError)
        assert_clean(run(node, m))


@SETTINGS
@given(commands)
def test_random_commands_get_clean_replies(node, cmd):
    try:
        data = op_msg(cmd)
    except Exception:  # a value bson cannot encode: not a message a client can send
        return
    (m,) = frames(data)
    assert_clean(run(node, m))


@SETTINGS
@given(st.integers(1, 1200))
def test_any_nesting_gets_a_reply_never_a_recursion_error(node, levels):
    msg = op_msg({"insert": "deep", "$db": "fuzz"}, {"documents": [nest(levels)]})
    (m,) = frames(msg)
    reply = run(node, m)
    assert_clean(reply)
    if levels > 201:
        assert isinstance(m, wire.BadMessage) and m.error.code == 15
        assert reply["code"] == 15 and reply["codeName"] == "Overflow"
    elif levels > MAX_USER_STORAGE_DEPTH:
        assert reply["writeErrors"][0]["code"] == 15
    else:
        assert reply["n"] == 1


# -- limits at the door --------------------------------------------------------------------
def test_message_nesting_limit_is_mongods():
    (ok,) = frames(op_msg({"ping": 1, "$db": "a", "x": nest(200)}))  # 201 levels with the body
    assert isinstance(ok, wire.OpMsg)
    (bad,) = frames(op_msg({"ping": 1, "$db": "a", "x": nest(201)}))
    assert isinstance(bad, wire.BadMessage) and not bad.fatal
    assert bad.error.code == 15
    assert bad.error.errmsg == "BSONObj exceeded maximum nested object depth: 200"


def _doc(elements: bytes) -> bytes:
    return struct.pack("<i", len(elements) + 5) + elements + b"\x00"


def test_nesting_inside_code_with_scope_counts(node):
    """Audit L1 (issue 28): the scope of a code-with-scope value is one more level, as
    ``validateBSON`` descends into it; 955 levels inside a scope used to be stored."""
    from bson import Code
    (ok,) = frames(op_msg({"ping": 1, "$db": "a", "x": Code("f", nest(200))}))  # 201 levels
    assert isinstance(ok, wire.OpMsg)
    (bad,) = frames(op_msg({"ping": 1, "$db": "a", "x": Code("f", nest(201))}))
    assert isinstance(bad, wire.BadMessage) and bad.error.code == 15
    scope = bson.encode({"a": 1})  # 955 levels, built as bytes (pymongo cannot encode them)
    for _ in range(954):
        scope = _doc(b"\x03a\x00" + scope)
    cws = b"f\x00"
    cws = struct.pack("<ii", 8 + len(cws) + len(scope), len(cws)) + cws + scope
    doc = RawBSONDocument(_doc(b"\x10_id\x00" + struct.pack("<i", 1) + b"\x0fc\x00" + cws))
    (m,) = frames(op_msg({"insert": "cws", "$db": "door"}, {"documents": [doc]}))
    reply = run(node, m)
    assert reply["ok"] == 0 and reply["code"] == 15 and reply["codeName"] == "Overflow"
    (m,) = frames(op_msg({"find": "cws", "$db": "door", "filter": {}}))
    assert run(node, m)["cursor"]["firstBatch"] == []


def test_deep_document_is_refused_and_the_collection_stays_usable(node):
    def cmd(body: dict, seq: dict | None = None) -> dict:
        (m,) = frames(op_msg({**body, "$db": "door"}, seq))
        return run(node, m)

    assert cmd({"insert": "c"}, {"documents": [{"_id": 1}, nest(180) | {"_id": 2}]})["n"] == 2
    r = cmd({"insert": "c"}, {"documents": [nest(181) | {"_id": 3}]})
    assert r["writeErrors"][0]["code"] == 15
    assert r["writeErrors"][0]["errmsg"] == \
        "cannot insert document because it exceeds 180 levels of nesting"
    r = cmd({"insert": "c"}, {"documents": [nest(900) | {"_id": 4}]})
    assert r["ok"] == 0 and r["code"] == 15
    r = cmd({"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"b": nest(185)}}}]})
    assert r["writeErrors"][0]["code"] == 15 and "maximum nesting depth of 180" in \
        r["writeErrors"][0]["errmsg"]
    assert cmd({"count": "c", "query": {}})["n"] == 2
    r = cmd({"aggregate": "c", "pipeline": [{"$group": {"_id": None, "n": {"$sum": 1}}}],
             "cursor": {}})
    assert r["cursor"]["firstBatch"][0]["n"] == 2
    r = cmd({"find": "c", "filter": {"_id": 2}})
    assert r["cursor"]["firstBatch"][0] == nest(180) | {"_id": 2}


def test_message_over_max_message_size_is_a_protocol_error():
    header = struct.pack("<iiii", wire.MAX_MESSAGE_SIZE + 1, 1, 0, wire.OP_MSG)
    with pytest.raises(wire.ProtocolError):
        frames(header + b"\x00" * 16)


def test_document_over_the_internal_bson_limit_is_bson_object_too_large():
    big = op_msg({"insert": "c", "$db": "a"}, {"documents": [{"x": "x" * (16 * 1024 * 1024 + 16 * 1024)}]})
    (m,) = frames(big)
    assert isinstance(m, wire.BadMessage) and m.error.code == 10334
