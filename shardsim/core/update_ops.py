"""The type-exact update operators: ``$inc``, ``$mul``, ``$min``, ``$max``, ``$bit``, ``$currentDate``.

These produce the values a change stream reports (the stored document, the oplog's ``$v: 2``
diff, ``updateDescription`` and every post-image), so they follow mongod 8.0 exactly rather
than Python's arithmetic:

* :func:`safe_add` / :func:`safe_mul` are ``SafeNum`` (``src/mongo/util/safe_num.cpp``):
  int32 op int32 stays int32 unless the result leaves the int32 range, then it is an Int64;
  an Int64 on either side gives an Int64, and an Int64 result that does not fit is *invalid*
  (the update fails with BadValue 2, ``ArithmeticNode::updateExistingElement``); a Decimal128
  on either side gives an exact Decimal128 (IEEE 754-2008 decimal128: 34 digits, half-even; a
  double operand first becomes a 15-significant-digit decimal, ``Decimal128(double,
  kRoundTo15Digits)``); otherwise a double.
* ``$bit`` is ``BitNode`` (``bit_node.cpp``): ``and``/``or``/``xor`` with int32/Int64 operands
  on an int32/Int64 field, int32 only when both sides are int32.
* ``$min``/``$max`` are ``CompareNode`` (``compare_node.cpp``): BSON order (``woCompare``,
  numbers by value across types); an equal value is a no-op, a replacement stores the operand
  as given (its type kept).
* ``$currentDate`` is ``CurrentDateNode`` (``current_date_node.cpp``): ``true`` or
  ``{$type: "date"}`` stores the wall clock in milliseconds, ``{$type: "timestamp"}`` a
  Timestamp from :data:`timestamp_source` (a shard sets it to its cluster-time clock).

Values in Python: int32 is ``int`` (a Python ``int`` outside the int32 range counts as an
Int64, as pymongo encodes it), Int64 is :class:`bson.int64.Int64`, double is ``float``,
Decimal128 is :class:`bson.decimal128.Decimal128`. Paths are created like ``ModifierNode``
(missing documents created, array indexes past the end padded with null); a path through a
scalar, or a non-numeric part on an array, is PathNotViable (28).
"""

from __future__ import annotations

import datetime
import decimal
import functools
import time
from contextvars import ContextVar
from typing import Any, Callable

from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError
from shardsim.core.keystring import encode_keystring
from shardsim.core.values import format_value

OWNED_OPERATORS = frozenset({"$inc", "$mul", "$min", "$max", "$bit", "$currentDate"})

_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_DEC_CTX = create_decimal128_context()


def _default_timestamp() -> Timestamp:
    return Timestamp(int(time.time()), 1)


# What ``$currentDate: {$type: "timestamp"}`` stores: mongod reserves one tick of its
# cluster-time clock (current_date_node.cpp). A context variable, so that several shards in
# one process (the in-process test kit) each tick their own clock.
_timestamp_source: ContextVar[Callable[[], Timestamp]] = ContextVar(
    "timestamp_source", default=_default_timestamp)


def set_timestamp_source(source: Callable[[], Timestamp]) -> None:
    """Make ``source()`` (a BSON Timestamp) what ``$currentDate: {$type: "timestamp"}``
    stores in the current task and the tasks it starts; a shard sets its clock's ``tick`` for
    every command it runs. Without it: ``Timestamp(<now s>, 1)``."""
    _timestamp_source.set(source)


# -- numbers (SafeNum) ------------------------------------------------------------------------

def num_kind(v: Any) -> str | None:
    """``"int"``, ``"long"``, ``"double"``, ``"decimal"`` for a BSON number, else None."""
    t = type(v)
    if t is int:
        return "int" if _INT32_MIN <= v <= _INT32_MAX else "long"
    if t is Int64:
        return "long"
    if t is float:
        return "double"
    if t is Decimal128:
        return "decimal"
    return None


