"""The query planner: index bounds from a filter, the choice of an index, its execution.

Follows mongod's outline: ``index_bounds_builder.cpp`` (``IndexBoundsBuilder::translate``:
equality, ``$in`` and ranges become intervals of index keys, a range is limited to its type
bracket, a multikey index does not intersect two bounds of one field), ``planner_access.cpp``
(``makeIndexScan``: an equality prefix of a compound key followed by one range; a FETCH with
the whole filter over the index scan) and ``query_planner.cpp`` (``QueryPlanner::plan``: the
indexes whose leading field the filter constrains, an index that provides the sort, a ``hint``
forcing one index, a collection scan otherwise).

Correctness rule: the intervals only ever give a *superset* of the matching documents (every
document FETCHed is matched against the whole filter again), and an index is used only when
that superset is provable: the operands are plain scalars (numbers other than NaN, strings,
booleans, ObjectIds, dates), never null/missing, arrays, subdocuments, regexes; ``$or``,
``$not``, ``$elemMatch``, ``$exists``... constrain no bounds (they are still matched). Indexes
with a collation, hidden ones and the non-ascending/descending kinds are never chosen (a
hinted one falls back to a collection scan); a partial index only when the filter implies its
``partialFilterExpression`` (:func:`implies`: it then holds every matching document), and no index is used while a
collation is active. Without a sort the documents come back in ``$natural`` order (the record
ids of the candidates), exactly as a collection scan returns them, except for a hinted index
read over one interval, which returns the index's order as mongod's IXSCAN (pymongo's
``test_hint``: a hint of ``{num: -1}`` reads the highest ``num`` first); with a sort an index whose
key pattern is the sort, or its fields after an equality prefix (all directions equal or all reversed, not multikey) gives the
order, ties in ``$natural`` order as the stable in-memory sort leaves them, and a limit stops
the scan early (no blocking SORT).

A hinted sparse index returns only the documents it holds (``{a: {$exists: false}}`` hinted to
a sparse index on ``a`` finds nothing), as on mongod.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Iterator

from bson import ObjectId

from shardsim.core import collation
from shardsim.core import query as q
from shardsim.shard.index_keys import IndexedDocs, encode_value, successor

_INVERT = bytes(range(255, -1, -1))
_MAX_POINTS = 4096  # equality/$in combinations expanded into intervals at most


def _plain(v: Any) -> bool:
    t = type(v)
    if t is float:
        return not math.isnan(v)
    return t is int or t is str or t is bool or t is ObjectId or t is datetime or \
        (isinstance(v, int) and not isinstance(v, bool))


def _bracket(enc: bytes) -> tuple[bytes, bytes]:
    """``[first key byte, end byte)`` of the BSON type bracket of an encoded value."""
    c = enc[0]
    if 30 <= c <= 51:  # numbers (NaN .. large positive)
        return b"\x1e", b"\x3c"
    if c in (110, 111):  # false, true
        return b"\x6e", b"\x70"
    return bytes([c]), bytes([c + 1])


def _points(values: list[Any]) -> list[bytes]:
    """The sorted distinct keys of equality operands, each with its twin the matcher also
    finds equal (mongomock compares ``0 == False`` and ``1 == True`` as Python does)."""
    out = set()
    for v in values:
        out.add(encode_value(v))
        if type(v) is not str and v in (0, 1):
            out.add(encode_value(bool(v) if type(v) is not bool else int(v)))
    return sorted(out)


class FieldBounds:
    """What a filter says about one field: ``points`` (sorted encoded values) or a range
    ``lo``/``hi`` (encoded bounds, each inclusive or not)."""

    __slots__ = ("points", "lo", "lo_incl", "hi", "hi_incl")

    def __init__(self) -> None:
        self.points: list[bytes] | None = None
        self.lo = self.hi = b""
        self.lo_incl = self.hi_incl = True


def field_bounds(value: Any, multikey: bool) -> FieldBounds | None:
    """The bounds a filter's value for one field gives (``index_bounds_builder.cpp``), None
    when it gives none the planner can prove."""
    fb = FieldBounds()
    if not isinstance(value, dict):
        if not _plain(value):
            return None
        fb.points = _points([value])
        return fb
    if not value or any(not (isinstance(k, str) and k.startswith("$")) for k in value):
        return None
    if "$eq" in value and _plain(value["$eq"]):
        fb.points = _points([value["$eq"]])
        return fb
    vals = value.get("$in")
    if isinstance(vals, list) and vals and len(vals) <= _MAX_POINTS and all(map(_plain, vals)):
        fb.points = _points(vals)
        return fb
    ranges = []
    for op in ("$gt", "$gte", "$lt", "$lte"):
        if op in value and _plain(value[op]):
            enc = encode_value(value[op])
            blo, bhi = _bracket(enc)
            if op in ("$gt", "$gte"):
                ranges.append((enc, op == "$gte", bhi, False))
            else:
                ranges.append((blo, True, enc, op == "$lte"))
    if not ranges:
        return None
    if multikey:  # two bounds of one field may be met by different elements
        ranges = ranges[:1]
    fb.lo, fb.lo_incl, fb.hi, fb.hi_incl = ranges[0]
    for lo, lo_incl, hi, hi_incl in ranges[1:]:
        if lo > fb.lo or (lo == fb.lo and not lo_incl):
            fb.lo, fb.lo_incl = lo, lo_incl
        if hi < fb.hi or (hi == fb.hi and not hi_incl):
            fb.hi, fb.hi_incl = hi, hi_incl
    return fb


def intervals_for(idx: Any, filt: dict[str, Any]) -> tuple[list[tuple[bytes, Any]], int, int]:
    """``([(start, stop)], fields used, equality fields)``: the key intervals of ``idx`` (an
    Index with sorted keys) the filter's top-level fields give, in index order (``stop`` None
    is unbounded), how many leading key fields they bound and how many of those by points. An
    equality prefix then at most one range (``planner_access.cpp``)."""
    sk = idx.sorted
    prefixes = [b""]
    used = eq = 0
    tail: list[tuple[bytes, Any]] | None = None
    for parts, desc in sk.fields:
        path = ".".join(parts)
        fb = field_bounds(filt[path], sk.multikey) if path in filt else None
        if fb is None:
            break
        if fb.points is not None:
            pts = [p.translate(_INVERT) for p in fb.points] if desc else fb.points
            if len(prefixes) * len(pts) > _MAX_POINTS:
                break
            prefixes = [p + e for p in prefixes for e in pts]
            used += 1
            eq += 1
            continue
        lo, lo_incl, hi, hi_incl = fb.lo, fb.lo_incl, fb.hi, fb.hi_incl
        if desc:
            lo, lo_incl, hi, hi_incl = (hi.translate(_INVERT), hi_incl,
                                        lo.translate(_INVERT), lo_incl)
        tail = []
        for p in prefixes:
            start = p + lo if lo_incl else successor(p + lo)
            stop = successor(p + hi) if hi_incl else p + hi
            if start is not None and (stop is None or start < stop):
                tail.append((start, stop))
        used += 1
        break
    if tail is None:
        tail = [(p, successor(p)) for p in prefixes]
    tail.sort(key=lambda iv: iv[0])
    return tail, used, eq


def _count(sk: Any, intervals: list[tuple[bytes, Any]]) -> int:
    entries = sk.entries
    n = 0
    for start, stop in intervals:
        lo = entries.bisect_left((start,))
        hi = len(entries) if stop is None else entries.bisect_left((stop,))
        n += max(0, hi - lo)
    return n


class Plan:
    """A chosen index plan: ``index`` (storage Index), ``intervals``, ``sorted_by_index``
    (the index gives the requested sort; ``reverse``: scanned backwards), and the execution
    counters explain reports (``keys_examined``, ``docs_examined``, ``n_returned``)."""

    def __init__(self, index: Any, intervals: list[tuple[bytes, Any]], used: int,
                 cost: int) -> None:
        self.index = index
        self.intervals = intervals
        self.used = used
        self.cost = cost
        self.sorted_by_index = False
        self.reverse = False
        self.keys_examined = 0
        self.docs_examined = 0
        self.n_returned = 0

    def entries(self) -> Iterator[tuple[bytes, int, Any]]:
        """The index entries in the intervals in scan order (ties by record id ascending)."""
        sk = self.index.sorted
        ivs = reversed(self.intervals) if self.reverse else self.intervals
        for start, stop in ivs:
            if not self.reverse:
                yield from sk.scan(start, stop)
                continue
            group: list[Any] = []
            for e in sk.scan(start, stop, reverse=True):
                if group and group[0][0] != e[0]:
                    yield from reversed(group)
                    group = []
                group.append(e)
            yield from reversed(group)


def _base(docs: Any) -> IndexedDocs | None:
    if isinstance(docs, IndexedDocs):
        return docs
    from shardsim.shard.sharding_runtime import _FilteredDocs  # the shard filter's view
    if isinstance(docs, _FilteredDocs) and isinstance(docs._docs, IndexedDocs):
        return docs._docs
    return None  # a transaction's or a snapshot's documents: no index of them


def _usable(idx: Any, hinted: bool, filt: dict[str, Any] | None = None) -> bool:
    spec = idx.spec
    return idx.sorted is not None and not spec.get("collation") and \
        (hinted or not spec.get("hidden")) and \
        (idx.partial is None or implies(filt or {}, idx.partial))


_BOUND_OPS = ("$eq", "$gt", "$gte", "$lt", "$lte")


def _comparable(a: Any, b: Any) -> bool:
    num = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    return (isinstance(a, num) and isinstance(b, num)) or (type(a) is str and type(b) is str)


def _query_bounds(cond: Any) -> list[tuple[str, Any]] | None:
    """A query condition on one field as ``[(op, value)]`` with ops of :data:`_BOUND_OPS`
    (a plain scalar is ``$eq``), or None when it is anything else."""
    if isinstance(cond, dict):
        if not cond or not all(k in _BOUND_OPS for k in cond):
            return None
        out = list(cond.items())
    else:
        out = [("$eq", cond)]
    if any(isinstance(v, (dict, list)) or v is None or (isinstance(v, float) and v != v)
           for _, v in out):
        return None
    return out


def _implies_op(bounds: list[tuple[str, Any]], op: str, c: Any) -> bool:
    """Does a field constrained by ``bounds`` (all of them hold) satisfy ``{op: c}``?"""
    for qop, v in bounds:
        if not _comparable(v, c):
            continue
        if op == "$eq" and qop == "$eq" and v == c:
            return True
        if op in ("$lte", "$lt"):
            if qop == "$eq" and (v <= c if op == "$lte" else v < c):
                return True
            if qop == "$lt" and v <= c:
                return True
            if qop == "$lte" and (v <= c if op == "$lte" else v < c):
                return True
        if op in ("$gte", "$gt"):
            if qop == "$eq" and (v >= c if op == "$gte" else v > c):
                return True
            if qop == "$gt" and v >= c:
                return True
            if qop == "$gte" and (v >= c if op == "$gte" else v > c):
                return True
    return False


def implies(filt: dict[str, Any], pfe: Any) -> bool:
    """Does every document matching ``filt`` match the partial index's ``pfe``? (mongod's
    ``expression::isSubsetOf``, for the simple forms: a top-level AND of fields compared with
    ``$eq``/``$gt``/``$gte``/``$lt``/``$lte`` or ``$exists: true``, each implied by the query's
    equality or range on that field of the same type bracket; anything else: no, and the
    partial index is not used.)"""
    if not isinstance(pfe, dict) or not pfe or not isinstance(filt, dict):
        return False
    clauses: list[tuple[str, Any]] = []
    for k, v in pfe.items():
        if k == "$and" and isinstance(v, list) and all(isinstance(x, dict) for x in v):
            clauses.extend(item for x in v for item in x.items())
        elif k.startswith("$"):
            return False
        else:
            clauses.append((k, v))
    for field, cond in clauses:
        if field.startswith("$"):
            return False
        bounds = _query_bounds(filt.get(field)) if field in filt else None
        if bounds is None:
            return False
        ops = cond.items() if isinstance(cond, dict) else [("$eq", cond)]
        for op, c in ops:
            if op == "$exists":
                if c is not True:
                    return False
                continue
            if op not in _BOUND_OPS or isinstance(c, (dict, list)) or c is None:
                return False
            if not _implies_op(bounds, op, c):
                return False
    return True


def _sort_match(idx: Any, sort: dict[str, Any] | None, eq: int = 0) -> bool | None:
    """None if the index cannot give ``sort``; else whether it is scanned backwards. The sort
    must be the key pattern (or reversed), or its fields after the first ``eq`` ones (bound by
    one point each: ``planner_analysis.cpp``'s equality-prefix rule), in full: ties of a
    shorter sort stay in ``$natural`` order, not key order."""
    if not sort or idx.sorted.multikey or idx.sorted.nan:
        return None
    key = list(idx.spec["key"].items())
    items = list(sort.items())
    for skip in range(eq + 1):
        rest = key[skip:]
        if len(items) != len(rest):
            continue
        flips = set()
        for (sf, sd), (kf, kd) in zip(items, rest):
            if sf != kf or isinstance(sd, (dict, bool)) or sd not in (1, -1):
                flips.add(None)
                break
            flips.add((sd < 0) != (kd < 0))
        if len(flips) == 1 and None not in flips:
            return flips.pop()
    return None


def choose(coll: Any, filt: dict[str, Any] | None, sort: dict[str, Any] | None = None,
           hint_index: Any = None) -> Plan | None:
    """The index plan for ``filt`` (and ``sort``) on ``coll`` (a Collection or the shard
    filter view of one), or None for a collection scan. ``hint_index``: the Index a hint
    named (then that index or a collection scan)."""
    if coll is None or collation.active() or _base(getattr(coll, "docs", None)) is None:
        return None
    filt = filt or {}
    if hint_index is not None:
        cands = [hint_index] if _usable(hint_index, True, filt) else []
    else:
        cands = [i for i in coll.indexes.values() if _usable(i, False, filt)]
    best: Plan | None = None
    for idx in cands:
        intervals, used, eq = intervals_for(idx, filt)
        rev = _sort_match(idx, sort, eq)
        if not used and rev is None and hint_index is None:
            continue
        if not used and idx.sparse and hint_index is None:
            continue  # a sparse index misses the documents without the field
        plan = Plan(idx, intervals, used, _count(idx.sorted, intervals))
        if rev is not None and len(intervals) <= 1:
            plan.sorted_by_index, plan.reverse = True, rev
        elif hint_index is not None and not sort and len(intervals) <= 1:
            # a hinted scan without a sort returns the index's order, as mongod's IXSCAN does
            # (a hint of {num: -1} reads the highest num first)
            plan.sorted_by_index, plan.reverse = True, False
        if best is None or _better(plan, best):
            best = plan
    return best


def _better(a: Plan, b: Plan) -> bool:
    if bool(a.used) != bool(b.used):
        return bool(a.used)
    if a.sorted_by_index != b.sorted_by_index:
        big, small = (a, b) if a.sorted_by_index else (b, a)
        prefer_sorted = big.cost <= 10 * small.cost
        return prefer_sorted == a.sorted_by_index
    return a.cost < b.cost


def execute(plan: Plan, coll: Any, filt: dict[str, Any] | None, matcher: Any,
            limit: int = 0) -> Iterator[tuple[Any, dict[str, Any]]]:
    """``(storage key, document)`` of the matching documents the plan finds: in index order
    when it gives the sort (stopping after ``limit``), else in ``$natural`` order. ``matcher``
    (filter, doc) -> bool re-checks every fetched document. Counters are updated on ``plan``."""
    if plan.sorted_by_index:
        keys: Iterator[Any] = _index_order_keys(plan)
    else:
        found: dict[Any, int] = {}
        for _kb, rid, key in plan.entries():
            plan.keys_examined += 1
            found.setdefault(key, rid)
        base = _base(coll.docs)
        rids = base.rids if base is not None else {}
        keys = iter(sorted(found, key=lambda k: rids.get(k, 0)))
    docs = coll.docs
    for key in keys:
        doc = docs.get(key)
        if doc is None:
            continue
        plan.docs_examined += 1
        if not filt or matcher(filt, doc):
            plan.n_returned += 1
            yield key, doc
            if limit and plan.n_returned >= limit:
                return


def _index_order_keys(plan: Plan) -> Iterator[Any]:
    """The storage keys of ``plan``'s index entries in index order, each once (a multikey
    index has several entries per document), counting ``keys_examined`` as they are read."""
    seen: set[Any] = set()
    for _kb, _rid, key in plan.entries():
        plan.keys_examined += 1
        if key not in seen:
            seen.add(key)
            yield key


def planned_select(coll: Any, filt: dict[str, Any]) -> Iterator[tuple[Any, dict[str, Any]]] | None:
    """:data:`shardsim.core.query.INDEX_PLANNER`: the matches of ``filt`` through the best
    index in ``$natural`` order (a list, materialised now so callers may write while
    iterating, as :func:`shardsim.core.query.select` allows), or None for a collection scan."""
    plan = choose(coll, filt)
    if plan is None:
        return None
    plan.sorted_by_index = False
    return iter(list(execute(plan, coll, filt, q.query_matcher(filt))))


q.INDEX_PLANNER = planned_select
