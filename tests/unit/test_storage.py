"""Oplog, pre-images and the collection store, without processes."""

from __future__ import annotations

import asyncio

import pytest
from bson import Binary, Decimal128, ObjectId
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.core.clock import ts_key
from shardsim.core.errors import MongoError
from shardsim.shard.oplog import Oplog, PreImages
from shardsim.shard.storage import Collection
from shardsim.core.values import id_key


def entry(secs: int, inc: int, **extra) -> dict:
    return {"ts": Timestamp(secs, inc), "op": "n", "ns": "", "o": {"msg": "x"}, **extra}


def test_oplog_order_lookup_and_bounds():
    o = Oplog()
    assert o.first_ts() is None and o.last_ts() is None and o.latest_key == 0
    for i in range(1, 6):
        o.append(entry(100, i))
    assert o.first_ts() == Timestamp(100, 1) and o.last_ts() == Timestamp(100, 5)
    assert o.latest_key == ts_key(Timestamp(100, 5))
    assert [e["ts"].inc for e in o.entries_from(ts_key(Timestamp(100, 3)))] == [3, 4, 5]
    assert [e["ts"].inc for e in o.entries_after(ts_key(Timestamp(100, 3)))] == [4, 5]
    assert o.get(ts_key(Timestamp(100, 2)))["ts"] == Timestamp(100, 2)
    assert [e["ts"].inc for e in o.entries_reversed()] == [5, 4, 3, 2, 1]
    with pytest.raises(ValueError):
        o.append(entry(100, 5))


def test_oplog_iterator_is_live_and_survives_truncation():
    o = Oplog(max_bytes=10_000_000)
    for i in range(1, 4):
        o.append(entry(100, i))
    it = o.entries_from(0)
    assert next(it)["ts"].inc == 1
    o.append(entry(100, 4))
    assert [e["ts"].inc for e in it] == [2, 3, 4]
    # Truncation by size: a reader that fell behind continues from the oldest retained entry.
    small = Oplog(max_bytes=200)
    for i in range(1, 4):
        small.append(entry(100, i))
    lagging = small.entries_from(0)
    for i in range(4, 3000):
        small.append(entry(100, i))
    first = next(lagging)
    assert ts_key(first["ts"]) >= ts_key(small.first_ts())
    assert small.size_bytes <= 200 + 100


def test_oplog_retention_by_size_keeps_newest_and_reports_truncation():
    cut = []
    o = Oplog(max_bytes=300)
    o.truncated_callbacks.append(cut.append)
    for i in range(1, 50):
        o.append(entry(100, i))
    assert o.last_ts() == Timestamp(100, 49)
    assert o.size_bytes <= 300
    assert cut and cut[-1] == ts_key(o.first_ts()) - 1
    assert o.truncated_through == cut[-1]


def test_oplog_retention_by_age_and_min_retention():
    now = [1000.0]
    o = Oplog(max_age_s=60, wall=lambda: now[0])
    o.append(entry(900, 1))
    o.append(entry(950, 1))
    o.append(entry(999, 1))
    assert o.first_ts() == Timestamp(950, 1)
    # min retention protects young entries from the size cap.
    keep = Oplog(max_bytes=1, min_retention_s=3600, wall=lambda: 1000.0)
    for i in range(1, 5):
        keep.append(entry(999, i))
    assert len(keep) == 4


def test_wait_for_newer_and_listeners():
    o = Oplog()
    seen = []
    o.add_listener(seen.append)

    async def main():
        async def later():
            await asyncio.sleep(0.02)
            o.append(entry(100, 1))
        task = asyncio.ensure_future(later())
        assert await o.wait_for_newer(0, 2.0) is True
        await task
        assert await o.wait_for_newer(o.latest_key, 0.02) is False

    asyncio.run(main())
    assert [e["ts"] for e in seen] == [Timestamp(100, 1)]
    o.remove_listener(seen.append)
    o.append(entry(100, 2))
    assert len(seen) == 1


def test_pre_images_put_get_truncate():
    p = PreImages()
    u = b"u" * 16
    p.put(u, Timestamp(10, 1), 0, {"_id": 1, "a": 1})
    p.put(u, Timestamp(10, 2), 3, {"_id": 2})
    assert p.get(u, Timestamp(10, 1)) == {"_id": 1, "a": 1}
    assert p.get(u, Timestamp(10, 2), 3) == {"_id": 2}
    assert p.get(u, Timestamp(10, 2)) is None
    assert p.truncate_before(ts_key(Timestamp(10, 2))) == 1
    assert p.get(u, Timestamp(10, 1)) is None and len(p) == 1
    [doc] = list(p.docs())
    assert doc["_id"]["nsUUID"] == Binary(u, 4) and doc["preImage"] == {"_id": 2}


def test_id_key_equality_like_mongod():
    assert id_key(1) == id_key(1.0) == id_key(Int64(1)) == id_key(Decimal128("1.00"))
    assert repr(id_key(Decimal128("1.5"))) == repr(id_key(1.5))
    assert repr(id_key(Decimal128("1"))) == repr(id_key(1.0))
    assert id_key(True) != id_key(1)
    assert id_key("1") != id_key(1)
    oid = ObjectId()
    assert id_key(oid) == id_key(ObjectId(str(oid)))
    assert id_key({"a": 1, "b": 2}) != id_key({"b": 2, "a": 1})


def test_collection_unique_indexes_and_document_key():
    c = Collection("db", "c", b"x" * 16, shard_key={"sk": 1})
    c.add_index({"v": 2, "key": {"email": 1}, "name": "email_1", "unique": True})
    k1 = c.insert({"_id": 1, "sk": 5, "email": "a"})
    with pytest.raises(MongoError) as e:
        c.insert({"_id": 1, "email": "b"})
    assert e.value.code == 11000 and e.value.extra["keyValue"] == {"_id": 1}
    with pytest.raises(MongoError) as e:
        c.insert({"_id": 2, "email": "a"})
    assert e.value.extra["keyPattern"] == {"email": 1}
    assert 'dup key: { email: "a" }' in e.value.errmsg
    # Replacing a document may keep its own unique value; deleting frees it.
    c.replace(k1, {"_id": 1, "sk": 5, "email": "a", "n": 1})
    c.delete(k1)
    c.insert({"_id": 3, "email": "a"})
    assert c.document_key({"_id": 3, "x": 1, "sk": 9}) == {"sk": 9, "_id": 3}
    assert Collection("d", "e", b"y" * 16).document_key({"_id": 4, "sk": 1}) == {"_id": 4}


def test_unique_multikey_index_unwinds_arrays():
    c = Collection("db", "m", b"m" * 16)
    c.add_index({"v": 2, "key": {"tags": 1}, "name": "tags_1", "unique": True})
    k = c.insert({"_id": 1, "tags": [1, 2, 2]})  # repeats inside one document are fine
    with pytest.raises(MongoError) as e:
        c.insert({"_id": 2, "tags": [3, 2]})
    assert e.value.extra["keyValue"] == {"tags": 2}
    c.insert({"_id": 3, "tags": 4})
    c.replace(k, {"_id": 1, "tags": [5]})
    c.insert({"_id": 4, "tags": [1, 2]})  # freed by the replacement
