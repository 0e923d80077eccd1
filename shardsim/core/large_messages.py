"""Large requests without holding the event loop (issue 28, audit D1).

Every process is one asyncio loop, so CPU spent on one client's message is time every other
client of the process waits. mongod validates and parses a message on the thread of the
connection that sent it (``ServiceStateMachine`` / ``SessionWorkflow`` in
``src/mongo/transport/``, ``OpMsg::parse`` in ``src/mongo/rpc/op_msg.cpp`` with
``validateBSON`` in ``src/mongo/bson/bson_validate.cpp``); here a message of
:data:`OFF_LOOP_BYTES` or more is framed, depth-checked and decoded on a small worker pool
instead:

- The depth scan (:func:`shardsim.core.bson_limits.raw_depth_exceeds`) is pure Python, so the
  interpreter hands the GIL back to the loop every switch interval (1 ms in a server
  process, :func:`shardsim.core.server.run_node`).
- Decoding goes through :func:`decode_sliced`: pymongo's C decoder holds the GIL for a whole
  call (1-2 s for a 16 MB document of small values), so a large document is decoded a slice of
  at most :data:`SLICE_BYTES` at a time and the pieces joined, which gives the loop the GIL
  back between slices.

Limits stay mongod's (:mod:`shardsim.core.wire`): ``maxMessageSizeBytes`` 48,000,000 (a larger
header closes the connection, ``ProtocolError``), a body section of at most 16 MiB + 16 KiB
(``BSONObjMaxInternalSize``, 10334).

Before authentication a connection may only run the commands that need none (``hello``,
``saslStart``, ...: the commands that declare ``privileges=NO_AUTH``). mongod parses the whole message
first and then answers Unauthorized (13); here a large message from an unauthenticated
connection on a process with ``--auth`` is answered from its command name alone (read from the
raw body, :func:`command_name`), with the same error and without depth-scanning or decoding
megabytes nobody may run. (The one difference: a malformed large message from such a client
gets 13 where mongod would name the malformation.)
"""

from __future__ import annotations

import asyncio
import struct
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Callable

from shardsim.core import wire
from shardsim.core.errors import MongoError

if TYPE_CHECKING:
    from shardsim.core.node import Node

OFF_LOOP_BYTES = 256 * 1024  # a message payload at least this large is parsed off the loop
SLICE_BYTES = 32 * 1024  # at most this much BSON per call of the C decoder

_i32 = struct.Struct("<i")
_POOL: ThreadPoolExecutor | None = None
# True while a request that was decoded off the loop runs: what it sends on (the router's
# commands to shards) is encoded off the loop too (:func:`encode_off_loop`).
LARGE_REQUEST: ContextVar[bool] = ContextVar("shardsim_large_request", default=False)
# Fixed value sizes by element type (bytes after the field name); others are sized below.
_FIXED = {0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8,
          0x13: 16, 0xFF: 0, 0x7F: 0}


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:  # one worker: large messages queue (one CPU-bound thread beside the loop)
        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardsim-parse")
    return _POOL


def start_worker() -> None:
    """Start the worker thread now (a server calls it when it starts listening): a thread
    started on demand is waited for by the loop until the OS first runs it, 100-300 ms on a
    busy machine."""
    _pool().submit(int).result()


class _Malformed(Exception):
    """The slicer met bytes it cannot walk: the whole-document decoder reports them (22)."""


def _value_end(data: bytes, kind: int, pos: int) -> int:
    """End offset of the value of type ``kind`` starting at ``pos``."""
    fixed = _FIXED.get(kind)
    if fixed is not None:
        return pos + fixed
    if kind in (0x02, 0x0D, 0x0E):  # string, code, symbol
        return pos + 4 + _i32.unpack_from(data, pos)[0]
    if kind in (0x03, 0x04, 0x0F):  # object, array, code with scope: length-prefixed
        return pos + _i32.unpack_from(data, pos)[0]
    if kind == 0x05:  # binary
        return pos + 5 + _i32.unpack_from(data, pos)[0]
    if kind == 0x0B:  # regex: two cstrings
        return data.index(b"\x00", data.index(b"\x00", pos) + 1) + 1
    if kind == 0x0C:  # DBPointer
        return pos + 4 + _i32.unpack_from(data, pos)[0] + 12
    raise _Malformed(kind)


