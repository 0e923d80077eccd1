"""The ``$bucketAuto`` stage (mongomock lists it but does not implement it), as
``src/mongo/db/pipeline/document_source_bucket_auto.cpp`` builds it.

``{$bucketAuto: {groupBy: <expression>, buckets: <int > 0>, output?: {field: accumulator},
granularity?: <series>}}``:

1. every document is keyed by ``groupBy`` (a missing value is null) and sorted by that key in
   BSON order (``DocumentSourceBucketAuto::doGetNext`` -> ``populateSorter``);
2. ``populateBuckets``: each bucket takes ``round(n / buckets)`` documents (at least 1), then
   every following document whose key equals the last one taken (a value never spans two
   buckets); the last bucket takes everything left;
3. a bucket's ``_id`` is ``{min: its first key, max: the next bucket's first key}`` (the last
   bucket's ``max`` is its own last key): boundaries are values, not positions;
4. the output is ``{_id: {min, max}, <output fields>}``, ``output`` defaulting to
   ``{count: {$sum: 1}}``.

``granularity`` (a preferred-number series that rounds the boundaries) is answered with
NotImplemented (238): no connector sends it. Errors as mongod's: 40240 (not an object),
40245 (unknown option), 40246 (``groupBy``/``buckets`` missing), 40239 (``groupBy`` not an
expression), 40241 / 40242 / 40243 (``buckets`` not a number / not a 32-bit integer / not
positive), 40244 (``output`` not an object).
"""

from __future__ import annotations

import functools
from typing import Any, Iterable

from mongomock import aggregate as mm_aggregate

from shardsim.core.errors import MongoError
from shardsim.core.shard_key import compare

STAGE = "$bucketAuto"
_OPTIONS = ("groupBy", "buckets", "output", "granularity")


def _check(spec: Any) -> tuple[Any, int, dict[str, Any]]:
    if not isinstance(spec, dict):
        raise MongoError(40240, f"The argument to $bucketAuto must be an object, but found "
                                f"type: {type(spec).__name__}.")
    for k in spec:
        if k not in _OPTIONS:
            raise MongoError(40245, f"Unrecognized option to $bucketAuto: {k}.")
    if "groupBy" not in spec or "buckets" not in spec:
        raise MongoError(40246, "$bucketAuto requires 'groupBy' and 'buckets' to be specified")
    group_by = spec["groupBy"]
    if not ((isinstance(group_by, str) and group_by.startswith("$"))
            or isinstance(group_by, dict)):
        raise MongoError(40239, f"The $bucketAuto 'groupBy' field must be defined as a "
                                f"$-prefixed path or an expression object, but found: "
                                f"{group_by!r}.")
    buckets = spec["buckets"]
    if isinstance(buckets, bool) or not isinstance(buckets, (int, float)):
        raise MongoError(40241, f"The $bucketAuto 'buckets' field must be a numeric value, but "
                                f"found type: {type(buckets).__name__}.")
    if int(buckets) != buckets or not -2**31 <= buckets < 2**31:
        raise MongoError(40242, f"The $bucketAuto 'buckets' field must be representable as a "
                                f"32-bit integer, but found {buckets}.")
    if buckets <= 0:
        raise MongoError(40243, f"The $bucketAuto 'buckets' field must be greater than 0, but "
                                f"found: {int(buckets)}.")
    output = spec.get("output", {"count": {"$sum": 1}})
    if not isinstance(output, dict):
        raise MongoError(40244, f"The $bucketAuto 'output' field must be an object, but found "
                                f"type: {type(output).__name__}.")
    if "granularity" in spec:
        raise MongoError(238, "$bucketAuto with 'granularity' is not supported by shardsim")
    return group_by, int(buckets), output


def _key(group_by: Any, doc: dict[str, Any]) -> Any:
    try:
        return mm_aggregate._Parser(doc).parse(group_by)
    except KeyError:
        return None  # missing: null (DocumentSourceBucketAuto::extractKey)


def buckets_of(keyed: list[tuple[Any, dict[str, Any]]], n_buckets: int
               ) -> list[tuple[Any, Any, list[dict[str, Any]]]]:
    """``[(min, max, documents)]`` of ``keyed`` ((key, document) sorted by key) cut into at
    most ``n_buckets`` buckets (``populateBuckets``)."""
    size = len(keyed)
    approx = max(1, int(size / n_buckets + 0.5))  # std::round of a positive double
    out: list[tuple[Any, Any, list[dict[str, Any]]]] = []
    i = 0
    for b in range(n_buckets):
        if i >= size:
            break
        start = i
        i = min(size, i + approx)
        last = b == n_buckets - 1
        while i < size and (last or compare(keyed[i - 1][0], keyed[i][0]) == 0):
            i += 1
        upper = keyed[i][0] if i < size else keyed[i - 1][0]
        out.append((keyed[start][0], upper, [d for _, d in keyed[start:i]]))
    return out


def handle_bucket_auto(in_collection: Iterable[dict[str, Any]], unused_database: Any,
                       options: Any) -> list[dict[str, Any]]:
    """mongomock pipeline handler for ``$bucketAuto`` (see the module docstring)."""
    group_by, n_buckets, output = _check(options)
    keyed = [(_key(group_by, d), d) for d in in_collection]
    keyed.sort(key=functools.cmp_to_key(lambda x, y: compare(x[0], y[0])))
    out = []
    for lo, hi, docs in buckets_of(keyed, n_buckets):
        acc = mm_aggregate._handle_group_stage(docs, None, {"_id": None, **output})[0]
        acc.pop("_id", None)
        out.append({"_id": {"min": lo, "max": hi}, **{k: acc.get(k) for k in output}})
    return out


def install() -> None:
    """Register :func:`handle_bucket_auto` as mongomock's ``$bucketAuto`` (idempotent)."""
    mm_aggregate._PIPELINE_HANDLERS[STAGE] = handle_bucket_auto


install()
