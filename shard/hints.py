"""``hint`` and ``min``/``max`` on the shard (``query_planner.cpp``, ``index_hint.cpp``,
``get_executor.cpp``).

* :func:`resolve_hint`: a hint is an index name (string) or a key pattern (object, fields in
  order) naming an existing, non-hidden index, or ``{$natural: 1 | -1}`` (a collection scan).
  An unknown one is BadValue (2) ``"... hint provided does not correspond to an existing
  index"``; a hint of another type FailedToParse (9). A missing collection takes any hint
  (mongod plans an EOF there).
* :func:`apply_min_max`: ``min`` (inclusive) and ``max`` (exclusive) bounds on the hinted
  index's key, documents in index order. Without a hint: 51173 "When using min()/max() a hint
  of which index to use must be provided"; bound fields not a prefix of the index key in
  order: 51174 "The index chosen is not compatible with min/max"; ``min`` not before ``max``:
  51175; with ``$natural``: 2.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from shardsim.core.errors import MongoError
from shardsim.core.shard_key import compare
from shardsim.core.values import get_path

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.storage import Collection, Index

NATURAL = "$natural"
_BAD_HINT = "hint provided does not correspond to an existing index"


def is_natural(hint: Any) -> bool:
    """True for ``{$natural: ...}``."""
    return isinstance(hint, dict) and NATURAL in hint


def resolve_hint(coll: "Collection | None", hint: Any, ns: str = "") -> "Index | None":
    """The index ``hint`` names on ``coll`` (None for no hint, ``$natural`` or a missing
    collection). Raises 9 for a hint that is neither string nor object, 2 for an unknown
    index."""
    if hint is None or (isinstance(hint, (dict, str)) and not hint):
        return None
    if not isinstance(hint, (dict, str)):
        raise MongoError(9, "hint must be either a string or nested object")
    if is_natural(hint) or coll is None:
        return None
    for idx in coll.indexes.values():
        if idx.spec.get("hidden"):
            continue
        if isinstance(hint, str) and idx.name == hint:
            return idx
        if isinstance(hint, dict) and list(idx.spec["key"].items()) == list(hint.items()):
            return idx
    prefix = f"error processing query: ns={ns} planner returned error :: caused by :: " \
        if ns else ""
    raise MongoError(2, prefix + _BAD_HINT)


def check_hint(coll: "Collection | None", hint: Any, ns: str = "") -> None:
    """:func:`resolve_hint` for its errors only."""
    resolve_hint(coll, hint, ns)


def _key_tuple(doc: dict[str, Any], fields: list[str]) -> list[Any]:
    out = []
    for f in fields:
        found, v = get_path(doc, f)
        out.append(v if found else None)
    return out


def _cmp_keys(a: list[Any], b: list[Any], directions: list[int]) -> int:
    for x, y, d in zip(a, b, directions):
        c = compare(x, y)
        if c:
            return c if d >= 0 else -c
    return 0


def apply_min_max(coll: "Collection | None", docs: list[dict[str, Any]], hint: Any,
                  min_doc: Any, max_doc: Any, ns: str) -> list[dict[str, Any]]:
    """``docs`` (already filtered) restricted to ``[min, max)`` of the hinted index, in the
    index's order; ``docs`` unchanged when neither bound is set."""
    if not min_doc and not max_doc:
        return docs
    for name, v in (("min", min_doc), ("max", max_doc)):
        if v is not None and not isinstance(v, dict):
            raise MongoError(14, f"BSON field 'FindCommandRequest.{name}' is the wrong type, "
                                 f"expected type 'object'")
    if coll is None:
        return docs
    if hint is None or (isinstance(hint, (dict, str)) and not hint):
        raise MongoError(51173, "When using min()/max() a hint of which index to use must "
                                "be provided")
    if is_natural(hint):
        raise MongoError(2, "min and max are incompatible with $natural")
    idx = resolve_hint(coll, hint, ns)
    assert idx is not None
    key = idx.spec["key"]
    fields = list(key.keys())
    directions = [-1 if isinstance(v, (int, float)) and v < 0 else 1 for v in key.values()]
    for bound in (min_doc, max_doc):
        if bound and list(bound.keys()) != fields[:len(bound)]:
            raise MongoError(51174, "The index chosen is not compatible with min/max")
    lo = list(min_doc.values()) if min_doc else None
    hi = list(max_doc.values()) if max_doc else None
    if lo is not None and hi is not None:
        n = min(len(lo), len(hi))
        if _cmp_keys(lo[:n], hi[:n], directions) >= 0 and len(lo) == len(hi):
            raise MongoError(51175, "The value provided for min() does not come before the "
                                    "value provided for max() in the hinted index")
    out = []
    for d in docs:
        k = _key_tuple(d, fields)
        if lo is not None and _cmp_keys(k[:len(lo)], lo, directions) < 0:
            continue
        if hi is not None and _cmp_keys(k[:len(hi)], hi, directions) >= 0:
            continue
        out.append(d)
    return sorted(out, key=functools.cmp_to_key(
        lambda a, b: _cmp_keys(_key_tuple(a, fields), _key_tuple(b, fields), directions)))