def _decode_run(decode: Callable[[bytes], dict], data: bytes, start: int, end: int) -> dict:
    """Decode the consecutive elements ``data[start:end]`` as one small document."""
    return decode(_i32.pack(end - start + 5) + data[start:end] + b"\x00")


def _decode_doc(decode: Callable[[bytes], dict], data: bytes, start: int,
                as_list: bool) -> Any:
    """The document (or array) at ``data[start:]``, decoded slice by slice."""
    (size,) = _i32.unpack_from(data, start)
    end = start + size - 1
    if size < 5 or end >= len(data) or data[end] != 0:
        raise _Malformed(start)
    out_d: dict[str, Any] = {}
    out_l: list[Any] = []

    def add(piece: dict) -> None:
        if as_list:
            out_l.extend(piece.values())
        else:
            out_d.update(piece)

    pos, run = start + 4, start + 4
    while pos < end:
        kind = data[pos]
        name_end = data.index(b"\x00", pos + 1)
        vend = _value_end(data, kind, name_end + 1)
        if vend > end:
            raise _Malformed(pos)
        if kind in (0x03, 0x04) and vend - name_end - 1 > SLICE_BYTES:
            if run < pos:
                add(_decode_run(decode, data, run, pos))
            name = data[pos + 1:name_end].decode("utf-8")
            add({name: _decode_doc(decode, data, name_end + 1, kind == 0x04)})
            run = vend
        elif vend - run > SLICE_BYTES and run < pos:
            add(_decode_run(decode, data, run, pos))
            run = pos
        pos = vend
    if run < end:
        add(_decode_run(decode, data, run, end))
    if as_list:
        return out_l
    if "$ref" in out_d and "$id" in out_d:  # a DBRef: the decoder's own rules
        return decode(data[start:start + size])
    return out_d


def decode_sliced(raw: bytes, decode: Callable[[bytes], dict] | None = None) -> dict[str, Any]:
    """Decode the BSON document ``raw`` like :func:`shardsim.core.node.decode` (same codec, same
    errors: InvalidBSON 22), but at most :data:`SLICE_BYTES` per call of the C decoder, so a
    thread running it lets the event loop's thread in between (the C decoder keeps the GIL
    for a whole call). Nested documents and arrays larger than a slice are decoded element
    by element; runs of smaller elements are decoded together."""
    if decode is None:
        from shardsim.core.node import decode
    if len(raw) <= SLICE_BYTES:
        return decode(raw)
    try:
        return _decode_doc(decode, raw, 0, False)
    except (_Malformed, struct.error, ValueError, IndexError, UnicodeDecodeError):
        return decode(raw)  # malformed: the decoder names the fault (22)


def command_name(op_code: int, payload: bytes) -> str | None:
    """The command name (first field of the body) of an OP_MSG payload, without parsing the
    rest; None when it cannot be read cheaply (the full parser then reports the fault)."""
    if op_code != wire.OP_MSG:
        return None
    try:
        pos, end = 4, len(payload)
        while pos < end:
            kind = payload[pos]
            if kind == 0:
                first = pos + 5
                if payload[first] == 0:
                    return None
                name_end = payload.index(b"\x00", first + 1, first + 256)
                return payload[first + 1:name_end].decode("utf-8")
            if kind != 1:
                return None
            pos += 1 + _i32.unpack_from(payload, pos + 1)[0]
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        return None
    return None


