"""The shard's ``explain`` command (``explain_cmd.cpp``; the commands' ``explain()``
methods): ``{explain: <find | count | distinct | aggregate | update | delete |
findAndModify>, verbosity}``.

Reply: ``{explainVersion: "1", queryPlanner: {namespace, parsedQuery, indexFilterSet,
queryHash, planCacheKey, optimizationTimeMillis, maxIndexedOrSolutionsReached,
maxIndexedAndSolutionsReached, maxScansToExplodeReached, prunedSimilarIndexes, winningPlan,
rejectedPlans}[, executionStats], command, serverInfo, serverParameters}`` — an aggregate
with stages beyond a leading ``$match`` gives ``stages: [{$cursor: {queryPlanner[,
executionStats]}}, <the other stages>]`` instead of ``queryPlanner``. Plans and stats come
from :mod:`shard.explain`; writes are planned, never applied. Errors: FailedToParse (9) for
a bad request or verbosity, InvalidLength (16) for an update/delete batch of more than one
statement, IllegalOperation (20) for insert, CommandNotFound (59) for other commands, and
the explained command's own errors (hint: 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.shard import explain as plans
from shardsim.shard import hints
from shardsim.shard.commands.helpers import coll_name
from shardsim.core import query as q
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.explain_common import (parse_request, parsed_query, query_hashes, server_info,
                                     server_parameters)
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode

commands = CommandFamily("explain")
_EXPLAINABLE = ("find", "count", "distinct", "aggregate", "update", "delete", "findAndModify")


def _planner(ns: str, filt: dict[str, Any], plan: plans.Plan, sort: Any = None,
             projection: Any = None) -> dict[str, Any]:
    qh, pk = query_hashes(ns, filt, sort, projection)
    return {"namespace": ns, "parsedQuery": parsed_query(filt), "indexFilterSet": False,
            "queryHash": qh, "planCacheKey": pk, "optimizationTimeMillis": 0,
            "maxIndexedOrSolutionsReached": False, "maxIndexedAndSolutionsReached": False,
            "maxScansToExplodeReached": False, "prunedSimilarIndexes": False,
            "winningPlan": plan.tree, "rejectedPlans": []}


def _int(v: Any) -> int:
    return abs(int(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _find(node: "ShardNode", req: Request, inner: dict[str, Any],
          verbosity: str) -> dict[str, Any]:
    name = coll_name(req)
    ns = f"{req.db}.{name}"
    coll = node.storage.get(req.db, name)
    filt = inner.get("filter") or {}
    sort, proj, hint = inner.get("sort"), inner.get("projection"), inner.get("hint")
    skip, limit = _int(inner.get("skip")), _int(inner.get("limit"))
    hints.check_hint(coll, hint, ns)
    plan = plans.find_plan(coll, filt, sort, skip, limit, proj, hint)
    out = {"queryPlanner": _planner(ns, filt, plan, sort, proj)}
    if verbosity != "queryPlanner":
        docs = plans.matching(coll, filt)
        docs = hints.apply_min_max(coll, docs, hint, inner.get("min"), inner.get("max"), ns)
        n = len(docs[skip:][:limit] if limit else docs[skip:])
        out["executionStats"] = plans.execution_stats(coll, plan, filt, n)
    return out


def _count(node: "ShardNode", req: Request, inner: dict[str, Any],
           verbosity: str) -> dict[str, Any]:
    name = coll_name(req)
    ns = f"{req.db}.{name}"
    coll = node.storage.get(req.db, name)
    filt, hint = inner.get("query") or {}, inner.get("hint")
    hints.check_hint(coll, hint, ns)
    if not filt and hint is None:
        plan = plans.Plan({"stage": "RECORD_STORE_FAST_COUNT"}, None, False)
    else:
        plan = plans.scan_plan(coll, filt, hint)
        plan.tree = {"stage": "COUNT", "inputStage": plan.tree}
    out = {"queryPlanner": _planner(ns, filt, plan)}
    if verbosity != "queryPlanner":
        n = len(plans.matching(coll, filt))
        skip, limit = _int(inner.get("skip")), _int(inner.get("limit"))
        n = max(0, n - skip)
        n = min(n, limit) if limit else n
        out["executionStats"] = plans.execution_stats(coll, plan, filt, n, {"nCounted": n},
                                                      returned_top=0)
    return out


def _distinct(node: "ShardNode", req: Request, inner: dict[str, Any],
              verbosity: str) -> dict[str, Any]:
    name = coll_name(req)
    ns = f"{req.db}.{name}"
    coll = node.storage.get(req.db, name)
    filt, key, hint = inner.get("query") or {}, inner.get("key"), inner.get("hint")
    if not isinstance(key, str):
        raise MongoError(40414, "BSON field 'distinct.key' is missing but a required field")
    hints.check_hint(coll, hint, ns)
    plan = plans.scan_plan(coll, filt, hint)
    idx = next((i for i in (coll.indexes.values() if coll else [])
                if i.fields[0] == key and not i.spec.get("hidden")), None)
    if idx is not None and not filt and hint is None:
        scan = {**plans.ixscan_stage(idx, {}), "stage": "DISTINCT_SCAN"}
        plan = plans.Plan({"stage": "PROJECTION_COVERED", "transformBy": {"_id": 0, key: 1},
                           "inputStage": scan}, idx, False)
    else:
        plan.tree = {"stage": "PROJECTION_SIMPLE", "transformBy": {"_id": 0, key: 1},
                     "inputStage": plan.tree}
    out = {"queryPlanner": _planner(ns, filt, plan)}
    if verbosity != "queryPlanner":
        n = len(q.distinct_values(plans.matching(coll, filt), key))
        out["executionStats"] = plans.execution_stats(coll, plan, filt, n)
    return out


def _write(node: "ShardNode", req: Request, inner: dict[str, Any], verbosity: str,
           kind: str) -> dict[str, Any]:
    """update/delete (one statement) and findAndModify: planned, not applied."""
    name = coll_name(req)
    ns = f"{req.db}.{name}"
    coll = node.storage.get(req.db, name)
    if kind == "findAndModify":
        stmt = {"q": inner.get("query") or {}, "hint": inner.get("hint"),
                "sort": inner.get("sort"), "upsert": inner.get("upsert", False),
                "multi": False, "limit": 1}
        delete = bool(inner.get("remove"))
    else:
        field = "updates" if kind == "update" else "deletes"
        stmts = inner.get(field)
        if not isinstance(stmts, list) or len(stmts) != 1:
            raise MongoError(16, "explained write batches must be of size 1")
        stmt = stmts[0] if isinstance(stmts[0], dict) else {}
        delete = kind == "delete"
    filt = stmt.get("q") or {}
    hints.check_hint(coll, stmt.get("hint"), ns)
    plan = plans.scan_plan(coll, filt, stmt.get("hint"))
    plan.tree = {"stage": "DELETE" if delete else "UPDATE", "inputStage": plan.tree}
    out = {"queryPlanner": _planner(ns, filt, plan)}
    if verbosity != "queryPlanner":
        docs = plans.matching(coll, filt)
        many = stmt.get("multi") if not delete else stmt.get("limit") == 0
        n = len(docs) if many else min(1, len(docs))
        extra = {"nWouldDelete": n} if delete else \
            {"nMatched": n, "nWouldModify": n,
             "nWouldUpsert": int(not docs and bool(stmt.get("upsert")))}
        out["executionStats"] = plans.execution_stats(coll, plan, filt, n, extra,
                                                      returned_top=0)
    return out


def _aggregate(node: "ShardNode", req: Request, inner: dict[str, Any],
               verbosity: str) -> dict[str, Any]:
    name = coll_name(req)
    ns = f"{req.db}.{name}"
    coll = node.storage.get(req.db, name)
    pipeline = inner.get("pipeline")
    if not isinstance(pipeline, list):
        raise MongoError(14, "BSON field 'aggregate.pipeline' is the wrong type, expected "
                             "type 'array'")
    filt: dict[str, Any] = {}
    rest = list(pipeline)
    while rest and isinstance(rest[0], dict) and list(rest[0]) == ["$match"]:
        filt = {**filt, **rest.pop(0)["$match"]} if not filt else \
            {"$and": [filt, rest.pop(0)["$match"]]}
    hint = inner.get("hint")
    hints.check_hint(coll, hint, ns)
    plan = plans.find_plan(coll, filt, None, 0, 0, None, hint)
    planner = _planner(ns, filt, plan)
    stats = None
    if verbosity != "queryPlanner":
        stats = plans.execution_stats(coll, plan, filt, len(plans.matching(coll, filt)))
    if not rest:
        return {"queryPlanner": planner, **({"executionStats": stats} if stats else {})}
    cursor: dict[str, Any] = {"queryPlanner": planner}
    if stats:
        cursor["executionStats"] = stats
    return {"stages": [{"$cursor": cursor}] + [dict(st) for st in rest]}


@commands.handler("explain", secondary="optIn", privileges=priv.EXPLAIN)
async def explain(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{explain: <command>, verbosity}``: see the module docstring."""
    name, inner, verbosity = parse_request(req.body)
    canonical = node.commands.canonical(name)
    if canonical == "insert":
        raise MongoError(20, "Cannot explain cmd: insert")
    if canonical not in _EXPLAINABLE:
        raise MongoError(59, f"Explain failed due to unknown command: {name}")
    sub = Request(name, req.db, inner, req.conn)
    if canonical == "find":
        body = _find(node, sub, inner, verbosity)
    elif canonical == "count":
        body = _count(node, sub, inner, verbosity)
    elif canonical == "distinct":
        body = _distinct(node, sub, inner, verbosity)
    elif canonical == "aggregate":
        body = _aggregate(node, sub, inner, verbosity)
    else:
        body = _write(node, sub, inner, verbosity, canonical)
    command = {k: v for k, v in inner.items() if k not in ("lsid", "$clusterTime", "txnNumber")}
    command["$db"] = req.db
    return {"explainVersion": "1", **body, "command": command,
            "serverInfo": server_info(node.port, node.profile.version), "serverParameters": server_parameters()}
