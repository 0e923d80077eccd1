"""Reads through the router: ``find``, ``count``, ``distinct``, ``aggregate`` (mongos'
``cluster_find_cmd.cpp``, ``cluster_count_cmd.cpp``, ``cluster_distinct_cmd.cpp``,
``cluster_pipeline_cmd.cpp``).

A read whose filter (or first ``$match``) pins the full shard key goes to one shard; otherwise
to every shard owning the collection, and the router merges: sort, skip and limit for ``find``,
sums for ``count``, a sorted union for ``distinct``, and for ``aggregate`` the leading
per-document stages run on the shards and the rest over the union. Unsharded collections are
read on the database's primary shard. The ``config``/``admin`` databases are the config
server's (:func:`router.commands.admin.config_read`).

An aggregate starting with ``$changeStream`` is handed to
:func:`router.change_stream.aggregate_change_stream`, one starting with ``$currentOp`` to
:func:`router.current_op.aggregate_current_op`.

Views: a read of a view goes to the primary shard like any unsharded namespace. When the view's
source is sharded, the shard answers 169 with ``resolvedView: {ns, pipeline}`` and the router
re-runs the read as an aggregate over the source with the view pipeline first (mongos:
ClusterFind/ClusterAggregate retry with the ResolvedView) — see :func:`run_resolved_view`.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

from shardsim.router import aggregate_write, change_stream, shard_versioning
from shardsim.router.current_op import aggregate_current_op
from shardsim.core import current_op, local_sessions, max_time
from shardsim.router.commands.admin import CONFIG_DATABASES, config_read
from shardsim.router.remote_cursor import tailable_find
from shardsim.router.shard_registry import read_preference_of
from shardsim.router.forwarding import BIG_BATCH, forwardable, namespace, session_fields
from shardsim.core.shard_key import compare
from shardsim.core.commands import CommandFamily, Request, check_type
from shardsim.core.errors import MongoError
from shardsim.core.search_indexes import check_search_stages
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("reads")

# Stages that work per document and can run on every shard before the merge.
_SHARD_STAGES = frozenset({"$match", "$project", "$addFields", "$set", "$unset", "$unwind",
                           "$replaceRoot", "$replaceWith", "$redact"})
# Options of a find that the router applies itself, not the shards.
_ROUTER_FIND_OPTS = ("batchSize", "singleBatch", "noCursorTimeout", "tailable", "awaitData")


async def read_targets(node: "RouterNode", req: Request, ns: str, filt: Any) -> list[str]:
    """The shards a read of ``ns`` with filter ``filt`` must visit (``[]`` when there is no
    shard). Inside a transaction a ``startTransaction`` statement begins it on the router
    (:mod:`router.transactions`); the shards become participants when they are sent to."""
    info = node.catalog.collection(ns)
    db = ns.split(".", 1)[0]
    if info is None:
        await node.refresh_on_database_miss(db)
        info = node.catalog.collection(ns)
    shard_versioning.TARGETED_WITH.set((ns, info))  # versions of this snapshot go out
    if info is None:
        shard = node.read_primary(db)
        shards = [shard] if shard else []
    else:
        # a large $in is targeted in slices, honouring maxTimeMS (issue 28)
        shards = await max_time.run_steps(
            info.chunks.shards_for_query_steps(filt if isinstance(filt, dict) else {}))
    if req.get("autocommit") is False:
        node.transactions.participant(req, set(shards))
    return shards


# -- find ---------------------------------------------------------------------------------------
@commands.handler("find", versioned=True, snapshot=True, reads=True, privileges=priv.on_coll("find"))
async def find(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{find, filter, sort, skip, limit, projection, batchSize, singleBatch}`` ->
    ``{cursor: {id, ns, firstBatch}}`` (a router cursor). InvalidNamespace (73); a view over a
    sharded collection is re-run as an aggregate."""
    return await on_shards_or_view(node, req, "find", find_on_shards)


