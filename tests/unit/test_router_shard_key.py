"""Shard keys without I/O: the hashed-key hash, BSON order, key extraction, chunk look-up."""

from __future__ import annotations

import datetime

import pytest
from bson import Binary, MaxKey, MinKey, ObjectId
from bson.int64 import Int64

from shardsim.core.shard_key import (TARGETING_STEP, Chunk, ChunkMap, KeyPattern, compare, hash64,
                              hashed_split_points)
from shardsim.core.errors import MongoError


def test_hash64_matches_the_server_check_value() -> None:
    # hasher.cpp's start-up self test: hash64(BSON("check" << 42).firstElement(), 0).
    assert hash64(42) == -944302157085130861


def test_hash64_squashes_numeric_types() -> None:
    assert hash64(1) == hash64(1.0) == hash64(Int64(1))
    assert hash64(1.9) == hash64(1)  # doubles truncate to a 64-bit integer
    assert hash64(float("nan")) == hash64(0)
    assert hash64("1") != hash64(1)
    assert hash64({"a": 1}) != hash64({"b": 1})  # field names are hashed inside objects
    assert hash64([1, 2]) != hash64({"0": 1, "1": 2})  # array vs object canonical type
    assert isinstance(hash64(ObjectId()), Int64)


def test_compare_follows_bson_type_order() -> None:
    ordered = [MinKey(), None, -5, 2.5, 3, "a", "b", {"a": 1}, [1], Binary(b"x"),
               ObjectId("0" * 24), False, True, datetime.datetime(2020, 1, 1), MaxKey()]
    for a, b in zip(ordered, ordered[1:]):
        assert compare(a, b) < 0 and compare(b, a) > 0, (a, b)
    assert compare(1, 1.0) == 0
    assert compare({"a": 1, "b": 2}, {"a": 1, "c": 0}) < 0


def test_key_extraction() -> None:
    kp = KeyPattern.parse({"a": 1, "b.c": 1})
    assert kp.key_of_doc({"a": 1, "b": {"c": 2}}) == (1, 2)
    assert kp.key_of_doc({"a": 1}) == (1, None)
    assert kp.key_of_query({"a": 1, "b.c": {"$eq": 2}}) == (1, 2)
    assert kp.key_of_query({"a": 1}) is None
    assert kp.key_of_query({"a": {"$gt": 1}, "b.c": 2}) is None
    hk = KeyPattern.parse({"_id": "hashed"})
    assert hk.key_of_doc({"_id": 42}) == (hash64(42),)
    with pytest.raises(MongoError):
        KeyPattern.parse({"a": -1})
    with pytest.raises(MongoError):
        KeyPattern.parse({"a": "hashed", "b": "hashed"})
    with pytest.raises(MongoError):
        kp.key_of_doc({"a": [1, 2]})


def test_hashed_split_points_are_even_and_symmetric() -> None:
    pts = hashed_split_points(6)
    assert len(pts) == 5 and pts[2] == 0 and pts[1] == -pts[3] and pts[0] == -pts[4]
    assert hashed_split_points(3) == sorted(hashed_split_points(3))
    assert len(hashed_split_points(3)) == 2


def test_chunk_map_finds_the_owning_chunk() -> None:
    kp = KeyPattern.parse({"x": 1})
    cmap = ChunkMap(kp, [Chunk((MinKey(),), (10,), "s0"), Chunk((10,), (20,), "s1"),
                         Chunk((20,), (MaxKey(),), "s2")])
    assert [cmap.find((v,)).shard for v in (-1, 9.5, 10, 19, 20, "str", None)] == \
        ["s0", "s0", "s1", "s1", "s2", "s2", "s0"]
    assert cmap.shards() == ["s0", "s1", "s2"]


