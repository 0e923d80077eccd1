"""Change-stream resume tokens: mongod's KeyString V1 encoding of ``ResumeTokenData``.

A token document is ``{_data: "<UPPERCASE HEX>"[, _typeBits: BinData(0, ...)]}``. ``_data`` is
the KeyString (``src/mongo/db/storage/key_string/key_string.cpp``, Version V1, all-ascending
ordering, inclusive discriminator ``0x04``) of a BSON object with empty field names built by
``ResumeToken::ResumeToken(const ResumeTokenData&)`` (``src/mongo/db/pipeline/resume_token.cpp``):

    clusterTime (Timestamp), version (int), [tokenType (int), v>=1], txnOpIndex (int),
    [fromInvalidate (bool), v>=1], uuid (BinData 4) | null (v>=2), [eventIdentifier (object)],
    [fragmentNum (int)]

Because KeyString bytes compare like the BSON values they encode, the hex strings sort in
stream order: clusterTime, then version, high-water marks (tokenType 0) before events (128),
txnOpIndex, fromInvalidate, collection UUID, eventIdentifier, fragmentNum.

``_typeBits`` restores BSON types that compare equal (int/long/double, string/symbol) and is
present only when some bit is 1 (e.g. a double or NumberLong in a documentKey).

Decoding raises :class:`~shardsim.core.errors.MongoError` with the server's codes and messages
(FailedToParse 9 for bad hex, 40647/40648 for bad token fields, 50795, 51057, ... from
``ResumeToken::getData``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from bson import Binary, Int64, ObjectId
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from shardsim.core.clock import ts_from_key
from shardsim.core.errors import MongoError
from shardsim.core.keystring import (CTYPE_FALSE, CTYPE_NULLISH, CTYPE_NUMERIC, CTYPE_OBJECT, CTYPE_OID,
                                CTYPE_POS_1B, CTYPE_STRING, KeyStringError, TypeBits,
                                append_integer, append_object_body,
                                append_string_like, INT32_MAX, decode_keystring, encode_keystring)

__all__ = [
    "ResumeTokenData", "encode", "decode", "encode_keystring", "decode_keystring",
    "make_high_water_mark", "make_high_water_mark_data", "is_high_water_mark", "token_key",
    "HIGH_WATER_MARK", "EVENT", "DEFAULT_VERSION", "event_token",
]

DEFAULT_VERSION = 2
HIGH_WATER_MARK = 0
EVENT = 128


@dataclass(slots=True)
class ResumeTokenData:
    """``ResumeTokenData`` (resume_token.h).

    ``clusterTime`` Timestamp of the event (or of the high-water mark); ``version`` 0/1/2;
    ``tokenType`` 0 (high-water mark) or 128 (event); ``txnOpIndex`` position of the op inside
    an ``applyOps`` transaction (else 0); ``fromInvalidate`` True for the invalidate event;
    ``uuid`` the collection UUID as 16 bytes (None for none); ``eventIdentifier`` a dict
    (``{operationType, documentKey}`` or ``{operationType, operationDescription}`` for v2,
    the bare documentKey for v<=1 classic events) or None; ``fragmentNum`` for split events.
    """

    clusterTime: Timestamp
    version: int = DEFAULT_VERSION
    tokenType: int = EVENT
    txnOpIndex: int = 0
    fromInvalidate: bool = False
    uuid: bytes | None = None
    eventIdentifier: Any = None
    fragmentNum: int | None = None

    def key_values(self) -> list[Any]:
        """The values of the token object in encoding order (``ResumeToken(data)``)."""
        if self.tokenType == HIGH_WATER_MARK and (
                self.txnOpIndex > 0 or self.fromInvalidate or self.uuid is not None
                or self.eventIdentifier is not None):
            raise MongoError(6189505, "Invalid high water mark token")
        if self.uuid is None and self.eventIdentifier is not None and self.version < 2:
            raise MongoError(50788, "Unexpected resume token with a eventIdentifier but no UUID")
        if self.tokenType == EVENT and self.eventIdentifier is None and self.version >= 2:
            raise MongoError(6189502, "Expected an eventIdentifier for an event resume token")
        vals: list[Any] = [self.clusterTime, self.version]
        if self.version >= 1:
            vals.append(self.tokenType)
        vals.append(self.txnOpIndex)
        if self.version >= 1:
            vals.append(bool(self.fromInvalidate))
        if self.uuid is not None:
            vals.append(Binary(bytes(self.uuid), 4))
        elif self.version >= 2:
            vals.append(None)
        if self.eventIdentifier is not None:
            vals.append(self.eventIdentifier)
        if self.fragmentNum is not None:
            if self.version < 2:
                raise MongoError(7182504, f"Tokens of version {self.version} cannot have a fragmentNum")
            vals.append(self.fragmentNum)
        return vals


def encode(data: ResumeTokenData) -> dict[str, Any]:
    """The token document ``{_data: HEX[, _typeBits: Binary(0)]}`` for ``data``."""
    key, tb = encode_keystring(data.key_values())
    doc: dict[str, Any] = {"_data": key.hex().upper()}
    if tb is not None:
        doc["_typeBits"] = Binary(tb, 0)
    return doc


_EVENT_V2_HEAD = bytes.fromhex("2B042C0100")  # version 2, tokenType 128
_OP_TYPE_FIELD = bytes([CTYPE_STRING]) + b"operationType\x00" + bytes([CTYPE_STRING])
_DOC_KEY_FIELD = bytes([CTYPE_OBJECT]) + b"documentKey\x00"


# Hex of everything between the clusterTime and the documentKey's fields, per (collection UUID,
# operationType, txnOpIndex): the same for every event of a collection (bounded cache).
_MID_HEX: dict[tuple[bytes | None, str, int], str] = {}
_MID_HEX_MAX = 4096
_ID_FIELD_HEX = (bytes([CTYPE_NUMERIC]) + b"_id\x00").hex().upper()
_ID_OID_HEX = (bytes([CTYPE_OID]) + b"_id\x00").hex().upper()
_ID_STR_HEX = (bytes([CTYPE_STRING]) + b"_id\x00").hex().upper()


def _event_mid_hex(uuid: bytes | None, operation_type: str, txn_op_index: int) -> str:
    out = bytearray(_EVENT_V2_HEAD)
    append_integer(out, txn_op_index)
    out.append(CTYPE_FALSE)
    if uuid is not None:
        out += b"\x5a\x10\x04"
        out += uuid
    else:
        out.append(CTYPE_NULLISH)
    out.append(CTYPE_OBJECT)
    out += _OP_TYPE_FIELD
    append_string_like(out, operation_type.encode())
    out += _DOC_KEY_FIELD
    out.append(CTYPE_OBJECT)
    mid = out.hex().upper()
    if len(_MID_HEX) >= _MID_HEX_MAX:
        _MID_HEX.clear()
    _MID_HEX[(uuid, operation_type, txn_op_index)] = mid
    return mid


def event_mid_hex(uuid: bytes | None, operation_type: str, txn_op_index: int = 0) -> str:
    """The uppercase hex of a v2 event token between its clusterTime and its documentKey's
    fields: version 2, tokenType 128, ``txn_op_index``, fromInvalidate false, the collection
    ``uuid`` (16 bytes, BinData subtype 4) or null, and the eventIdentifier's
    ``{operationType: <operation_type>, documentKey: {`` head. The same for every event of a
    collection and operation type (cached); the prefix :func:`fast_event_token_hex` needs."""
    mid = _MID_HEX.get((uuid, operation_type, txn_op_index))
    if mid is None:
        mid = _event_mid_hex(uuid, operation_type, txn_op_index)
    return mid


def fast_event_token_hex(key: int, mid: str,
                         document_key: dict[str, Any]) -> tuple[str, bytes | None]:
    """``(_data, _typeBits bytes or None)`` of the v2 CRUD event token whose clusterTime is the
    ts key ``key`` (``secs << 32 | inc``), whose bytes up to the documentKey's fields are ``mid``
    (:func:`event_mid_hex`) and whose documentKey is ``document_key``. Byte-identical to
    :func:`event_token`; a documentKey ``{_id: <int32 > 0 | ObjectId | str without NUL>}`` (type
    bits all zero) is written without the generic KeyString encoder."""
    if len(document_key) == 1:
        v = document_key.get("_id", _MISSING_ID)
        tv = type(v)
        if tv is int and 0 < v <= INT32_MAX:
            # Positive integer: 0x2B + (nbytes - 1) then (v << 1) big-endian (append_preshifted).
            n = ((v << 1).bit_length() + 7) >> 3
            return "82%016X%s%s%02X%0*X000004" % (key, mid, _ID_FIELD_HEX, CTYPE_POS_1B + n - 1,
                                                   n << 1, v << 1), None
        if tv is ObjectId:
            return "82%016X%s%s%s%s000004" % (key, mid, _ID_OID_HEX, "%02X" % CTYPE_OID,
                                              v.binary.hex().upper()), None
        if tv is str and "\x00" not in v:
            return "82%016X%s%s%02X%s00000004" % (key, mid, _ID_STR_HEX, CTYPE_STRING,
                                                  v.encode("utf-8").hex().upper()), None
    tb = TypeBits()
    tb.n = 7  # version, tokenType, txnOpIndex (NumberInt: 0 0 each) and operationType (string: 0)
    body = bytearray()
    append_object_body(body, tb, document_key)
    return "82%016X%s%s0004" % (key, mid, body.hex().upper()), (tb.serialize() if tb.nonzero
                                                                  else None)


def int_id_token_template(mid: str, n: int) -> str:
    """A %-template of the ``_data`` of a v2 event token whose bytes up to the documentKey's
    fields are ``mid`` (:func:`event_mid_hex`) and whose documentKey is ``{_id: v}`` with ``v``
    an int, ``0 < v <= 2**31 - 1`` (NumberInt, type bits all zero), for the ``v`` with
    ``n = ((v << 1).bit_length() + 7) >> 3``: fill with ``(key, v << 1)`` where ``key`` is the
    clusterTime's ts key (``append_preshifted``: the byte 0x2B + (n - 1), then ``v << 1`` in
    n big-endian bytes). The result has ``2 * n + len(mid) + 36`` characters; identical to
    :func:`fast_event_token_hex` for such keys."""
    return "82%%016X%s%s%02X%%0%dX000004" % (mid, _ID_FIELD_HEX, CTYPE_POS_1B + n - 1, 2 * n)


def oid_id_token_template(mid: str) -> str:
    """A %-template of the ``_data`` of a v2 event token whose bytes up to the documentKey's
    fields are ``mid`` (:func:`event_mid_hex`) and whose documentKey is ``{_id: <ObjectId>}``:
    fill with ``(key, hex)`` where ``key`` is the clusterTime's ts key and ``hex`` the id's 12
    bytes in uppercase hex. The result has ``len(mid) + 60`` characters; identical to
    :func:`fast_event_token_hex` for such keys."""
    return "82%%016X%s%s%02X%%s000004" % (mid, _ID_OID_HEX, CTYPE_OID)


def fast_event_token(cluster_time: Timestamp, uuid: bytes | None, operation_type: str,
                     document_key: dict[str, Any], txn_op_index: int = 0) -> dict[str, Any]:
    """``event_token`` for the common v2 CRUD case (``{operationType, documentKey}``, not from
    invalidate, no fragment), built directly; byte-identical to :func:`event_token`.

    Hot path (one token per event): the bytes between clusterTime and the documentKey are cached
    per (uuid, operationType, txnOpIndex) (:func:`event_mid_hex`), and common documentKeys are
    written without the generic KeyString encoder (:func:`fast_event_token_hex`)."""
    mid = _MID_HEX.get((uuid, operation_type, txn_op_index))
    if mid is None:
        mid = _event_mid_hex(uuid, operation_type, txn_op_index)
    data, tb = fast_event_token_hex((cluster_time.time << 32) | cluster_time.inc, mid, document_key)
    if tb is None:
        return {"_data": data}
    return {"_data": data, "_typeBits": Binary(tb, 0)}


_MISSING_ID = object()


def event_token(cluster_time: Timestamp, uuid: bytes | None, operation_type: str,
                document_key: Any = None, operation_description: Any = None, *,
                txn_op_index: int = 0, from_invalidate: bool = False,
                version: int = DEFAULT_VERSION, fragment_num: int | None = None) -> dict[str, Any]:
    """Shortcut for an event token (``ResumeTokenData(clusterTime, version, txnOpIndex, uuid,
    opType, documentKey, opDescription)`` then encode). v2: eventIdentifier is
    ``{operationType, documentKey}`` or ``{operationType, operationDescription}`` (or just
    ``{operationType}`` when both are missing)."""
    return encode(event_token_data(cluster_time, uuid, operation_type, document_key,
                                   operation_description, txn_op_index=txn_op_index,
                                   from_invalidate=from_invalidate, version=version,
                                   fragment_num=fragment_num))


_CLASSIC_OPS = frozenset({"insert", "update", "replace", "delete", "drop", "rename",
                          "dropDatabase", "invalidate", "reshardBegin", "reshardDoneCatchUp",
                          "kNewShardDetected", "migrateChunkToNewShard"})


def event_token_data(cluster_time: Timestamp, uuid: bytes | None, operation_type: str,
                     document_key: Any = None, operation_description: Any = None, *,
                     txn_op_index: int = 0, from_invalidate: bool = False,
                     version: int = DEFAULT_VERSION,
                     fragment_num: int | None = None) -> ResumeTokenData:
    """The ``ResumeTokenData`` of an event (see :func:`event_token`)."""
    if version <= 1 and operation_type in _CLASSIC_OPS:
        ident = document_key
    else:
        ident = {"operationType": operation_type}
        if document_key is not None:
            ident["documentKey"] = document_key
        elif operation_description is not None:
            ident["operationDescription"] = operation_description
    return ResumeTokenData(cluster_time, version, EVENT, txn_op_index, from_invalidate,
                           bytes(uuid) if uuid is not None else None, ident, fragment_num)


def make_high_water_mark_data(ts: Timestamp, version: int = DEFAULT_VERSION) -> ResumeTokenData:
    """``ResumeToken::makeHighWaterMarkTokenData``."""
    return ResumeTokenData(ts, version, HIGH_WATER_MARK)


_HWM_SUFFIX = {v: encode_keystring([Timestamp(0, 0), v, 0, 0, False] + ([None] if v >= 2 else []))[0][9:].hex().upper()
               for v in (1, 2)}


def make_high_water_mark(ts: Timestamp, version: int = DEFAULT_VERSION) -> dict[str, Any]:
    """``ResumeToken::makeHighWaterMarkToken(ts, version)`` as a token document."""
    suffix = _HWM_SUFFIX.get(version)
    if suffix is None:
        return encode(make_high_water_mark_data(ts, version))
    return {"_data": "82%08X%08X%s" % (ts.time, ts.inc, suffix)}


def is_high_water_mark(data: ResumeTokenData) -> bool:
    """``ResumeToken::isHighWaterMarkToken``."""
    return data == make_high_water_mark_data(data.clusterTime, data.version)


SortKey = tuple  # (data_hex: str, has_type_bits: 0|1, type_bits: bytes): see token_key


def token_key(token: Any) -> SortKey:
    """The sort key of a resume token document (dict or RawBSONDocument ``{_data[, _typeBits]}``).

    Raises MongoError 1 (InternalError) when ``_data`` is not a string, as the ARM cannot sort it.
    """
    try:
        data = token["_data"]
    except (KeyError, TypeError):
        raise MongoError(1, f"Missing field '_data' in sort key {token!r}") from None
    if not isinstance(data, str):
        raise MongoError(1, "sort key field '_data' must be a string")
    try:
        tb = token["_typeBits"]
    except KeyError:
        return (data, 0, b"")
    tb = bytes(tb)
    # BSON BinData compares by length, then subtype, then bytes; the length prefix is enough here.
    return (data, 1, len(tb).to_bytes(4, "big") + tb)


def hwm_data(ts_key_value: int, version: int = 2) -> str:
    """``_data`` of ``makeHighWaterMarkToken(ts, version)`` for a Timestamp given as the 64-bit
    integer ``(secs << 32) | inc`` (see :func:`shardsim.core.clock.ts_key`)."""
    return hwm_token(ts_key_value, version)["_data"]


def hwm_token(ts_key_value: int, version: int = 2) -> dict[str, Any]:
    """The high-water-mark resume token document ``{_data}`` for a Timestamp key."""
    return make_high_water_mark(ts_from_key(ts_key_value), version)


def is_hwm_data(data: str) -> bool:
    """True when ``_data`` is a high-water-mark token (v1 or v2), i.e. ``isHighWaterMarkToken``."""
    ts = token_ts_key(data)
    return ts is not None and data in (hwm_data(ts, 2), hwm_data(ts, 1))


def token_ts_key(data: str) -> int | None:
    """The clusterTime (as a 64-bit key) encoded at the front of a KeyString token, or None."""
    if len(data) >= 18 and data[:2] in ("82", "82".lower()):
        try:
            return int(data[2:18], 16)
        except ValueError:
            return None
    return None


def is_invalidate_data(data: str) -> bool:
    """Does the token ``_data`` decode with ``fromInvalidate: true``? False for anything that is
    not a well-formed token (the shards reject those when the stream is opened)."""
    try:
        return decode({"_data": data}).fromInvalidate
    except MongoError:
        return False


_HEX_RE = re.compile(r"^(?:[0-9A-Fa-f]{2})*$")


def decode(token: Any) -> ResumeTokenData:
    """Parse a token document (``ResumeToken(doc).getData()``).

    Raises MongoError: 40647 ``_data`` missing/not a string, 40648 bad ``_typeBits``,
    FailedToParse (9) bad hex, 40649 empty, 50796/50854/50795 version, 51055/51056/51057 token
    type, 50793/50855/50794 txnOpIndex, 50872/50870 fromInvalidate, 6189500/6189501/6189504
    structure, 6189503 eventIdentifier not an object, 7182501 fragmentNum, 40646 oversized,
    and InvalidBSON-like 50811 for malformed KeyString bytes.
    """
    if isinstance(token, RawBSONDocument):
        token = dict(token.items())
    if not isinstance(token, Mapping):
        raise MongoError(40647, f"Bad resume token: _data of missing or of wrong type. Expected string, got {token!r}")
    data = token.get("_data")
    if not isinstance(data, str):
        raise MongoError(40647, "Bad resume token: _data of missing or of wrong type. Expected string, got "
                         + _doc_repr(token))
    tbits = token.get("_typeBits")
    if tbits is not None and not (isinstance(tbits, Binary) and tbits.subtype == 0) and not (
            isinstance(tbits, bytes) and not isinstance(tbits, Binary)):
        raise MongoError(40648, "Bad resume token: _typeBits of wrong type " + _doc_repr(token))
    if not _HEX_RE.match(data):
        raise MongoError(9, "resume token string was not a valid hex string")
    try:
        vals = decode_keystring(bytes.fromhex(data), bytes(tbits) if tbits is not None else None)
    except KeyStringError as exc:
        raise MongoError(50811, f"KeyString format error: {exc}") from None
    return _data_from_values(vals)


def _data_from_values(vals: list[Any]) -> ResumeTokenData:
    it = iter(vals)
    nxt = _next_or_missing
    ct = nxt(it)
    if ct is _MISSING:
        raise MongoError(40649, "invalid empty resume token")
    cluster_time = ct if isinstance(ct, Timestamp) else Timestamp(0, 0)
    v = nxt(it)
    if v is _MISSING:
        raise MongoError(50796, "Resume Token does not contain version")
    if not _is_int32(v):
        raise MongoError(50854, "Invalid resume token: wrong type for version")
    if v not in (0, 1, 2):
        raise MongoError(50795, "Invalid Resume Token: only supports version 0, 1 and 2")
    out = ResumeTokenData(cluster_time, v, EVENT)
    if v >= 1:
        tt = nxt(it)
        if tt is _MISSING:
            raise MongoError(51055, "Resume Token does not contain tokenType")
        if not _is_int32(tt):
            raise MongoError(51056, "Resume Token tokenType is not an int.")
        if tt not in (EVENT, HIGH_WATER_MARK):
            raise MongoError(51057, f"Token type {tt} not recognized")
        out.tokenType = tt
    idx = nxt(it)
    if idx is _MISSING:
        raise MongoError(50793, "Resume Token does not contain txnOpIndex")
    if not _is_int32(idx):
        raise MongoError(50855, "Resume Token txnOpIndex is not an integer")
    if idx < 0:
        raise MongoError(50794, "Invalid Resume Token: txnOpIndex should be non-negative")
    out.txnOpIndex = idx
    if v >= 1:
        fi = nxt(it)
        if fi is _MISSING:
            raise MongoError(50872, "Resume Token does not contain fromInvalidate")
        if not isinstance(fi, bool):
            raise MongoError(50870, "Resume Token fromInvalidate is not a boolean.")
        out.fromInvalidate = fi
    u = nxt(it)
    if u is _MISSING:
        if v > 1:
            raise MongoError(6189500, "Expected UUID or null")
        return out
    if u is not None:
        if not isinstance(u, Binary) or len(u) != 16 or u.subtype not in (3, 4):
            raise MongoError(2, "Invalid UUID in resume token")
        out.uuid = bytes(u)
    ident = nxt(it)
    if out.tokenType == HIGH_WATER_MARK and ident is not _MISSING:
        raise MongoError(6189504, "Invalid high water mark token")
    if ident is _MISSING:
        if out.tokenType == EVENT and v >= 2:
            raise MongoError(6189501, "Expected an eventIdentifier for an event resume token")
        return out
    if not isinstance(ident, dict):
        raise MongoError(6189503, "Resume Token eventIdentifier is not an object")
    out.eventIdentifier = ident
    frag = nxt(it)
    if frag is not _MISSING and v >= 2:
        if not _is_int32(frag) or frag < 0:
            raise MongoError(7182501, "Resume token 'fragmentNum' must be a non-negative integer.")
        out.fragmentNum = frag
        frag = nxt(it)
    if frag is not _MISSING:
        raise MongoError(40646, "invalid oversized resume token")
    return out


_MISSING = object()


def _next_or_missing(it: Any) -> Any:
    return next(it, _MISSING)


def _is_int32(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, (bool, Int64))


def _doc_repr(doc: Mapping[str, Any]) -> str:
    parts = []
    for k, v in doc.items():
        parts.append(f"{k}: {v!r}" if not isinstance(v, str) else f'{k}: "{v}"')
    return "{" + ", ".join(parts) + "}"
