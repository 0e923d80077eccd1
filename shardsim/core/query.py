"""The query language every role shares, on top of ``mongomock``.

mongomock (pinned in pyproject) supplies the matcher (``filtering.filter_applies``: comparison,
logical, ``$exists``, ``$type``, ``$in``, ``$elemMatch``, ``$regex``, ``$expr``, dotted and array
paths) and the aggregation stages (``aggregate.process_pipeline``). This module adds what
mongomock lacks or does differently from mongod 8.0: the BSON type order for Timestamp, MinKey and
MaxKey, sort and projection with mongod's rules, an ``_id`` fast path for :func:`select`, and
mongod's error codes instead of mongomock's exceptions (BadValue 2 for a bad query).

Shards run it over their storage; the router runs it over the union of shard results (sort,
``$group`` after the shards' part of a pipeline, ``distinct``). The update language is
:mod:`shardsim.core.update`.
"""

from __future__ import annotations

import heapq
import operator
import re
from time import perf_counter
from typing import Any, Iterable, Iterator

import mongomock
from mongomock import aggregate as mm_aggregate
from mongomock import filtering as mm_filtering
from bson import Code, Decimal128, MaxKey, MinKey, Regex, Timestamp

from shardsim.core import bucket_auto, collation, expressions, fast_match, javascript, max_time, \
    regex_limits
from shardsim.core.errors import MongoError
from shardsim.core.search_indexes import check_search_stages
from shardsim.core.values import id_key

expressions.install()  # let variables, $getField/$setField
regex_limits.install()  # $regex with a match limit; maxTimeMS checked per document tested

bucket_auto.install()  # mongomock pipelines get the server's $bucketAuto (idempotent)
MM_SCRATCH = mongomock.MongoClient().get_database("shardsim").get_collection("scratch")

# mongomock's comparator has no place for Timestamp/MinKey/MaxKey in the BSON type order
# (bsontypes.h canonical values); oplog filters such as {ts: {$gt: Timestamp}} need them.
_mm_compare_type = mm_filtering._get_compare_type


def _compare_type(val: Any) -> int:
    if isinstance(val, Timestamp):
        return 47
    if isinstance(val, _EmptyArray):
        return 3
    if isinstance(val, MinKey):
        return -1
    if isinstance(val, MaxKey):
        return 127
    return _mm_compare_type(val)


mm_filtering._get_compare_type = _compare_type

# $type names mongomock lists but does not implement (bsontypes.h / "$type" aliases).
for _name, _test in {
        "null": lambda v: v is None,
        "regex": lambda v: isinstance(v, (Regex, re.Pattern)),
        "timestamp": lambda v: isinstance(v, Timestamp),
        "minKey": lambda v: isinstance(v, MinKey),
        "maxKey": lambda v: isinstance(v, MaxKey),
        "javascript": lambda v: isinstance(v, Code) and v.scope is None,
        "javascriptWithScope": lambda v: isinstance(v, Code) and v.scope is not None}.items():
    if mm_filtering.TYPE_MAP.get(_name, 0) is None:
        mm_filtering.TYPE_MAP[_name] = _test
# $type by number (BSONType codes) as mongod accepts it; arrays of types match any of them.
_TYPE_CODES = {1: "double", 2: "string", 3: "object", 4: "array", 5: "binData", 6: "undefined",
               7: "objectId", 8: "bool", 9: "date", 10: "null", 11: "regex", 12: "dbPointer",
               13: "javascript", 14: "symbol", 15: "javascriptWithScope", 16: "int",
               17: "timestamp", 18: "long", 19: "decimal", -1: "minKey", 127: "maxKey"}


def _type_op(doc_val: Any, search_val: Any) -> bool:
    if isinstance(search_val, list):
        return any(_type_op(doc_val, v) for v in search_val)
    if isinstance(search_val, (int, float)) and not isinstance(search_val, bool):
        if search_val not in _TYPE_CODES:
            raise MongoError(2, f"Invalid numerical type code: {search_val}")
        search_val = _TYPE_CODES[int(search_val)]
    return _mm_type_op(doc_val, search_val)


_mm_type_op = mm_filtering._type_op
mm_filtering._filterer_inst._operator_map["$type"] = _type_op



