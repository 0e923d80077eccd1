"""mongod's KeyString encoding (Version V1, all-ascending ordering), encoder and decoder.

The byte format of ``src/mongo/db/storage/key_string/key_string.cpp``: each BSON value becomes a
CType byte (the canonical type order of ``bsontypes.h``) followed by an order-preserving body, so
byte-wise comparison of two KeyStrings equals ``BSONObj::woCompare`` of the values. Numbers of
different BSON types that compare equal (int, long, double, decimal) encode to the same bytes;
``TypeBits`` (``_typeBits`` in a resume token) records which type each one was.

:func:`encode_keystring` / :func:`decode_keystring` are the whole codec; the public names at the
end (``CTYPE_*``, ``TypeBits``, ``append_*``) are the building blocks the resume-token fast path in
:mod:`shardsim.core.resume_token` assembles tokens from without re-encoding a whole object.
Decoding raises :class:`KeyStringError` on malformed input (callers turn it into the server's
resume-token errors).
"""

from __future__ import annotations

import decimal
import math
import re
import struct
import uuid as _uuid
from datetime import datetime, timezone
from typing import Any, Mapping

from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from shardsim.core.errors import MongoError

__all__ = ["encode_keystring", "decode_keystring", "KeyStringError", "TypeBits"]

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


# -- building blocks for shardsim.core.resume_token's fast token assembly --------------------------
CTYPE_FALSE = _FALSE
KeyStringError = _KeyStringError
CTYPE_NULLISH = _NULLISH
CTYPE_NUMERIC = _NUMERIC
CTYPE_OBJECT = _OBJECT
CTYPE_OID = _OID
CTYPE_POS_1B = _POS_1B
CTYPE_STRING = _STRING
TypeBits = _TypeBits
append_integer = _append_integer
append_object_body = _append_object_body
append_preshifted = _append_preshifted
append_string_like = _append_string_like
INT32_MAX = _INT32_MAX
