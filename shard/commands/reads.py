"""The shard's read commands: find, count, distinct, aggregate.

``find`` on ``local.oplog.rs``, ``config.system.preimages`` and ``config.transactions`` reads
the oplog, the pre-images and the session records (:meth:`shard.sessions.Sessions.records`);
reads of a view run its pipeline over the source first; reads inside a transaction see its own
writes. A routed read (with ``shardVersion``) of a sharded collection sees only the
documents of the chunks this shard owns, not the orphans of a migration in progress
(:meth:`shard.sharding_runtime.ShardingRuntime.owned_view`). An aggregate whose pipeline starts with ``$changeStream`` is handed to
:mod:`shard.change_stream`. Reply shapes follow ``find_cmd.cpp`` and ``run_aggregate.cpp``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson.int64 import Int64

from shardsim.core.commands import CommandFamily, Request, check_type
from shardsim.shard import coll_stats, hints, planner
from shardsim.shard.commands.capped_cursor import TailableCollectionCursor
from shardsim.core.cursors import Batch, Cursor, ListCursor
from shardsim.core.errors import MongoError
from shardsim.core import query as q
from shardsim.shard.change_stream import aggregate_change_stream
from shardsim.core import current_op, fast_group, local_sessions, max_time
from shardsim.shard.commands.helpers import Database, check_fields, coll_name, txn_view, view_docs
from shardsim.shard.commands.oplog_cursor import oplog_cursor
from shardsim.core.errors import view_error
from shardsim.shard.storage import Collection
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode

commands = CommandFamily("reads")


def find_plan(coll: Any, filt: dict[str, Any] | None, sort: dict[str, Any] | None,
              hint: Any) -> planner.Plan | None:
    """The index plan of a find (:func:`shard.planner.choose`; a ``$natural`` hint: None)."""
    if coll is None or hints.is_natural(hint):
        return None
    return planner.choose(coll, filt, sort, hints.resolve_hint(coll, hint))


async def run_plan(plan: planner.Plan, coll: Any, filt: dict[str, Any] | None,
                   limit: int) -> list[dict[str, Any]]:
    """The documents an index plan returns, paced like a scan (maxTimeMS 50)."""
    pacer = max_time.Pacer()
    out = []
    for _k, doc in planner.execute(plan, coll, filt, q.query_matcher(filt), limit):
        out.append(doc)
        if len(out) % 256 == 0:
            await pacer.tick()
    return out


async def _read_docs(coll: Collection | None, filt: dict[str, Any] | None,
                     sort: dict[str, Any] | None, skip: int, limit: int,
                     projection: dict[str, Any] | None, hint: Any = None) -> list[dict[str, Any]]:
    """The documents of ``coll`` a find returns (an unsorted limit stops the scan early). The
    scan yields to the event loop and honours maxTimeMS (:func:`shardsim.core.query.select_paced`).
    An index plan (:mod:`shard.planner`) reads only the keys of its intervals and, when the
    index gives the sort, stops after ``skip + limit`` documents (no blocking sort)."""
    if filt:
        q.matches(q.strip_where(filt), {})  # the filter's parse errors first, as a scan reports them
    plan = find_plan(coll, filt, sort, hint)
    if plan is not None:
        q.sort_docs([], sort)  # the sort specification's errors
        early = plan.sorted_by_index or not sort
        docs = await run_plan(plan, coll, filt, skip + limit if limit and early else 0)
        if sort and not plan.sorted_by_index:
            docs = await q.sort_docs_paced(docs, sort)
        docs = docs[skip:]
        return q.project(docs[:limit] if limit else docs, projection)
    if not sort and limit and not skip:
        docs = [d for _, d in await q.select_paced(coll, filt, limit)]
    else:
        docs = [d for _, d in await q.select_paced(coll, filt)]
        docs = await q.sort_docs_paced(docs, sort)
        if skip:
            docs = docs[skip:]
        if limit:
            docs = docs[:limit]
    return q.project(docs, projection)


def _int_opt(req: Request, field: str, minimum: int = 0) -> int:
    """A non-negative integer option (skip, batchSize): 14, 51024 or 2 otherwise."""
    v = check_type(req, field, (int, float), "long")
    if v is None:
        return 0
    if v < minimum:
        label = {"batchSize": "BatchSize", "skip": "Skip"}.get(field, field)
        raise MongoError(51024, f"{label} value must be non-negative, but received: {v}") \
            if field in ("batchSize", "skip") else MongoError(2, f"{field} value must be non-negative")
    return int(v)


@commands.handler("find", versioned=True, snapshot=True, reads=True, secondary="optIn", privileges=priv.on_coll("find"))
async def find(node: ShardNode, req: Request) -> dict[str, Any]:
    """``find`` (``find_cmd.cpp``): ``{cursor: {firstBatch, id, ns}}``. ``local.oplog.rs`` reads
    the oplog (sorted, reverse, or tailable/awaitData: :mod:`shard.commands.oplog_cursor`),
    ``config.system.preimages`` the pre-images, ``config.transactions`` the session records, a
    view runs its pipeline first. Errors: 14, 40415 (unknown field), 51024 (negative limit/batchSize), 9 (awaitData without tailable),
    2 (tailable on a normal collection), 169 (view over a sharded collection)."""
    storage = node.storage
    name = coll_name(req)
    check_fields(req, "find")
    filt = check_type(req, "filter", dict, "object") or {}
    sort = check_type(req, "sort", dict, "object")
    projection = check_type(req, "projection", dict, "object")
    skip = _int_opt(req, "skip")
    limit_v = check_type(req, "limit", (int, float), "long")
    if limit_v is not None and limit_v < 0:
        raise MongoError(51024, f"LimitValue must be non-negative, but received: {limit_v}")
    limit = int(limit_v or 0)
    batch_size = check_type(req, "batchSize", (int, float), "long")
    if batch_size is not None and batch_size < 0:
        raise MongoError(51024, f"BatchSize value must be non-negative, but received: {batch_size}")
    single = req.body.get("singleBatch", False)
    tailable = bool(req.body.get("tailable", False))
    await_data = bool(req.body.get("awaitData", False))
    if await_data and not tailable:
        raise MongoError(9, "Cannot set 'awaitData' without also setting 'tailable'")
    ns = f"{req.db}.{name}"
    if req.db == "local" and name == "oplog.rs":
        cursor: Cursor = oplog_cursor(node, ns, filt, sort, skip, limit, projection, tailable,
                                      await_data)
    elif req.db == "config" and name in ("system.preimages", "transactions"):
        src = node.pre_images.docs() if name == "system.preimages" else node.sessions.records()
        docs = [d for d in src if q.matches(filt, d)]
        cursor = ListCursor(ns, q.project(q.sort_docs(docs, sort)[skip:][:limit or None], projection))
    elif tailable and (storage.get(req.db, name) is not None
                       and storage.get(req.db, name).options.get("capped")):
        cursor = TailableCollectionCursor(node, req.db, name, filt, projection, await_data,
                                          skip, limit)
    else:
        if tailable:
            raise MongoError(2, f"error processing query: ns={ns} tailable cursor requested on "
                                f"non capped collection")
        vdocs = view_docs(node, req, name)
        if vdocs is not None:  # find on a view = aggregate over the view (find_cmd.cpp)
            vdocs = q.sort_docs([d for d in vdocs if q.matches(filt, d)], sort)[skip:]
            cursor = ListCursor(ns, q.project(vdocs[:limit] if limit else vdocs, projection))
        else:
            raw = storage.get(req.db, name)
            hint = req.body.get("hint")
            hints.check_hint(raw, hint, ns)
            coll = node.sharding.owned_view(req, txn_view(node, raw, req))
            if req.body.get("min") or req.body.get("max"):  # index bounds of the hint
                docs = hints.apply_min_max(raw, [d for _, d in q.select(coll, filt)], hint,
                                           req.body.get("min"), req.body.get("max"), ns)
                docs = (q.sort_docs(docs, sort) if sort else docs)[skip:]
                cursor = ListCursor(ns, q.project(docs[:limit] if limit else docs, projection))
            else:
                cursor = ListCursor(ns, await _read_docs(coll, filt, sort, skip, limit,
                                                         projection, hint))
    if req.body.get("noCursorTimeout"):
        cursor.no_timeout = True
    bs = int(batch_size) if batch_size is not None else None
    if limit and ((bs is None and limit < 101) or (bs is not None and bs > limit)):
        bs = limit
    if bs == 0 and batch_size is not None:
        reply = await node.cursors.run_first_batch(_EmptyFirst(cursor), 0)
    else:
        reply = await node.cursors.run_first_batch(cursor, bs)
    if (single or limit) and reply["id"] and not tailable:
        if single or (limit and len(reply["firstBatch"]) >= limit):
            await node.cursors.kill([int(reply["id"])])
            reply["id"] = Int64(0)
    return {"cursor": reply}


@commands.handler("count", versioned=True, reads=True, secondary="optIn", privileges=priv.on_coll("find"))
async def count(node: ShardNode, req: Request) -> dict[str, Any]:
    """``count: <coll>, query?, skip?, limit?``: ``{n}`` (views and ``local.oplog.rs`` too)."""
    name = coll_name(req)
    filt = check_type(req, "query", dict, "object") or {}
    skip = _int_opt(req, "skip")
    limit = abs(int(check_type(req, "limit", (int, float), "long") or 0))
    vdocs = view_docs(node, req, name)
    if req.db == "local" and name == "oplog.rs":
        n = sum(1 for d in node.oplog.entries_from(0) if q.matches(filt, d))
    elif vdocs is not None:
        n = sum(1 for d in vdocs if q.matches(filt, d))
    else:
        raw = node.storage.get(req.db, name)
        hints.check_hint(raw, req.body.get("hint"), f"{req.db}.{name}")
        coll = node.sharding.owned_view(req, txn_view(node, raw, req))
        n = len(coll.docs) if coll is not None and not filt else \
            len(await q.select_paced(coll, filt))
    n = max(0, n - skip)
    if limit:
        n = min(n, limit)
    return {"n": n}


@commands.handler("distinct", versioned=True, snapshot=True, reads=True, secondary="optIn", privileges=priv.on_coll("find"))
async def distinct(node: ShardNode, req: Request) -> dict[str, Any]:
    """``distinct: <coll>, key, query?``: ``{values}`` (views and transactions
    as for find)."""
    name = coll_name(req)
    key = check_type(req, "key", str, "string", required=True)
    filt = check_type(req, "query", dict, "object") or {}
    vdocs = view_docs(node, req, name)
    if vdocs is not None:
        return {"values": q.distinct_values((d for d in vdocs if q.matches(filt, d)), key)}
    raw = node.storage.get(req.db, name)
    hints.check_hint(raw, req.body.get("hint"), f"{req.db}.{name}")
    coll = node.sharding.owned_view(req, txn_view(node, raw, req))
    return {"values": q.distinct_values((d for _, d in await q.select_paced(coll, filt)), key)}


@commands.handler("aggregate", versioned=True, snapshot=True, reads=True, secondary="optIn", privileges=priv.aggregate_privileges)
async def aggregate(node: ShardNode, req: Request) -> dict[str, Any]:
    """``aggregate`` (``run_aggregate.cpp``): ``{cursor: {firstBatch, id, ns}}``. A pipeline
    starting with ``$changeStream`` is handed to :func:`shard.change_stream.aggregate_change_stream`
    (166 on a view); ``{aggregate: 1}`` needs ``$documents`` (73 otherwise). Errors: 9 without
    ``cursor``, 40602 ($changeStream not first), 238 (explain, $out, $merge), 51024."""
    storage = node.storage
    pipeline = check_type(req, "pipeline", list, "array", required=True)
    if "cursor" not in req.body and not req.body.get("explain"):
        raise MongoError(9, "The 'cursor' option is required, except for aggregate with the "
                            "explain argument")
    cursor_opt = check_type(req, "cursor", dict, "object") or {}
    if pipeline and isinstance(pipeline[0], dict) and "$changeStream" in pipeline[0]:
        if isinstance(req.arg, str) and storage.view_def(req.db, req.arg) is not None:
            raise view_error(f"{req.db}.{req.arg}")
        return await aggregate_change_stream(node, req)
    for st in pipeline:
        if isinstance(st, dict) and "$changeStream" in st:
            raise MongoError(40602, "$changeStream is only valid as the first stage in a pipeline.")
    if req.body.get("explain"):
        raise MongoError(238, "explain is not supported by shardsim")
    target = req.arg
    if current_op.is_current_op(pipeline):
        # $currentOp: this shard's cursors (shardsim/current_op.py)
        docs = current_op.local_operations(node, current_op.parse(req.db, target, pipeline))
        pipeline = pipeline[1:]
        ns = f"{req.db}.$cmd.aggregate"
    elif local_sessions.is_list_local_sessions(pipeline):
        docs = local_sessions.local_sessions_docs(node.local_sessions, req.db, target, pipeline,
                                                  req.conn)
        pipeline = pipeline[1:]
        ns = f"{req.db}.$cmd.aggregate"
    elif target == 1 or isinstance(target, (int, float)) and not isinstance(target, bool):
        if pipeline and isinstance(pipeline[0], dict) and "$documents" in pipeline[0]:
            docs = list(pipeline[0]["$documents"])
            pipeline = pipeline[1:]
            ns = f"{req.db}.$cmd.aggregate"
        else:
            raise MongoError(73, f"{{aggregate: 1}} is not valid for '{pipeline[0] if pipeline else ''}'; "
                                 f"a collection is required.")
    elif coll_stats.is_coll_stats(pipeline):
        name = coll_name(req)
        ns = f"{req.db}.{name}"
        coll_stats.check_position(pipeline)
        docs = coll_stats.coll_stats_docs(node, req.db, name, pipeline[0][coll_stats.STAGE])
        pipeline = pipeline[1:]
    else:
        name = coll_name(req)
        ns = f"{req.db}.{name}"
        coll_stats.check_position(pipeline)
        vdocs = view_docs(node, req, name)
        if req.db == "local" and name == "oplog.rs":
            docs = list(node.oplog.entries_from(0))
        elif vdocs is not None:
            docs = vdocs
        else:
            raw = storage.get(req.db, name)
            hints.check_hint(raw, req.body.get("hint"), ns)
            coll = node.sharding.owned_view(req, txn_view(node, raw, req))
            if pipeline and pipeline[0] == {"$match": {}} and coll is not None and \
                    fast_group.is_count(pipeline[1:]):
                docs = coll.docs.values()  # a count needs only its size (O(1))
                pipeline = pipeline[1:]
            elif pipeline and isinstance(pipeline[0], dict) and list(pipeline[0]) == ["$match"] \
                    and isinstance(pipeline[0]["$match"], dict):
                # the leading $match as the query layer runs it: paced, honouring maxTimeMS
                docs = [d for _, d in await q.select_paced(coll, pipeline[0]["$match"])]
                pipeline = pipeline[1:]
            else:
                docs = list(coll.docs.values()) if coll is not None else []
    for st in pipeline:
        if isinstance(st, dict) and ("$out" in st or "$merge" in st):
            raise MongoError(238, "$out and $merge are not supported by shardsim")
    grouped = fast_group.group(docs, pipeline)  # counts and simple tallies, one pass
    if grouped is not None:
        docs, pipeline = grouped
    docs = q.run_pipeline([q.deep_copy(d) for d in docs], pipeline, Database(node, req.db))
    bs = cursor_opt.get("batchSize")
    if bs is not None and (isinstance(bs, bool) or not isinstance(bs, (int, float)) or bs < 0):
        raise MongoError(51024, f"BatchSize value must be non-negative, but received: {bs}")
    cursor = ListCursor(ns, docs)
    if bs == 0:
        reply = await node.cursors.run_first_batch(_EmptyFirst(cursor), 0)
    else:
        reply = await node.cursors.run_first_batch(cursor, int(bs) if bs else None)
    return {"cursor": reply}


class _EmptyFirst(Cursor):
    """``batchSize: 0``: an empty first batch, then the wrapped cursor's batches."""

    def __init__(self, inner: Cursor) -> None:
        super().__init__(inner.ns)
        self.inner = inner
        self.tailable = inner.tailable
        self.await_data = inner.await_data
        self.no_timeout = inner.no_timeout

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        """Nothing on the first fetch, then the wrapped cursor's batches."""
        if first:
            return Batch([], exhausted=False)
        return await self.inner.fetch(batch_size, max_time_ms, first=False)

    async def close(self) -> None:
        """Close the wrapped cursor."""
        await self.inner.close()