def test_shards_for_query_targets_ranges_and_in() -> None:
    kp = KeyPattern.parse({"x": 1})
    cmap = ChunkMap(kp, [Chunk((MinKey(),), (10,), "s0"), Chunk((10,), (20,), "s1"),
                         Chunk((20,), (MaxKey(),), "s2")])
    assert cmap.shards_for_query({"x": 15}) == ["s1"]
    assert cmap.shards_for_query({"x": {"$gt": 12}}) == ["s1", "s2"]
    assert cmap.shards_for_query({"x": {"$gte": 10, "$lt": 20}}) == ["s1"]
    assert cmap.shards_for_query({"x": {"$lte": 10}}) == ["s0", "s1"]
    assert cmap.shards_for_query({"x": {"$in": [1, 25]}}) == ["s0", "s2"]
    assert cmap.shards_for_query({"x": {"$ne": 1}}) == ["s0", "s1", "s2"]
    assert cmap.shards_for_query({"y": 1}) == ["s0", "s1", "s2"]
    hk = KeyPattern.parse({"x": "hashed"})
    hmap = ChunkMap(hk, [Chunk((MinKey(),), (Int64(0),), "a"), Chunk((Int64(0),), (MaxKey(),), "b")])
    assert hmap.shards_for_query({"x": 42}) == [hmap.find((hash64(42),)).shard]
    assert hmap.shards_for_query({"x": {"$gt": 1}}) == ["a", "b"]


def test_chunk_map_covers_key_space_only_without_gaps() -> None:
    """A routing table read half-way through a chunk rewrite (no chunks yet, or some missing)
    is told apart from a complete one, so the router reads the catalog again."""
    p = KeyPattern({"a": 1})
    lo, hi = (MinKey(),), (MaxKey(),)
    assert ChunkMap(p, [Chunk(lo, (0,), "s0"), Chunk((0,), hi, "s1")]).covers_key_space()
    assert ChunkMap(p, [Chunk(lo, hi, "s0")]).covers_key_space()
    assert not ChunkMap(p, []).covers_key_space()
    assert not ChunkMap(p, [Chunk((0,), hi, "s1")]).covers_key_space()
    assert not ChunkMap(p, [Chunk(lo, (0,), "s0")]).covers_key_space()
    assert not ChunkMap(p, [Chunk(lo, (0,), "s0"), Chunk((5,), hi, "s1")]).covers_key_space()


def test_a_large_in_is_targeted_in_steps_with_the_same_answer() -> None:
    """Issue 28 (D3): a $in of many values is looked up by bisection in steps (the router
    awaits between them) and gives the shards the value-by-value answer would, in chunk
    order; a value that cannot be targeted (an object) still means every owner."""
    kp = KeyPattern.parse({"x": 1})
    cmap = ChunkMap(kp, [Chunk((MinKey(),), (10,), "s0"), Chunk((10,), (20,), "s1"),
                         Chunk((20,), (MaxKey(),), "s2"), Chunk((MaxKey(),), (MaxKey(),), "s1")])
    many = list(range(-5000, 0))
    steps = cmap.shards_for_query_steps({"x": {"$in": many}})
    yields = 0
    while True:
        try:
            next(steps)
            yields += 1
        except StopIteration as done:
            assert done.value == ["s0"]
            break
    assert yields >= len(many) // TARGETING_STEP - 1
    assert cmap.shards_for_query({"x": {"$in": many + [25, 15]}}) == ["s0", "s1", "s2"]
    assert cmap.shards_for_query({"x": {"$in": [25] * 1000 + [12]}}) == ["s1", "s2"]
    assert cmap.shards_for_query({"x": {"$in": many + [{"a": 1}]}}) == ["s0", "s1", "s2"]
    hk = KeyPattern.parse({"x": "hashed"})
    hmap = ChunkMap(hk, [Chunk((MinKey(),), (Int64(0),), "a"), Chunk((Int64(0),), (MaxKey(),), "b")])
    values = list(range(2000))
    assert hmap.shards_for_query({"x": {"$in": values}}) == \
        sorted({hmap.find((hash64(v),)).shard for v in values})
