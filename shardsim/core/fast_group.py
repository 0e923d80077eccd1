"""A native ``$group`` for the shapes counting and simple tallies use, before mongomock's.

mongomock's ``$group`` (``aggregate._handle_group_stage``) sorts every input document by its
group key with the interpreted BSON comparison (about 40 µs per document). The common shapes
are done here in one pass over the documents, with mongomock's result: the groups in ascending
key order (the same comparison, over the distinct keys only), ``_id`` then the accumulators
(mongod's ``DocumentSourceGroup`` field order).

Handled: ``_id`` a constant (``count_documents``: ``{_id: 1, n: {$sum: 1}}``) or ``"$field"``
(a top-level field whose values are all ints, strings, null or missing); accumulators
``{$sum: <int>}`` and ``{$sum: "$field"}`` over int values (missing or null add nothing).
Anything else (other value types, other accumulators or expressions) returns None and the
stage runs in mongomock as before. A constant ``_id`` needs only ``len(docs)``: the count of
a collection is O(1).
"""

from __future__ import annotations

from typing import Any, Sized

_MISSING = object()


def _int(v: Any) -> bool:
    return type(v) is int


def _plan(spec: Any) -> tuple[Any, list[tuple[str, Any]]] | None:
    """``(key, [(name, accumulator)])``: key ``("const", v)`` or ``("field", name)``;
    accumulator ``("count", k)`` or ``("sum", field)``. None when not handled."""
    if not isinstance(spec, dict) or "_id" not in spec:
        return None
    key_spec = spec["_id"]
    if isinstance(key_spec, str) and key_spec.startswith("$"):
        name = key_spec[1:]
        if not name or "." in name or name.startswith("$"):
            return None
        key: Any = ("field", name)
    elif key_spec is None or _int(key_spec) or (isinstance(key_spec, str)):
        key = ("const", key_spec)
    else:
        return None
    accs = []
    for out, acc in spec.items():
        if out == "_id":
            continue
        if not isinstance(out, str) or not out or out.startswith("$") or "." in out or \
                not isinstance(acc, dict) or list(acc) != ["$sum"]:
            return None
        arg = acc["$sum"]
        if _int(arg):
            accs.append((out, ("count", arg)))
        elif isinstance(arg, str) and arg.startswith("$") and len(arg) > 1 and \
                "." not in arg and not arg.startswith("$$"):
            accs.append((out, ("sum", arg[1:])))
        else:
            return None
    return key, accs


def is_count(pipeline: list[Any]) -> bool:
    """True when ``pipeline`` starts with a ``$group`` on a constant ``_id`` whose accumulators
    all count (``{$sum: <int>}``): its result needs only the number of input documents."""
    if not pipeline or not isinstance(pipeline[0], dict) or list(pipeline[0]) != ["$group"]:
        return False
    plan = _plan(pipeline[0]["$group"])
    return plan is not None and plan[0][0] == "const" and all(a[0] == "count" for _, a in plan[1])


def group(docs: Sized, pipeline: list[Any]) -> tuple[list[dict[str, Any]], list[Any]] | None:
    """``(grouped documents, rest of the pipeline)`` when ``pipeline`` starts with a ``$group``
    handled here, else None. ``docs``: the stage's input (any sized iterable of documents)."""
    if not pipeline or not isinstance(pipeline[0], dict) or list(pipeline[0]) != ["$group"]:
        return None
    plan = _plan(pipeline[0]["$group"])
    if plan is None:
        return None
    (kind, key), accs = plan
    if kind == "const" and all(a[0] == "count" for _, a in accs):
        n = len(docs)
        out = [{"_id": key, **{name: a[1] * n for name, a in accs}}] if n else []
        return out, pipeline[1:]
    groups: dict[Any, list[Any]] = {}
    keys: dict[Any, Any] = {}
    for doc in docs:
        if kind == "field":
            k = doc.get(key, None)
            if k is not None and not _int(k) and type(k) is not str:
                return None
            hk = (type(k) is str, k)
        else:
            k, hk = key, None
        acc = groups.get(hk)
        if acc is None:
            acc = groups[hk] = [0] * len(accs)
            keys[hk] = k
        for i, (_name, (op, arg)) in enumerate(accs):
            if op == "count":
                acc[i] += arg
            else:
                v = doc.get(arg, None)
                if v is None:
                    continue
                if not _int(v):
                    return None
                acc[i] += v
    from shardsim.core.query import _SortKey
    order = sorted(groups, key=lambda hk: _SortKey(keys[hk]))
    return [{"_id": keys[hk], **{name: groups[hk][i] for i, (name, _a) in enumerate(accs)}}
            for hk in order], pipeline[1:]