async def find_on_shards(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``find`` without the view retry: targeted or broadcast, merged here (sort, skip,
    limit; sort fields a projection drops are added for the merge and removed after)."""
    db, coll = namespace(req)
    if db in CONFIG_DATABASES:
        return await config_read(node, req, "find")
    ns = f"{db}.{coll}"
    filt = req.get("filter") or {}
    for field, label in (("skip", "Skip"), ("limit", "LimitValue")):
        v = check_type(req, field, (int, float), "long")
        if v is not None and v < 0:  # find_command.idl validators (mongos parses the same IDL)
            raise MongoError(51024, f"{label} value must be non-negative, but received: {v}")
    shards = await read_targets(node, req, ns, filt)
    batch_size = req.get("batchSize")
    single = bool(req.get("singleBatch"))
    if not shards:
        return await node.cursor_reply(ns, [], req, batch_size, single)
    body = forwardable(req.body)
    for k in _ROUTER_FIND_OPTS:
        body.pop(k, None)
    body["batchSize"] = BIG_BATCH
    sess = session_fields(req)
    rp = _read_preference(req)
    if req.get("tailable") and len(shards) == 1:  # a capped collection: one shard's cursor
        return await tailable_find(node, req, shards[0])
    if len(shards) == 1:
        _, docs = await node.drain(shards[0], db, body, session=sess, read_preference=rp)
        return await node.cursor_reply(ns, docs, req, batch_size, single)
    sort = req.get("sort") or None
    skip = int(req.get("skip") or 0)
    limit = req.get("limit")
    limit = int(limit) if limit else None
    body.pop("skip", None)
    if limit is not None:
        body["limit"] = limit + skip
    projection = req.get("projection")
    added: list[str] = []  # sort fields the projection would drop: removed after the merge
    if sort and projection:
        projection = dict(projection)
        inclusive = any(v not in (0, False) for k, v in projection.items() if k != "_id")
        for f in sort:
            if inclusive and f not in projection and f.split(".")[0] not in projection:
                projection[f] = 1
                added.append(f)
            elif not inclusive and projection.get(f) in (0, False):
                del projection[f]
                added.append(f)
        body["projection"] = projection
    results = await asyncio.gather(*(node.drain(s, db, body, session=sess, read_preference=rp)
                                     for s in shards))
    docs = [d for _, part in results for d in part]
    if sort:  # paced when large (issue 28)
        from shardsim.core.query import sort_docs_paced
        docs = await sort_docs_paced(docs, sort)
    docs = docs[skip:]
    if limit is not None:
        docs = docs[:limit]
    if added:
        docs = [_without(d, added) for d in docs]
    return await node.cursor_reply(ns, docs, req, batch_size, single)


def _without(doc: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """``doc`` without the top-level fields of the dotted paths ``fields``."""
    out = dict(doc)
    for f in fields:
        top = f.split(".")[0]
        out.pop(top, None)
    return out


async def on_shards_or_view(node: "RouterNode", req: Request, name: str,
                            run: Any) -> dict[str, Any]:
    """``await run(node, req)``; when a shard answers CommandOnShardedViewNotSupportedOnMongod
    (169) with a ``resolvedView``, re-run ``name`` over the view's source as mongos does
    (:func:`run_resolved_view`)."""
    try:
        return await run(node, req)
    except MongoError as exc:
        resolved = resolved_view(exc)
        if resolved is None:
            raise
        return await run_resolved_view(node, req, name, resolved)


# -- count and distinct -------------------------------------------------------------------------
@commands.handler("count", versioned=True, reads=True, privileges=priv.on_coll("find"))
async def count(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{count, query, skip, limit}`` -> ``{n}``: the shards' counts summed, then skip and
    limit applied. InvalidNamespace (73); views over sharded collections re-run."""
    return await on_shards_or_view(node, req, "count", count_on_shards)


async def count_on_shards(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``count`` without the view retry."""
    db, coll = namespace(req)
    if db in CONFIG_DATABASES:
        return await config_read(node, req, None)
    ns = f"{db}.{coll}"
    query = req.get("query") or {}
    shards = await read_targets(node, req, ns, query)
    if not shards:
        return {"n": 0}
    body = forwardable(req.body)
    rp = _read_preference(req)
    if len(shards) == 1:
        reply = await node.shard_command(shards[0], db, body, read_preference=rp)
        return {"n": reply["n"]}
    skip = int(req.get("skip") or 0)
    limit = req.get("limit")
    limit = abs(int(limit)) if limit else None
    body.pop("skip", None)
    if limit is not None:
        body["limit"] = limit + skip
    replies = await asyncio.gather(*(node.shard_command(s, db, body, read_preference=rp)
                                     for s in shards))
    n = max(0, sum(int(x["n"]) for x in replies) - skip)
    if limit is not None:
        n = min(n, limit)
    return {"n": n}


@commands.handler("distinct", versioned=True, snapshot=True, reads=True, privileges=priv.on_coll("find"))
async def distinct(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{distinct, key, query}`` -> ``{values}``: the union of the shards' values, without
    duplicates, in BSON order. InvalidNamespace (73); views over sharded collections re-run."""
    return await on_shards_or_view(node, req, "distinct", distinct_on_shards)


async def distinct_on_shards(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``distinct`` without the view retry."""
    db, coll = namespace(req)
    if db in CONFIG_DATABASES:
        return await config_read(node, req, None)
    ns = f"{db}.{coll}"
    shards = await read_targets(node, req, ns, req.get("query") or {})
    if not shards:
        return {"values": []}
    body = forwardable(req.body)
    rp = _read_preference(req)
    replies = await asyncio.gather(*(node.shard_command(s, db, body, read_preference=rp)
                                     for s in shards))
    if len(replies) == 1:
        return {"values": replies[0]["values"]}
    from shardsim.core import collation
    from shardsim.core.values import id_key
    seen: dict[Any, Any] = {}
    for rep in replies:
        for v in rep["values"]:  # values equal under the command's collation: one
            seen.setdefault(id_key(collation.fold(v)), v)
    return {"values": sorted(seen.values(), key=functools.cmp_to_key(compare))}


# -- aggregate ----------------------------------------------------------------------------------
@commands.handler("aggregate", versioned=True, snapshot=True, reads=True, privileges=priv.aggregate_privileges)
async def aggregate(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{aggregate, pipeline, cursor}`` -> ``{cursor: {id, ns, firstBatch}}``. A
    ``$changeStream`` pipeline opens a change stream (:mod:`router.change_stream`). Raises
    TypeMismatch (14) / IDLFailedToParse (40414) for a bad pipeline, FailedToParse (9) without
    ``cursor``, InvalidNamespace (73); a final ``$out``/``$merge`` writes through the router
    (:mod:`router.aggregate_write`); views over sharded collections re-run."""
    return await on_shards_or_view(node, req, "aggregate", aggregate_on_shards)


async def aggregate_on_shards(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``aggregate`` without the view retry."""
    pipeline = req.get("pipeline")
    if not isinstance(pipeline, list):
        check_type(req, "pipeline", list, "array", required=True)
    if pipeline and isinstance(pipeline[0], dict) and "$changeStream" in pipeline[0]:
        return await change_stream.aggregate_change_stream(node, req)
    if any(isinstance(st, dict) and "$changeStream" in st for st in pipeline[1:]):
        # DocumentSourceChangeStream's position constraint (Pipeline::validateCommon)
        raise MongoError(40602, "$changeStream is only valid as the first stage in a pipeline.")
    check_search_stages(pipeline)  # mongos parses the pipeline first: SearchNotEnabled 31082
    cursor_opt = req.get("cursor")
    if current_op.is_current_op(pipeline) and cursor_opt is not None:
        return await aggregate_current_op(node, req)
    if req.get("explain") is True:  # aggregate with explain: true = verbosity queryPlanner
        from shardsim.router.commands.explain import explain_command
        inner = {k: v for k, v in req.body.items() if k not in ("explain", "$db")}
        return await explain_command(node, req.db, "aggregate", inner, "queryPlanner", req.conn)
    if cursor_opt is None and not req.get("explain"):
        raise MongoError(9, "The 'cursor' option is required, except for aggregate with the "
                            "explain argument")
    batch_size = (cursor_opt or {}).get("batchSize")
    if req.arg == 1:
        return await _aggregate_database(node, req, batch_size)
    db, coll = namespace(req)
    if db in CONFIG_DATABASES:
        return await config_read(node, req, "aggregate")
    ns = f"{db}.{coll}"
    first_match = pipeline[0].get("$match") if pipeline and isinstance(pipeline[0], dict) else None
    shards = await read_targets(node, req, ns, first_match or {})
    if not shards:
        return await node.cursor_reply(ns, [], req, batch_size)
    body = forwardable(req.body)
    body["cursor"] = {"batchSize": BIG_BATCH}
    sess = session_fields(req)
    if aggregate_write.write_stage(pipeline) is not None:
        return await aggregate_write.aggregate_with_write(node, req, functools.partial(
            _read_all, node))
    rp = _read_preference(req)
    if len(shards) == 1:
        _, docs = await node.drain(shards[0], db, body, session=sess, read_preference=rp)
        return await node.cursor_reply(ns, docs, req, batch_size)
    split = 1 if pipeline and isinstance(pipeline[0], dict) and "$collStats" in pipeline[0] \
        else 0  # $collStats: one document from each shard owning the collection
    while split < len(pipeline) and isinstance(pipeline[split], dict) and \
            next(iter(pipeline[split]), None) in _SHARD_STAGES:
        split += 1
    body["pipeline"] = pipeline[:split]
    results = await asyncio.gather(*(node.drain(s, db, body, session=sess, read_preference=rp)
                                     for s in shards))
    docs = [d for _, part in results for d in part]
    if split < len(pipeline):
        from shardsim.core.query import run_pipeline
        docs = run_pipeline(docs, pipeline[split:], None)
    return await node.cursor_reply(ns, docs, req, batch_size)


async def _read_all(node: "RouterNode", req: Request) -> list[dict[str, Any]]:
    """Every document an aggregate ``req`` (no write stage) returns, its cursor drained."""
    body = dict(req.body)
    body["cursor"] = {"batchSize": BIG_BATCH}
    reply = await aggregate_on_shards(node, Request(req.name, req.db, body, req.conn))
    docs = list(reply["cursor"]["firstBatch"])
    if reply["cursor"].get("id"):
        await node.cursors.kill([int(reply["cursor"]["id"])])
    return docs


async def _aggregate_database(node: "RouterNode", req: Request, batch_size: Any) -> dict[str, Any]:
    """``{aggregate: 1}`` (a database-level pipeline such as ``$listLocalSessions``): run on the
    database's primary shard."""
    db = req.db
    ns = f"{db}.$cmd.aggregate"
    pipeline = req.get("pipeline")
    if local_sessions.is_list_local_sessions(pipeline):  # the router's own sessions
        from shardsim.core.query import run_pipeline
        docs = local_sessions.local_sessions_docs(node.local_sessions, db, req.arg, pipeline,
                                                  req.conn)
        return await node.cursor_reply(ns, run_pipeline(docs, pipeline[1:], None), req,
                                       batch_size)
    shard = node.read_primary(db)
    if shard is None:
        return await node.cursor_reply(ns, [], req, batch_size)
    body = forwardable(req.body)
    body["cursor"] = {"batchSize": BIG_BATCH}
    _, docs = await node.drain(shard, db, body, session=session_fields(req))
    return await node.cursor_reply(ns, docs, req, batch_size)


def _read_preference(req: Request) -> Any:
    """The client's ``$readPreference`` for the shard commands of a read (None: primary);
    inside a transaction always primary. Bad input: FailedToParse (9), BadValue (2)."""
    if req.body.get("autocommit") is False:
        return None
    return read_preference_of(req)


# -- views on sharded collections ---------------------------------------------------------------
def resolved_view(exc: MongoError) -> dict[str, Any] | None:
    """The ``resolvedView`` (``{ns, pipeline}``) of the primary shard's
    CommandOnShardedViewNotSupportedOnMongod (169) error, or None for any other error."""
    resolved = exc.extra.get("resolvedView")
    if exc.code != 169 or not isinstance(resolved, dict):
        return None
    return resolved


async def run_resolved_view(node: "RouterNode", req: Request, name: str,
                            resolved: dict[str, Any]) -> dict[str, Any]:
    """Run the read ``req`` (``name``: find, count, distinct or aggregate) of a view as an
    aggregate over ``resolved["ns"]`` with ``resolved["pipeline"]`` first, then the read's own
    filter/sort/skip/limit/projection or pipeline; returns the reply ``name`` gives (a cursor
    on the view's namespace, ``{n}`` or ``{values}``)."""
    db, view_coll = namespace(req)
    src_db, _, src_coll = str(resolved.get("ns", "")).partition(".")
    stages: list[Any] = list(resolved.get("pipeline") or [])
    query = req.get("filter" if name == "find" else "query")
    if name in ("find", "count", "distinct") and query:
        stages.append({"$match": query})
    if name == "find" and req.get("sort"):
        stages.append({"$sort": req.get("sort")})
    if name in ("find", "count"):
        if req.get("skip"):
            stages.append({"$skip": int(req.get("skip"))})
        if req.get("limit"):
            stages.append({"$limit": abs(int(req.get("limit")))})
    if name == "find" and req.get("projection"):
        stages.append({"$project": req.get("projection")})
    if name == "aggregate":
        stages.extend(req.get("pipeline") or [])
    body: dict[str, Any] = {"aggregate": src_coll, "pipeline": stages,
                            "cursor": {"batchSize": BIG_BATCH}, **session_fields(req)}
    reply = await aggregate_on_shards(node, Request("aggregate", src_db or db, body, req.conn))
    docs = list(reply["cursor"]["firstBatch"])
    if reply["cursor"].get("id"):
        await node.cursors.kill([int(reply["cursor"]["id"])])
    if name == "count":
        return {"n": len(docs)}
    if name == "distinct":
        from shardsim.core.query import distinct_values
        return {"values": sorted(distinct_values(docs, check_type(req, "key", str, "string")),
                                 key=functools.cmp_to_key(compare))}
    ns = f"{db}.{view_coll}"
    if name == "find":
        return await node.cursor_reply(ns, docs, req, req.get("batchSize"),
                                       bool(req.get("singleBatch")))
    return await node.cursor_reply(ns, docs, req, (req.get("cursor") or {}).get("batchSize"))


@commands.handler("mapReduce", "mapreduce", versioned=True, reads=True,
                  privileges=priv.on_coll("find"))
async def map_reduce(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``mapReduce`` through the router (mongos' ``cluster_map_reduce_agg.cpp`` runs it as an
    aggregation over the shards): the documents of ``query``/``sort``/``limit`` are read from
    the shards (an aggregate), mapped and reduced here on the JavaScript engine
    (:func:`shardsim.core.javascript.map_reduce`); inline results ``{results: [{_id,
    value}]}``, or the output collection replaced through the router (as ``$out``:
    :func:`router.aggregate_write.run_out`) and ``{result: <name>}``."""
    from shardsim.core import javascript
    spec = javascript.parse_map_reduce(req.body)
    db, coll = namespace(req)
    pipeline: list[dict[str, Any]] = [{"$match": spec["query"]}]
    if spec["sort"]:
        pipeline.append({"$sort": spec["sort"]})
    if spec["limit"]:
        pipeline.append({"$limit": spec["limit"]})
    body = {"aggregate": coll, "pipeline": pipeline, "cursor": {}, "$db": db}
    for k in ("collation", "readConcern", "lsid", "maxTimeMS"):
        if k in req.body:
            body[k] = req.body[k]
    docs = await _read_all(node, Request("aggregate", db, body, req.conn))
    results = javascript.map_reduce(db, docs, spec)
    if spec["out"] is None:
        return {"results": results}
    out_db, out_name = spec["out"]
    await aggregate_write.run_out(node, req, results, {"db": out_db or db, "coll": out_name})
    return {"result": {"db": out_db, "collection": out_name} if out_db else out_name}
