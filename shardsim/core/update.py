"""The update language: mongod 8.0's update operators and the ``$v: 2`` oplog diff.

mongomock (through :mod:`shardsim.core.query`) supplies the structural operators
(``$set``/``$unset``/``$pop``/``$push`` with modifiers/``$pull``/``$pullAll``/``$addToSet``/
``$setOnInsert``, pipeline updates). The value-computing operators (``$inc``, ``$mul``,
``$min``, ``$max``, ``$bit``, ``$currentDate``) are ours, type-exact as mongod's ``SafeNum``, in
:mod:`shardsim.core.update_ops`. This module adds dotted ``$rename``, mongod's order of application
(paths sorted like ``UpdateObjectNode``'s children, not the order the operators were sent), the
``_id`` immutability and operator validation errors with mongod's codes, and — the part change
streams depend on — the ``$v: 2`` update diff written to the oplog (``doc_diff.cpp`` format:
``d`` deleted, ``u`` updated, ``i`` inserted, ``s<field>`` sub-diff, arrays ``a: true``,
``l`` new length, ``u<idx>``/``s<idx>``).

Stored documents are never mutated: :func:`apply_update` returns a new document.
"""

from __future__ import annotations

import re
from typing import Any

import bson
from bson import Regex

from shardsim.core.errors import MongoError
from shardsim.core import update_ops
from shardsim.core.values import get_path, id_key
from shardsim.core.query import MM_SCRATCH, deep_copy, matches, rewrite_stage, translate_error

UPDATE_OPERATORS = frozenset({
    "$set", "$unset", "$inc", "$mul", "$min", "$max", "$rename", "$push", "$pull", "$pullAll",
    "$addToSet", "$pop", "$currentDate", "$setOnInsert", "$bit",
})



def classify_update(update: Any) -> str:
    """``"pipeline"``, ``"operators"`` or ``"replacement"``; FailedToParse (9) on a mix."""
    if isinstance(update, list):
        return "pipeline"
    if not isinstance(update, dict):
        raise MongoError(14, "Update argument must be either an object or an array")
    if not update:
        return "replacement"
    first = next(iter(update))
    if first.startswith("$"):
        for k in update:
            if not k.startswith("$"):
                raise MongoError(9, f"Unknown modifier: {k}. Expected a valid update modifier or "
                                    f"pipeline-style update specified as an array")
        return "operators"
    for k in update:
        if k.startswith("$"):
            raise MongoError(52, f"The dollar ($) prefixed field '{k}' in '{k}' is not allowed "
                                 f"in the context of an update's replacement document. Consider "
                                 f"using an aggregation pipeline with $replaceWith.")
    return "replacement"


def validate_update(update: Any) -> str:
    """Parse-time checks of an update (before any document is matched); returns its kind."""
    kind = classify_update(update)
    if kind == "operators":
        _validate_operators(update)
    elif kind == "pipeline":
        for stage in update:
            rewrite_stage(stage)
    return kind


def _validate_operators(update: dict[str, Any]) -> None:
    for op, arg in update.items():
        if op not in UPDATE_OPERATORS:
            raise MongoError(9, f"Unknown modifier: {op}. Expected a valid update modifier or "
                                f"pipeline-style update specified as an array")
        if not isinstance(arg, dict):
            raise MongoError(9, f"Modifiers operate on fields but we found type "
                                f"{type(arg).__name__} instead. For example: {{$mod: {{<field>: ...}}}} "
                                f"not {{{op}: {arg!r}}}")
        for path in arg:
            if path == "_id" or path.startswith("_id."):
                if op not in ("$setOnInsert",):
                    # Checked after applying (an equal value is allowed), see apply_update.
                    pass
            if path == "" or path.endswith(".") or ".." in path:
                raise MongoError(56, "An empty update path is not valid.")
            if op in update_ops.OWNED_OPERATORS:
                update_ops.validate_operand(op, path, arg[path])
    # Two modifiers on the same path or on a path and its prefix conflict (update_driver.cpp).
    seen: list[tuple[str, ...]] = []
    for op, arg in update.items():
        targets = list(arg)
        if op == "$rename":
            targets += [v for v in arg.values() if isinstance(v, str)]
        for path in targets:
            parts = tuple(path.split("."))
            for other in seen:
                n = min(len(parts), len(other))
                if parts[:n] == other[:n]:
                    raise MongoError(40, f"Updating the path '{path}' would create a conflict at "
                                         f"'{'.'.join(parts[:n])}'")
            seen.append(parts)


