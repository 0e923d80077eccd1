"""The type-exact update operators (shardsim/update_ops.py): mongod's SafeNum table for $inc
and $mul, $bit, $min/$max in BSON order, $currentDate, their errors, path creation, and the
order mongod applies paths in (shardsim/update.py)."""

from __future__ import annotations

import asyncio
import contextvars
import datetime

import bson
import pytest
from bson import Decimal128, Int64, Timestamp

from shardsim.core import update_ops
from shardsim.core.errors import MongoError
from shardsim.core.update import apply_update, update_diff, validate_update

I32_MAX = 2 ** 31 - 1
I64_MAX = 2 ** 63 - 1


def typed(v):
    """(BSON type name, value) after a BSON round trip, so int32 vs Int64 is visible."""
    out = bson.decode(bson.encode({"v": v}))["v"]
    return update_ops.num_kind(out) or type(out).__name__, out


@pytest.mark.parametrize("a,b,kind,value", [
    (1, 2, "int", 3),
    (I32_MAX, 1, "long", 2 ** 31),                 # int32 overflow widens to Int64
    (-(2 ** 31), -1, "long", -(2 ** 31) - 1),
    (Int64(5), 1, "long", 6),                      # Int64 stays Int64 ...
    (1, Int64(5), "long", 6),
    (Int64(1), Int64(1), "long", 2),               # ... even when the sum fits in int32
    (1, 0.5, "double", 1.5),
    (Int64(2), 0.5, "double", 2.5),
    (Decimal128("1.1"), 1, "decimal", Decimal128("2.1")),
    (Decimal128("1.1"), Int64(2), "decimal", Decimal128("3.1")),
    (Decimal128("0.1"), 0.2, "decimal", Decimal128("0.300000000000000")),   # double -> 15 digits
    (Decimal128("9999999999999999999999999999999999"), 1, "decimal", Decimal128("1.000000000000000000000000000000000E+34")),
])
def test_safe_add_table(a, b, kind, value):
    got = update_ops.safe_add(a, b)
    assert typed(got)[0] == kind
    assert got == value


@pytest.mark.parametrize("a,b,kind,value", [
    (3, 4, "int", 12),
    (65536, 65536, "long", 2 ** 32),
    (Int64(3), 2, "long", 6),
    (2, 1.5, "double", 3.0),
    (Decimal128("1.5"), 3, "decimal", Decimal128("4.5")),
    (Decimal128("2.5"), 0, "decimal", Decimal128("0.0")),
])
def test_safe_mul_table(a, b, kind, value):
    got = update_ops.safe_mul(a, b)
    assert typed(got)[0] == kind
    assert got == value


def test_int64_overflow_is_invalid_not_a_double():
    assert update_ops.safe_add(Int64(I64_MAX), 1) is None
    assert update_ops.safe_add(Int64(-(2 ** 63)), -1) is None
    assert update_ops.safe_mul(Int64(2 ** 62), 4) is None
    assert update_ops.safe_add(1, "x") is None


def test_double_to_decimal_keeps_fifteen_digits():
    assert str(update_ops.double_to_decimal(0.1)) == "0.100000000000000"
    assert str(update_ops.double_to_decimal(2.5)) == "2.50000000000000"
    assert str(update_ops.double_to_decimal(123456789.0)) == "123456789.000000"
    assert str(update_ops.double_to_decimal(0.0)) == "0"


def test_bit_types():
    assert typed(update_ops.safe_bit(6, 3, "and")) == ("int", 2)
    assert typed(update_ops.safe_bit(6, Int64(3), "or")) == ("long", 7)
    assert typed(update_ops.safe_bit(Int64(6), 3, "xor")) == ("long", 5)
    assert update_ops.safe_bit(1.0, 1, "and") is None


def doc():
    return {"_id": 1, "l": Int64(5), "i": I32_MAX, "d": Decimal128("1.1"), "f": 1.5, "s": "x"}


