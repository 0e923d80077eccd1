"""Sans-IO MongoDB wire protocol codec: bytes in, messages out, and back.

No sockets here (h11/wsproto style): :class:`MessageReader` is a small state machine fed with
bytes; :func:`encode_op_msg` / :func:`encode_op_reply` build replies. Reference: the MongoDB
Wire Protocol docs and ``src/mongo/rpc/op_msg.cpp`` (``OpMsg::parse``), whose error codes
(40430, 40431, 40432, 40587, 40433, IllegalOpMsgFlag 223, ChecksumMismatch 288,
TooManyDocumentSequences 233) this module raises.

Layout (all little-endian):
- header: ``messageLength:int32 requestID:int32 responseTo:int32 opCode:int32``
- OP_MSG (2013): ``flagBits:uint32`` then sections (kind 0: one BSON body; kind 1:
  ``size:int32 identifier:cstring`` + BSON documents), then ``crc32c:uint32`` when flag bit 0 is set.
- OP_QUERY (2004): ``flags:int32 fullCollectionName:cstring numberToSkip:int32
  numberToReturn:int32 query:BSON [returnFieldsSelector:BSON]``.
- OP_REPLY (1): ``responseFlags:int32 cursorID:int64 startingFrom:int32 numberReturned:int32 docs``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from itertools import count

import crc32c as _crc32c

from shardsim.core import compression
from shardsim.core.errors import MongoError
from shardsim.core.bson_limits import check_wire_depth

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013

HEADER = struct.Struct("<iiii")
HEADER_SIZE = 16
MAX_MESSAGE_SIZE = 48_000_000  # maxMessageSizeBytes advertised in hello (bytes)
MAX_BSON_SIZE = 16 * 1024 * 1024  # maxBsonObjectSize (bytes)
# A command body may exceed maxBsonObjectSize by this much for internal fields (BSONObjMaxInternalSize).
MAX_INTERNAL_BSON_SIZE = MAX_BSON_SIZE + 16 * 1024

FLAG_CHECKSUM_PRESENT = 1 << 0
FLAG_MORE_TO_COME = 1 << 1
FLAG_EXHAUST_ALLOWED = 1 << 16
_KNOWN_REQUIRED_FLAGS = FLAG_CHECKSUM_PRESENT | FLAG_MORE_TO_COME
_REQUIRED_FLAG_MASK = 0xFFFF  # bits 0-15 must be understood; 16-31 are optional

_i32 = struct.Struct("<i")
_u32 = struct.Struct("<I")
_request_ids = count(1)


class ProtocolError(Exception):
    """A message that cannot be framed at all (bad length): the connection must be closed."""


@dataclass(slots=True)
class Header:
    """The 16-byte standard message header."""

    length: int
    request_id: int
    response_to: int
    op_code: int


@dataclass(slots=True)
class OpMsg:
    """A parsed OP_MSG: ``body`` is the raw BSON bytes of the kind-0 section; ``sequences``
    maps each kind-1 identifier to its documents' raw BSON bytes."""

    request_id: int
    flags: int
    body: bytes
    sequences: dict[str, list[bytes]] = field(default_factory=dict)
    compressor_id: int | None = None  # set when it came in OP_COMPRESSED

    @property
    def more_to_come(self) -> bool:
        return bool(self.flags & FLAG_MORE_TO_COME)


@dataclass(slots=True)
class OpQuery:
    """A parsed legacy OP_QUERY (only commands on ``<db>.$cmd`` are served)."""

    request_id: int
    flags: int
    collection: str
    skip: int
    limit: int
    query: bytes
    fields: bytes | None = None
    compressor_id: int | None = None  # set when it came in OP_COMPRESSED


@dataclass(slots=True)
class BadMessage:
    """A framed message whose contents are invalid: answered with ``error`` (a MongoError),
    after which the connection stays open (unless ``fatal``). ``answered`` False: closed without
    a reply (an OP_COMPRESSED that cannot be decompressed, :mod:`shardsim.core.compression`)."""

    request_id: int
    op_code: int
    error: MongoError
    fatal: bool = False
    answered: bool = True
    compressor_id: int | None = None


Message = OpMsg | OpQuery | BadMessage


def parse_header(data: bytes | memoryview) -> Header:
    """Decode a 16-byte header. Raises :class:`ProtocolError` for an impossible length."""
    length, request_id, response_to, op_code = HEADER.unpack_from(data, 0)
    if length < HEADER_SIZE or length > MAX_MESSAGE_SIZE:
        raise ProtocolError(f"invalid message length {length}")
    return Header(length, request_id, response_to, op_code)


def _bson_doc(buf: memoryview, offset: int, end: int, what: str) -> tuple[bytes, int]:
    """Slice one BSON document starting at ``offset``; validates its length prefix and terminator."""
    if end - offset < 5:
        raise MongoError(22, f"{what}: truncated BSON document")
    (size,) = _i32.unpack_from(buf, offset)
    if size < 5 or offset + size > end:
        raise MongoError(22, f"{what}: BSON document length {size} exceeds the message")
    if buf[offset + size - 1] != 0:
        raise MongoError(22, f"{what}: BSON document is not null-terminated")
    if size > MAX_INTERNAL_BSON_SIZE:
        raise MongoError(10334, f"BSONObj size: {size} (0x{size:X}) is invalid. Size must be "
                                f"between 0 and 16793600(16MB)")
    return bytes(buf[offset:offset + size]), offset + size