def translate_error(exc: Exception) -> MongoError:
    """A mongomock exception as the MongoError mongod would send; MongoErrors pass through.

    A feature mongomock does not implement (``NotImplementedError``) is NotImplemented (238)
    naming the feature; an exception carrying a server code keeps it; an unknown operator is
    BadValue (2) ``unknown operator: $x`` as mongod's ``MatchExpressionParser`` says; anything
    else is BadValue (2). Python's own exception text (``unsupported operand type(s)``...)
    never reaches a client: it becomes ``Invalid argument for this operation`` plus the
    exception type, so the client sees a server-style message."""
    if isinstance(exc, MongoError):
        return exc
    msg = str(exc).replace("is not implemented in mongomock yet", "is not supported by shardsim")
    msg = msg.replace("in Mongomock", "in shardsim").replace("Mongomock", "shardsim")
    msg = msg.replace("mongomock", "shardsim")
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code > 0:
        return MongoError(code, msg)
    m = re.search(r"unknown operator: (\$\w+)", msg, re.I) or re.search(r"Unrecognized operator (\$\w+)", msg)
    if m:
        return MongoError(2, f"unknown operator: {m.group(1)}")
    if isinstance(exc, NotImplementedError):
        return MongoError(238, msg or "not supported by shardsim")
    if type(exc).__module__ == "builtins":
        return MongoError(2, f"Invalid argument for this operation ({type(exc).__name__} while "
                             f"evaluating it in shardsim)")
    return MongoError(2, msg)


def matches(filt: dict[str, Any] | None, doc: dict[str, Any]) -> bool:
    """True if ``doc`` satisfies the query ``filt``; BadValue (2) for an invalid query.
    ``$where`` clauses run on the JavaScript engine (:mod:`shardsim.core.javascript`)."""
    if not filt:
        return True
    if "$where" in filt or (("$and" in filt or "$or" in filt or "$nor" in filt)
                            and javascript.has_where(filt)):
        return _matches_with_where(filt, doc)
    if collation.active():
        filt, doc = collation.fold(filt), collation.fold(doc)
    try:
        return mm_filtering.filter_applies(filt, doc)
    except KeyError:
        # mongomock's $expr raises for a missing field path or variable operand; mongod
        # evaluates it to "missing", which does not satisfy the comparison here
        return False
    except Exception as exc:  # mongomock raises OperationFailure/NotImplementedError/TypeError
        raise translate_error(exc) from None


def _current_db() -> str:
    from shardsim.core.commands import CURRENT_REQUEST
    req = CURRENT_REQUEST.get()
    return req.db if req is not None else "test"


def _matches_with_where(filt: dict[str, Any], doc: dict[str, Any]) -> bool:
    """:func:`matches` for a filter holding ``$where``: the clauses without it go to the
    matcher, ``$where`` to JavaScript (``this`` the document), ``$and``/``$or``/``$nor`` over
    clauses that hold it evaluated here."""
    rest: dict[str, Any] = {}
    for k, v in filt.items():
        if k == "$where":
            if not javascript.where(_current_db(), v, doc):
                return False
        elif k in ("$and", "$or", "$nor") and isinstance(v, list) and javascript.has_where(
                {k: v}):
            results = (matches(x, doc) if isinstance(x, dict) else False for x in v)
            ok = all(results) if k == "$and" else any(results)
            if ok == (k == "$nor"):
                return False
        else:
            rest[k] = v
    return matches(rest, doc) if rest else True


def strip_where(filt: Any) -> Any:
    """``filt`` without its ``$where`` clauses, each checked as mongod parses it (engine on,
    a string or Code operand, a function that compiles: 6108304, 2, 139), for the parse-error
    pass of a query that scans nothing."""
    if not isinstance(filt, dict) or not javascript.has_where(filt):
        return filt
    out: dict[str, Any] = {}
    for k, v in filt.items():
        if k == "$where":
            javascript.compile_where(_current_db(), v)
        elif k in ("$and", "$or", "$nor") and isinstance(v, list):
            kept = [strip_where(x) for x in v]
            kept = [x for x in kept if x != {}]
            if kept:
                out[k] = kept
        else:
            out[k] = v
    return out


