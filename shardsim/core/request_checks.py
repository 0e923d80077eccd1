"""Request checks every role makes before running a command, with mongod 8.0's codes: the
generic ``maxTimeMS`` and ``writeConcern`` fields (for every command) and the batch shape of
the write commands (router and shard alike, so a client sees the same error from either).

* ``maxTimeMS``: a number in ``[0, 2147483647]`` without a fractional part, else BadValue (2)
  (``parseMaxTimeMS`` in ``src/mongo/db/query/query_request_helper.cpp``).
* ``writeConcern`` (``src/mongo/db/write_concern_options.cpp``, ``write_concern.idl``): a
  document (TypeMismatch 14); ``w`` a number in ``[0, 50]`` (FailedToParse 9 otherwise), or
  ``"majority"``; any other mode name is UnknownReplWriteConcern (79): shardsim's replica sets
  have no tag sets (``ReplicationCoordinatorImpl::_checkIfWriteConcernCanBeSatisfied``);
  ``wtimeout`` a number (TypeMismatch 14); ``j``/``fsync`` booleans or numbers (14).
* ``insert``/``update``/``delete``: ``ordered`` a boolean (TypeMismatch 14), the statement array
  between 1 and 100,000 entries (InvalidLength 16, ``write_ops::checkOpCountForCommand`` in
  ``src/mongo/db/ops/write_ops.cpp``).
"""

from __future__ import annotations

from typing import Any

from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError
from shardsim.core.txn_rules import check_transaction_command, check_transaction_write_concern

MAX_TIME_MS = 2**31 - 1
MAX_WRITE_BATCH = 100_000
MAX_W_MEMBERS = 50
_NUMBER = (int, float)
_STATEMENTS = {"insert": "documents", "update": "updates", "delete": "deletes"}


def _is_number(v: Any) -> bool:
    return isinstance(v, _NUMBER) and not isinstance(v, bool) or type(v).__name__ in (
        "Int64", "Decimal128")


def check_max_time_ms(value: Any) -> None:
    """BadValue (2) unless ``value`` is an integral number in ``[0, 2147483647]``."""
    if value is None:
        return
    if not _is_number(value):
        raise MongoError(2, "maxTimeMS must be a number")
    v = float(str(value)) if type(value).__name__ == "Decimal128" else float(value)
    if v < 0 or v > MAX_TIME_MS:
        raise MongoError(2, f"{value} value for maxTimeMS is out of range [0, {MAX_TIME_MS}]")
    if v != int(v):
        raise MongoError(2, "maxTimeMS has a fractional component")


def check_write_concern(wc: Any) -> None:
    """The command's ``writeConcern`` document as mongod parses it (see the module text)."""
    if wc is None:
        return
    if not isinstance(wc, dict):
        raise MongoError(14, f"BSON field 'writeConcern' is the wrong type "
                             f"'{bson_type_name(wc)}', expected type 'object'")
    if "w" in wc:
        w = wc["w"]
        if _is_number(w):
            if float(w) < 0 or float(w) > MAX_W_MEMBERS or float(w) != int(float(w)):
                raise MongoError(9, f"w has to be a non-negative number and not greater than "
                                    f"{MAX_W_MEMBERS}; found: {w}")
        elif isinstance(w, str):
            if w != "majority" and not w.startswith("$"):
                raise MongoError(79, f"No write concern mode named '{w}' found in replica set "
                                     f"configuration")
        elif not isinstance(w, dict):
            raise MongoError(9, "w has to be a number, a string or an object")
    for name in ("wtimeout", "wtimeoutMS"):
        if name in wc and not _is_number(wc[name]):
            raise MongoError(14, f"BSON field 'writeConcern.{name}' is the wrong type "
                                 f"'{bson_type_name(wc[name])}', expected types '[long, int, "
                                 f"decimal, double]'")
    for name in ("j", "fsync"):
        if name in wc and not (isinstance(wc[name], bool) or _is_number(wc[name])):
            raise MongoError(14, f"BSON field 'writeConcern.{name}' is the wrong type "
                                 f"'{bson_type_name(wc[name])}', expected types '[bool, long, "
                                 f"int, decimal, double]'")


def check_write_batch(name: str, body: dict[str, Any]) -> None:
    """An insert/update/delete body's ``ordered`` (TypeMismatch 14) and statement count
    (InvalidLength 16 outside 1..100,000); a statement field that is not an array is left to
    the command's own parser (14/40414)."""
    ordered = body.get("ordered", True)
    if not isinstance(ordered, bool):
        raise MongoError(14, f"BSON field '{name}.ordered' is the wrong type "
                             f"'{bson_type_name(ordered)}', expected type 'bool'")
    stmts = body.get(_STATEMENTS[name])
    if isinstance(stmts, list) and not 1 <= len(stmts) <= MAX_WRITE_BATCH:
        raise MongoError(16, f"Write batch sizes must be between 1 and {MAX_WRITE_BATCH}. "
                             f"Got {len(stmts)} operations.")


def check_request(name: str, body: dict[str, Any]) -> None:
    """Every check of this module that applies to command ``name`` (canonical name)."""
    check_max_time_ms(body.get("maxTimeMS"))
    check_write_concern(body.get("writeConcern"))
    check_transaction_write_concern(name, body)
    if name == "aggregate" and body.get("autocommit") is False:  # stages not allowed (263)
        check_transaction_command(name, "", body)
    if name in _STATEMENTS:
        check_write_batch(name, body)
