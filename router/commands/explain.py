"""``explain`` through the router (``cluster_explain_cmd.cpp``, ``cluster_explain.cpp``,
``cluster_aggregate.cpp``): the explained command is targeted as the command itself would be
and sent to those shards as ``{explain: <command>, verbosity}``; their answers are combined
in mongos' shape.

find, count, distinct, update, delete, findAndModify::

    {queryPlanner: {mongosPlannerVersion: 1,
                    winningPlan: {stage, shards: [{shardName, connectionString, serverInfo,
                                                   <the shard's queryPlanner fields>}]}},
     executionStats: {nReturned, executionTimeMillis, totalKeysExamined, totalDocsExamined,
                      executionStages: {stage, nReturned, executionTimeMillis,
                                        totalKeysExamined, totalDocsExamined,
                                        totalChildMillis,
                                        shards: [{shardName, executionSuccess,
                                                  executionStages}]}},   # not for queryPlanner
     serverInfo, serverParameters, command}

``stage`` (``ClusterExplain::getStageNameForReadOp``): ``SINGLE_SHARD`` for one shard, else
``SHARD_MERGE_SORT`` for a find with ``sort``, else ``SHARD_MERGE``; ``SHARD_WRITE`` for
update and delete; findAndModify always reaches one shard (``SINGLE_SHARD``).

aggregate (``sharded_agg_helpers::appendExplainResults``): ``{splitPipeline: null, shards:
{<name>: {host, <the shard's explain>}}}`` when one shard runs the whole pipeline, else
``{mergeType: "mongos", splitPipeline: {shardsPart, mergerPart}, shards: {...}}`` with the
per-document stages in ``shardsPart`` and ``$mergeCursors`` plus the rest in ``mergerPart``.
An ``aggregate`` with ``explain: true`` answers the same (verbosity ``queryPlanner``).

Errors: FailedToParse (9) for a bad request or verbosity, IllegalOperation (20) for insert,
CommandNotFound (59) for a command that cannot be explained, and the shards' errors (e.g.
BadValue 2 for an unknown hint).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from shardsim.router.commands.reads import read_targets
from shardsim.router.forwarding import forwardable, namespace, reply_body
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.explain_common import parse_request, server_info, server_parameters
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("explain")
_READS = ("find", "count", "distinct")
_WRITES = ("update", "delete", "findAndModify")
# aggregation stages that run per document on the shards (as router.commands.reads splits)
_SHARD_STAGES = frozenset({"$match", "$project", "$addFields", "$set", "$unset", "$unwind",
                           "$replaceRoot", "$replaceWith", "$redact"})


async def _targets(node: "RouterNode", sub: Request, name: str, ns: str) -> list[str]:
    """The shards the explained command would reach (one shard when it reaches none)."""
    inner = sub.body
    if name == "find":
        filt = inner.get("filter")
    elif name in ("count", "distinct", "findAndModify"):
        filt = inner.get("query")
    elif name in ("update", "delete"):
        stmts = inner.get("updates" if name == "update" else "deletes")
        filt = stmts[0].get("q") if isinstance(stmts, list) and stmts and \
            isinstance(stmts[0], dict) else {}
    else:
        pipeline = inner.get("pipeline") or []
        first = pipeline[0] if pipeline and isinstance(pipeline[0], dict) else {}
        filt = first.get("$match")
    shards = await read_targets(node, sub, ns, filt if isinstance(filt, dict) else {})
    if name == "findAndModify":
        shards = shards[:1]
    if not shards:
        primary = node.read_primary(ns.split(".", 1)[0])
        shards = [primary] if primary else [s for s, _, _ in node.catalog.shards()][:1]
    if not shards:
        raise MongoError(70, "no shards found for explain")
    return shards


def _connection_string(node: "RouterNode", shard: str) -> str:
    """The shard's connection string as explain reports it: its ``config.shards.host``
    (``setName/host1,host2,...``, the set's members)."""
    conn = node.catalog.shard_connection_string(shard)
    if conn:
        return conn
    addr = node.catalog.shard_address(shard)
    return f"{shard}/{addr[0]}:{addr[1]}" if addr else shard


def _stage_name(name: str, n_shards: int, inner: dict[str, Any]) -> str:
    """``getStageNameForReadOp`` and the write stages."""
    if name in ("update", "delete"):
        return "SHARD_WRITE"
    if n_shards == 1 or name == "findAndModify":
        return "SINGLE_SHARD"
    return "SHARD_MERGE_SORT" if name == "find" and inner.get("sort") else "SHARD_MERGE"


def _cluster_reply(node: "RouterNode", stage: str, shards: list[str],
                   replies: list[dict[str, Any]], millis: int) -> dict[str, Any]:
    """``buildPlannerInfo`` + ``buildExecStats``."""
    planned = []
    for shard, rep in zip(shards, replies):
        entry = {"shardName": shard, "connectionString": _connection_string(node, shard),
                 "serverInfo": rep.get("serverInfo", {})}
        entry.update(rep.get("queryPlanner", {}))
        planned.append(entry)
    out: dict[str, Any] = {"queryPlanner": {"mongosPlannerVersion": 1, "winningPlan": {
        "stage": stage, "shards": planned}}}
    if not all("executionStats" in r for r in replies):
        return out
    totals = {k: sum(int(r["executionStats"].get(k, 0)) for r in replies)
              for k in ("nReturned", "totalKeysExamined", "totalDocsExamined",
                        "executionTimeMillis")}
    per_shard = [{"shardName": s, "executionSuccess": r["executionStats"].get(
        "executionSuccess", True), "executionStages": r["executionStats"].get(
        "executionStages", {})} for s, r in zip(shards, replies)]
    out["executionStats"] = {
        "nReturned": totals["nReturned"], "executionTimeMillis": millis,
        "totalKeysExamined": totals["totalKeysExamined"],
        "totalDocsExamined": totals["totalDocsExamined"],
        "executionStages": {"stage": stage, "nReturned": totals["nReturned"],
                            "executionTimeMillis": millis,
                            "totalKeysExamined": totals["totalKeysExamined"],
                            "totalDocsExamined": totals["totalDocsExamined"],
                            "totalChildMillis": totals["executionTimeMillis"],
                            "shards": per_shard}}
    return out


def _split(pipeline: list[Any]) -> int:
    """How many leading stages run on the shards."""
    split = 0
    while split < len(pipeline) and isinstance(pipeline[split], dict) and \
            next(iter(pipeline[split]), None) in _SHARD_STAGES:
        split += 1
    return split


async def _aggregate(node: "RouterNode", db: str, ns: str, shards: list[str],
                     inner: dict[str, Any], verbosity: str) -> dict[str, Any]:
    pipeline = inner.get("pipeline")
    if not isinstance(pipeline, list):
        raise MongoError(14, "BSON field 'aggregate.pipeline' is the wrong type, expected "
                             "type 'array'")
    body = {k: v for k, v in forwardable(inner).items() if k not in ("explain", "cursor")}
    split = len(pipeline) if len(shards) == 1 else _split(pipeline)
    body["pipeline"] = pipeline[:split]
    cmd = {"explain": body, "verbosity": verbosity}
    replies = await asyncio.gather(*(node.shard_command(s, db, cmd) for s in shards))
    per_shard = {}
    for s, rep in zip(shards, replies):
        addr = node.catalog.shard_address(s)
        per_shard[s] = {"host": f"{addr[0]}:{addr[1]}" if addr else s, **{
            k: v for k, v in reply_body(rep).items()
            if k not in ("command", "serverInfo", "serverParameters")}}
    if len(shards) == 1:
        return {"splitPipeline": None, "shards": per_shard}
    merge = {"$mergeCursors": {"compareWholeSortKey": False, "tailableMode": "normal",
                               "nss": ns, "allowPartialResults": False,
                               "recordRemoteOpWaitTime": False,
                               "requestQueryStatsFromRemotes": False}}
    return {"mergeType": "mongos",
            "splitPipeline": {"shardsPart": pipeline[:split],
                              "mergerPart": [merge] + pipeline[split:]},
            "shards": per_shard}


async def explain_command(node: "RouterNode", db: str, name: str, inner: dict[str, Any],
                          verbosity: str, conn: Any) -> dict[str, Any]:
    """Explain ``inner`` (command ``name``) on the shards; the reply without ``ok``."""
    canonical = node.commands.canonical(name)
    if canonical == "insert":
        raise MongoError(20, "Cannot explain cmd: insert")
    if canonical not in _READS + _WRITES + ("aggregate",):
        raise MongoError(59, f"Explain failed due to unknown command: {name}")
    sub = Request(name, db, inner, conn)
    _, coll = namespace(sub)
    ns = f"{db}.{coll}"
    shards = await _targets(node, sub, canonical, ns)
    started = time.monotonic()
    if canonical == "aggregate":
        out = await _aggregate(node, db, ns, shards, inner, verbosity)
    else:
        cmd = {"explain": forwardable(inner), "verbosity": verbosity}
        replies = await asyncio.gather(*(node.shard_command(s, db, cmd) for s in shards))
        millis = int((time.monotonic() - started) * 1000)
        out = _cluster_reply(node, _stage_name(canonical, len(shards), inner), shards,
                             list(replies), millis)
    command = {k: v for k, v in inner.items() if k not in ("lsid", "$clusterTime", "txnNumber")}
    command["$db"] = db
    out.update({"serverInfo": server_info(node.port, node.profile.version), "serverParameters": server_parameters(),
                "command": command})
    return out


@commands.handler("explain", privileges=priv.EXPLAIN)
async def explain(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{explain: <command>, verbosity}``: see the module docstring."""
    name, inner, verbosity = parse_request(req.body)
    return await explain_command(node, req.db, name, inner, verbosity, req.conn)