def _cstring(buf: memoryview, offset: int, end: int) -> tuple[str, int]:
    raw = bytes(buf[offset:end])
    nul = raw.find(b"\x00")
    if nul < 0:
        raise MongoError(22, "unterminated cstring")
    return raw[:nul].decode("utf-8", "replace"), offset + nul + 1


def parse_op_msg(request_id: int, payload: bytes | memoryview, raw_header: bytes | None = None,
                 *, check_depth: bool = True) -> OpMsg:
    """Parse an OP_MSG payload (everything after the header). Raises MongoError like OpMsg::parse.

    ``raw_header`` (the 16 header bytes) is needed to verify a checksum, which covers the header.
    ``check_depth``: refuse sections nested beyond the BSON depth limit (Overflow 15), as a
    server validates what it receives; a member reading another member's reply passes False
    (mongod validates requests, not its peers' replies, and a batch of events is large).
    """
    buf = memoryview(payload)
    end = len(buf)
    if end < 4:
        raise MongoError(22, "OP_MSG too short for its flags")
    (flags,) = _u32.unpack_from(buf, 0)
    if flags & _REQUIRED_FLAG_MASK & ~_KNOWN_REQUIRED_FLAGS:
        raise MongoError(223, f"Message contains illegal flags value: Ob{flags:032b}")
    if flags & FLAG_CHECKSUM_PRESENT:
        if end < 8:
            raise MongoError(22, "OP_MSG too short for its checksum")
        end -= 4
    offset = 4
    body: bytes | None = None
    sequences: dict[str, list[bytes]] = {}
    while offset < end:
        kind = buf[offset]
        offset += 1
        if kind == 0:
            if body is not None:
                raise MongoError(40430, "Multiple body sections in message")
            body, offset = _bson_doc(buf, offset, end, "OP_MSG body")
            if check_depth:
                check_wire_depth(body)
        elif kind == 1:
            if len(sequences) >= 2:
                raise MongoError(233, "Too many document sequences in OP_MSG")
            if end - offset < 4:
                raise MongoError(22, "truncated document sequence")
            (size,) = _i32.unpack_from(buf, offset)
            if size < 5 or offset + size > end:
                raise MongoError(22, f"document sequence length {size} exceeds the message")
            seq_end = offset + size
            name, pos = _cstring(buf, offset + 4, seq_end)
            if name in sequences:
                raise MongoError(40431, f"Duplicate document sequence: {name}")
            docs: list[bytes] = []
            while pos < seq_end:
                doc, pos = _bson_doc(buf, pos, seq_end, f"document sequence {name}")
                if check_depth:
                    check_wire_depth(doc)
                docs.append(doc)
            sequences[name] = docs
            offset = seq_end
        else:
            raise MongoError(40432, f"Unknown section kind {kind}")
    if body is None:
        raise MongoError(40587, "OP_MSG messages must have a body")
    if flags & FLAG_CHECKSUM_PRESENT:
        (expected,) = _u32.unpack_from(buf, end)
        header = raw_header or HEADER.pack(HEADER_SIZE + len(buf), request_id, 0, OP_MSG)
        actual = _crc32c.crc32c(bytes(buf[:end]), _crc32c.crc32c(header))
        if actual != expected:
            raise MongoError(288, "OP_MSG checksum does not match contents")
    return OpMsg(request_id, flags, body, sequences)


def parse_op_query(request_id: int, payload: bytes | memoryview) -> OpQuery:
    """Parse a legacy OP_QUERY payload."""
    buf = memoryview(payload)
    end = len(buf)
    if end < 4:
        raise MongoError(22, "OP_QUERY too short")
    (flags,) = _i32.unpack_from(buf, 0)
    collection, offset = _cstring(buf, 4, end)
    if end - offset < 8:
        raise MongoError(22, "OP_QUERY too short")
    skip, limit = struct.unpack_from("<ii", buf, offset)
    query, offset = _bson_doc(buf, offset + 8, end, "OP_QUERY query")
    check_wire_depth(query)
    fields = None
    if offset < end:
        fields, offset = _bson_doc(buf, offset, end, "OP_QUERY returnFieldsSelector")
    return OpQuery(request_id, flags, collection, skip, limit, query, fields)


def parse_message(header: Header, payload: bytes | memoryview, raw_header: bytes | None = None,
                  *, check_depth: bool = True) -> Message:
    """Parse one framed message; contents errors come back as :class:`BadMessage`.
    ``check_depth`` as :func:`parse_op_msg` (False for replies read by a client)."""
    try:
        if header.op_code == OP_MSG:
            return parse_op_msg(header.request_id, payload, raw_header, check_depth=check_depth)
        if header.op_code == OP_QUERY:
            return parse_op_query(header.request_id, payload)
        if header.op_code == OP_COMPRESSED:
            return _parse_compressed(header, payload, check_depth)
        return BadMessage(header.request_id, header.op_code,
                          MongoError(17, f"Unsupported opCode {header.op_code}"), fatal=True)
    except MongoError as exc:
        fatal = exc.code in (223, 233, 288)  # category ConnectionFatalMessageParseError
        return BadMessage(header.request_id, header.op_code, exc, fatal=fatal)