@commands.handler("mapReduce", "mapreduce", versioned=True, reads=True, secondary="optIn", privileges=priv.on_coll("find"))
async def map_reduce(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``mapReduce`` on a shard (``map_reduce_agg.cpp``; JavaScript in
    :func:`shardsim.core.javascript.map_reduce`): the documents matching ``query`` (``sort``,
    ``limit``) are mapped, reduced and finalized; ``out: {inline: 1}`` answers ``{results:
    [{_id, value}]}``, a collection name or ``{replace, db?}`` replaces that collection's
    documents (a delete and an insert here, so change streams see those) and answers
    ``{result: <name>}`` (``{result: {db, collection}}`` with ``db``). Errors:
    :func:`shardsim.core.javascript.parse_map_reduce`'s, 26 never (a missing collection maps
    nothing), 139 / 50 from the engine."""
    from shardsim.core import javascript
    spec = javascript.parse_map_reduce(req.body)
    name = coll_name(req)
    coll = node.storage.get(req.db, name)
    docs = [d for _, d in await q.select_paced(coll, spec["query"])] if coll is not None else []
    if spec["sort"]:
        docs = await q.sort_docs_paced(docs, spec["sort"])
    if spec["limit"]:
        docs = docs[:spec["limit"]]
    results = javascript.map_reduce(req.db, docs, spec)
    if spec["out"] is None:
        return {"results": results}
    out_db, out_name = spec["out"]
    db = out_db or req.db
    for cmd in ({"delete": out_name, "deletes": [{"q": {}, "limit": 0}]},
                {"insert": out_name, "documents": results} if results else
                {"create": out_name}):
        cmd["$db"] = db
        if "writeConcern" in req.body:
            cmd["writeConcern"] = req.body["writeConcern"]
        reply = await node.run_command(Request(next(iter(cmd)), db, cmd, req.conn))
        if not reply.get("ok") and reply.get("code") != 48:
            raise MongoError(int(reply.get("code", 8)), str(reply.get("errmsg", "")))
        if reply.get("writeErrors"):
            e = reply["writeErrors"][0]
            raise MongoError(int(e["code"]), e.get("errmsg", ""))
    return {"result": {"db": db, "collection": out_name} if out_db else out_name}
