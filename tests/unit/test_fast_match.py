"""Compiled simple filters (:mod:`shardsim.core.fast_match`) and the native ``$group``
(:mod:`shardsim.core.fast_group`) give mongomock's answers (property tests, hypothesis)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardsim.core import fast_group, fast_match
from shardsim.core import query as q

SCALARS = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, -0.0, 1.0, math.nan, math.inf]),
                    st.sampled_from(["", "a", "b", "ab"]), st.booleans(), st.none())
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3),
                   st.fixed_dictionaries({}, optional={"b": SCALARS}))
DOCS = st.fixed_dictionaries({}, optional={"a": VALUES, "b": VALUES, "c": SCALARS})
OPERAND = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 1.0, -0.0, "a", "", "b",
                                                         math.inf]))
SPEC = st.one_of(
    OPERAND, st.builds(lambda v: {"$eq": v}, OPERAND),
    st.builds(lambda vs: {"$in": vs}, st.lists(OPERAND, max_size=3)),
    st.dictionaries(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), OPERAND, min_size=1,
                    max_size=2),
    st.builds(lambda b: {"$exists": b}, st.booleans()))
FILTERS = st.one_of(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), SPEC, min_size=1, max_size=3),
    st.builds(lambda fs: {"$and": fs},
              st.lists(st.dictionaries(st.sampled_from(["a", "b"]), SPEC, min_size=1,
                                       max_size=2), min_size=1, max_size=2)))


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(FILTERS, st.lists(DOCS, max_size=6))
def test_compiled_filters_answer_as_mongomock(filt: dict[str, Any],
                                              docs: list[dict[str, Any]]) -> None:
    assert fast_match.compile_filter(filt) is not None
    match = fast_match.matcher(filt, q.matches)
    for doc in docs:
        assert match(filt, doc) == q.matches(filt, doc), (filt, doc)


def test_other_forms_are_not_compiled() -> None:
    for filt in ({"a.b": 1}, {"a": None}, {"a": {"$ne": 1}}, {"$or": [{"a": 1}]},
                 {"a": {"$regex": "x"}}, {"a": [1]}, {"a": {"b": 1}}, {"a": math.nan},
                 {"a": {"$in": [None]}}, {"a": True}, {"$expr": {"$eq": [1, 1]}}):
        assert fast_match.compile_filter(filt) is None, filt


GROUP_VALUES = st.one_of(st.integers(-3, 3), st.sampled_from(["", "a", "b"]), st.none())


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.fixed_dictionaries({}, optional={"g": GROUP_VALUES, "v": GROUP_VALUES}),
                min_size=1, max_size=12),
       st.sampled_from([{"_id": "$g", "n": {"$sum": 1}}, {"_id": 1, "n": {"$sum": 1}},
                        {"_id": "$g", "s": {"$sum": "$v"}, "n": {"$sum": 2}},
                        {"_id": None, "s": {"$sum": "$v"}}]))
def test_native_group_gives_mongomocks_groups(docs: list[dict[str, Any]],
                                              spec: dict[str, Any]) -> None:
    pipeline = [{"$group": spec}, {"$limit": 100}]
    got = fast_group.group(docs, pipeline)
    expected = q.run_pipeline([q.deep_copy(d) for d in docs], pipeline[:1], None)
    if got is None:  # a string summed: mongomock's stage runs
        assert any(isinstance(d.get("v"), str) for d in docs)
        return
    assert got[1] == pipeline[1:]
    assert got[0] == expected
    assert all(list(d)[0] == "_id" for d in got[0])  # mongod's field order


def test_count_shape_needs_only_the_size() -> None:
    pipeline = [{"$group": {"_id": 1, "n": {"$sum": 1}}}]
    assert fast_group.is_count(pipeline)
    assert fast_group.group(range(5), pipeline) == ([{"_id": 1, "n": 5}], [])
    assert fast_group.group(range(0), pipeline) == ([], [])
    assert not fast_group.is_count([{"$group": {"_id": "$a", "n": {"$sum": 1}}}])