def _set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    cur: Any = doc
    for p in parts[:-1]:
        if isinstance(cur, list) and p.isdigit():
            cur = cur[int(p)]
            continue
        if p not in cur or not isinstance(cur[p], (dict, list)):
            cur[p] = {}
        cur = cur[p]
    last = parts[-1]
    if isinstance(cur, list) and last.isdigit():
        i = int(last)
        while len(cur) <= i:
            cur.append(None)
        cur[i] = value
    else:
        cur[last] = value


def _pop_path(doc: dict[str, Any], path: str) -> tuple[bool, Any]:
    parts = path.split(".")
    found, parent = (True, doc) if len(parts) == 1 else get_path(doc, ".".join(parts[:-1]))
    if not found or not isinstance(parent, dict) or parts[-1] not in parent:
        return False, None
    return True, parent.pop(parts[-1])


def _apply_rename(doc: dict[str, Any], arg: dict[str, Any]) -> None:
    for src, dst in arg.items():
        if not isinstance(dst, str):
            raise MongoError(2, f"The 'to' field for $rename must be a string: {src}: {dst!r}")
        if src == dst:
            raise MongoError(2, f"The source and target field for $rename must differ: {src}: {dst!r}")
        found, value = _pop_path(doc, src)
        if found:
            _set_path(doc, dst, value)


_IDENT = re.compile(r"^[a-z][a-zA-Z0-9]*$")


def parse_array_filters(array_filters: Any) -> dict[str, list[dict[str, Any]]]:
    """``arrayFilters`` -> identifier -> element filters (keys rewritten onto ``x``).

    Errors like mongod: FailedToParse (9) for a filter naming no or several identifiers,
    BadValue (2) for a bad identifier."""
    out: dict[str, list[dict[str, Any]]] = {}
    if array_filters is None:
        return out
    if not isinstance(array_filters, list):
        raise MongoError(14, "BSON field 'arrayFilters' is the wrong type, expected type 'array'")
    for f in array_filters:
        if not isinstance(f, dict) or not f:
            raise MongoError(9, "Cannot use an expression without a top-level field name in arrayFilters")
        idents = {k.split(".", 1)[0] for k in f if not k.startswith("$")}
        if len(idents) != 1:
            raise MongoError(9, "Error parsing array filter :: caused by :: Expected a single "
                                "top-level field name, found " + ", ".join(sorted(idents)))
        ident = idents.pop()
        if not _IDENT.match(ident):
            raise MongoError(2, f"Error parsing array filter :: caused by :: The top-level field name "
                                f"must be an alphanumeric string beginning with a lowercase letter, "
                                f"found '{ident}'")
        if ident in out:
            raise MongoError(9, f"Found multiple array filters with the same top-level field name {ident}")
        out[ident] = [{("x" + k[len(ident):]): v for k, v in f.items()}]
    return out


def expand_positional(doc: dict[str, Any], update: Any, query: dict[str, Any] | None,
                      array_filters: Any = None) -> Any:
    """Rewrite ``$``, ``$[]`` and ``$[<id>]`` path components of an operator update into the
    concrete array indices they select in ``doc`` (so the update and its oplog diff name real
    paths). ``$`` is the first element that made ``query`` match; ``$[<id>]`` every element
    matching the ``arrayFilters`` entry for ``<id>``. Errors: BadValue (2) when ``$`` has no
    match or an identifier has no filter; FailedToParse (9) for an unused filter."""
    filters = parse_array_filters(array_filters)
    if not isinstance(update, dict) or not update or not next(iter(update)).startswith("$"):
        if filters:
            raise MongoError(9, f"The array filter for identifier '{next(iter(filters))}' was not "
                                f"used in the update {update}")
        return update
    used: set[str] = set()
    out: dict[str, Any] = {}
    for op, arg in update.items():
        if not isinstance(arg, dict) or not any("$" in p for p in arg):
            out[op] = arg
            continue
        new_arg: dict[str, Any] = {}
        for path, value in arg.items():
            parts = path.split(".")
            if not any(p == "$" or p.startswith("$[") for p in parts):
                new_arg[path] = value
                continue
            for concrete in _expand_parts(doc, parts, [], query or {}, filters, used, path):
                new_arg[".".join(concrete)] = value
        out[op] = new_arg
    for ident in filters:
        if ident not in used:
            raise MongoError(9, f"The array filter for identifier '{ident}' was not used in the "
                                f"update {update}")
    return out