@pytest.mark.parametrize("update,field,expected", [
    ({"$inc": {"l": 1}}, "l", ("long", 6)),
    ({"$inc": {"l": Int64(1)}}, "l", ("long", 6)),
    ({"$inc": {"i": 1}}, "i", ("long", 2 ** 31)),
    ({"$inc": {"d": 1}}, "d", ("decimal", Decimal128("2.1"))),
    ({"$mul": {"d": Decimal128("3")}}, "d", ("decimal", Decimal128("3.3"))),
    ({"$mul": {"l": 2}}, "l", ("long", 10)),
    ({"$inc": {"f": 1}}, "f", ("double", 2.5)),
    ({"$inc": {"new": Int64(7)}}, "new", ("long", 7)),
    ({"$mul": {"new": Int64(7)}}, "new", ("long", 0)),      # a missing field: operand's type, 0
    ({"$mul": {"new": 7}}, "new", ("int", 0)),
    ({"$bit": {"i": {"and": Int64(1)}}}, "i", ("long", 1)),
    ({"$bit": {"new": {"or": 4}}}, "new", ("int", 4)),
    ({"$max": {"l": Decimal128("6")}}, "l", ("decimal", Decimal128("6"))),
    ({"$min": {"f": 1}}, "f", ("int", 1)),
])
def test_stored_types_and_diff_agree(update, field, expected):
    pre = doc()
    post = apply_update(pre, update, {})
    assert typed(post[field]) == expected
    diff = update_diff(pre, post, update)["diff"]
    logged = diff.get("u", diff.get("i"))[field]
    assert typed(logged) == expected
    assert pre == doc()  # the stored original is never mutated


@pytest.mark.parametrize("update", [
    {"$max": {"l": 5.0}},               # equal by value: a no-op, the type is kept
    {"$min": {"l": Decimal128("5")}},
    {"$inc": {"d": Decimal128("0.00")}},  # 1.1 + 0.00 == 1.10: identical, no write
    {"$bit": {"l": {"or": 1}}},
])
def test_noops_leave_the_value_alone(update):
    pre = doc()
    post = apply_update(pre, update, {})
    assert bson.encode(post) == bson.encode(pre)


def test_min_max_use_bson_type_order():
    pre = {"_id": 1, "v": "str"}
    assert apply_update(pre, {"$max": {"v": 1}}, {})["v"] == "str"      # numbers < strings
    assert apply_update(pre, {"$min": {"v": 1}}, {})["v"] == 1
    assert apply_update(pre, {"$min": {"v": None}}, {})["v"] is None   # null < numbers


@pytest.mark.parametrize("update,code,message", [
    ({"$inc": {"s": 1}}, 14, "Cannot apply $inc to a value of non-numeric type. {_id: 1} has the "
                             "field 's' of non-numeric type string"),
    ({"$mul": {"s": 1}}, 14, "Cannot apply $mul to a value of non-numeric type. {_id: 1} has the "
                             "field 's' of non-numeric type string"),
    ({"$inc": {"l": Int64(I64_MAX)}}, 2, "Failed to apply $inc operations to current value "
                                          "((NumberLong)5) for document {_id: 1}"),
    ({"$mul": {"l": Int64(I64_MAX)}}, 2, "Failed to apply $mul operations to current value "
                                          "((NumberLong)5) for document {_id: 1}"),
    ({"$inc": {"s.x": 1}}, 28, "Cannot create field 'x' in element {s: \"x\"}"),
    ({"$bit": {"f": {"and": 1}}}, 2, "Cannot apply $bit to a value of non-integral type._id: 1 has "
                                     "the field f of non-integer type double"),
])
def test_apply_errors(update, code, message):
    with pytest.raises(MongoError) as info:
        apply_update(doc(), update, {})
    assert (info.value.code, info.value.errmsg) == (code, message)


