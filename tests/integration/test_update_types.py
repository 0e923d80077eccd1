"""Type-exact updates through the router of a real cluster (the shared 3-shard ``cluster``):
``$inc``/``$mul`` on Int64, int32-overflowing and Decimal128 values keep mongod's BSON types in
the stored document, the shard's oplog ``$v: 2`` diff, the change event's
``updateDescription.updatedFields`` and the ``updateLookup`` post-image."""

from __future__ import annotations

from typing import Any

import bson
import pymongo
import pytest
from bson import Decimal128, Int64
from bson.raw_bson import RawBSONDocument
from pymongo.errors import WriteError

pytestmark = pytest.mark.timeout(120)

I32_MAX = 2 ** 31 - 1


def bson_type(value: Any) -> str:
    """The BSON type pymongo decoded (int32 -> int, int64 -> Int64, ...)."""
    return {int: "int", Int64: "long", float: "double", Decimal128: "decimal"}[type(value)]


def raw_types(raw: RawBSONDocument) -> dict[str, int]:
    """field -> BSON element type byte, read from the document's own bytes."""
    data, out, i = raw.raw, {}, 4
    while data[i] != 0:
        t = data[i]
        end = data.index(b"\x00", i + 1)
        name = data[i + 1:end].decode()
        out[name] = t
        # re-encode the single field to learn its length (fine for a test)
        value = bson.decode(bson.encode({name: raw[name]}))[name]
        i = end + 1 + len(bson.encode({"": value})) - 4 - 1 - 1 - 1
    return out


CASES = [
    # (field, initial value, update, expected value, expected BSON type byte)
    ("long_inc", Int64(10), {"$inc": {"long_inc": 1}}, Int64(11), 0x12),
    ("long_inc64", Int64(10), {"$inc": {"long_inc64": Int64(5)}}, Int64(15), 0x12),
    ("int_overflow", I32_MAX, {"$inc": {"int_overflow": 1}}, Int64(2 ** 31), 0x12),
    ("int_stays", 5, {"$inc": {"int_stays": 1}}, 6, 0x10),
    ("dec_inc", Decimal128("1.10"), {"$inc": {"dec_inc": 1}}, Decimal128("2.10"), 0x13),
    ("long_mul", Int64(3), {"$mul": {"long_mul": 2}}, Int64(6), 0x12),
    ("int_mul_overflow", 65536, {"$mul": {"int_mul_overflow": 65536}}, Int64(2 ** 32), 0x12),
    ("dec_mul", Decimal128("1.5"), {"$mul": {"dec_mul": Decimal128("3")}}, Decimal128("4.5"), 0x13),
]


@pytest.mark.parametrize("field,initial,update,expected,type_byte", CASES, ids=[c[0] for c in CASES])
def test_update_types_through_router(cluster, router_client: pymongo.MongoClient, field, initial,
                                     update, expected, type_byte) -> None:
    db_name, coll_name = "update_types_db", f"c_{field}"
    router_client.admin.command("enableSharding", db_name)
    router_client.admin.command("shardCollection", f"{db_name}.{coll_name}", key={"_id": "hashed"})
    coll = router_client[db_name][coll_name]
    coll.insert_one({"_id": 1, field: initial})
    with coll.watch(full_document="updateLookup", max_await_time_ms=200) as stream:
        assert coll.update_one({"_id": 1}, update).modified_count == 1
        event = stream.next()
    # The stored document, read as raw bytes.
    raw = coll.with_options(codec_options=bson.CodecOptions(document_class=RawBSONDocument)) \
        .find_one({"_id": 1})
    assert raw_types(raw)[field] == type_byte
    stored = coll.find_one({"_id": 1})[field]
    assert stored == expected and bson_type(stored) == bson_type(expected)
    # The change event and its post-image.
    assert event["operationType"] == "update"
    changed = event["updateDescription"]["updatedFields"][field]
    assert changed == expected and bson_type(changed) == bson_type(expected)
    post = event["fullDocument"][field]
    assert post == expected and bson_type(post) == bson_type(expected)
    # The shard's oplog entry: a $v: 2 diff carrying the same typed value.
    entries = []
    for proc in cluster.shards:
        with pymongo.MongoClient(f"mongodb://{proc.address}/?directConnection=true") as direct:
            entries += list(direct.local["oplog.rs"].find({"ns": f"{db_name}.{coll_name}", "op": "u"}))
    assert len(entries) == 1
    assert entries[0]["o"]["$v"] == 2
    logged = entries[0]["o"]["diff"]["u"][field]
    assert logged == expected and bson_type(logged) == bson_type(expected)


def test_int64_overflow_and_non_numeric_fail_like_mongod(router_client: pymongo.MongoClient) -> None:
    coll = router_client.update_types_db.errors
    coll.drop()
    coll.insert_one({"_id": 1, "l": Int64(2 ** 63 - 1), "s": "x"})
    with pytest.raises(WriteError) as info:
        coll.update_one({"_id": 1}, {"$inc": {"l": 1}})
    assert info.value.code == 2
    assert "Failed to apply $inc operations to current value ((NumberLong)9223372036854775807) " \
           "for document {_id: 1}" in str(info.value)
    with pytest.raises(WriteError) as info:
        coll.update_one({"_id": 1}, {"$inc": {"s": Decimal128("1")}})
    assert info.value.code == 14
    assert "Cannot apply $inc to a value of non-numeric type. {_id: 1} has the field 's' of " \
           "non-numeric type string" in str(info.value)
    assert coll.find_one({"_id": 1})["l"] == Int64(2 ** 63 - 1)