def _expand_parts(cur: Any, parts: list[str], done: list[str], query: dict[str, Any],
                  filters: dict[str, list[dict[str, Any]]], used: set[str], path: str) -> list[list[str]]:
    if not parts:
        return [done]
    head, rest = parts[0], parts[1:]
    if head == "$":
        if not isinstance(cur, list):
            raise MongoError(2, "The positional operator did not find the match needed from the query.")
        prefix = ".".join(done)
        sub = {k: v for k, v in query.items() if k == prefix or k.startswith(prefix + ".")}
        for i, elem in enumerate(cur):
            probe: dict[str, Any] = {}
            _set_path(probe, prefix, [elem])
            if sub and matches(sub, probe):
                return _expand_parts(elem, rest, done + [str(i)], query, filters, used, path)
        raise MongoError(2, "The positional operator did not find the match needed from the query.")
    if head.startswith("$[") and head.endswith("]"):
        ident = head[2:-1]
        if ident and ident not in filters:
            raise MongoError(2, f"No array filter found for identifier '{ident}' in path '{path}'")
        if not isinstance(cur, list):
            if cur is None:
                return []
            raise MongoError(2, f"Cannot apply array updates to non-array element {'.'.join(done)}")
        used.add(ident)
        out: list[list[str]] = []
        for i, elem in enumerate(cur):
            if ident and not all(matches(f, {"x": elem}) for f in filters[ident]):
                continue
            out += _expand_parts(elem, rest, done + [str(i)], query, filters, used, path)
        return out
    if isinstance(cur, dict):
        nxt = cur.get(head)
    elif isinstance(cur, list) and head.isdigit() and int(head) < len(cur):
        nxt = cur[int(head)]
    else:
        nxt = None
    return _expand_parts(nxt, rest, done + [head], query, filters, used, path)


def apply_update(doc: dict[str, Any], update: Any, spec: dict[str, Any] | None, *,
                 is_insert: bool = False) -> dict[str, Any]:
    """The document after ``update`` (operators, replacement or pipeline) applied to ``doc``.

    ``doc`` is not modified. Raises mongod's errors: ImmutableField (66) when ``_id`` changes,
    FailedToParse (9) for unknown modifiers, TypeMismatch (14) for bad operands.
    """
    kind = classify_update(update)
    old_id = doc.get("_id", _MISSING)
    if kind == "replacement":
        new = {"_id": old_id} if old_id is not _MISSING else {}
        for k, v in update.items():
            if k == "_id":
                continue
            new[k] = deep_copy(v)
        if "_id" in update:
            if old_id is not _MISSING and id_key(update["_id"]) != id_key(old_id):
                raise MongoError(66, f"After applying the update, the (immutable) field '_id' was "
                                     f"found to have been altered to _id: {update['_id']!r}")
            if old_id is _MISSING:
                new = {"_id": update["_id"], **new}
        return new
    new = deep_copy(doc)
    try:
        if kind == "pipeline":
            MM_SCRATCH._apply_update_pipeline(new, [rewrite_stage(s) for s in update], None)
        else:
            _validate_operators(update)
            _apply_operators(new, update, spec or {}, is_insert)
    except MongoError:
        raise
    except Exception as exc:
        raise translate_error(exc) from None
    new_id = new.get("_id", _MISSING)
    if kind == "pipeline" and new_id is _MISSING and old_id is not _MISSING:
        # a pipeline that drops _id keeps the original (PipelineExecutor: the _id is
        # preserved, src/mongo/db/update/pipeline_executor.cpp)
        new = {"_id": old_id, **new}
        new_id = old_id
    if old_id is not _MISSING and (new_id is _MISSING or id_key(new_id) != id_key(old_id)
                                   or type(new_id) is not type(old_id)):
        raise MongoError(66, "Performing an update on the path '_id' would modify the immutable field '_id'")
    if old_id is not _MISSING and next(iter(new)) != "_id":
        new = {"_id": new.pop("_id"), **new}
    return new


