"""OP_COMPRESSED (opcode 2012): the compressors, their negotiation in ``hello``, and the codec.

Sans-IO, pure functions over bytes, as mongod's ``src/mongo/transport/``:

- ``message_compressor_registry.cpp``: the compressors a server has (``net.compression.compressors``,
  default ``snappy,zstd,zlib``), each with its wire id: noop 0, snappy 1, zlib 2, zstd 3
  (``message_compressor_snappy.cpp``, ``message_compressor_zlib.cpp``,
  ``message_compressor_zstd.cpp``). Here a compressor whose library is not installed is left out
  of :data:`SUPPORTED`, as a server built without it.
- ``MessageCompressorManager::serverNegotiate`` (``message_compressor_manager.cpp``): a ``hello``
  with ``compression: [names]`` gets back, in the client's order, the names the server has
  (:func:`negotiate`); one without the field gets the list negotiated before on that connection,
  or nothing.
- ``MessageCompressorManager::decompressMessage``: the payload is ``originalOpcode:int32
  uncompressedSize:int32 compressorId:uint8`` then the compressed original payload. Its errors
  (:class:`CompressionError`): fewer than 9 bytes -> BadValue "Invalid compressed message
  header"; an id the server has not -> InternalError "Compression algorithm specified in message
  is not available"; an uncompressed size beyond ``maxMessageSizeBytes`` -> BadValue
  "Decompressed message would be larger than maximum message size"; a size other than announced
  -> BadValue "Decompressing message returned less data than expected". The session workflow
  (``session_workflow.cpp``, ``_processMessage``) ``uassert``s them, which ends the session:
  the connection is closed without a reply.
- ``MessageCompressorManager::compressMessage``: a reply is compressed with the compressor of the
  request it answers (the workflow keeps the request's ``compressorId``), whatever the command,
  hello and SASL included (mongod only logs warning 6697500 for SASL over OP_COMPRESSED; drivers
  never compress hello/saslStart/saslContinue, so those replies go out plain); a reply whose
  compressed bound would exceed ``maxMessageSizeBytes`` goes out uncompressed.
"""

from __future__ import annotations

import struct
import zlib
from typing import Callable

from shardsim.core.errors import MongoError

OP_COMPRESSED = 2012
HEADER = struct.Struct("<iiii")
HEADER_SIZE = 16
MAX_MESSAGE_SIZE = 48_000_000
_COMPRESSION_HEADER = struct.Struct("<iiB")  # originalOpcode, uncompressedSize, compressorId

NOOP, SNAPPY, ZLIB, ZSTD = 0, 1, 2, 3


class CompressionError(MongoError):
    """A compressed message that cannot be decompressed: the connection is closed, unanswered."""


def _zstd() -> tuple[Callable[[bytes], bytes], Callable[[bytes, int], bytes]] | None:
    try:
        from compression import zstd  # the standard library from Python 3.14
    except ImportError:
        try:
            from backports import zstd  # the same module before 3.14 (pymongo uses it too)
        except ImportError:  # pragma: no cover - a pinned dependency
            return None

    def decompress(data: bytes, size: int) -> bytes:
        return zstd.ZstdDecompressor().decompress(data, max_length=size + 1)
    return zstd.compress, decompress


def _snappy() -> tuple[Callable[[bytes], bytes], Callable[[bytes, int], bytes]] | None:
    try:
        import snappy
    except ImportError:  # pragma: no cover - a pinned dependency
        return None
    return snappy.compress, lambda data, size: snappy.uncompress(data)


def _zlib_decompress(data: bytes, size: int) -> bytes:
    d = zlib.decompressobj()
    out = d.decompress(data, size + 1)
    return out


def _build() -> tuple[dict[str, int], dict[int, tuple[Callable, Callable]]]:
    by_id: dict[int, tuple[Callable, Callable]] = {}
    names: dict[str, int] = {}
    for name, ident, impl in (("snappy", SNAPPY, _snappy()), ("zstd", ZSTD, _zstd()),
                              ("zlib", ZLIB, (zlib.compress, _zlib_decompress))):
        if impl is not None:
            names[name] = ident
            by_id[ident] = impl
    return names, by_id


# name -> id, in the server's default order (net.compression.compressors "snappy,zstd,zlib").
SUPPORTED, _BY_ID = _build()
NAMES = {ident: name for name, ident in SUPPORTED.items()}


def negotiate(requested: object, previous: list[str]) -> list[str] | None:
    """The ``compression`` list of a hello reply (None: leave the field out) and, through the
    return value, the connection's new negotiated list (``MessageCompressorManager::
    serverNegotiate``). ``requested``: the hello's ``compression`` value (None when absent: the
    previous list is repeated, unchanged). Raises TypeMismatch (14) for a non-string name."""
    if requested is None:
        return list(previous) if previous else None
    if not isinstance(requested, list):
        raise MongoError(14, "BSON field 'hello.compression' is the wrong type, expected type 'array'")
    out: list[str] = []
    for name in requested:
        if not isinstance(name, str):
            raise MongoError(14, "BSON field 'hello.compression' is the wrong type, expected "
                                 "type 'string'")
        if name in SUPPORTED:  # no de-duplication, as serverNegotiate
            out.append(name)
    return out


def decompress(payload: bytes | memoryview, request_id: int,
               response_to: int) -> tuple[bytes, bytes, int]:
    """An OP_COMPRESSED payload (everything after its header) -> ``(raw_header, payload,
    compressor_id)`` of the original message, its header rebuilt with the original opcode and
    length (``decompressMessage``). Raises :class:`CompressionError` (see the module)."""
    buf = bytes(payload)
    if len(buf) < _COMPRESSION_HEADER.size:
        raise CompressionError(2, "Invalid compressed message header")
    op_code, size, ident = _COMPRESSION_HEADER.unpack_from(buf, 0)
    impl = _BY_ID.get(ident)
    if impl is None:
        raise CompressionError(1, "Compression algorithm specified in message is not available")
    if size < 0 or size + HEADER_SIZE > MAX_MESSAGE_SIZE:
        raise CompressionError(2, "Decompressed message would be larger than maximum message size")
    try:
        out = impl[1](buf[_COMPRESSION_HEADER.size:], size)
    except Exception as exc:  # a corrupt stream: the compressor's own error status
        raise CompressionError(2, f"Could not decompress message: {exc}") from None
    if len(out) != size:
        raise CompressionError(2, "Decompressing message returned less data than expected")
    raw_header = HEADER.pack(HEADER_SIZE + size, request_id, response_to, op_code)
    return raw_header, out, ident


def compress(message: bytes, compressor_id: int) -> bytes:
    """Wrap a framed ``message`` in OP_COMPRESSED with ``compressor_id`` (``compressMessage``):
    same requestID and responseTo, the original opcode and payload size in the compression
    header. A message whose compressed bound would pass ``maxMessageSizeBytes`` is returned
    unchanged (the server's rule)."""
    impl = _BY_ID[compressor_id]
    length, request_id, response_to, op_code = HEADER.unpack_from(message, 0)
    if length + length // 100 + 1024 > MAX_MESSAGE_SIZE:
        return message
    body = impl[0](bytes(memoryview(message)[HEADER_SIZE:]))
    total = HEADER_SIZE + _COMPRESSION_HEADER.size + len(body)
    return (HEADER.pack(total, request_id, response_to, OP_COMPRESSED)
            + _COMPRESSION_HEADER.pack(op_code, length - HEADER_SIZE, compressor_id) + body)