def pre_auth_refusal(node: "Node", header: wire.Header, payload: bytes,
                     conn: Any) -> wire.BadMessage | None:
    """Unauthorized (13) ``Command <name> requires authentication`` for a large message from
    an unauthenticated connection to a process with ``--auth`` whose command needs
    authentication (``Security.authorize``'s answer, given before the body is parsed); None
    when the message must be parsed (no auth, an authenticated connection, a command that
    needs none, or the first-user localhost exception)."""
    security = node.security
    if not security.enabled or (conn.auth is not None and conn.auth.users):
        return None
    name = command_name(header.op_code, payload)
    if name is None:
        return None
    from shardsim.core.auth import privileges
    try:
        node.commands.lookup(name)
    except MongoError:
        return None  # no such command (59) is answered after a full parse, as before
    canonical = node.commands.canonical(name)
    if node.commands.spec(canonical).privileges == privileges.NO_AUTH or \
            canonical in ("createUser", "createRole"):
        return None
    return wire.BadMessage(header.request_id, header.op_code,
                           MongoError(13, f"Command {canonical} requires authentication"))


async def parse_off_loop(header: wire.Header, payload: bytes, raw_header: bytes,
                         decode_request: Callable[[wire.Message], Any]) -> tuple[wire.Message, Any]:
    """``wire.parse_message`` then ``decode_request(msg)`` (a Request or a MongoError) on the
    worker pool; the loop awaits them."""
    def work() -> tuple[wire.Message, Any]:
        msg = wire.parse_message(header, payload, raw_header)
        if isinstance(msg, wire.BadMessage):
            return msg, None
        try:
            return msg, decode_request(msg)
        except MongoError as exc:
            return msg, exc
    return await asyncio.get_running_loop().run_in_executor(_pool(), work)


_BIG = 256  # containers with more elements than this are taken apart a slice at a time


def _release(holder: list[Any]) -> None:
    """Drop the last references to the objects in ``holder`` a slice at a time (on a worker,
    so the loop's thread gets the GIL between slices). Only containers nobody else refers to
    are emptied (reference count); anything shared is just let go."""
    import sys
    stack = holder
    while stack:
        obj = stack.pop()
        if sys.getrefcount(obj) > 2:  # still referenced elsewhere (stored, cached): leave it
            continue
        if type(obj) is dict:
            while obj:
                _, value = obj.popitem()
                if type(value) in (dict, list) and len(value) > _BIG:
                    stack.append(value)
                del value
        elif type(obj) is list:
            while obj:
                tail = obj[-1024:]
                del obj[-1024:]
                stack.extend(v for v in tail if type(v) in (dict, list) and len(v) > _BIG)
                del tail
        del obj


def release(holder: list[Any]) -> None:
    """Hand the objects in ``holder`` (the decoded body of a large request: the caller holds
    no other reference to them) to the worker pool to be freed there: freeing a million
    objects on the loop's thread held it for 60-150 ms."""
    if holder:
        _pool().submit(_release, holder)


def _encode_value(encode: Callable[[Any], bytes], key: str, value: Any) -> bytes:
    """The BSON element ``key: value``, a large array a slice of elements at a time."""
    if type(value) is list and len(value) > 1024:
        parts = []
        for at in range(0, len(value), 1024):
            piece = encode({str(at + i): v for i, v in enumerate(value[at:at + 1024])})
            parts.append(piece[4:-1])
        return b"\x04" + key.encode() + b"\x00" + _wrap(parts)
    if type(value) is dict and 0 < len(value) <= 64:
        parts = [_encode_value(encode, str(k), v) for k, v in value.items()]
        return b"\x03" + key.encode() + b"\x00" + _wrap(parts)
    return encode({key: value})[4:-1]


def _wrap(parts: list[bytes]) -> bytes:
    size = 5 + sum(map(len, parts))
    return _i32.pack(size) + b"".join(parts) + b"\x00"


def encode_sliced(doc: dict[str, Any], encode: Callable[[Any], bytes]) -> bytes:
    """``encode(doc)``, but arrays of more than 1024 values (a ``$in`` of 500,000) are encoded
    1024 values per call of the C encoder (which keeps the GIL for a whole call), so a
    thread running it lets the event loop's thread in between. Small documents along the way
    are walked; anything else is encoded whole."""
    return _wrap([_encode_value(encode, str(k), v) for k, v in doc.items()])


async def encode_off_loop(doc: dict[str, Any], encode: Callable[[Any], bytes]) -> bytes:
    """:func:`encode_sliced` on the worker pool."""
    return await asyncio.get_running_loop().run_in_executor(_pool(), encode_sliced, doc,
                                                            encode)