def query_matcher(filt: dict[str, Any] | None) -> Any:
    """``(filt, doc) -> bool`` for the documents of one query: :func:`matches`, with the simple
    forms compiled once into closures (:mod:`shardsim.core.fast_match`) when no collation is
    active. The compiled closures check the operation's deadline (maxTimeMS 50) every 512
    documents, as mongomock's matcher does at each."""
    if collation.active() or javascript.has_where(filt):
        return matches
    return fast_match.matcher(filt, matches, max_time.check)


def _exact_id(filt: dict[str, Any]) -> tuple[bool, Any]:
    if "_id" not in filt:
        return False, None
    v = filt["_id"]
    if isinstance(v, dict):
        if any(isinstance(k, str) and k.startswith("$") for k in v):
            if len(v) == 1 and "$eq" in v and not isinstance(v["$eq"], (dict, list, Regex)):
                return True, v["$eq"]
            return False, None
        return True, v
    if isinstance(v, (list, Regex)) or type(v).__name__ == "Pattern":
        return False, None
    return True, v


def _id_in_list(filt: dict[str, Any]) -> list[Any] | None:
    v = filt.get("_id")
    if not isinstance(v, dict) or list(v) != ["$in"] or not isinstance(v["$in"], list):
        return None
    vals = v["$in"]
    for x in vals:
        if isinstance(x, (dict, list, Regex)) or type(x).__name__ == "Pattern" or x is None:
            return None
    return vals


def pinned_id_keys(filt: dict[str, Any] | None) -> list[Any] | None:
    """The ``id_key`` of every document ``filt`` can match when it pins ``_id`` (an equality or
    an ``$in`` of plain values: :func:`select` answers it from the ``_id`` map, as mongod's
    IDHACK / ``_id`` index plan), else None (a collection scan that reads every document)."""
    if not filt:
        return None
    exact, value = _exact_id(filt)
    if exact:
        if isinstance(value, str) and collation.active():
            return None
        return [id_key(value)]
    in_values = _id_in_list(filt)
    if in_values is not None and not (collation.active() and
                                      any(isinstance(v, str) for v in in_values)):
        return [id_key(v) for v in in_values]
    return None


PAUSE = (None, None)  # what select(..., pauses=True) yields every SLICE_S of scanning

#: the shard's index planner (``shard.planner.planned_select``, installed by it): given
#: ``(coll, filt)`` an iterator of the matching ``(id_key, doc)`` in ``$natural`` order read
#: through an index, or None when a collection scan it is
INDEX_PLANNER: Any = None


def select(coll: Any, filt: dict[str, Any] | None, *,
           pauses: bool = False) -> Iterator[tuple[Any, dict[str, Any]]]:
    """``(id_key, doc)`` for every document of ``coll`` matching ``filt`` in natural order.

    ``coll`` is anything with a ``docs`` mapping ``id_key -> document`` in natural order (a
    shard's :class:`shard.storage.Collection`), or None for a missing collection.

    An equality on ``_id`` is answered from the ``_id`` map without a scan. The scan works on a
    snapshot of the keys, so callers may modify the collection while iterating. ``pauses``:
    also yield :data:`PAUSE` once :data:`shardsim.core.max_time.SLICE_S` of scanning has passed
    since the last one, where an async caller lets the event loop in (:func:`select_paced`).
    """
    filt = filt or {}
    exact, value = _exact_id(filt)
    if exact and isinstance(value, str) and collation.active():
        exact = False  # a string _id may equal others under the collation: scan
    if not exact and filt:
        matches(strip_where(filt), {})  # parse errors surface even when nothing is scanned
    if coll is None:
        return
    if exact:
        k = id_key(value)
        doc = coll.docs.get(k)
        if doc is not None and (len(filt) == 1 or matches(filt, doc)):
            yield k, doc
        return
    in_values = _id_in_list(filt)
    if in_values is not None:
        # {_id: {$in: [...]}} answered from the _id map in ascending _id order, like an IXSCAN.
        keys = {}
        for v in in_values:
            keys.setdefault(id_key(v), v)
        ordered = sorted(keys.items(), key=lambda kv: _SortKey(kv[1]))
        since = perf_counter()
        for k, _v in ordered:
            if pauses and perf_counter() - since >= max_time.SLICE_S:
                yield PAUSE
                since = perf_counter()
            doc = coll.docs.get(k)
            if doc is not None and (len(filt) == 1 or matches(filt, doc)):
                yield k, doc
        return
    if not filt:
        for k, doc in list(coll.docs.items()):
            yield k, doc
        return
    since = perf_counter()
    planned = INDEX_PLANNER(coll, filt) if INDEX_PLANNER is not None else None
    if planned is not None:
        for item in planned:
            if pauses and perf_counter() - since >= max_time.SLICE_S:
                yield PAUSE
                since = perf_counter()
            yield item
        return
    docs = coll.docs
    match = query_matcher(filt)
    for k in list(docs):
        if pauses and perf_counter() - since >= max_time.SLICE_S:
            yield PAUSE
            since = perf_counter()
        doc = docs.get(k)
        if doc is not None and match(filt, doc):
            yield k, doc


