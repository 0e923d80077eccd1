"""The sans-IO wire codec fed raw bytes, no sockets: valid messages, truncation, lying lengths,
bad section kinds, checksums, OP_QUERY handshakes (error codes from ``op_msg.cpp``)."""

from __future__ import annotations

import struct

import bson
import crc32c
import pytest

from shardsim.core import wire
from shardsim.core.errors import MongoError


def op_msg_bytes(body: dict, *, flags: int = 0, sections: bytes | None = None,
                 request_id: int = 7) -> bytes:
    """An OP_MSG built by hand (independent of encode_op_msg)."""
    payload = struct.pack("<I", flags) + (sections if sections is not None else b"\x00" + bson.encode(body))
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, wire.OP_MSG) + payload


def read_all(data: bytes) -> list:
    r = wire.MessageReader()
    r.feed(data)
    return list(r.messages())


def test_valid_op_msg_round_trip():
    raw = op_msg_bytes({"ping": 1, "$db": "admin"})
    [msg] = read_all(raw)
    assert isinstance(msg, wire.OpMsg)
    assert msg.request_id == 7
    assert bson.decode(msg.body) == {"ping": 1, "$db": "admin"}
    assert msg.sequences == {}
    # encode_op_msg produces what the parser accepts, with checksum too.
    again = wire.encode_op_msg(bson.encode({"x": 1}), response_to=7, checksum=True)
    [m2] = read_all(again)
    assert isinstance(m2, wire.OpMsg) and bson.decode(m2.body) == {"x": 1}


def test_document_sequences_are_split():
    docs = [bson.encode({"_id": i}) for i in range(3)]
    ident = b"documents\x00"
    seq = b"\x01" + struct.pack("<i", 4 + len(ident) + sum(map(len, docs))) + ident + b"".join(docs)
    raw = op_msg_bytes({}, sections=seq + b"\x00" + bson.encode({"insert": "c", "$db": "t"}))
    [msg] = read_all(raw)
    assert isinstance(msg, wire.OpMsg)
    assert [bson.decode(d) for d in msg.sequences["documents"]] == [{"_id": 0}, {"_id": 1}, {"_id": 2}]


def test_incremental_feed_frames_only_complete_messages():
    raw = op_msg_bytes({"ping": 1, "$db": "admin"}) * 2
    r = wire.MessageReader()
    r.feed(raw[:10])
    assert list(r.messages()) == []
    r.feed(raw[10:30])
    assert list(r.messages()) == []
    r.feed(raw[30:])
    assert len(list(r.messages())) == 2
    assert r.buffered == 0


@pytest.mark.parametrize("length", [0, 15, -1, 48_000_001])
def test_impossible_header_length_is_a_protocol_error(length):
    raw = struct.pack("<iiii", length, 1, 0, wire.OP_MSG) + b"\x00" * 8
    r = wire.MessageReader()
    r.feed(raw)
    with pytest.raises(wire.ProtocolError):
        list(r.messages())


def _bad(raw: bytes) -> MongoError:
    [msg] = read_all(raw)
    assert isinstance(msg, wire.BadMessage), msg
    return msg.error


def test_bson_length_lies_about_the_message():
    body = bytearray(bson.encode({"ping": 1}))
    body[0:4] = struct.pack("<i", 500)  # claims more bytes than the message has
    err = _bad(op_msg_bytes({}, sections=b"\x00" + bytes(body)))
    assert err.code == 22


def test_truncated_body_and_missing_terminator():
    body = bson.encode({"ping": 1})
    assert _bad(op_msg_bytes({}, sections=b"\x00" + body[:3])).code == 22
    broken = body[:-1] + b"\x01"
    assert _bad(op_msg_bytes({}, sections=b"\x00" + broken)).code == 22


def test_unknown_section_kind():
    err = _bad(op_msg_bytes({}, sections=b"\x05" + bson.encode({"ping": 1})))
    assert err.code == 40432


def test_two_bodies_and_no_body():
    b = bson.encode({"ping": 1})
    assert _bad(op_msg_bytes({}, sections=b"\x00" + b + b"\x00" + b)).code == 40430
    ident = b"documents\x00"
    seq = b"\x01" + struct.pack("<i", 4 + len(ident)) + ident
    assert _bad(op_msg_bytes({}, sections=seq)).code == 40587


def test_duplicate_sequence_and_lying_sequence_length():
    ident = b"documents\x00"
    seq = b"\x01" + struct.pack("<i", 4 + len(ident)) + ident
    body = b"\x00" + bson.encode({"insert": "c"})
    assert _bad(op_msg_bytes({}, sections=seq + seq + body)).code == 40431
    lying = b"\x01" + struct.pack("<i", 9999) + ident
    assert _bad(op_msg_bytes({}, sections=lying + body)).code == 22


def test_illegal_required_flag_is_connection_fatal():
    [msg] = read_all(op_msg_bytes({"ping": 1}, flags=1 << 3))
    assert isinstance(msg, wire.BadMessage)
    assert msg.error.code == 223 and msg.fatal


def test_checksum_valid_and_mismatch():
    payload = struct.pack("<I", wire.FLAG_CHECKSUM_PRESENT) + b"\x00" + bson.encode({"ping": 1})
    header = struct.pack("<iiii", 16 + len(payload) + 4, 3, 0, wire.OP_MSG)
    good = header + payload + struct.pack("<I", crc32c.crc32c(header + payload))
    [msg] = read_all(good)
    assert isinstance(msg, wire.OpMsg)
    bad = header + payload + struct.pack("<I", crc32c.crc32c(header + payload) ^ 1)
    [msg] = read_all(bad)
    assert isinstance(msg, wire.BadMessage) and msg.error.code == 288 and msg.fatal


def test_op_query_handshake_parses():
    raw = wire.encode_op_query("admin.$cmd", bson.encode({"isMaster": 1}), request_id=11)
    [msg] = read_all(raw)
    assert isinstance(msg, wire.OpQuery)
    assert msg.collection == "admin.$cmd" and msg.limit == -1
    assert bson.decode(msg.query) == {"isMaster": 1}


def test_truncated_op_query():
    payload = struct.pack("<i", 0) + b"admin.$cmd"  # no terminator, no query
    raw = struct.pack("<iiii", 16 + len(payload), 1, 0, wire.OP_QUERY) + payload
    assert _bad(raw).code == 22


def test_unsupported_opcodes_are_fatal():
    raw = struct.pack("<iiii", 20, 1, 0, 2001) + b"\x00" * 4
    [msg] = read_all(raw)
    assert isinstance(msg, wire.BadMessage) and msg.fatal


def test_op_reply_encoding():
    doc = bson.encode({"ok": 1.0})
    raw = wire.encode_op_reply(doc, response_to=5)
    length, _rid, response_to, op = struct.unpack_from("<iiii", raw)
    assert length == len(raw) and response_to == 5 and op == wire.OP_REPLY
    assert wire.parse_op_reply(raw[16:]) == [doc]