def double_to_decimal(x: float) -> decimal.Decimal:
    """``Decimal128(double, kRoundTo15Digits)``: zero, infinities and NaN convert exactly,
    anything else is rounded (half-even) to exactly 15 significant digits, trailing zeros kept
    (``0.1`` -> ``0.100000000000000``)."""
    d = decimal.Decimal(x)
    if x == 0.0 or not d.is_finite():
        return d
    rounded = decimal.Context(prec=15, rounding=decimal.ROUND_HALF_EVEN).plus(d)
    return rounded.quantize(decimal.Decimal(1).scaleb(rounded.adjusted() - 14),
                            context=decimal.Context(prec=40))


def to_decimal(v: Any) -> decimal.Decimal:
    """``SafeNum::getDecimal``: a number as an exact ``decimal.Decimal``."""
    if type(v) is Decimal128:
        return v.to_decimal()
    if type(v) is float:
        return double_to_decimal(v)
    return decimal.Decimal(int(v))


def _int_result(value: int, wide: bool) -> Any:
    """An integer result: int32 when both operands were int32 and it fits, else Int64, else
    None (invalid SafeNum)."""
    if not wide and _INT32_MIN <= value <= _INT32_MAX:
        return value
    if _INT64_MIN <= value <= _INT64_MAX:
        return Int64(value)
    return None


def _arith(a: Any, b: Any, op: str) -> Any:
    ka, kb = num_kind(a), num_kind(b)
    if ka is None or kb is None:
        return None
    if ka in ("int", "long") and kb in ("int", "long"):
        value = int(a) + int(b) if op == "add" else int(a) * int(b)
        wide = ka == "long" or kb == "long"
        if not wide:
            # int32 op int32 is computed in 64 bits and kept there when it overflows int32.
            return value if _INT32_MIN <= value <= _INT32_MAX else Int64(value)
        return _int_result(value, True)
    if ka == "decimal" or kb == "decimal":
        da, db = to_decimal(a), to_decimal(b)
        return Decimal128(_DEC_CTX.add(da, db) if op == "add" else _DEC_CTX.multiply(da, db))
    return float(a) + float(b) if op == "add" else float(a) * float(b)


def safe_add(a: Any, b: Any) -> Any:
    """``SafeNum`` addition of two BSON numbers; None when the result is invalid (an Int64
    overflow or a non-number)."""
    return _arith(a, b, "add")


def safe_mul(a: Any, b: Any) -> Any:
    """``SafeNum`` multiplication of two BSON numbers; None when invalid (Int64 overflow)."""
    return _arith(a, b, "mul")


def safe_bit(a: Any, b: Any, op: str) -> Any:
    """``SafeNum::bitAnd/bitOr/bitXor`` (``op`` is ``and``/``or``/``xor``) of two integers:
    int32 when both are int32, else Int64; None for a non-integer."""
    ka, kb = num_kind(a), num_kind(b)
    if ka not in ("int", "long") or kb not in ("int", "long"):
        return None
    x, y = int(a), int(b)
    value = x & y if op == "and" else x | y if op == "or" else x ^ y
    return value if ka == kb == "int" else Int64(value)


def identical(a: Any, b: Any) -> bool:
    """``SafeNum::isIdentical``: same numeric type and equal value (decimals by value, so
    ``1.0`` and ``1.00`` are identical; NaN never is)."""
    ka, kb = num_kind(a), num_kind(b)
    if ka is None or ka != kb:
        return False
    if ka == "decimal":
        da, db = a.to_decimal(), b.to_decimal()
        return not da.is_nan() and not db.is_nan() and da == db
    return a == b


def debug_string(v: Any) -> str:
    """``SafeNum::debugString``: ``(NumberInt)5``, ``(NumberLong)5``, ``(NumberDouble)0.5``,
    ``(NumberDecimal)1.5``."""
    kind = num_kind(v)
    if kind == "int":
        return f"(NumberInt){int(v)}"
    if kind == "long":
        return f"(NumberLong){int(v)}"
    if kind == "double":
        return f"(NumberDouble){v:g}"
    if kind == "decimal":
        return f"(NumberDecimal){v}"
    return "(EOO)"


def type_name(v: Any) -> str:
    """mongod's ``typeName(BSONType)`` of a decoded value (``int``, ``long``, ``string``...)."""
    return bson_type_name(v)