async def select_paced(coll: Any, filt: dict[str, Any] | None,
                       limit: int = 0) -> list[tuple[Any, dict[str, Any]]]:
    """:func:`select` as a list (the first ``limit`` matches when ``limit``), for a command
    handler: the scan checks the operation's ``maxTimeMS`` (MaxTimeMSExpired 50) and lets the
    event loop serve other connections every few milliseconds (:class:`shardsim.core.max_time.Pacer`,
    mongod's query yielding), so a slow scan stalls no other client."""
    pacer = max_time.Pacer()
    out: list[tuple[Any, dict[str, Any]]] = []
    for item in select(coll, filt, pauses=True):
        if item is PAUSE:
            await pacer.tick()
            continue
        out.append(item)
        if limit and len(out) >= limit:
            break
    return out


def sort_docs(docs: list[dict[str, Any]], sort: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Sort like mongod (BSON type order); ``{$natural: ±1}`` keeps/reverses natural order."""
    if not sort:
        return docs
    if list(sort) == ["$natural"]:
        return docs if sort["$natural"] >= 0 else list(reversed(docs))
    for k, v in sort.items():
        if isinstance(v, dict):
            if v.get("$meta") is None:
                raise MongoError(2, f"Illegal key in $sort specification: {k}: {v}")
        elif v not in (1, -1) or isinstance(v, bool):
            raise MongoError(15975, "$sort key ordering must be 1 (for ascending) or -1 (for descending)")
    out = list(docs)
    folded = collation.active()
    try:
        for path, direction in reversed(list(sort.items())):
            if isinstance(direction, dict):
                continue  # {$meta: ...}: no text scores here, keep the order
            desc = direction < 0
            out.sort(key=lambda d, p=path, r=desc: _SortKey(_sort_value(
                collation.fold(d) if folded else d, p, r)), reverse=desc)
    except MongoError:
        raise
    except Exception as exc:
        raise translate_error(exc) from None
    return out


_SORT_RUN = 2048  # documents sorted in one call by sort_docs_paced
_PACED_SORT_MIN = 8 * _SORT_RUN  # fewer documents are sorted in one go (about 0.2 s at most)


async def sort_docs_paced(docs: list[dict[str, Any]],
                          sort: dict[str, Any] | None) -> list[dict[str, Any]]:
    """:func:`sort_docs` for a command handler: a list of more than ``_PACED_SORT_MIN``
    documents is sorted in runs of ``_SORT_RUN`` documents, which are then merged (both
    stable, so the result is the same), with a :class:`shardsim.core.max_time.Pacer` between runs
    and every ``_SORT_RUN`` merged documents, so a sort of 100,000 documents neither stalls
    other clients nor outlives its maxTimeMS (50). The merge compares in Python: such a sort
    takes 2-4 times the CPU of one in a single call."""
    if len(docs) <= _PACED_SORT_MIN or not sort or list(sort) == ["$natural"]:
        return sort_docs(docs, sort)
    sort_docs([], sort)  # the specification's errors first
    pacer = max_time.Pacer()
    out = list(docs)
    folded = collation.active()
    try:
        for path, direction in reversed(list(sort.items())):
            if isinstance(direction, dict):
                continue
            desc = direction < 0

            def key(d: dict[str, Any], p: str = path, r: bool = desc) -> _SortKey:
                return _SortKey(_sort_value(collation.fold(d) if folded else d, p, r))

            runs = []
            for n, at in enumerate(range(0, len(out), _SORT_RUN)):
                run = [_Merged(key(d), n, desc, d) for d in out[at:at + _SORT_RUN]]
                run.sort()
                runs.append(run)
                await pacer.tick()
            merged: list[dict[str, Any]] = []
            for item in heapq.merge(*runs):
                merged.append(item.doc)
                if len(merged) % _SORT_RUN == 0:
                    await pacer.tick()
            out = merged
    except MongoError:
        raise
    except Exception as exc:
        raise translate_error(exc) from None
    return out


class _Merged:
    """A document in :func:`sort_docs_paced`: ordered by its sort key (descending when
    ``desc``), ties by its run, so sorting runs and merging them is stable."""

    __slots__ = ("key", "run", "desc", "doc")

    def __init__(self, key: "_SortKey", run: int, desc: bool, doc: dict[str, Any]) -> None:
        self.key, self.run, self.desc, self.doc = key, run, desc, doc

    def __lt__(self, other: "_Merged") -> bool:
        first, second = (other.key, self.key) if self.desc else (self.key, other.key)
        if first < second:
            return True
        if second < first:
            return False
        return self.run < other.run


class _EmptyArray:
    """Stands for ``[]`` in sort keys: it sorts before null (``sort_key_generator.cpp``)."""


_EMPTY = _EmptyArray()


class _SortKey:
    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: "_SortKey") -> bool:
        a, b = self.v, other.v
        if a is _EMPTY or b is _EMPTY:  # [] sorts before everything, equal to itself
            return a is _EMPTY and b is not _EMPTY
        a_nan, b_nan = _is_nan(a), _is_nan(b)
        if (a_nan or b_nan) and _is_number(a) and _is_number(b):
            # NaN sorts before every other number (mongod's compareDoubles / KeyString), where
            # a plain < calls it equal to all of them
            return a_nan and not b_nan
        return mm_filtering.bson_compare(operator.lt, a, b)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, Decimal128)) and not isinstance(v, bool)


def _is_nan(v: Any) -> bool:
    if isinstance(v, float):
        return v != v
    return isinstance(v, Decimal128) and v.to_decimal().is_nan()


def _sort_value(doc: dict[str, Any], path: str, desc: bool) -> Any:
    """The value a document sorts by: through arrays, the smallest element ascending and the
    largest descending (mongod's multikey sort); missing is null."""
    cands: list[Any] = []
    for v in mm_filtering.iter_key_candidates(path, doc):
        if v is mm_filtering.NOTHING:
            continue
        if isinstance(v, list):
            if v:
                cands.extend(v)
            else:
                cands.append(_EMPTY)
        else:
            cands.append(v)
    if not cands:
        return None
    best = cands[0]
    op = operator.gt if desc else operator.lt
    for c in cands[1:]:
        if mm_filtering.bson_compare(op, c, best):
            best = c
    return best


def project(docs: list[dict[str, Any]], projection: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Apply a find projection (``projection.cpp`` semantics): inclusion or exclusion of
    (dotted) paths in the document's own field order with ``_id`` first, the ``$slice`` and
    ``$elemMatch`` operators, and aggregation expressions (computed by mongomock's ``$project``).
    Errors: 31254/31253 mixing inclusion and exclusion, 2 for bad operator arguments."""
    if not projection:
        return docs
    spec = _ProjectionSpec(projection)
    return [spec.apply(d) for d in docs]


class _ProjectionSpec:
    def __init__(self, projection: dict[str, Any]) -> None:
        self.include: list[tuple[str, ...]] = []
        self.exclude: list[tuple[str, ...]] = []
        self.ops: dict[str, dict[str, Any]] = {}
        self.exprs: dict[str, Any] = {}
        self.id_mode: bool | None = None
        for field, value in projection.items():
            if not isinstance(field, str) or not field:
                raise MongoError(2, "Projection field name cannot be empty")
            if isinstance(value, dict) and value and next(iter(value)) in ("$slice", "$elemMatch"):
                op = next(iter(value))
                if op == "$slice" and not (isinstance(value[op], int) and not isinstance(value[op], bool)
                                           or isinstance(value[op], list) and len(value[op]) == 2):
                    raise MongoError(28724, "First argument to $slice must be an array")
                if op == "$elemMatch" and not isinstance(value[op], dict):
                    raise MongoError(31274, "elemMatch: Invalid argument, object required, but got "
                                            f"{type(value[op]).__name__}")
                self.ops[field] = value
                continue
            if field.endswith(".$"):
                raise MongoError(238, "positional projection is not supported by shardsim")
            if isinstance(value, (bool, int, float)) and not isinstance(value, dict):
                flag = bool(value)
                if field == "_id":
                    self.id_mode = flag
                elif flag:
                    self.include.append(tuple(field.split(".")))
                else:
                    self.exclude.append(tuple(field.split(".")))
                continue
            self.exprs[field] = value
        # $elemMatch projects like an inclusion; $slice alone keeps every other field.
        # {_id: 1} (or true) with no other inclusion or exclusion is an inclusion projection,
        # whatever $slice says (projection_parser.cpp parseAndAnalyze: idIncludedEntirely);
        # {_id: 1, a: 0} stays an exclusion.
        inclusive = bool(self.include or self.exprs or
                         any("$elemMatch" in op for op in self.ops.values()) or
                         (self.id_mode is True and not self.exclude))
        if inclusive and self.exclude:
            raise MongoError(31254, f"Cannot do exclusion on field {'.'.join(self.exclude[0])} in "
                                    f"inclusion projection")
        self.inclusive = inclusive
        if self.id_mode is False and not inclusive and not self.exclude:
            self.exclude.append(("_id",))
            self.id_mode = None

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        if self.inclusive:
            out: dict[str, Any] = {}
            if self.id_mode is not False and "_id" in doc:
                out["_id"] = doc["_id"]
            rest = _include(doc, self.include + [tuple(f.split(".")) for f in self.ops])
            for k, v in rest.items():
                if k != "_id" or self.id_mode is not False:
                    out[k] = v
            if ("_id",) in self.include and "_id" in doc:
                out["_id"] = doc["_id"]
        else:
            out = _exclude(doc, self.exclude + ([("_id",)] if self.id_mode is False else []))
        for field, op in self.ops.items():
            if field not in out:
                continue
            val = out[field]
            if "$slice" in op:
                if isinstance(val, list):
                    arg = op["$slice"]
                    if isinstance(arg, list):
                        skip, limit = arg
                        if skip < 0:
                            skip = max(0, len(val) + skip)
                        out[field] = val[skip:skip + limit]
                    elif arg < 0:
                        out[field] = val[len(val) + arg:] if -arg < len(val) else val
                    else:
                        out[field] = val[:arg]
            else:
                match = [x for x in val if isinstance(x, dict) and matches(op["$elemMatch"], x)] \
                    if isinstance(val, list) else []
                if match:
                    out[field] = [match[0]]
                else:
                    del out[field]
        if self.exprs:
            try:
                computed = mm_aggregate._handle_project_stage([doc], None, dict(self.exprs))
            except Exception as exc:
                raise translate_error(exc) from None
            if computed:
                for k, v in computed[0].items():
                    if k != "_id":
                        out[k] = v
        return out


def _include(doc: Any, paths: list[tuple[str, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        subs = [p[1:] for p in paths if p[0] == k]
        if not subs:
            continue
        if any(not s for s in subs):
            out[k] = v
        elif isinstance(v, dict):
            out[k] = _include(v, subs)
        elif isinstance(v, list):
            out[k] = [_include(x, subs) for x in v if isinstance(x, dict)]
    return out


def _exclude(doc: Any, paths: list[tuple[str, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        subs = [p[1:] for p in paths if p[0] == k]
        if not subs:
            out[k] = v
        elif any(not s for s in subs):
            continue
        elif isinstance(v, dict):
            out[k] = _exclude(v, subs)
        elif isinstance(v, list):
            out[k] = [_exclude(x, subs) if isinstance(x, dict) else x for x in v]
        else:
            out[k] = v
    return out


def _group_id_first(handler: Any) -> Any:
    """mongomock's ``$group`` with each output document's ``_id`` first, as mongod writes it
    (``DocumentSourceGroup::makeDocument``: ``_id``, then the accumulators in spec order);
    mongomock appends ``_id`` after the accumulators. A constant key that is false in Python
    (``0``, ``false``, ``""``, ``{}``, ``[]``) stays itself, as on mongod (mongomock makes it
    null)."""
    def group(in_collection: Any, database: Any, options: Any) -> list[dict[str, Any]]:
        out = handler(in_collection, database, options)
        gid = options.get("_id") if isinstance(options, dict) else None
        const = gid is not None and not gid
        return [{"_id": gid if const else d["_id"], **{k: v for k, v in d.items() if k != "_id"}}
                if type(d) is dict and "_id" in d else d for d in out]
    return group


mm_aggregate._PIPELINE_HANDLERS["$group"] = _group_id_first(mm_aggregate._PIPELINE_HANDLERS["$group"])


def run_pipeline(docs: list[dict[str, Any]], pipeline: list[dict[str, Any]], database: Any) -> list[dict[str, Any]]:
    """Run an aggregation ``pipeline`` over ``docs`` (mongomock stages).

    ``database`` answers ``get_collection(name)`` for ``$lookup``. Unknown stages give mongod's
    "Unrecognized pipeline stage name" (40324).
    """
    pipeline = [rewrite_stage(stage) for stage in pipeline]
    if collation.active() and any("$match" in st or "$sort" in st for st in pipeline):
        # mongomock's $match and $sort do not go through matches()/sort_docs(): run them here,
        # under the collation
        for i, st in enumerate(pipeline):
            if "$match" in st or "$sort" in st:
                head = run_pipeline(docs, pipeline[:i], database) if i else docs
                if "$match" in st:
                    kept = [d for d in head if matches(st["$match"], d)]
                else:
                    if not isinstance(st["$sort"], dict) or not st["$sort"]:
                        break  # mongomock reports the bad specification
                    kept = sort_docs(head, st["$sort"])
                return run_pipeline(kept, pipeline[i + 1:], database)
    try:
        return list(mm_aggregate.process_pipeline(docs, database, pipeline, None))
    except MongoError:
        raise
    except NotImplementedError as exc:
        raise MongoError(238, str(exc).split(".")[0]) from None
    except Exception as exc:
        raise translate_error(exc) from None


def rewrite_stage(stage: Any) -> dict[str, Any]:
    """Validate a stage; express ``$replaceWith``/``$unset`` with stages mongomock has."""
    if not isinstance(stage, dict) or len(stage) != 1:
        raise MongoError(40323, "A pipeline stage specification object must contain exactly one field.")
    name, arg = next(iter(stage.items()))
    check_search_stages([stage])  # SearchNotEnabled (31082) before "unrecognized"
    if name not in mm_aggregate._PIPELINE_HANDLERS:
        raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")
    if name == "$replaceWith":
        return {"$replaceRoot": {"newRoot": arg}}
    if name == "$unset":
        fields = [arg] if isinstance(arg, str) else arg
        if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields):
            raise MongoError(31002, "$unset specification must be a string or an array containing "
                                    "at least one field")
        return {"$project": {f: 0 for f in fields}}
    return stage


# -- updates ----------------------------------------------------------------------------------

def deep_copy(v: Any) -> Any:
    """Copy dicts/lists recursively (other BSON values are immutable here); faster than deepcopy."""
    t = type(v)
    if t is dict:
        return {k: deep_copy(x) for k, x in v.items()}
    if t is list:
        return [deep_copy(x) for x in v]
    return v



def distinct_values(docs: Iterable[dict[str, Any]], key: str) -> list[Any]:
    """``distinct``: the unique values at ``key`` (arrays unwound one level), in first-seen order."""
    seen: set[Any] = set()
    out: list[Any] = []
    for doc in docs:
        for v in mm_filtering.iter_key_candidates(key, doc):
            if v is mm_filtering.NOTHING:
                continue
            vals = v if isinstance(v, list) else [v]
            for x in vals:
                k = id_key(collation.fold(x))  # equal under the collation: one value
                if k not in seen:
                    seen.add(k)
                    out.append(x)
    return out
