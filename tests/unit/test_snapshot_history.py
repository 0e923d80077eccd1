"""The snapshot history (shard/snapshot.py) is bounded by its window and by a byte budget: the
oldest changes go first, and a read older than what is left gets SnapshotTooOld (239)."""

import pytest
from bson.timestamp import Timestamp

from shardsim.shard.snapshot import History, documents_at
from shardsim.shard.storage import Collection, Storage, new_uuid
from shardsim.core.errors import MongoError


def _coll(max_bytes: int):
    storage = Storage()
    storage.history = History(max_bytes=max_bytes)
    coll = storage.add(Collection("db", "c", new_uuid()))
    return storage, coll


def _replace(storage, coll, v: int, ts: Timestamp, size: int) -> None:
    key = next(iter(coll.docs))
    coll.replace(key, {"_id": 1, "v": v})
    storage.history.stamp(ts, size)


def test_reads_see_old_versions_within_the_budget():
    storage, coll = _coll(max_bytes=10_000)
    coll.insert({"_id": 1, "v": 0})
    storage.history.stamp(Timestamp(100, 1), 100)
    for v in range(1, 5):
        _replace(storage, coll, v, Timestamp(100, 1 + v), 100)
    assert [d["v"] for d in documents_at(coll, Timestamp(100, 3)).values()] == [2]
    assert [d["v"] for d in documents_at(coll, Timestamp(100, 5)).values()] == [4]


def test_budget_drops_the_oldest_and_older_reads_get_239():
    storage, coll = _coll(max_bytes=1_000)
    coll.insert({"_id": 1, "v": 0})
    storage.history.stamp(Timestamp(100, 1), 400)
    for v in range(1, 6):
        _replace(storage, coll, v, Timestamp(100, 1 + v), 400)
    h = storage.history
    assert h.bytes <= h.max_bytes and len(coll.history) == 2 == len(h.order)
    assert [d["v"] for d in documents_at(coll, Timestamp(100, 5)).values()] == [4]
    with pytest.raises(MongoError) as err:
        documents_at(coll, Timestamp(100, 2))
    assert err.value.code == 239


def test_window_drops_history_older_than_it():
    storage, coll = _coll(max_bytes=1 << 30)
    storage.history.window_s = 300
    coll.insert({"_id": 1, "v": 0})
    storage.history.stamp(Timestamp(100, 1), 10)
    _replace(storage, coll, 1, Timestamp(1000, 1), 10)
    assert len(coll.history) == 1 and coll.history_floor == Timestamp(100, 1)
