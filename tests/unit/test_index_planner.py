"""Indexes and the planner (issue 29): the same documents and query with and without an index
(and with the index hinted) give the same documents in the same order; indexes stay in step
with every write; plans use the index only where they may.

The reference is the collection scan (every document through the matcher, then the stable
in-memory sort), which is what the shard did before indexes existed."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardsim.core import query as q
from shardsim.shard import planner
from shardsim.shard.commands import reads
from shardsim.shard.storage import Collection

SCALARS = st.one_of(
    st.integers(-5, 5), st.sampled_from([0.5, -0.0, 2.0, 1e300, -math.inf, math.inf, math.nan]),
    st.sampled_from(["", "a", "b", "ab", "é", "B"]), st.booleans(), st.none())
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3),
                   st.fixed_dictionaries({}, optional={"b": SCALARS, "c": SCALARS}),
                   st.lists(st.fixed_dictionaries({}, optional={"b": SCALARS}), max_size=2))
DOCS = st.lists(st.fixed_dictionaries({}, optional={"a": VALUES, "b": VALUES}), max_size=25)
OPERAND = st.one_of(st.integers(-5, 5), st.sampled_from([0.5, 2.0, -0.0, "a", "b", "", True,
                                                         None, math.inf]))
FIELD_FILTER = st.one_of(
    OPERAND,
    st.builds(lambda v: {"$eq": v}, OPERAND),
    st.builds(lambda vs: {"$in": vs}, st.lists(OPERAND, min_size=1, max_size=3)),
    st.dictionaries(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), OPERAND, min_size=1,
                    max_size=2),
    st.builds(lambda b: {"$exists": b}, st.booleans()),
    st.builds(lambda v: {"$ne": v}, OPERAND))
FILTERS = st.dictionaries(st.sampled_from(["a", "b", "a.b"]), FIELD_FILTER, max_size=2)
INDEXES = st.sampled_from([{"a": 1}, {"a": -1}, {"a": 1, "b": -1}, {"b": 1, "a": 1},
                           {"a.b": 1}, {"a": -1, "b": 1}])
SORTS = st.sampled_from([None, {"a": 1}, {"a": -1}, {"a": 1, "b": -1}, {"a": -1, "b": 1},
                         {"b": 1}, {"a.b": 1}])


def _coll(docs: list[dict[str, Any]], key: dict[str, Any] | None, sparse: bool = False,
          index_first: bool = True) -> Collection:
    c = Collection("db", "c", b"\x00" * 16)
    spec = {"v": 2, "key": key, "name": "ix", **({"sparse": True} if sparse else {})}
    if key and index_first:
        c.add_index(spec)
    for i, d in enumerate(docs):
        c.insert({"_id": i, **d})
    if key and not index_first:
        c.add_index(spec)  # built over existing data (createIndexes)
    return c


def _find(c: Collection, filt: dict[str, Any], sort: Any, skip: int, limit: int,
          hint: Any = None) -> list[Any]:
    docs = asyncio.run(reads._read_docs(c, filt, sort, skip, limit, None, hint))
    return [d["_id"] for d in docs]


def _scan(c: Collection, filt: dict[str, Any], sort: Any, skip: int, limit: int) -> list[Any]:
    docs = q.sort_docs([d for d in c.docs.values() if q.matches(filt, d)], sort)[skip:]
    return [d["_id"] for d in (docs[:limit] if limit else docs)]


def _error(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the same error either way
        return ("error", type(exc).__name__, str(exc))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(DOCS, FILTERS, INDEXES, SORTS, st.integers(0, 2), st.integers(0, 4), st.booleans())
def test_index_gives_the_scan_result(docs: list[dict[str, Any]], filt: dict[str, Any],
                                     key: dict[str, Any], sort: Any, skip: int, limit: int,
                                     index_first: bool) -> None:
    plain = _coll(docs, None)
    indexed = _coll(docs, key, index_first=index_first)
    expected = _error(lambda: _scan(plain, filt, sort, skip, limit))
    assert _error(lambda: _find(plain, filt, sort, skip, limit)) == expected
    assert _error(lambda: _find(indexed, filt, sort, skip, limit)) == expected
    hinted = expected
    if sort is None:  # a hinted scan returns the index's order (mongod's IXSCAN): one
        # interval, or the whole index when the filter gives the index no bounds
        plan = _error(lambda: planner.choose(indexed, filt, None, indexed.indexes["ix"]))
        if not isinstance(plan, tuple) and (plan is None or plan.sorted_by_index):
            hinted = _error(lambda: _scan(plain, filt, key, skip, limit))
    assert _error(lambda: _find(indexed, filt, sort, skip, limit, "ix")) == hinted
    assert _error(lambda: [k[1] for k, _ in q.select(indexed, filt)]) == \
        _error(lambda: [k[1] for k, _ in q.select(plain, filt)])


def test_a_hint_without_a_sort_reads_in_index_order() -> None:
    """pymongo's ``test_hint``: ``find().hint([("num", -1)])`` returns the highest ``num``
    first, as mongod's IXSCAN; without the hint the collection scan's order."""
    c = _coll([{"a": 2}, {"a": 1}, {"a": 3}], {"a": -1})
    assert _find(c, {}, None, 0, 0, "ix") == [2, 0, 1]
    assert _find(c, {}, None, 0, 0) == [0, 1, 2]
    assert _find(c, {}, None, 1, 1, "ix") == [0]


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(DOCS, FILTERS)
def test_hinted_sparse_index_skips_documents_without_the_field(
        docs: list[dict[str, Any]], filt: dict[str, Any]) -> None:
    c = _coll(docs, {"a": 1}, sparse=True)
    expected = _error(lambda: [i for i in _scan(c, filt, None, 0, 0) if "a" in c.docs[("n", i)]])
    found = _error(lambda: _find(c, filt, None, 0, 0, "ix"))
    plan = _error(lambda: planner.choose(c, filt, None, c.indexes["ix"]))
    if not isinstance(plan, tuple) and plan is not None and plan.sorted_by_index and \
            not isinstance(found, tuple) and not isinstance(expected, tuple):
        found, expected = sorted(found), sorted(expected)  # index order (tested above)
    assert found == expected


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(DOCS, st.lists(st.tuples(st.sampled_from(["ins", "upd", "del"]), st.integers(0, 30),
                                VALUES), max_size=30), INDEXES)
def test_index_keys_follow_every_write(docs: list[dict[str, Any]], ops: list[Any],
                                       key: dict[str, Any]) -> None:
    c = _coll(docs, key)
    n = len(docs)
    for op, i, v in ops:
        k = ("n", i)
        if op == "ins" and k not in c.docs:
            c.insert({"_id": i, "a": v, "b": i})
        elif op == "upd" and k in c.docs:
            c.replace(k, {"_id": i, "a": v})
        elif op == "del" and k in c.docs:
            c.delete(k)
        n += 1
    rebuilt = _coll([], None)
    for d in c.docs.values():
        rebuilt.insert(d)
    rebuilt.add_index({"v": 2, "key": key, "name": "ix"})
    got = [(kb, key_) for kb, _rid, key_ in c.indexes["ix"].sorted.entries]
    want = [(kb, key_) for kb, _rid, key_ in rebuilt.indexes["ix"].sorted.entries]
    assert sorted(got) == sorted(want)


def _docs(n: int) -> Collection:
    c = _coll([], {"a": 1})
    for i in range(n):
        c.insert({"_id": i, "a": i % 10, "b": i})
    return c


def test_equality_reads_only_its_keys() -> None:
    c = _docs(1000)
    plan = planner.choose(c, {"a": 3})
    assert plan is not None and plan.index.name == "ix"
    got = list(planner.execute(plan, c, {"a": 3}, q.matches))
    assert len(got) == 100 and plan.keys_examined == 100 and plan.docs_examined == 100


def test_sort_from_the_index_stops_at_the_limit() -> None:
    c = _docs(1000)
    plan = planner.choose(c, {"a": {"$gte": 5}}, {"a": -1})
    assert plan is not None and plan.sorted_by_index and plan.reverse
    got = list(planner.execute(plan, c, {"a": {"$gte": 5}}, q.matches, 3))
    assert [d["_id"] for _, d in got] == [9, 19, 29] and plan.keys_examined == 3


def test_no_index_where_the_result_could_differ() -> None:
    c = _docs(10)
    for filt in ({"a": None}, {"a": {"$exists": True}}, {"a": {"$ne": 3}}, {"$or": [{"a": 1}]},
                 {"a": {"$regex": "x"}}, {"a": [1]}, {"a": {"b": 1}}, {"a": math.nan},
                 {"a": {"$not": {"$gt": 1}}}, {"a": {"$elemMatch": {"$gt": 1}}}):
        assert planner.choose(c, filt) is None, filt
    c.add_index({"v": 2, "key": {"b": 1}, "name": "b_p", "partialFilterExpression": {"b": 1}})
    c.add_index({"v": 2, "key": {"b": -1}, "name": "b_s", "sparse": True})
    c.add_index({"v": 2, "key": {"c": 1}, "name": "c_coll", "collation": {"locale": "fr"}})
    assert planner.choose(c, {"b": 2}).index.name == "b_s"  # {b: 2} does not imply {b: 1}
    assert planner.choose(c, {}, {"b": -1}) is None  # a sparse index misses documents
    assert planner.choose(c, {"c": "x"}) is None
    assert planner.choose(c, {"b": 2}, hint_index=c.indexes["b_p"]) is None
    # a partial index serves a filter that implies its partialFilterExpression
    assert planner.choose(c, {"b": 1}, hint_index=c.indexes["b_p"]).index.name == "b_p"


def test_a_partial_index_serves_the_filters_that_imply_it() -> None:
    """pymongo's ``test_index_filter``: ``{x: 1}`` with ``partialFilterExpression: {a: {$lte:
    1.5}}`` is used for ``{x: 6, a: 1}``, ``{x: {$gt: 1}, a: 1}``, ``{x: 6, a: {$lte: 1}}``,
    not for ``{x: 6, a: {$lte: 1.6}}`` or ``{x: 6}`` (mongod's ``isSubsetOf``); the result is
    the collection scan's."""
    docs = [{"x": i % 7, "a": (i % 5) / 2} for i in range(40)]
    plain = _coll(docs, None)
    c = _coll(docs, None)
    c.add_index({"v": 2, "key": {"x": 1}, "name": "ix", "partialFilterExpression":
                 {"a": {"$lte": 1.5}}})
    for filt, used in (({"x": 6, "a": 1}, True), ({"x": {"$gt": 1}, "a": 1}, True),
                       ({"x": 6, "a": {"$lte": 1}}, True), ({"x": 6, "a": {"$lt": 1.5}}, True),
                       ({"x": 6, "a": {"$lte": 1.6}}, False), ({"x": 6}, False),
                       ({"x": 6, "a": "1"}, False)):
        plan = planner.choose(c, filt)
        assert (plan is not None and plan.index.name == "ix") == used, filt
        assert _find(c, filt, None, 0, 0) == _scan(plain, filt, None, 0, 0), filt
    assert not planner.implies({"a": 1}, {"a": {"$exists": False}})
    assert planner.implies({"a": 1}, {"a": {"$exists": True}})
    assert planner.implies({"a": {"$gt": 3}}, {"$and": [{"a": {"$gte": 3}}]})


def test_multikey_bounds_are_not_intersected() -> None:
    c = _coll([{"a": [1, 10]}, {"a": 4}], {"a": 1})
    assert _find(c, {"a": {"$gt": 5, "$lt": 3}}, None, 0, 0) == [0]
    assert _find(c, {"a": {"$gt": 0}}, {"a": 1}, 0, 0) == [0, 1]


def test_sort_on_the_fields_after_an_equality_prefix() -> None:
    docs = [{"a": i % 3, "b": (i * 7) % 5} for i in range(30)]
    c = _coll(docs, {"a": 1, "b": -1})
    for filt, sort in (({"a": 2}, {"b": -1}), ({"a": 2}, {"b": 1}),
                       ({"a": 2, "b": {"$lt": 4}}, {"b": 1})):
        plan = planner.choose(c, filt, sort)
        assert plan is not None and plan.sorted_by_index, (filt, sort)
        for skip, limit in ((0, 0), (1, 3)):
            assert _find(c, filt, sort, skip, limit) == _scan(c, filt, sort, skip, limit)
    assert not planner.choose(c, {"a": {"$in": [1, 2]}}, {"b": 1}).sorted_by_index
    assert not planner.choose(c, {"a": 1}, {"b": 1}).sorted_by_index  # 1 and true: two points


def test_nan_sorts_before_every_number_in_a_sort_and_in_the_index() -> None:
    """mongod orders NaN below every other number, -inf included (the hypothesis example
    ``[{a: 0}, {a: NaN}]`` once found a sort that called NaN equal to all numbers)."""
    c = _coll([{"a": 0}, {"a": float("nan")}, {"a": -float("inf")}, {"a": -1}], {"a": 1})
    assert _find(c, {}, {"a": 1}, 0, 0) == [1, 2, 3, 0]
    assert _find(c, {}, {"a": -1}, 0, 0) == [0, 3, 2, 1]
    assert _find(c, {}, None, 0, 0, "ix") == [1, 2, 3, 0]
