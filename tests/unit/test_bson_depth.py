"""The wire's nesting-depth check (shardsim/core/bson_limits.py ``raw_depth_exceeds``): a
subdocument with too few object/array type bytes to reach the limit is skipped whole; the answer
is the same as walking every element (hypothesis, on nestings around the limit and wide
documents), and mongod's limit holds at its edge."""

from __future__ import annotations

import bson
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.core.bson_limits import MAX_ALLOWABLE_DEPTH, raw_depth_exceeds


def _depth(value) -> int:
    """Levels of objects/arrays (a document is 1), as the check counts open documents."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _nest(levels: int, leaf) -> dict:
    """Documents and arrays nested in turn around ``leaf`` (its depth: :func:`_depth`)."""
    doc = {"v": leaf}
    for i in range(levels - 1):
        doc = {"a": [doc]} if i % 3 == 0 else {"d": doc}
    return doc


LEAVES = st.one_of(st.integers(-2**31, 2**31 - 1), st.text(max_size=4), st.binary(max_size=4),
                   st.just(3), st.just(4), st.just(15), st.just(b"\x03\x04\x0f"))


@settings(max_examples=150, deadline=None)
@given(levels=st.integers(1, 230), width=st.integers(0, 300), leaf=LEAVES,
       limit=st.sampled_from([MAX_ALLOWABLE_DEPTH, 5, 40]))
def test_depth_check_matches_the_document_depth(levels, width, leaf, limit):
    deep = _nest(levels, leaf)
    wide = {"insert": "c", "documents": [{"_id": i, "x": {"y": [i, leaf]}} for i in range(width)],
            "deep": deep}
    for doc in (deep, wide):
        # begins an object while `limit` are open <=> more than limit + 1 levels
        assert raw_depth_exceeds(bson.encode(doc), limit) == (_depth(doc) > limit + 1)


def _objects(levels: int) -> dict:
    """``levels`` nested documents ({d: {d: ... {v: 1}}})."""
    doc: dict = {"v": 1}
    for _ in range(levels - 1):
        doc = {"d": doc}
    return doc


def test_mongods_limit_at_its_edge():
    assert not raw_depth_exceeds(bson.encode(_objects(201)))  # mongod: 200 levels + the body
    assert raw_depth_exceeds(bson.encode(_objects(202)))
    wide = {"documents": [{"x": {"y": {"z": i}}} for i in range(2000)], "d": _objects(200)}
    assert not raw_depth_exceeds(bson.encode(wide))
    wide["d"] = _objects(201)
    assert raw_depth_exceeds(bson.encode(wide))
