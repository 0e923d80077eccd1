"""BSON values as mongod compares and prints them: what every role needs of a document.

* :func:`id_key`: a hashable key with mongod's equality for an ``_id`` or an index value (numbers
  by value across int/long/double/decimal, other types by BSON bytes), so a dict can stand for
  the ``_id`` index.
* :func:`get_path`: the value at a dotted path (numeric parts index arrays).
* :func:`format_value`: a value as the server's ``BSONObj::toString`` prints it in error
  messages (DuplicateKey's ``dup key: { _id: 1 }``, say).
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import bson
from bson import Binary, Decimal128, ObjectId
from bson.int64 import Int64
from bson.timestamp import Timestamp


def id_key(value: Any) -> Any:
    """A hashable key with mongod's equality for an ``_id`` or index value.

    Numbers compare by value across int/long/double (``1 == 1.0``); booleans, strings,
    ObjectIds and dates are distinct types; anything else (documents, arrays, binaries) is
    compared by its BSON bytes.
    """
    t = type(value)
    if t is ObjectId or t is str:
        return value
    if t is int or t is Int64:
        return ("n", int(value))
    if t is float:
        return ("n", int(value)) if value.is_integer() else ("n", value)
    if t is bool:
        return ("b", value)
    if value is None:
        return ("null",)
    if t is datetime.datetime:
        return ("d", value)
    if t is Decimal128:
        # Canonical numeric form, so equal numbers of different types give equal keys with
        # equal reprs (the durable store keys rows by repr).
        d = value.to_decimal()
        if d.is_finite() and d == d.to_integral_value():
            return ("n", int(d))
        f = float(d)
        return ("n", f) if decimal.Decimal(f) == d else ("n", d.normalize())
    if isinstance(value, str):  # a string under a collation (core.collation.CollationKey)
        return value
    return ("x", bson.encode({"": value}))


def get_path(doc: Any, path: str) -> tuple[bool, Any]:
    """``(found, value)`` for a dotted ``path`` (numeric parts index arrays)."""
    cur = doc
    for part in path.split("."):
        if isinstance(cur, dict):
            if part not in cur:
                return False, None
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit():
            i = int(part)
            if i >= len(cur):
                return False, None
            cur = cur[i]
        else:
            return False, None
    return True, cur


def format_value(v: Any) -> str:
    """A value the way the server's ``BSONObj::toString`` prints it in error messages."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, float):
        return repr(v) if v != int(v) or abs(v) >= 1e16 else f"{v:.1f}"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, ObjectId):
        return f"ObjectId('{v}')"
    if isinstance(v, dict):
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{k}: {format_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        if not v:
            return "[]"
        return "[ " + ", ".join(format_value(x) for x in v) + " ]"
    if isinstance(v, datetime.datetime):
        return f"new Date({int(v.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000)})"
    if isinstance(v, Timestamp):
        return f"Timestamp({v.time}, {v.inc})"
    if isinstance(v, Binary):
        return f"BinData({v.subtype}, {v.hex().upper()})"
    return str(v)
