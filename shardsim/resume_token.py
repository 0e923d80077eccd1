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

Decoding raises :class:`~shardsim.errors.MongoError` with the server's codes and messages
(FailedToParse 9 for bad hex, 40647/40648 for bad token fields, 50795, 51057, ... from
``ResumeToken::getData``).
"""

from __future__ import annotations

import decimal
import math
import re
import struct
import uuid as _uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from shardsim.errors import MongoError

__all__ = [
    "ResumeTokenData", "encode", "decode", "encode_keystring", "decode_keystring",
    "make_high_water_mark", "make_high_water_mark_data", "is_high_water_mark", "token_key",
    "HIGH_WATER_MARK", "EVENT", "DEFAULT_VERSION", "event_token",
]

DEFAULT_VERSION = 2
HIGH_WATER_MARK = 0
EVENT = 128

# CType bytes (key_string.cpp, namespace CType).
_MINKEY = 10
_UNDEFINED = 15
_NULLISH = 20
_NUMERIC = 30
_NAN = 30
_NEG_LARGE = 31
_NEG_8B = 32
_NEG_1B = 39
_NEG_SMALL = 40
_ZERO = 41
_POS_SMALL = 42
_POS_1B = 43
_POS_8B = 50
_POS_LARGE = 51
_STRING = 60
_OBJECT = 70
_ARRAY = 80
_BINDATA = 90
_OID = 100
_BOOL = 110
_FALSE = 110
_TRUE = 111
_DATE = 120
_TIMESTAMP = 130
_REGEX = 140
_DBREF = 150
_CODE = 160
_CODEWSCOPE = 170
_MAXKEY = 240
_END = 4

_TWO63 = 2.0 ** 63
_TINIEST_2BIT_DCM = math.ldexp(1.0, -255)
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_U64 = (1 << 64) - 1

_pack_q = struct.Struct(">Q").pack
_pack_d = struct.Struct("<d").pack
_unpack_d = struct.Struct("<d").unpack
_unpack_Q = struct.Struct("<Q").unpack
_pack_Q_le = struct.Struct("<Q").pack


def _double_bits(x: float) -> int:
    return _unpack_Q(_pack_d(x))[0]


def _bits_double(b: int) -> float:
    return _unpack_d(_pack_Q_le(b & _U64))[0]


class _TypeBits:
    """Bit stream of type information (key_string.h ``TypeBits``), packed low-bit first."""

    __slots__ = ("bits", "n", "nonzero")

    def __init__(self) -> None:
        self.bits = 0
        self.n = 0
        self.nonzero = False

    def append(self, bit: int) -> None:
        if bit:
            self.bits |= 1 << self.n
            self.nonzero = True
        self.n += 1

    def two(self, code: int) -> None:
        self.append(code >> 1)
        self.append(code & 1)

    def serialize(self) -> bytes | None:
        """None when all zeros (``_typeBits`` omitted), else the getBuffer() bytes."""
        if not self.nonzero:
            return None
        nbytes = (self.n + 7) // 8
        data = self.bits.to_bytes(nbytes, "little")
        if nbytes == 1 and data[0] < 0x80:
            return data
        if nbytes <= 127:
            return bytes([0x80 | nbytes]) + data
        return b"\x80" + struct.pack("<I", nbytes) + data


class _TypeBitsReader:
    __slots__ = ("bits", "pos")

    def __init__(self, raw: bytes | None) -> None:
        self.pos = 0
        if not raw:
            self.bits = 0
            return
        first = raw[0]
        if first == 0:
            self.bits = 0
        elif first & 0x80 == 0:
            self.bits = first
        elif first == 0x80:
            if len(raw) < 5:
                raise MongoError(50818, "Invalid TypeBits: buffer too short")
            n = struct.unpack("<I", raw[1:5])[0]
            self.bits = int.from_bytes(raw[5:5 + n], "little")
        else:
            n = first & 0x7F
            self.bits = int.from_bytes(raw[1:1 + n], "little")

    def bit(self) -> int:
        b = (self.bits >> self.pos) & 1
        self.pos += 1
        return b

    def two(self) -> int:
        return (self.bit() << 1) | self.bit()


# ----------------------------------------------------------------------------------------------
# Encoding
# ----------------------------------------------------------------------------------------------

def _append_preshifted(out: bytearray, value: int, negative: bool) -> None:
    nbytes = (value.bit_length() + 7) // 8
    raw = value.to_bytes(nbytes, "big")
    if negative:
        out.append(_NEG_1B - (nbytes - 1))
        out += bytes(b ^ 0xFF for b in raw)
    else:
        out.append(_POS_1B + (nbytes - 1))
        out += raw


def _append_integer(out: bytearray, num: int) -> None:
    if num == 0:
        out.append(_ZERO)
        return
    if num == -(1 << 63):
        _append_large_double(out, -_TWO63)
        return
    _append_preshifted(out, abs(num) << 1, num < 0)


def _append_large_double(out: bytearray, value: float) -> None:
    out.append(_POS_LARGE if value > 0 else _NEG_LARGE)
    if math.isinf(value):
        enc = _U64
    else:
        enc = ((_double_bits(value) << 1) & _U64) & ~(1 << 63)
    raw = _pack_q(enc)
    out += raw if value > 0 else bytes(b ^ 0xFF for b in raw)


def _append_double_value(out: bytearray, num: float, dcm: int = 0) -> None:
    """``_appendDoubleWithoutTypeBits`` (Version V1); ``dcm`` is the decimal continuation marker
    (0 kDCMEqualToDouble, 2 kDCMEqualToDoubleRoundedUpTo15Digits for decimals)."""
    negative = num < 0.0
    mag = -num if negative else num
    if not mag >= 1.0:
        if mag > 0.0:
            out.append(_NEG_SMALL if negative else _POS_SMALL)
            if mag >= _TINIEST_2BIT_DCM:
                enc = ((_double_bits(mag) << 2) & _U64) | dcm
            else:
                enc = ((((_double_bits(mag * 2.0 ** 256) << 1) & _U64) | (1 if dcm else 0))
                       + (1 << 62)) & _U64
            raw = _pack_q(enc)
            out += bytes(b ^ 0xFF for b in raw) if negative else raw
        elif num == 0.0:
            out.append(_ZERO)
        else:
            out.append(_NAN)
        return
    if mag < _TWO63:
        ip = int(mag)
        if float(ip) == mag and dcm == 0:
            _append_preshifted(out, ip << 1, negative)
            return
        clz = 64 - (ip << 1).bit_length()
        fb = clz // 8
        out.append((_NEG_8B + fb) if negative else (_POS_8B - fb))
        enc = int(math.ldexp(mag, 8 * fb)) + ((ip + 1) << (8 * fb))
        raw = _pack_q((enc | dcm) & _U64)
        out += bytes(b ^ 0xFF for b in raw) if negative else raw
        return
    _append_large_double(out, num)


def _append_string_like(out: bytearray, data: bytes) -> None:
    if b"\x00" in data:
        data = data.replace(b"\x00", b"\x00\xff")
    out += data
    out.append(0)


def _generic_ctype(value: Any) -> int:
    if value is None:
        return _NULLISH
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, (int, float, Decimal128)):
        return _NUMERIC
    if isinstance(value, str):
        return _STRING
    if isinstance(value, (Mapping, RawBSONDocument)):
        return _OBJECT
    if isinstance(value, (list, tuple)):
        return _ARRAY
    if isinstance(value, (bytes, Binary, _uuid.UUID)):
        return _BINDATA
    if isinstance(value, ObjectId):
        return _OID
    if isinstance(value, datetime):
        return _DATE
    if isinstance(value, Timestamp):
        return _TIMESTAMP
    if isinstance(value, (Regex, re.Pattern)):
        return _REGEX
    if isinstance(value, DBRef):
        return _OBJECT  # pymongo represents DBRef as a {$ref, $id} document
    if isinstance(value, Code):
        return _CODEWSCOPE if value.scope is not None else _CODE
    if isinstance(value, MinKey):
        return _MINKEY
    if isinstance(value, MaxKey):
        return _MAXKEY
    raise MongoError(2, f"cannot encode value of type {type(value).__name__} in a resume token")


def _append_value(out: bytearray, tb: _TypeBits, value: Any) -> None:
    """``_appendBsonValue`` for one Python/BSON value (no field name)."""
    fast = _FAST.get(type(value))
    if fast is not None:
        fast(out, tb, value)
        return
    if value is None:
        out.append(_NULLISH)
    elif isinstance(value, bool):
        out.append(_TRUE if value else _FALSE)
    elif isinstance(value, Int64):
        tb.two(1)
        _append_integer(out, int(value))
    elif isinstance(value, int):
        if _INT32_MIN <= value <= _INT32_MAX:
            tb.two(0)
        else:  # pymongo encodes out-of-int32 ints as NumberLong
            tb.two(1)
        _append_integer(out, value)
    elif isinstance(value, float):
        if value == 0.0 and math.copysign(1.0, value) < 0:
            for i in range(4, -1, -1):  # kV1NegativeDoubleZero = 0b11000
                tb.append((0x18 >> i) & 1)
        else:
            tb.two(2)
        _append_double_value(out, value)
    elif isinstance(value, str):
        tb.append(0)
        out.append(_STRING)
        _append_string_like(out, value.encode("utf-8"))
    elif isinstance(value, (Mapping, RawBSONDocument)):
        out.append(_OBJECT)
        _append_object_body(out, tb, value)
    elif isinstance(value, (list, tuple)):
        out.append(_ARRAY)
        for v in value:
            _append_value(out, tb, v)
        out.append(0)
    elif isinstance(value, ObjectId):
        out.append(_OID)
        out += value.binary
    elif isinstance(value, (Binary, bytes, _uuid.UUID)):
        if isinstance(value, _uuid.UUID):
            data, subtype = value.bytes, 4
        elif isinstance(value, Binary):
            data, subtype = bytes(value), value.subtype
        else:
            data, subtype = bytes(value), 0
        out.append(_BINDATA)
        if len(data) < 0xFF:
            out.append(len(data))
        else:
            out.append(0xFF)
            out += struct.pack(">i", len(data))
        out.append(subtype)
        out += data
    elif isinstance(value, datetime):
        millis = _datetime_millis(value)
        out.append(_DATE)
        out += _pack_q((millis & _U64) ^ (1 << 63))
    elif isinstance(value, Timestamp):
        out.append(_TIMESTAMP)
        out += _pack_q((value.time << 32) | value.inc)
    elif isinstance(value, Decimal128):
        _append_decimal(out, tb, value)
    elif isinstance(value, (Regex, re.Pattern)):
        pattern = value.pattern if isinstance(value.pattern, str) else value.pattern.decode()
        flags = value.flags if isinstance(value, Regex) else ""
        if not isinstance(flags, str):
            flags = Regex.from_native(value).flags if isinstance(value, re.Pattern) else str(flags)
        out.append(_REGEX)
        out += pattern.encode() + b"\x00" + flags.encode() + b"\x00"
    elif isinstance(value, DBRef):
        out.append(_OBJECT)
        _append_object_body(out, tb, value.as_doc())
    elif isinstance(value, Code):
        if value.scope is not None:
            out.append(_CODEWSCOPE)
            _append_string_like(out, str(value).encode())
            _append_object_body(out, tb, value.scope)
        else:
            out.append(_CODE)
            _append_string_like(out, str(value).encode())
    elif isinstance(value, MinKey):
        out.append(_MINKEY)
    elif isinstance(value, MaxKey):
        out.append(_MAXKEY)
    else:
        raise MongoError(2, f"cannot encode value of type {type(value).__name__} in a resume token")


def _append_object_body(out: bytearray, tb: _TypeBits, doc: Any) -> None:
    for name, v in doc.items():
        ctype = _GENERIC.get(type(v))
        out.append(ctype if ctype is not None else _generic_ctype(v))
        out += name.encode("utf-8")
        out.append(0)
        _append_value(out, tb, v)
    out.append(0)


# Exact-type fast paths for the values documentKeys are made of (hot path: one token per event).
def _fast_int(out: bytearray, tb: _TypeBits, value: int) -> None:
    if _INT32_MIN <= value <= _INT32_MAX:
        tb.n += 2  # NumberInt: type bits 0, 0
    else:
        tb.two(1)
    _append_integer(out, value)


def _fast_str(out: bytearray, tb: _TypeBits, value: str) -> None:
    tb.n += 1  # String: type bit 0
    out.append(_STRING)
    _append_string_like(out, value.encode("utf-8"))


def _fast_oid(out: bytearray, tb: _TypeBits, value: ObjectId) -> None:
    out.append(_OID)
    out += value.binary


def _fast_dict(out: bytearray, tb: _TypeBits, value: dict) -> None:
    out.append(_OBJECT)
    _append_object_body(out, tb, value)


def _fast_ts(out: bytearray, tb: _TypeBits, value: Timestamp) -> None:
    out.append(_TIMESTAMP)
    out += _pack_q((value.time << 32) | value.inc)


_FAST = {int: _fast_int, str: _fast_str, ObjectId: _fast_oid, dict: _fast_dict,
         Timestamp: _fast_ts}
_GENERIC = {int: _NUMERIC, float: _NUMERIC, Int64: _NUMERIC, str: _STRING, dict: _OBJECT,
            ObjectId: _OID, bool: _BOOL, type(None): _NULLISH, list: _ARRAY, Binary: _BINDATA,
            Timestamp: _TIMESTAMP, datetime: _DATE}


_DEC_CTX = decimal.Context(prec=34)
_ROUND15_UP = decimal.Context(prec=15, rounding=decimal.ROUND_UP)


def _toward_zero(d: decimal.Decimal) -> float:
    """``Decimal128::toDouble(kRoundTowardZero)``."""
    f = float(d)
    if math.isfinite(f) and abs(decimal.Decimal(f)) > abs(d):
        f = math.nextafter(f, 0.0)
    return f


def _append_decimal(out: bytearray, tb: _TypeBits, value: Decimal128) -> None:
    """NumberDecimal (``_appendNumberDecimal``): exact for decimals equal to a double and for
    decimals with at most 15 significant digits in [2^-255, 2^53) (the DCM "equal to the double
    rounded up to 15 digits"); decimals that need an 8-byte decimal continuation are encoded as
    their nearest double (documented limitation: order kept to double precision)."""
    dec = value.to_decimal()
    if dec.is_nan():
        out.append(_NAN)
        tb.two(3)
        return
    if dec.is_infinite():
        tb.two(3)
        out.append(_NEG_LARGE if dec.is_signed() else _POS_LARGE)
        out += b"\x00" * 8 if dec.is_signed() else b"\xff" * 8
        return
    sign, digits, exponent = dec.as_tuple()
    biased = int(exponent) + 6176
    if dec.is_zero():
        which = biased + (12288 if dec.is_signed() else 0)
        # appendDecimalZero: 5-bit prefix (0b11010 + which >> 12), then 12 bits.
        high = 0x1A + (which >> 12)
        for i in range(4, -1, -1):
            tb.append((high >> i) & 1)
        for i in range(11, -1, -1):
            tb.append((which >> i) & 1)
        out.append(_ZERO)
        return
    tb.two(3)
    for i in range(5, -1, -1):
        tb.append((biased >> i) & 1)
    bin_ = _toward_zero(dec)
    if math.isfinite(bin_) and bin_ != 0.0 and decimal.Decimal(bin_) == dec:
        _append_double_value(out, bin_)  # the decimal is exactly a double
        return
    mag = abs(bin_)
    if math.isfinite(bin_) and _TINIEST_2BIT_DCM <= mag < 2.0 ** 53:
        coefficient = int("".join(map(str, digits)) or "0")
        if coefficient < 10 ** 15 or _ROUND15_UP.plus(decimal.Decimal(bin_)) == dec:
            _append_double_value(out, bin_, 2)
            return
    _append_double_value(out, float(dec))


def _decimal_with_exponent(d: decimal.Decimal, low_bits: int) -> Decimal128:
    """``adjustDecimalExponent``: the exponent is the one <= the normalized exponent whose low 6
    biased bits match the type bits (unique within 34 digits)."""
    norm = d.normalize(_DEC_CTX)
    if norm.is_zero():
        return Decimal128(norm)
    e = int(norm.as_tuple().exponent)
    target = e - (((e + 6176) - low_bits) & 63)
    return Decimal128(norm.quantize(decimal.Decimal(1).scaleb(target), context=_DEC_CTX))


def _datetime_millis(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000


def encode_keystring(values: list[Any]) -> tuple[bytes, bytes | None]:
    """KeyString V1 of a BSON object whose fields are ``values`` (names ignored), all ascending,
    followed by the ``0x04`` end byte. Returns ``(key bytes, typeBits bytes or None)``."""
    out = bytearray()
    tb = _TypeBits()
    for v in values:
        _append_value(out, tb, v)
    out.append(_END)
    return bytes(out), tb.serialize()


# ----------------------------------------------------------------------------------------------
# Decoding
# ----------------------------------------------------------------------------------------------

class _KeyStringError(Exception):
    pass


class _Reader:
    __slots__ = ("buf", "pos", "tb")

    def __init__(self, buf: bytes, tb: _TypeBitsReader) -> None:
        self.buf = buf
        self.pos = 0
        self.tb = tb

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise _KeyStringError("unexpected end of buffer")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise _KeyStringError("unexpected end of buffer")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def cstring(self) -> bytes:
        end = self.buf.find(b"\x00", self.pos)
        if end < 0:
            raise _KeyStringError("unterminated string")
        s = self.buf[self.pos:end]
        self.pos = end + 1
        return s

    def string_like(self) -> bytes:
        parts = []
        while True:
            end = self.buf.find(b"\x00", self.pos)
            if end < 0:
                raise _KeyStringError("unterminated string")
            parts.append(self.buf[self.pos:end])
            if end + 1 < len(self.buf) and self.buf[end + 1] == 0xFF:
                parts.append(b"\x00")
                self.pos = end + 2
                continue
            self.pos = end + 1
            return b"".join(parts)

    def value(self, ctype: int) -> Any:
        if ctype == _MINKEY:
            return MinKey()
        if ctype == _MAXKEY:
            return MaxKey()
        if ctype in (_NULLISH, _UNDEFINED):
            return None
        if ctype == _FALSE:
            return False
        if ctype == _TRUE:
            return True
        if ctype == _STRING:
            self.tb.bit()
            return self.string_like().decode("utf-8")
        if ctype == _OBJECT:
            return self.object_body()
        if ctype == _ARRAY:
            out = []
            while True:
                c = self.byte()
                if c == 0:
                    return out
                out.append(self.value(c))
        if ctype == _BINDATA:
            n = self.byte()
            if n == 0xFF:
                n = struct.unpack(">i", self.take(4))[0]
            subtype = self.byte()
            return Binary(self.take(n), subtype)
        if ctype == _OID:
            return ObjectId(self.take(12))
        if ctype == _DATE:
            raw = struct.unpack(">Q", self.take(8))[0] ^ (1 << 63)
            if raw >= 1 << 63:
                raw -= 1 << 64
            from bson.datetime_ms import DatetimeMS
            try:
                return DatetimeMS(raw).as_datetime()
            except Exception:  # out of Python's datetime range
                return DatetimeMS(raw)
        if ctype == _TIMESTAMP:
            v = struct.unpack(">Q", self.take(8))[0]
            return Timestamp(v >> 32, v & 0xFFFFFFFF)
        if ctype == _REGEX:
            pattern = self.cstring().decode()
            flags = self.cstring().decode()
            return Regex(pattern, flags)
        if ctype == _CODE:
            return Code(self.string_like().decode())
        if ctype == _CODEWSCOPE:
            code = self.string_like().decode()
            return Code(code, self.object_body())
        if ctype == _DBREF:
            n = struct.unpack(">i", self.take(4))[0]
            ns = self.take(n).decode()
            return DBRef(ns, ObjectId(self.take(12)))
        if _NAN <= ctype <= _POS_LARGE:
            return self.number(ctype)
        raise _KeyStringError(f"unknown type {ctype}")

    def object_body(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while True:
            c = self.byte()
            if c == 0:
                return out
            name = self.cstring().decode("utf-8")
            out[name] = self.value(self.byte())

    def number(self, ctype: int) -> Any:
        if ctype == _ZERO:
            kind = self.tb.two()
            if kind == 3:
                rest = (self.tb.bit() << 2) | (self.tb.two())
                five = (3 << 3) | rest
                if five == 0x18:
                    return -0.0
                which = ((five - 0x1A) << 12)
                for i in range(11, -1, -1):
                    which |= self.tb.bit() << i
                neg = which >= 12288
                biased = which - 12288 if neg else which
                return Decimal128(f"{'-' if neg else ''}0E{biased - 6176}")
            return (0, Int64(0), 0.0)[kind]
        kind = self.tb.two()
        exp_bits = 0
        if kind == 3:
            for i in range(5, -1, -1):
                exp_bits |= self.tb.bit() << i
        if ctype == _NAN:
            return Decimal128("NaN") if kind == 3 else float("nan")
        dcm = 0
        if ctype in (_POS_LARGE, _NEG_LARGE):
            raw = struct.unpack(">Q", self.take(8))[0]
            neg = ctype == _NEG_LARGE
            if neg:
                raw ^= _U64
            if raw == _U64:
                val = float("inf")
            else:
                dcm = 3 if raw & 1 else 0
                val = _bits_double((raw >> 1) | (1 << 62))
            val = -val if neg else val
        elif ctype in (_POS_SMALL, _NEG_SMALL):
            raw = struct.unpack(">Q", self.take(8))[0]
            neg = ctype == _NEG_SMALL
            if neg:
                raw ^= _U64
            if raw >> 62 == 3:
                dcm = raw & 3
                val = _bits_double(raw >> 2)
            else:
                dcm = 3 if raw & 1 else 0
                val = _bits_double(((raw - (1 << 62)) & _U64) >> 1) * 2.0 ** -256
            val = -val if neg else val
        else:
            neg = ctype < _ZERO
            nbytes = (_NEG_1B - ctype + 1) if neg else (ctype - _POS_1B + 1)
            raw_b = self.take(nbytes)
            if neg:
                raw_b = bytes(b ^ 0xFF for b in raw_b)
            pre = int.from_bytes(raw_b, "big")
            ip = pre >> 1
            if pre & 1:  # a fractional part follows (V1 layout)
                fb = 8 - nbytes
                frac_raw = self.take(fb)
                if neg:
                    frac_raw = bytes(b ^ 0xFF for b in frac_raw)
                enc = (pre << (8 * fb)) | int.from_bytes(frac_raw, "big")
                dcm = enc & 3
                enc &= ~3
                val = math.ldexp(float(enc - ((ip + 1) << (8 * fb))), -8 * fb)
                val = -val if neg else val
                if kind < 2:
                    kind = 2
            else:
                num = -ip if neg else ip
                if kind == 0:
                    return num if _INT32_MIN <= num <= _INT32_MAX else Int64(num)
                if kind == 1:
                    return Int64(num)
                val = float(num)
        if kind != 3:
            return val
        if not math.isfinite(val):
            return Decimal128(str(val).replace("inf", "Infinity"))
        if dcm in (1, 3):
            cont = struct.unpack(">Q", self.take(8))[0]
            if neg:
                cont ^= _U64
            stored = decimal.Context(prec=34, rounding=decimal.ROUND_UP).plus(
                decimal.Decimal(val)).normalize(_DEC_CTX)
            step = decimal.Decimal(1).scaleb(stored.as_tuple().exponent)
            d = stored + (-cont if neg else cont) * step
        elif dcm == 2:
            d = _ROUND15_UP.plus(decimal.Decimal(val))
        else:
            d = decimal.Decimal(val)
        return _decimal_with_exponent(d, exp_bits)


def decode_keystring(data: bytes, type_bits: bytes | None = None) -> list[Any]:
    """Inverse of :func:`encode_keystring`: the top-level values. Raises ``_KeyStringError``."""
    r = _Reader(data, _TypeBitsReader(type_bits))
    out = []
    while True:
        c = r.byte()
        if c == _END:
            if r.pos != len(data):
                raise _KeyStringError("trailing bytes after end of key")
            return out
        out.append(r.value(c))


# ----------------------------------------------------------------------------------------------
# Resume tokens
# ----------------------------------------------------------------------------------------------

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
_OP_TYPE_FIELD = bytes([_STRING]) + b"operationType\x00" + bytes([_STRING])
_DOC_KEY_FIELD = bytes([_OBJECT]) + b"documentKey\x00"


# Hex of everything between the clusterTime and the documentKey's fields, per (collection UUID,
# operationType, txnOpIndex): the same for every event of a collection (bounded cache).
_MID_HEX: dict[tuple[bytes | None, str, int], str] = {}
_MID_HEX_MAX = 4096
_ID_FIELD_HEX = (bytes([_NUMERIC]) + b"_id\x00").hex().upper()
_ID_OID_HEX = (bytes([_OID]) + b"_id\x00").hex().upper()
_ID_STR_HEX = (bytes([_STRING]) + b"_id\x00").hex().upper()


def _event_mid_hex(uuid: bytes | None, operation_type: str, txn_op_index: int) -> str:
    out = bytearray(_EVENT_V2_HEAD)
    _append_integer(out, txn_op_index)
    out.append(_FALSE)
    if uuid is not None:
        out += b"\x5a\x10\x04"
        out += uuid
    else:
        out.append(_NULLISH)
    out.append(_OBJECT)
    out += _OP_TYPE_FIELD
    _append_string_like(out, operation_type.encode())
    out += _DOC_KEY_FIELD
    out.append(_OBJECT)
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
        if tv is int and 0 < v <= _INT32_MAX:
            # Positive integer: 0x2B + (nbytes - 1) then (v << 1) big-endian (_append_preshifted).
            n = ((v << 1).bit_length() + 7) >> 3
            return "82%016X%s%s%02X%0*X000004" % (key, mid, _ID_FIELD_HEX, _POS_1B + n - 1,
                                                   n << 1, v << 1), None
        if tv is ObjectId:
            return "82%016X%s%s%s%s000004" % (key, mid, _ID_OID_HEX, "%02X" % _OID,
                                              v.binary.hex().upper()), None
        if tv is str and "\x00" not in v:
            return "82%016X%s%s%02X%s00000004" % (key, mid, _ID_STR_HEX, _STRING,
                                                  v.encode("utf-8").hex().upper()), None
    tb = _TypeBits()
    tb.n = 7  # version, tokenType, txnOpIndex (NumberInt: 0 0 each) and operationType (string: 0)
    body = bytearray()
    _append_object_body(body, tb, document_key)
    return "82%016X%s%s0004" % (key, mid, body.hex().upper()), (tb.serialize() if tb.nonzero
                                                                  else None)


def int_id_token_template(mid: str, n: int) -> str:
    """A %-template of the ``_data`` of a v2 event token whose bytes up to the documentKey's
    fields are ``mid`` (:func:`event_mid_hex`) and whose documentKey is ``{_id: v}`` with ``v``
    an int, ``0 < v <= 2**31 - 1`` (NumberInt, type bits all zero), for the ``v`` with
    ``n = ((v << 1).bit_length() + 7) >> 3``: fill with ``(key, v << 1)`` where ``key`` is the
    clusterTime's ts key (``_append_preshifted``: the byte 0x2B + (n - 1), then ``v << 1`` in
    n big-endian bytes). The result has ``2 * n + len(mid) + 36`` characters; identical to
    :func:`fast_event_token_hex` for such keys."""
    return "82%%016X%s%s%02X%%0%dX000004" % (mid, _ID_FIELD_HEX, _POS_1B + n - 1, 2 * n)


def oid_id_token_template(mid: str) -> str:
    """A %-template of the ``_data`` of a v2 event token whose bytes up to the documentKey's
    fields are ``mid`` (:func:`event_mid_hex`) and whose documentKey is ``{_id: <ObjectId>}``:
    fill with ``(key, hex)`` where ``key`` is the clusterTime's ts key and ``hex`` the id's 12
    bytes in uppercase hex. The result has ``len(mid) + 60`` characters; identical to
    :func:`fast_event_token_hex` for such keys."""
    return "82%%016X%s%s%02X%%s000004" % (mid, _ID_OID_HEX, _OID)


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
                          "kNewShardDetected"})


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


def token_key(token: Mapping[str, Any]) -> str:
    """The sort key of a token document: its ``_data`` string (uppercase hex sorts like bytes)."""
    return token["_data"]


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
    except _KeyStringError as exc:
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