_MISSING = object()


def _apply_operators(new: dict[str, Any], update: dict[str, Any], spec: dict[str, Any],
                     is_insert: bool) -> None:
    """Apply an operator update to ``new`` in place, one path at a time in mongod's order
    (``UpdateObjectNode`` applies its children sorted by path; a ``$rename`` sits at its
    destination)."""
    entries: list[tuple[Any, str, str, Any]] = []
    for op, arg in update.items():
        if op == "$setOnInsert" and not is_insert:
            continue
        for path, value in arg.items():
            at = value if op == "$rename" and isinstance(value, str) else path
            entries.append((update_ops.path_sort_key(at), op, path, value))
    entries.sort(key=lambda e: e[0])
    for _key, op, path, value in entries:
        if op in update_ops.OWNED_OPERATORS:
            update_ops.apply_operator(new, op, path, value)
        elif op == "$rename":
            _apply_rename(new, {path: value})
        elif op == "$setOnInsert":
            MM_SCRATCH._apply_update_document(new, spec, {"$set": {path: value}}, is_insert)
        else:
            MM_SCRATCH._apply_update_document(new, spec, {op: {path: value}}, is_insert)


# -- the $v: 2 diff ---------------------------------------------------------------------------

def same(a: Any, b: Any) -> bool:
    """BSON-identical: same types, same field order, same values (1 and 1.0 differ)."""
    ta = type(a)
    if ta is not type(b):
        return False
    if ta is dict:
        if len(a) != len(b) or list(a) != list(b):
            return False
        return all(same(a[k], b[k]) for k in a)
    if ta is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if ta is float and a != a and b != b:
        return True
    return a == b


def is_noop(pre: dict[str, Any], post: dict[str, Any], update: Any) -> bool:
    """Whether mongod would treat the update as a no-op (no write, no oplog entry, nModified 0).

    Operators and pipelines: the result is BSON-identical to the original. Replacements: only
    when the replacement as sent (with its ``_id``) is binary-equal to the original document
    (``ObjectReplaceExecutor::applyReplacementUpdate``); a replacement without ``_id`` always
    writes.
    """
    if isinstance(update, dict) and (not update or not next(iter(update)).startswith("$")):
        return "_id" in update and same(pre, update)
    return same(pre, post)


def update_paths(update: dict[str, Any]) -> tuple[list[tuple[str, ...]], set[tuple[str, ...]]]:
    """The paths an operator update touches (split on dots) and the ``$push``/``$addToSet``
    targets (logged as appended elements when the array only grew)."""
    paths: list[tuple[str, ...]] = []
    appends: set[tuple[str, ...]] = set()
    for op, arg in update.items():
        if not isinstance(arg, dict):
            continue
        for p, v in arg.items():
            t = tuple(p.split("."))
            paths.append(t)
            if op == "$rename" and isinstance(v, str):
                paths.append(tuple(v.split(".")))
            if op == "$push":
                appends.add(t)
    return paths, appends


def _part_matches(pattern: str, actual: str) -> bool:
    return pattern == actual or pattern == "$" or pattern.startswith("$[")


def _descends(paths: list[tuple[str, ...]] | None, child: tuple[str, ...]) -> bool:
    if paths is None:
        return True
    n = len(child)
    for p in paths:
        if len(p) > n and all(_part_matches(p[i], child[i]) for i in range(n)):
            return True
    return False


