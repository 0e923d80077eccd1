"""Oplog size settings validated as mongod validates them.

``replSetResizeOplog`` (``src/mongo/db/commands/resize_oplog.cpp``, request parsed by the IDL
struct ``ReplSetResizeOplogRequest`` in ``resize_oplog.idl``): ``size`` in MB and
``minRetentionHours`` are numbers (else TypeMismatch 14); ``size`` must be between 990 and
1073741824 (1 PB in MB) and ``minRetentionHours`` at least 0, else the IDL validator's error
(51024) ``BSON field 'replSetResizeOplog.size' value must be >= 990, actual value '0'``. The
reply is ``{ok: 1}``. ``setParameter`` with shardsim's ``oplogSizeMB`` /
``oplogMinRetentionHours`` applies the same rules, so no value can cut the history to nothing.
(``--oplog-size-mb`` at start-up accepts any size above 0, for tests with a tiny oplog.)
"""

from __future__ import annotations

from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64

from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError

MIN_SIZE_MB = 990
MAX_SIZE_MB = 1073741824  # 1 PB in MB


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, Int64, Decimal128)):
        raise MongoError(14, f"BSON field '{field}' is the wrong type '{bson_type_name(value)}', "
                             f"expected types '[long, int, decimal, double]'")
    return float(value.to_decimal()) if isinstance(value, Decimal128) else float(value)


def _bound(field: str, op: str, value: float, limit: int) -> MongoError:
    return MongoError(51024, f"BSON field '{field}' value must be {op} {limit}, actual value "
                             f"'{value:g}'")


def check_size_mb(value: Any, field: str = "replSetResizeOplog.size") -> float:
    """An oplog size in MB (990 .. 1073741824) or MongoError 14 / 51024."""
    v = _number(value, field)
    if not v >= MIN_SIZE_MB:  # also NaN
        raise _bound(field, ">=", v, MIN_SIZE_MB)
    if not v <= MAX_SIZE_MB:
        raise _bound(field, "<=", v, MAX_SIZE_MB)
    return v


def check_min_retention_hours(value: Any,
                              field: str = "replSetResizeOplog.minRetentionHours") -> float:
    """``minRetentionHours`` (>= 0) or MongoError 14 / 51024."""
    v = _number(value, field)
    if not v >= 0:
        raise _bound(field, ">=", v, 0)
    return v