def _parse_compressed(header: Header, payload: bytes | memoryview, check_depth: bool) -> Message:
    """OP_COMPRESSED: decompress (:func:`shardsim.core.compression.decompress`), then parse the
    original message and remember its compressor (the reply is compressed with it). A message
    that cannot be decompressed closes the connection unanswered, as mongod's session workflow."""
    try:
        raw_header, inner, ident = compression.decompress(payload, header.request_id,
                                                          header.response_to)
    except compression.CompressionError as exc:
        return BadMessage(header.request_id, header.op_code, exc, fatal=True, answered=False)
    inner_header = parse_header(raw_header)
    if inner_header.op_code == OP_COMPRESSED:
        return BadMessage(header.request_id, header.op_code, MongoError(
            17, f"Unsupported opCode {OP_COMPRESSED} inside OP_COMPRESSED"), fatal=True,
            compressor_id=ident)
    msg = parse_message(inner_header, inner, raw_header, check_depth=check_depth)
    msg.compressor_id = ident
    return msg


class MessageReader:
    """Incremental framer: ``feed(bytes)`` then iterate ``messages()``.

    Raises :class:`ProtocolError` from ``messages()`` when a header carries an impossible
    length; the caller must then close the connection (the stream cannot be re-synchronised).
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def messages(self):
        """Yield every complete message buffered so far."""
        while len(self._buf) >= HEADER_SIZE:
            header = parse_header(self._buf)
            if len(self._buf) < header.length:
                return
            raw_header = bytes(self._buf[:HEADER_SIZE])
            payload = bytes(self._buf[HEADER_SIZE:header.length])
            del self._buf[:header.length]
            yield parse_message(header, payload, raw_header)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet framed."""
        return len(self._buf)


def next_request_id() -> int:
    """A process-wide increasing requestID for outgoing messages."""
    return next(_request_ids) & 0x7FFFFFFF


def encode_op_msg(body: bytes | list[bytes], *, response_to: int = 0,
                  request_id: int | None = None, flags: int = 0,
                  sequences: dict[str, list[bytes]] | None = None,
                  checksum: bool = False) -> bytes:
    """Build an OP_MSG from raw BSON ``body`` (bytes, or pieces to concatenate) and optional
    kind-1 ``sequences``."""
    # One join of all the pieces: a large reply body is copied once, not once per step.
    parts: list[bytes] = [b"", b""]  # header and flags, filled in below
    if sequences:
        for name, docs in sequences.items():
            ident = name.encode() + b"\x00"
            size = 4 + len(ident) + sum(len(d) for d in docs)
            parts.append(b"\x01" + _i32.pack(size) + ident)
            parts.extend(docs)
    parts.append(b"\x00")
    if isinstance(body, list):
        parts.extend(body)
    else:
        parts.append(body)
    if checksum:
        flags |= FLAG_CHECKSUM_PRESENT
    length = HEADER_SIZE + 4 + sum(map(len, parts)) + (4 if checksum else 0)
    rid = next_request_id() if request_id is None else request_id
    parts[0] = HEADER.pack(length, rid, response_to, OP_MSG)
    parts[1] = _u32.pack(flags)
    msg = b"".join(parts)
    if checksum:
        msg += _u32.pack(_crc32c.crc32c(msg))
    return msg


def encode_op_reply(doc: bytes, *, response_to: int, request_id: int | None = None,
                    flags: int = 8) -> bytes:
    """Build an OP_REPLY carrying one document (flags 8 = AwaitCapable, as mongod sets)."""
    rid = next_request_id() if request_id is None else request_id
    payload = struct.pack("<iqii", flags, 0, 0, 1) + doc
    return HEADER.pack(HEADER_SIZE + len(payload), rid, response_to, OP_REPLY) + payload


def encode_op_query(collection: str, query: bytes, *, request_id: int | None = None,
                    flags: int = 0, skip: int = 0, limit: int = -1) -> bytes:
    """Build an OP_QUERY (used by tests and for old-driver handshakes)."""
    rid = next_request_id() if request_id is None else request_id
    payload = _i32.pack(flags) + collection.encode() + b"\x00" + struct.pack("<ii", skip, limit) + query
    return HEADER.pack(HEADER_SIZE + len(payload), rid, 0, OP_QUERY) + payload


def parse_op_reply(payload: bytes) -> list[bytes]:
    """Documents of an OP_REPLY payload (client side)."""
    buf = memoryview(payload)
    _flags, _cursor, _start, n = struct.unpack_from("<iqii", buf, 0)
    docs, offset = [], 20
    for _ in range(n):
        doc, offset = _bson_doc(buf, offset, len(buf), "OP_REPLY")
        docs.append(doc)
    return docs