def _obj_diff(pre: dict[str, Any], post: dict[str, Any], prefix: tuple[str, ...],
              paths: list[tuple[str, ...]] | None, appends: set[tuple[str, ...]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    u: dict[str, Any] = {}
    i: dict[str, Any] = {}
    s: dict[str, Any] = {}
    for k in pre:
        if k not in post:
            d[k] = False
    for k, v in post.items():
        if k not in pre:
            i[k] = v
            continue
        old = pre[k]
        if same(old, v):
            continue
        child = prefix + (k,)
        sub = _child_diff(old, v, child, paths, appends)
        if sub is None:
            u[k] = v
        else:
            s["s" + k] = sub
    out: dict[str, Any] = {}
    if d:
        out["d"] = d
    if u:
        out["u"] = u
    if i:
        out["i"] = i
    out.update(s)
    return out


def _child_diff(old: Any, new: Any, child: tuple[str, ...], paths: list[tuple[str, ...]] | None,
                appends: set[tuple[str, ...]]) -> dict[str, Any] | None:
    """A sub-diff for a changed value, or None to log the whole new value."""
    if type(old) is dict and type(new) is dict:
        if _descends(paths, child):
            return _obj_diff(old, new, child, paths, appends)
        return None
    if type(old) is list and type(new) is list:
        if paths is None:
            return _arr_diff(old, new, child, paths, appends, allow_shrink=True)
        grown = len(new) > len(old) and all(same(a, b) for a, b in zip(old, new))
        if child in appends and grown:
            return _arr_diff(old, new, child, paths, appends, allow_shrink=False)
        if _descends(paths, child) and len(new) >= len(old):
            return _arr_diff(old, new, child, paths, appends, allow_shrink=False)
    return None


def _arr_diff(pre: list[Any], post: list[Any], prefix: tuple[str, ...],
              paths: list[tuple[str, ...]] | None, appends: set[tuple[str, ...]], *,
              allow_shrink: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"a": True}
    if len(post) < len(pre) and allow_shrink:
        out["l"] = len(post)
    for idx, v in enumerate(post):
        if idx >= len(pre):
            out[f"u{idx}"] = v
            continue
        if same(pre[idx], v):
            continue
        sub = _child_diff(pre[idx], v, prefix + (str(idx),), paths, appends)
        if sub is None:
            out[f"u{idx}"] = v
        else:
            out[f"s{idx}"] = sub
    return out


def update_diff(pre: dict[str, Any], post: dict[str, Any], update: Any) -> dict[str, Any]:
    """The oplog ``o`` of an update: ``{$v: 2, diff: {...}}``, or the full post-image for a
    replacement (and for a pipeline update whose diff would be larger than the document, as
    ``doc_diff::computeOplogDiff`` decides)."""
    kind = classify_update(update)
    if kind == "replacement":
        return post
    if kind == "operators":
        paths, appends = update_paths(update)
        return {"$v": 2, "diff": _obj_diff(pre, post, (), paths, appends)}
    diff = _obj_diff(pre, post, (), None, set())
    if len(bson.encode({"$v": 2, "diff": diff})) > len(bson.encode(post)):
        return post
    return {"$v": 2, "diff": diff}


def upsert_seed(query: dict[str, Any]) -> dict[str, Any]:
    """The document an upsert starts from: the query's equality fields (``_id`` first)."""
    seed: dict[str, Any] = {}

    def walk(q: dict[str, Any]) -> None:
        for k, v in q.items():
            if k == "$and" and isinstance(v, list):
                for sub in v:
                    if isinstance(sub, dict):
                        walk(sub)
                continue
            if k.startswith("$"):
                continue
            if isinstance(v, dict) and any(isinstance(x, str) and x.startswith("$") for x in v):
                if "$eq" in v:
                    _set_path(seed, k, deep_copy(v["$eq"]))
                continue
            if isinstance(v, Regex) or type(v).__name__ == "Pattern":
                continue
            _set_path(seed, k, deep_copy(v))

    walk(query or {})
    if "_id" in seed and next(iter(seed)) != "_id":
        seed = {"_id": seed.pop("_id"), **seed}
    return seed
