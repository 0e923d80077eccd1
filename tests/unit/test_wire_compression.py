"""OP_COMPRESSED (2012): the codec fed bytes, hello's negotiation, and a server's connection
handling (``shardsim/core/compression.py``, after ``message_compressor_manager.cpp`` and
``session_workflow.cpp``): replies use the request's compressor; a message that cannot be
decompressed closes the connection without a reply."""

from __future__ import annotations

import asyncio
import struct
import zlib

import bson
import pymongo
import pytest
import snappy
from backports import zstd

from shardsim.core import compression, wire
from shardsim.core.node import Node
from shardsim.core.server import Server

_PACK = {1: snappy.compress, 2: zlib.compress, 3: zstd.compress}


def compressed(body: dict, compressor_id: int, *, request_id: int = 9,
               size_delta: int = 0) -> bytes:
    """An OP_MSG wrapped in OP_COMPRESSED by hand (independent of compression.compress)."""
    inner = struct.pack("<I", 0) + b"\x00" + bson.encode(body)
    data = _PACK[compressor_id](inner)
    payload = struct.pack("<iiB", wire.OP_MSG, len(inner) + size_delta, compressor_id) + data
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, wire.OP_COMPRESSED) + payload


def read_all(data: bytes) -> list:
    r = wire.MessageReader()
    r.feed(data)
    return list(r.messages())


@pytest.mark.parametrize("cid", [1, 2, 3])
def test_each_compressor_decodes_to_the_original_message(cid):
    [msg] = read_all(compressed({"ping": 1, "$db": "admin"}, cid))
    assert isinstance(msg, wire.OpMsg)
    assert msg.compressor_id == cid and msg.request_id == 9
    assert bson.decode(msg.body) == {"ping": 1, "$db": "admin"}


@pytest.mark.parametrize("cid", [1, 2, 3])
def test_compress_round_trips_and_keeps_ids(cid):
    plain = wire.encode_op_msg(bson.encode({"ok": 1.0}), response_to=41, request_id=77)
    out = compression.compress(plain, cid)
    length, rid, response_to, op = struct.unpack_from("<iiii", out)
    assert (length, rid, response_to, op) == (len(out), 77, 41, wire.OP_COMPRESSED)
    orig_op, size, ident = struct.unpack_from("<iiB", out, 16)
    assert (orig_op, size, ident) == (wire.OP_MSG, len(plain) - 16, cid)
    raw_header, payload, got = compression.decompress(out[16:], rid, response_to)
    assert raw_header + payload == plain and got == cid


def _bad(raw: bytes) -> wire.BadMessage:
    [msg] = read_all(raw)
    assert isinstance(msg, wire.BadMessage)
    assert msg.fatal and not msg.answered  # the session ends, unanswered
    return msg


def test_unknown_compressor_id():
    raw = compressed({"ping": 1, "$db": "admin"}, 2)
    raw = raw[:24] + bytes([7]) + raw[25:]
    err = _bad(raw).error
    assert (err.code, str(err.errmsg)) == (1, "Compression algorithm specified in message is not available")


def test_truncated_compression_header():
    payload = struct.pack("<ii", wire.OP_MSG, 10)  # 8 bytes, no compressor id
    raw = struct.pack("<iiii", 16 + len(payload), 1, 0, wire.OP_COMPRESSED) + payload
    err = _bad(raw).error
    assert (err.code, err.errmsg) == (2, "Invalid compressed message header")


@pytest.mark.parametrize("cid", [1, 2, 3])
def test_announced_size_larger_than_the_data(cid):
    err = _bad(compressed({"ping": 1, "$db": "admin"}, cid, size_delta=5)).error
    assert err.code == 2


def test_size_mismatch_message_for_zlib():
    err = _bad(compressed({"ping": 1, "$db": "admin"}, 2, size_delta=5)).error
    assert err.errmsg == "Decompressing message returned less data than expected"


def test_size_beyond_max_message_size():
    err = _bad(compressed({"ping": 1}, 2, size_delta=60_000_000)).error
    assert err.errmsg == "Decompressed message would be larger than maximum message size"


