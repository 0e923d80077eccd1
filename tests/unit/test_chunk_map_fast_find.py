"""ChunkMap.find's fast look-up (plain tuples for int, float, string, ObjectId, MinKey and
MaxKey bounds) finds exactly the chunk the general BSON comparison (compare_keys) finds, for
bounds and keys of every type, mixed in one key space."""

from __future__ import annotations

import bisect
import math

from bson import Decimal128, MaxKey, MinKey, ObjectId
from bson.int64 import Int64
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.core.shard_key import (Chunk, ChunkMap, KeyPattern, SortKey, compare, compare_keys,
                                      fast_key_rank)

FAST = st.one_of(st.integers(-2**63, 2**63 - 1),
                 st.integers(-2**63, 2**63 - 1).map(Int64),
                 st.floats(allow_nan=False), st.text(max_size=6),
                 st.binary(min_size=12, max_size=12).map(ObjectId))
OTHER = st.one_of(st.just(math.nan), st.booleans(), st.none(),
                  st.sampled_from([Decimal128("1.5"), Decimal128("NaN"), Decimal128("-3")]))


def _general(cm: ChunkMap, key: tuple) -> Chunk:
    i = bisect.bisect_right(cm._mins, SortKey(key)) - 1
    return cm.chunks[i]


def _map(fields: int, bounds: list[tuple]) -> ChunkMap:
    pattern = KeyPattern({f"k{i}": 1 for i in range(fields)})
    lows = [tuple(MinKey() for _ in range(fields))]
    for b in sorted(bounds, key=SortKey):  # distinct bounds (equal ones by BSON order dropped)
        if compare_keys(b, lows[-1]) > 0:
            lows.append(b)
    highs = lows[1:] + [tuple(MaxKey() for _ in range(fields))]
    return ChunkMap(pattern, [Chunk(lo, hi, f"s{i}") for i, (lo, hi) in enumerate(zip(lows, highs))])


@settings(max_examples=300, deadline=None)
@given(data=st.data(), fields=st.integers(1, 2), other_bounds=st.booleans())
def test_fast_find_agrees_with_compare_keys(data, fields, other_bounds):
    values = st.one_of(FAST, OTHER) if other_bounds else FAST
    bounds = data.draw(st.lists(st.tuples(*[values] * fields), max_size=12))
    cm = _map(fields, bounds)
    assert (cm._fast_mins is not None) == all(fast_key_rank(c.min) is not None for c in cm.chunks)
    keys = data.draw(st.lists(st.tuples(*[st.one_of(FAST, OTHER)] * fields), min_size=1,
                              max_size=20))
    keys += bounds  # the bounds themselves: equal keys belong to the chunk they start
    for key in keys:
        assert cm.find(key) is _general(cm, key), (key, [c.min for c in cm.chunks])


@settings(max_examples=300, deadline=None)
@given(a=FAST, b=FAST)
def test_fast_rank_orders_as_compare(a, b):
    ra, rb = fast_key_rank((a,)), fast_key_rank((b,))
    assert ((ra > rb) - (ra < rb)) == compare(a, b)