def _bson_compare(a: Any, b: Any) -> int:
    """``woCompare`` of two values (field names not compared at the top level): -1, 0, 1."""
    ka, _ = encode_keystring([a])
    kb, _ = encode_keystring([b])
    return (ka > kb) - (ka < kb)


# -- parse-time checks (the nodes' init) ------------------------------------------------------

def _element(path: str, value: Any) -> str:
    return f"{path}: {format_value(value)}"


def validate_operand(op: str, path: str, value: Any) -> None:
    """The checks ``ArithmeticNode/BitNode/CurrentDateNode::init`` make on an operand.

    Errors: TypeMismatch (14) ``Cannot increment with non-numeric argument: {a: "x"}`` (and
    ``multiply`` for ``$mul``); BadValue (2) for a malformed ``$bit`` or ``$currentDate``."""
    if op in ("$inc", "$mul"):
        if num_kind(value) is None:
            verb = "increment" if op == "$inc" else "multiply"
            raise MongoError(14, f"Cannot {verb} with non-numeric argument: {{{_element(path, value)}}}")
    elif op == "$bit":
        _parse_bit(path, value)
    elif op == "$currentDate":
        _current_date_is_date(value)


def _parse_bit(path: str, value: Any) -> list[tuple[str, Any]]:
    if not isinstance(value, dict):
        raise MongoError(2, f"The $bit modifier is not compatible with a {type_name(value)}. You must "
                            f"pass in an embedded document: {{$bit: {{field: {{and/or/xor: #}}}}")
    ops: list[tuple[str, Any]] = []
    for name, operand in value.items():
        if name not in ("and", "or", "xor"):
            raise MongoError(2, f"The $bit modifier only supports 'and', 'or', and 'xor', not '{name}' "
                                f"which is an unknown operator: {{{_element(name, operand)}}}")
        if num_kind(operand) not in ("int", "long"):
            raise MongoError(2, f"The $bit modifier field must be an Integer(32/64 bit); a "
                                f"'{type_name(operand)}' is not supported here: {{{_element(name, operand)}}}")
        ops.append((name, operand))
    if not ops:
        raise MongoError(2, "You must pass in at least one bitwise operation. The format is: "
                            "{$bit: {field: {and/or/xor: #}}")
    return ops


def _current_date_is_date(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, dict):
        is_date: bool | None = None
        for k, v in value.items():
            if k != "$type":
                raise MongoError(2, f"Unrecognized $currentDate option: {k}")
            if v == "date":
                is_date = True
            elif v == "timestamp":
                is_date = False
        if is_date is None:
            raise MongoError(2, "The '$type' string field is required to be 'date' or 'timestamp': "
                                "{$currentDate: {field : {$type: 'date'}}}")
        return is_date
    raise MongoError(2, f"{type_name(value)} is not valid type for $currentDate. Please use a boolean "
                        f"('true') or a $type expression ({{$type: 'timestamp/date'}}).")


# -- paths ------------------------------------------------------------------------------------

def _is_index(part: str) -> bool:
    return part.isdigit() and part.isascii()


def _locate(doc: dict[str, Any], parts: list[str]) -> tuple[Any, int, bool]:
    """Walk ``parts``: ``(container, i, found)``; ``container`` holds ``parts[i]`` (found) or is
    where the missing ``parts[i:]`` must be created. PathNotViable (28) through a scalar."""
    cur: Any = doc
    prev = ""
    for i, part in enumerate(parts):
        if isinstance(cur, dict):
            if part not in cur:
                return cur, i, False
        elif isinstance(cur, list):
            if not _is_index(part):
                raise MongoError(28, f"Cannot create field '{part}' in element {{{prev}: {format_value(cur)}}}")
            if int(part) >= len(cur):
                return cur, i, False
        else:
            raise MongoError(28, f"Cannot create field '{part}' in element {{{prev}: {format_value(cur)}}}")
        if i == len(parts) - 1:
            return cur, i, True
        cur = cur[int(part)] if isinstance(cur, list) else cur[part]
        prev = part
    raise AssertionError("unreachable")


def _get(container: Any, part: str) -> Any:
    return container[int(part)] if isinstance(container, list) else container[part]


def _put(container: Any, part: str, value: Any) -> None:
    if isinstance(container, list):
        i = int(part)
        while len(container) <= i:
            container.append(None)
        container[i] = value
    else:
        container[part] = value