def test_negotiate_keeps_the_clients_order_and_drops_unknown():
    assert compression.negotiate(["zstd", "lz4", "zlib", "snappy"], []) == ["zstd", "zlib", "snappy"]
    assert compression.negotiate(["noop"], []) == []
    assert compression.negotiate(None, ["zlib"]) == ["zlib"]  # a later hello without the field
    assert compression.negotiate(None, []) is None


async def _exchange(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), timeout=10)  # until the server closes
    except asyncio.TimeoutError:
        return b"(open)"
    finally:
        writer.close()


async def _one_reply(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    header = await reader.readexactly(16)
    (length,) = struct.unpack_from("<i", header)
    body = await reader.readexactly(length - 16)
    writer.close()
    return header + body


def test_server_answers_in_the_requests_compressor_and_closes_on_bad_input():
    async def scenario() -> tuple[list[tuple[int, dict]], bytes]:
        server = Server(Node(), "127.0.0.1", 0)
        await server.start()
        try:
            replies = []
            for cid in (1, 2, 3):
                out = await _one_reply(server.port, compressed({"ping": 1, "$db": "admin"}, cid))
                length, _rid, response_to, op = struct.unpack_from("<iiii", out)
                assert op == wire.OP_COMPRESSED and response_to == 9
                _h, payload, got = compression.decompress(out[16:], _rid, response_to)
                replies.append((got, bson.decode(wire.parse_op_msg(0, payload).body)))
            bad = compressed({"ping": 1, "$db": "admin"}, 2)
            closed = await _exchange(server.port, bad[:24] + bytes([9]) + bad[25:])
        finally:
            await server.close()
        return replies, closed

    replies, closed = asyncio.run(scenario())
    assert [cid for cid, _ in replies] == [1, 2, 3]
    assert all(r["ok"] == 1.0 for _, r in replies)
    assert closed == b""  # no reply, connection closed


@pytest.mark.parametrize("name,cid", [("zlib", 2), ("snappy", 1), ("zstd", 3)])
def test_pymongo_negotiates_and_uses_each_compressor(name, cid, monkeypatch):
    used: list[int] = []
    real = compression.decompress

    def spy(payload, request_id, response_to):
        out = real(payload, request_id, response_to)
        used.append(out[2])
        return out
    monkeypatch.setattr(compression, "decompress", spy)

    async def scenario() -> tuple[dict, dict]:
        server = Server(Node(), "127.0.0.1", 0)
        await server.start()
        try:
            def run() -> tuple[dict, dict]:
                client = pymongo.MongoClient(f"127.0.0.1:{server.port}", directConnection=True,
                                             compressors=f"{name},zlib",
                                             serverSelectionTimeoutMS=5000)
                try:
                    ping = client.admin.command("ping")  # compressed by pymongo
                    # hello itself is never compressed by a driver
                    hello = client.admin.command("hello", compression=[name, "lz4", "zlib"])
                    return hello, ping
                finally:
                    client.close()
            return await asyncio.to_thread(run)
        finally:
            await server.close()
    hello, ping = asyncio.run(scenario())
    assert ping["ok"] == 1.0
    assert hello["compression"] == [name, "zlib"]  # duplicates kept, as mongod
    assert used and set(used) == {cid}


def test_a_compressed_hello_is_answered_compressed():
    """mongod has no list of replies it leaves uncompressed: it only logs warning 6697500 for
    SASL over OP_COMPRESSED; drivers are the ones that never compress hello and SASL."""
    async def scenario() -> tuple[int, dict]:
        server = Server(Node(), "127.0.0.1", 0)
        await server.start()
        try:
            out = await _one_reply(server.port, compressed(
                {"hello": 1, "compression": ["zstd", "zlib"], "$db": "admin"}, 2))
        finally:
            await server.close()
        _h, payload, cid = compression.decompress(out[16:], 0, 0)
        return cid, bson.decode(wire.parse_op_msg(0, payload).body)
    cid, reply = asyncio.run(scenario())
    assert cid == 2 and reply["compression"] == ["zstd", "zlib"]
