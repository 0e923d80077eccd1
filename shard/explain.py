"""The shard's query plans for ``explain`` (mongod 8.0's classic engine output:
``plan_explainer_impl.cpp``, ``query_planner.cpp``).

The plan reported is the plan that runs: :func:`shard.planner.choose` (the index a find,
count, distinct, update or delete reads through, or a collection scan), and the
``executionStats`` counters are those of running it (``keysExamined``/``docsExamined`` of the
index scan and its FETCH; a collection scan examines every document).

* Index choice: :mod:`shard.planner` (a hint forces its index when the planner can use it,
  else a collection scan); ``{$natural}`` hints scan the collection. A filter that is
  exactly ``{_id: <value>}`` is mongod 8.0's express path (``EXPRESS_IXSCAN``); other
  ``_id`` equalities and ``$in`` read the ``_id`` index (``IXSCAN`` on ``_id_``).
* An index that gives the sort has no ``SORT`` stage (a ``LIMIT`` over the FETCH instead),
  scanned ``backward`` when the sort is the key pattern reversed.
* Stages: ``COLLSCAN`` (``filter``, ``direction``) or ``FETCH`` over ``IXSCAN``
  (``keyPattern``, ``indexName``, ``isMultiKey``, ``multiKeyPaths``, ``isUnique``,
  ``isSparse``, ``isPartial``, ``indexVersion``, ``direction``, ``indexBounds``), with
  ``SHARDING_FILTER`` on a sharded collection, then ``SORT`` (``sortPattern``, ``memLimit``,
  ``type: "simple"``, ``limitAmount`` with a limit), ``SKIP``, ``LIMIT``,
  ``PROJECTION_SIMPLE``/``PROJECTION_DEFAULT``; ``COUNT``, ``UPDATE``, ``DELETE`` roots for
  those commands.
* ``executionStats``: ``{executionSuccess, nReturned, executionTimeMillis,
  totalKeysExamined, totalDocsExamined, executionStages}`` where every stage carries
  ``nReturned, executionTimeMillisEstimate, works, advanced, needTime, needYield, saveState,
  restoreState, isEOF`` and its own counters (``docsExamined``, ``keysExamined``, ``seeks``,
  ``nMatched``/``nWouldModify``/``nWouldUpsert``, ``nWouldDelete``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson.max_key import MaxKey
from bson.min_key import MinKey

from shardsim.core import query as q
from shardsim.core.explain_common import parsed_query
from shardsim.shard import planner

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.storage import Collection, Index

_RANGE_OPS = {"$eq", "$gt", "$gte", "$lt", "$lte", "$in"}


class Plan:
    """A winning plan: ``tree`` (the ``winningPlan`` document) and how it reads the data
    (``index`` or None for a collection scan, ``express`` for the _id fast path)."""

    def __init__(self, tree: dict[str, Any], index: "Index | None", express: bool,
                 run: "planner.Plan | None" = None) -> None:
        self.tree = tree
        self.index = index
        self.express = express
        self.run = run  # the planner's plan (None: collection scan or the _id path)
        self.run_limit = 0  # documents the index plan stops after (sort from the index)


def _constrains(filt: dict[str, Any], field: str) -> bool:
    """Whether ``filt`` bounds ``field`` (equality, range or $in at the top level)."""
    if field not in filt:
        return False
    v = filt[field]
    if isinstance(v, dict) and v and all(str(k).startswith("$") for k in v):
        return any(k in _RANGE_OPS for k in v)
    return True


def choose_index(coll: "Collection | None", filt: dict[str, Any], hint: Any,
                 sort: Any = None) -> "tuple[Index | None, planner.Plan | None]":
    """``(index, planner plan)`` the query reads through (``(None, None)``: a collection
    scan; ``(_id_, None)``: the ``_id`` map, for an ``_id`` equality or ``$in``)."""
    if coll is None:
        return None, None
    from shardsim.shard.hints import resolve_hint
    hinted = hint is not None and hint != {} and hint != ""
    hint_index = resolve_hint(coll, hint) if hinted else None
    if (hint_index is None or hint_index.name == "_id_") and "_id_" in coll.indexes and \
            q.pinned_id_keys(filt) is not None:
        return coll.indexes["_id_"], None
    run = planner.choose(coll, filt, sort, hint_index)
    return (run.index, run) if run is not None else (None, None)


def _bounds(idx: "Index", filt: dict[str, Any]) -> dict[str, list[str]]:
    """``indexBounds``: per key field, the interval strings mongod prints."""
    out = {}
    for f, direction in idx.spec["key"].items():
        v = filt.get(f, _ABSENT)
        out[f] = [_interval(v, direction)]
    return out


_ABSENT = object()


def _fmt(v: Any) -> str:
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, MinKey):
        return "MinKey"
    if isinstance(v, MaxKey):
        return "MaxKey"
    return repr(v) if not isinstance(v, (int, float)) else str(v)


def _interval(v: Any, direction: Any) -> str:
    """One interval: ``[v, v]`` for equality, the range of ``$gt``/``$lt``..., else all."""
    lo, hi, lo_inc, hi_inc = MinKey(), MaxKey(), True, True
    if v is not _ABSENT:
        if isinstance(v, dict) and v and all(str(k).startswith("$") for k in v):
            for op, arg in v.items():
                if op == "$eq":
                    lo = hi = arg
                elif op in ("$gt", "$gte"):
                    lo, lo_inc = arg, op == "$gte"
                elif op in ("$lt", "$lte"):
                    hi, hi_inc = arg, op == "$lte"
        else:
            lo = hi = v
    text = f"{'[' if lo_inc else '('}{_fmt(lo)}, {_fmt(hi)}{']' if hi_inc else ')'}"
    if isinstance(direction, (int, float)) and direction < 0:
        text = f"{'[' if hi_inc else '('}{_fmt(hi)}, {_fmt(lo)}{']' if lo_inc else ')'}"
    return text


def ixscan_stage(idx: "Index", filt: dict[str, Any],
                 run: "planner.Plan | None" = None) -> dict[str, Any]:
    key = dict(idx.spec["key"])
    multi = bool(idx.sorted is not None and idx.sorted.multikey)
    return {"stage": "IXSCAN", "keyPattern": key, "indexName": idx.name, "isMultiKey": multi,
            "multiKeyPaths": {f: [f] if multi else [] for f in key},
            "isUnique": bool(idx.spec.get("unique"))
            or idx.name == "_id_", "isSparse": idx.sparse, "isPartial": idx.partial is not None,
            "indexVersion": 2, "direction": "backward" if run is not None and run.reverse
            else "forward", "indexBounds": _bounds(idx, filt if run is None or run.used
                                                   else {})}


def scan_plan(coll: "Collection | None", filt: dict[str, Any], hint: Any,
              natural_dir: int = 1, sort: Any = None) -> Plan:
    """The access part of a plan: ``COLLSCAN``, ``FETCH``+``IXSCAN`` or ``EXPRESS_IXSCAN``,
    under ``SHARDING_FILTER`` for a sharded collection."""
    pq = parsed_query(filt)
    if isinstance(hint, dict) and "$natural" in hint:
        natural_dir = -1 if hint["$natural"] in (-1, -1.0) else 1
        hint = None
        idx, run = None, None
    else:
        idx, run = choose_index(coll, filt, hint, sort)
    if coll is not None and hint is None and list(filt) == ["_id"] and \
            not isinstance(filt["_id"], dict) and "_id_" in coll.indexes:
        return Plan({"stage": "EXPRESS_IXSCAN", "keyPattern": "{ _id: 1 }",
                     "indexName": "_id_"}, coll.indexes["_id_"], True)
    if idx is None:
        tree: dict[str, Any] = {"stage": "COLLSCAN"}
        if pq:
            tree["filter"] = pq
        tree["direction"] = "forward" if natural_dir >= 0 else "backward"
    else:
        rest = dict(filt) if run is not None else \
            {k: v for k, v in filt.items() if k not in idx.fields[:1]}
        tree = {"stage": "FETCH"}
        if rest:
            tree["filter"] = parsed_query(rest)
        tree["inputStage"] = ixscan_stage(idx, filt, run)
    if coll is not None and coll.shard_key:
        tree = {"stage": "SHARDING_FILTER", "inputStage": tree}
    return Plan(tree, idx, False, run)


def find_plan(coll: "Collection | None", filt: dict[str, Any], sort: Any, skip: int,
              limit: int, projection: Any, hint: Any) -> Plan:
    """The plan of a find (also an aggregate's pushed-down part)."""
    plan = scan_plan(coll, filt, hint, sort=sort)
    if plan.express:
        return plan
    tree = plan.tree
    by_index = plan.run is not None and plan.run.sorted_by_index
    if by_index and limit:
        plan.run_limit = skip + limit
    if sort and by_index:
        if limit:
            tree = {"stage": "LIMIT", "limitAmount": limit + skip, "inputStage": tree}
    elif sort:
        tree = {"stage": "SORT", "sortPattern": dict(sort), "memLimit": 104857600,
                **({"limitAmount": limit + skip} if limit else {}), "type": "simple",
                "inputStage": tree}
    if skip:
        tree = {"stage": "SKIP", "skipAmount": skip, "inputStage": tree}
    if limit and not sort:
        tree = {"stage": "LIMIT", "limitAmount": limit, "inputStage": tree}
    if projection:
        simple = all(v in (0, 1, True, False) for v in projection.values())
        tree = {"stage": "PROJECTION_SIMPLE" if simple else "PROJECTION_DEFAULT",
                "transformBy": dict(projection), "inputStage": tree}
    plan.tree = tree
    return plan


# -- execution statistics --------------------------------------------------------------------
def _examined(coll: "Collection | None", plan: Plan, filt: dict[str, Any]) -> tuple[int, int]:
    """``(keysExamined, docsExamined)`` of the plan's scan."""
    if coll is None:
        return 0, 0
    if plan.index is None:
        return 0, len(coll.docs)
    if plan.run is not None:  # run the plan: its own counters
        run = plan.run
        run.keys_examined = run.docs_examined = run.n_returned = 0
        for _ in planner.execute(run, coll, filt, q.matches, plan.run_limit):
            pass
        return run.keys_examined, run.docs_examined
    if plan.index.name == "_id_":
        n = sum(1 for _ in q.select(coll, filt))
        return n, n
    first = plan.index.fields[0]
    if plan.express or first in filt:
        n = sum(1 for _ in q.select(coll, {first: filt[first]}))
        return n, n
    return len(coll.docs), len(coll.docs)


_COUNTERS = ("nReturned", "executionTimeMillisEstimate", "works", "advanced", "needTime",
             "needYield", "saveState", "restoreState", "isEOF")


def _with_stats(tree: dict[str, Any], returned: int, keys: int, docs: int) -> dict[str, Any]:
    """``tree`` with each stage's counters (the leaf's examined counts; every stage returns
    ``returned``)."""
    out: dict[str, Any] = {"stage": tree["stage"]}
    if "filter" in tree:
        out["filter"] = tree["filter"]
    works = max(keys, docs) + 1
    n = 0 if tree["stage"] in ("COUNT", "UPDATE", "DELETE") else returned  # roots that return
    out.update(dict(zip(_COUNTERS, (n, 0, works, n, works - n - 1, 0, 0, 0, 1))))
    for k, v in tree.items():
        if k not in ("stage", "filter", "inputStage"):
            out[k] = v
    stage = tree["stage"]
    if stage == "COLLSCAN":
        out["docsExamined"] = docs
    elif stage in ("IXSCAN", "EXPRESS_IXSCAN"):
        out.update({"keysExamined": keys, "seeks": 1, "dupsTested": 0, "dupsDropped": 0})
        if stage == "EXPRESS_IXSCAN":
            out["docsExamined"] = docs
    elif stage == "FETCH":
        out.update({"docsExamined": docs, "alreadyHasObj": 0})
    if "inputStage" in tree:
        out["inputStage"] = _with_stats(tree["inputStage"], returned, keys, docs)
    return out


def execution_stats(coll: "Collection | None", plan: Plan, filt: dict[str, Any],
                    returned: int, root_extra: dict[str, Any] | None = None,
                    returned_top: int | None = None) -> dict[str, Any]:
    """The ``executionStats`` section (``root_extra``: the root stage's own counters, e.g.
    ``nWouldModify``; ``returned_top``: the command's ``nReturned`` when it differs)."""
    keys, docs = _examined(coll, plan, filt)
    stages = _with_stats(plan.tree, returned, keys, docs)
    if root_extra:
        stages.update(root_extra)
    return {"executionSuccess": True,
            "nReturned": returned if returned_top is None else returned_top,
            "executionTimeMillis": 0, "totalKeysExamined": keys, "totalDocsExamined": docs,
            "executionStages": stages}


def matching(coll: "Collection | None", filt: dict[str, Any]) -> list[dict[str, Any]]:
    """The documents ``filt`` selects in ``coll``."""
    return [d for _, d in q.select(coll, filt)] if coll is not None else []


def first_matching(coll: "Collection | None", filt: dict[str, Any],
                   sort: Any) -> dict[str, Any] | None:
    """The document a findAndModify/updateOne with ``sort`` would pick."""
    docs = matching(coll, filt)
    if sort:
        docs = q.sort_docs(docs, sort)
    return docs[0] if docs else None