def _create(container: Any, parts: list[str], value: Any) -> None:
    """Create the missing ``parts`` under ``container`` (new levels are documents)."""
    for part in reversed(parts[1:]):
        value = {part: value}
    _put(container, parts[0], value)


# -- applying ---------------------------------------------------------------------------------

def _now_date() -> datetime.datetime:
    ms = int(time.time() * 1000)
    return datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=ms)


def _id_element(doc: dict[str, Any]) -> str:
    return _element("_id", doc["_id"]) if "_id" in doc else "no id"


def _new_value(op: str, path: str, operand: Any) -> Any:
    """``setValueForNewElement``: what a missing field becomes."""
    if op == "$inc" or op in ("$min", "$max"):
        return operand
    if op == "$mul":
        return safe_mul(operand, 0)
    if op == "$bit":
        value: Any = 0
        for name, x in _parse_bit(path, operand):
            value = safe_bit(value, x, name)
        return value
    return _now_date() if _current_date_is_date(operand) else _timestamp_source.get()()


_NOOP = object()


def _updated_value(doc: dict[str, Any], op: str, path: str, field: str, cur: Any, operand: Any) -> Any:
    """``updateExistingElement``: the new value, or ``_NOOP`` to leave the field as it is."""
    if op in ("$inc", "$mul"):
        if num_kind(cur) is None:
            raise MongoError(14, f"Cannot apply {op} to a value of non-numeric type. {{{_id_element(doc)}}} "
                                 f"has the field '{field}' of non-numeric type {type_name(cur)}")
        result = safe_add(operand, cur) if op == "$inc" else safe_mul(operand, cur)
        if result is None:
            raise MongoError(2, f"Failed to apply {op} operations to current value ({debug_string(cur)}) "
                                f"for document {{{_id_element(doc)}}}")
        return _NOOP if identical(result, cur) else result
    if op in ("$min", "$max"):
        c = _bson_compare(cur, operand)
        if c == 0 or (c < 0 if op == "$min" else c > 0):
            return _NOOP
        return operand
    if op == "$bit":
        if num_kind(cur) not in ("int", "long"):
            raise MongoError(2, f"Cannot apply $bit to a value of non-integral type.{_id_element(doc)} has "
                                f"the field {field} of non-integer type {type_name(cur)}")
        value = cur
        for name, x in _parse_bit(path, operand):
            value = safe_bit(value, x, name)
        return _NOOP if identical(value, cur) else value
    return _new_value(op, path, operand)  # $currentDate always writes


def apply_operator(doc: dict[str, Any], op: str, path: str, operand: Any) -> None:
    """Apply one ``{op: {path: operand}}`` of the owned operators to ``doc`` in place.

    Raises the node's errors: TypeMismatch (14) for a non-numeric field under ``$inc``/``$mul``,
    BadValue (2) for an Int64 overflow or ``$bit`` on a non-integer, PathNotViable (28) for a
    path through a scalar."""
    validate_operand(op, path, operand)
    parts = path.split(".")
    container, i, found = _locate(doc, parts)
    if not found:
        _create(container, parts[i:], _new_value(op, path, operand))
        return
    value = _updated_value(doc, op, path, parts[-1], _get(container, parts[-1]), operand)
    if value is not _NOOP:
        _put(container, parts[-1], value)


def _cmp_component(a: str, b: str) -> int:
    if _is_index(a) and _is_index(b):
        ia, ib = int(a), int(b)
        return (ia > ib) - (ia < ib)
    return (a > b) - (a < b)


def _cmp_paths(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    for x, y in zip(a, b):
        c = _cmp_component(x, y)
        if c:
            return c
    return (len(a) > len(b)) - (len(a) < len(b))


_PATH_KEY = functools.cmp_to_key(_cmp_paths)


def path_sort_key(path: str) -> Any:
    """Sort key for update paths in the order mongod applies them (``UpdateObjectNode``'s
    children map, ``pathsupport::cmpPathsAndArrayIndexes``: component by component, array
    indexes numerically)."""
    return _PATH_KEY(tuple(path.split(".")))