@pytest.mark.parametrize("update,code,message", [
    ({"$inc": {"a": "x"}}, 14, 'Cannot increment with non-numeric argument: {a: "x"}'),
    ({"$mul": {"a": None}}, 14, "Cannot multiply with non-numeric argument: {a: null}"),
    ({"$bit": {"a": 5}}, 2, "The $bit modifier is not compatible with a int. You must pass in an "
                            "embedded document: {$bit: {field: {and/or/xor: #}}"),
    ({"$bit": {"a": {"nand": 1}}}, 2, "The $bit modifier only supports 'and', 'or', and 'xor', not "
                                      "'nand' which is an unknown operator: {nand: 1}"),
    ({"$bit": {"a": {"and": 1.0}}}, 2, "The $bit modifier field must be an Integer(32/64 bit); a "
                                       "'double' is not supported here: {and: 1.0}"),
    ({"$bit": {"a": {}}}, 2, "You must pass in at least one bitwise operation. The format is: "
                             "{$bit: {field: {and/or/xor: #}}"),
    ({"$currentDate": {"a": {"$type": "x"}}}, 2, "The '$type' string field is required to be 'date' "
                                                 "or 'timestamp': {$currentDate: {field : {$type: 'date'}}}"),
    ({"$currentDate": {"a": {"x": 1}}}, 2, "Unrecognized $currentDate option: x"),
    ({"$currentDate": {"a": 1}}, 2, "int is not valid type for $currentDate. Please use a boolean "
                                    "('true') or a $type expression ({$type: 'timestamp/date'})."),
])
def test_parse_errors_before_any_document(update, code, message):
    with pytest.raises(MongoError) as info:
        validate_update(update)
    assert (info.value.code, info.value.errmsg) == (code, message)


def test_current_date_date_and_timestamp():
    def run() -> dict:
        update_ops.set_timestamp_source(lambda: Timestamp(42, 7))
        return apply_update({"_id": 1}, {"$currentDate": {"t": {"$type": "timestamp"}, "d": True,
                                                          "e": {"$type": "date"}}}, {})
    post = contextvars.copy_context().run(run)
    assert post["t"] == Timestamp(42, 7)
    assert isinstance(post["d"], datetime.datetime) and post["d"].microsecond % 1000 == 0
    assert isinstance(post["e"], datetime.datetime)
    assert list(post) == ["_id", "d", "e", "t"]  # created in path order


def test_current_date_timestamp_source_is_per_task():
    """Two shards in one process (the in-process test kit) each tick their own clock: the
    source is a context variable set per command, not a module global the last shard wins."""
    async def shard(ts: Timestamp, gate: asyncio.Event) -> Timestamp:
        update_ops.set_timestamp_source(lambda: ts)
        await gate.wait()  # both have set their source before either updates
        return apply_update({"_id": 1}, {"$currentDate": {"t": {"$type": "timestamp"}}}, {})["t"]

    async def main() -> list[Timestamp]:
        gate = asyncio.Event()
        tasks = [asyncio.create_task(shard(Timestamp(1, i), gate)) for i in (1, 2)]
        await asyncio.sleep(0)
        gate.set()
        return list(await asyncio.gather(*tasks))

    assert asyncio.run(main()) == [Timestamp(1, 1), Timestamp(1, 2)]


def test_paths_are_applied_in_mongod_order_not_operator_order():
    post = apply_update({"_id": 1}, {"$set": {"zz": 1, "aa": 2}, "$inc": {"b": Int64(1)}}, {})
    assert list(post) == ["_id", "aa", "b", "zz"]
    post = apply_update({"_id": 1, "a": [0]}, {"$set": {"a.10": 1, "a.9": 2}}, {})
    assert post["a"][9:] == [2, 1]


def test_array_index_past_the_end_pads_with_null():
    post = apply_update({"_id": 1, "a": [1]}, {"$inc": {"a.3": Int64(2)}}, {})
    assert post["a"] == [1, None, None, 2] and isinstance(post["a"][3], Int64)
    with pytest.raises(MongoError) as info:
        apply_update({"_id": 1, "a": [1]}, {"$inc": {"a.x": 1}}, {})
    assert info.value.code == 28 and info.value.errmsg == "Cannot create field 'x' in element {a: [ 1 ]}"
