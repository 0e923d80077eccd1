"""The router's command table (what a mongos answers; see
``shared/reference/router-command-surface.md``): sharding commands, reads, DDL, transactions.

Writes are in :mod:`router.writes`; change streams in :mod:`router.change_stream`.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

from router.node import BIG_BATCH, forwardable
from shardsim.shard_key import compare
from router import change_stream, writes
from shardsim.client import remote_error
from shardsim.commands import Request, check_type
from shardsim.errors import MongoError

if TYPE_CHECKING:  # pragma: no cover
    from router.node import RouterNode

# Stages that work per document and can run on every shard before the merge.
_SHARD_STAGES = frozenset({"$match", "$project", "$addFields", "$set", "$unset", "$unwind",
                           "$replaceRoot", "$replaceWith", "$redact"})


def _ns(req: Request) -> tuple[str, str]:
    coll = req.arg
    if not isinstance(coll, str) or not coll:
        raise MongoError(73, f"Invalid namespace specified '{req.db}.{coll}'")
    return req.db, coll


def register(router: "RouterNode") -> None:
    """Register every router command on ``router.commands``."""
    router.retry_cache = writes.RetryCache()  # type: ignore[attr-defined]
    router._txns = {}  # type: ignore[attr-defined]
    c = router.commands
    r = router

    # -- transactions (single shard) ------------------------------------------------------
    def txn_key(req: Request) -> tuple[bytes, int]:
        lsid = req.get("lsid") or {}
        return (bytes(lsid.get("id", b"")), int(req.get("txnNumber", 0)))

    async def txn_participant(req: Request, shards: set[str]) -> str | None:
        """Record/check the one shard a transaction uses (OperationNotSupportedInTransaction
        263 when it would span shards: the router does not run two-phase commit)."""
        key = txn_key(req)
        txns = r._txns  # type: ignore[attr-defined]
        if req.get("startTransaction"):
            txns.pop(key, None)
            # forget older transactions of the same session
            for k in [k for k in txns if k[0] == key[0] and k[1] < key[1]]:
                del txns[k]
        current = txns.get(key)
        wanted = set(shards)
        if current is not None:
            wanted.add(current)
        if len(wanted) > 1:
            raise MongoError(263, "shardsim: a transaction through the router may only use one "
                                  f"shard; this one would use {sorted(wanted)}")
        if wanted:
            txns[key] = next(iter(wanted))
        return txns.get(key)

    router.txn_participant = txn_participant  # type: ignore[attr-defined]

    async def end_txn(req: Request) -> dict[str, Any]:
        key = txn_key(req)
        shard = r._txns.get(key)  # type: ignore[attr-defined]
        name = r.commands.canonical(req.name)
        if shard is None:
            if name == "commitTransaction":
                return {}
            raise MongoError(251, f"Transaction with {{ txnNumber: {key[1]} }} has been aborted.",
                             labels=["TransientTransactionError"])
        reply = await r.shard_command(shard, "admin", forwardable(req.body))
        if name == "abortTransaction":
            r._txns.pop(key, None)  # type: ignore[attr-defined]
        return {k: v for k, v in reply.items() if k not in ("ok", "$clusterTime", "operationTime")}

    c.register("commitTransaction", end_txn)
    c.register("abortTransaction", end_txn)

    def session_fields(req: Request) -> dict[str, Any]:
        if req.get("autocommit") is False:
            return {k: req.body[k] for k in ("lsid", "txnNumber", "autocommit") if k in req.body}
        return {}

    async def read_targets(req: Request, ns: str, filt: Any) -> list[str]:
        """Shards a read of ``ns`` with filter ``filt`` must visit."""
        info = r.catalog.collection(ns)
        if info is None:
            shard = r.read_primary(ns.split(".", 1)[0])
            shards = [shard] if shard else []
        else:
            shards = info.chunks.shards_for_query(filt if isinstance(filt, dict) else {})
        if req.get("autocommit") is False and shards:
            await txn_participant(req, set(shards))
        return shards

    async def config_read(req: Request, cursor_field: str | None) -> dict[str, Any]:
        """Reads of the ``config`` and ``admin`` databases are answered by the config server
        (as on mongos)."""
        body = forwardable(req.body)
        if cursor_field is None:
            return strip(await r.config_command(body, db=req.db))
        batch_size = body.get("batchSize") if cursor_field == "find" else (body.get("cursor") or {}).get("batchSize")
        if cursor_field == "find":
            body["batchSize"] = BIG_BATCH
        else:
            body["cursor"] = {"batchSize": BIG_BATCH}
        reply = await r.config_command(body, db=req.db)
        cur = reply["cursor"]
        docs = list(cur["firstBatch"])
        coll = cur["ns"].split(".", 1)[1]
        while cur["id"]:
            reply = await r.config_command({"getMore": cur["id"], "collection": coll,
                                            "batchSize": BIG_BATCH}, db=req.db)
            cur = reply["cursor"]
            docs.extend(cur["nextBatch"])
        return await r.cursor_reply(cur["ns"], docs, req, batch_size, bool(req.get("singleBatch")))

    def strip(reply: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in reply.items() if k not in ("ok", "$clusterTime", "operationTime")}

    # -- writes ---------------------------------------------------------------------------
    async def config_write(req: Request) -> dict[str, Any]:
        """Writes to the ``config``/``admin`` databases go to the config server (mongos)."""
        return strip(await r.config_command(forwardable(req.body), db=req.db))

    async def insert(req: Request) -> dict[str, Any]:
        if req.db in ("config", "admin"):
            return await config_write(req)
        return await writes.run_write(r, req, "insert")

    async def update(req: Request) -> dict[str, Any]:
        if req.db in ("config", "admin"):
            return await config_write(req)
        return await writes.run_write(r, req, "update")

    async def delete(req: Request) -> dict[str, Any]:
        if req.db in ("config", "admin"):
            return await config_write(req)
        return await writes.run_write(r, req, "delete")

    async def find_and_modify(req: Request) -> dict[str, Any]:
        _ns(req)
        return await writes.find_and_modify(r, req)

    c.register("insert", insert)
    c.register("update", update)
    c.register("delete", delete)
    c.register("findAndModify", find_and_modify, "findandmodify")

    # -- reads ----------------------------------------------------------------------------
    async def find(req: Request) -> dict[str, Any]:
        db, coll = _ns(req)
        if db in ("config", "admin"):
            return await config_read(req, "find")
        ns = f"{db}.{coll}"
        filt = req.get("filter") or {}
        shards = await read_targets(req, ns, filt)
        batch_size = req.get("batchSize")
        single = bool(req.get("singleBatch"))
        if not shards:
            return await r.cursor_reply(ns, [], req, batch_size, single)
        body = forwardable(req.body)
        for k in ("batchSize", "singleBatch", "noCursorTimeout", "tailable", "awaitData"):
            body.pop(k, None)
        body["batchSize"] = BIG_BATCH
        sess = session_fields(req)
        if len(shards) == 1:
            _, docs = await r.drain(shards[0], db, body, session=sess)
            return await r.cursor_reply(ns, docs, req, batch_size, single)
        sort = req.get("sort") or None
        skip = int(req.get("skip") or 0)
        limit = req.get("limit")
        limit = int(limit) if limit else None
        body.pop("skip", None)
        if limit is not None:
            body["limit"] = limit + skip
        projection = req.get("projection")
        strip: list[str] = []
        if sort and projection:
            projection = dict(projection)
            inclusive = any(v not in (0, False) for k, v in projection.items() if k != "_id")
            for f in sort:
                if inclusive and f not in projection and f.split(".")[0] not in projection:
                    projection[f] = 1
                    strip.append(f)
                elif not inclusive and projection.get(f) in (0, False):
                    del projection[f]
                    strip.append(f)
            body["projection"] = projection
        results = await asyncio.gather(*(r.drain(s, db, body, session=sess) for s in shards))
        docs = [d for _, part in results for d in part]
        if sort:
            from shardsim.query import sort_docs  # deferred: loads mongomock, rarely needed
            docs = sort_docs(docs, sort)
        docs = docs[skip:]
        if limit is not None:
            docs = docs[:limit]
        if strip:
            docs = [_strip(d, strip) for d in docs]
        return await r.cursor_reply(ns, docs, req, batch_size, single)

    c.register("find", find)

    async def count(req: Request) -> dict[str, Any]:
        db, coll = _ns(req)
        if db in ("config", "admin"):
            return await config_read(req, None)
        ns = f"{db}.{coll}"
        query = req.get("query") or {}
        shards = await read_targets(req, ns, query)
        if not shards:
            return {"n": 0}
        body = forwardable(req.body)
        if len(shards) == 1:
            reply = await r.shard_command(shards[0], db, body)
            return {"n": reply["n"]}
        skip = int(req.get("skip") or 0)
        limit = req.get("limit")
        limit = abs(int(limit)) if limit else None
        body.pop("skip", None)
        if limit is not None:
            body["limit"] = limit + skip
        replies = await asyncio.gather(*(r.shard_command(s, db, body) for s in shards))
        n = max(0, sum(int(x["n"]) for x in replies) - skip)
        if limit is not None:
            n = min(n, limit)
        return {"n": n}

    c.register("count", count)

    async def distinct(req: Request) -> dict[str, Any]:
        db, coll = _ns(req)
        if db in ("config", "admin"):
            return await config_read(req, None)
        ns = f"{db}.{coll}"
        shards = await read_targets(req, ns, req.get("query") or {})
        if not shards:
            return {"values": []}
        body = forwardable(req.body)
        replies = await asyncio.gather(*(r.shard_command(s, db, body) for s in shards))
        if len(replies) == 1:
            return {"values": replies[0]["values"]}
        from shardsim.values import id_key
        seen: dict[Any, Any] = {}
        for rep in replies:
            for v in rep["values"]:
                seen.setdefault(id_key(v), v)
        return {"values": sorted(seen.values(), key=functools.cmp_to_key(compare))}

    c.register("distinct", distinct)

    async def aggregate(req: Request) -> dict[str, Any]:
        pipeline = req.get("pipeline")
        if not isinstance(pipeline, list):
            check_type(req, "pipeline", list, "array", required=True)
        if pipeline and isinstance(pipeline[0], dict) and "$changeStream" in pipeline[0]:
            return await change_stream.aggregate_change_stream(r, req)
        cursor_opt = req.get("cursor")
        if cursor_opt is None and not req.get("explain"):
            raise MongoError(9, "The 'cursor' option is required, except for aggregate with the "
                                "explain argument")
        batch_size = (cursor_opt or {}).get("batchSize")
        db = req.db
        if req.arg == 1:
            ns = f"{db}.$cmd.aggregate"
            shard = r.read_primary(db)
            if shard is None:
                return await r.cursor_reply(ns, [], req, batch_size)
            body = forwardable(req.body)
            body["cursor"] = {"batchSize": BIG_BATCH}
            _, docs = await r.drain(shard, db, body, session=session_fields(req))
            return await r.cursor_reply(ns, docs, req, batch_size)
        db, coll = _ns(req)
        if db in ("config", "admin"):
            return await config_read(req, "aggregate")
        ns = f"{db}.{coll}"
        first_match = pipeline[0].get("$match") if pipeline and isinstance(pipeline[0], dict) else None
        shards = await read_targets(req, ns, first_match or {})
        if not shards:
            return await r.cursor_reply(ns, [], req, batch_size)
        body = forwardable(req.body)
        body["cursor"] = {"batchSize": BIG_BATCH}
        sess = session_fields(req)
        writes_out = any(isinstance(s, dict) and ("$out" in s or "$merge" in s) for s in pipeline)
        if len(shards) == 1 or writes_out:
            if writes_out and len(shards) > 1:
                raise MongoError(115, "shardsim: $out/$merge over a sharded collection is not "
                                      "supported through the router")
            _, docs = await r.drain(shards[0], db, body, session=sess)
            return await r.cursor_reply(ns, docs, req, batch_size)
        split = 0
        while split < len(pipeline) and isinstance(pipeline[split], dict) and \
                next(iter(pipeline[split]), None) in _SHARD_STAGES:
            split += 1
        body["pipeline"] = pipeline[:split]
        results = await asyncio.gather(*(r.drain(s, db, body, session=sess) for s in shards))
        docs = [d for _, part in results for d in part]
        if split < len(pipeline):
            from shardsim.query import run_pipeline
            docs = run_pipeline(docs, pipeline[split:], None)
        return await r.cursor_reply(ns, docs, req, batch_size)

    c.register("aggregate", aggregate)

    # -- views on sharded collections ----------------------------------------------------------
    # A read of a view goes to the database's primary shard like any unsharded namespace. When
    # the view's source is sharded the shard answers 169 with ``resolvedView: {ns, pipeline}``
    # and the router re-runs the read as an aggregate over the source with the view pipeline
    # first (mongos: ClusterFind/ClusterAggregate retry with the ResolvedView).
    async def run_resolved_view(req: Request, name: str, resolved: dict[str, Any]) -> dict[str, Any]:
        db, view_coll = _ns(req)
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
        reply = await aggregate(Request("aggregate", src_db or db, body, req.conn))
        docs = list(reply["cursor"]["firstBatch"])
        if reply["cursor"].get("id"):
            await r.cursors.kill([int(reply["cursor"]["id"])])
        if name == "count":
            return {"n": len(docs)}
        if name == "distinct":
            from shardsim.query import distinct_values
            return {"values": sorted(distinct_values(docs, check_type(req, "key", str, "string")),
                                     key=functools.cmp_to_key(compare))}
        ns = f"{db}.{view_coll}"
        if name == "find":
            return await r.cursor_reply(ns, docs, req, req.get("batchSize"),
                                        bool(req.get("singleBatch")))
        return await r.cursor_reply(ns, docs, req, (req.get("cursor") or {}).get("batchSize"))

    def view_aware(name: str, handler: Any) -> Any:
        async def run(req: Request) -> dict[str, Any]:
            try:
                return await handler(req)
            except MongoError as exc:
                resolved = exc.extra.get("resolvedView")
                if exc.code != 169 or not isinstance(resolved, dict):
                    raise
                return await run_resolved_view(req, name, resolved)
        return run

    for _name, _handler in (("find", find), ("count", count), ("distinct", distinct),
                            ("aggregate", aggregate)):
        c.register(_name, view_aware(_name, _handler))

    # -- catalog listing ------------------------------------------------------------------
    async def list_databases(req: Request) -> dict[str, Any]:
        body = forwardable(req.body)
        targets = [s for s, _, _ in r.catalog.shards()]
        replies = await asyncio.gather(*(r.shard_command(s, "admin", body) for s in targets))
        sizes: dict[str, int] = {}
        for rep in replies:
            for d in rep.get("databases", []):
                if d["name"] in ("admin", "config", "local"):
                    continue
                sizes[d["name"]] = sizes.get(d["name"], 0) + int(d.get("sizeOnDisk", 0) or 0)
        sizes.setdefault("config", 4096)
        sizes.setdefault("admin", 4096)
        if req.get("nameOnly"):
            return {"databases": [{"name": n} for n in sorted(sizes)]}
        total = sum(sizes.values())
        return {"databases": [{"name": n, "sizeOnDisk": s, "empty": s == 0}
                              for n, s in sorted(sizes.items())],
                "totalSize": total, "totalSizeMb": total // (1024 * 1024)}

    c.register("listDatabases", list_databases)

    async def list_collections(req: Request) -> dict[str, Any]:
        db = req.db
        ns = f"{db}.$cmd.listCollections"
        batch_size = (req.get("cursor") or {}).get("batchSize")
        shard = r.read_primary(db) if db != "config" else None
        if db in ("config", "admin"):
            return await config_read(req, "listCollections")
        if shard is None:
            return await r.cursor_reply(ns, [], req, batch_size)
        body = forwardable(req.body)
        body["cursor"] = {"batchSize": BIG_BATCH}
        _, docs = await r.drain(shard, db, body, session=session_fields(req))
        return await r.cursor_reply(ns, docs, req, batch_size)

    c.register("listCollections", list_collections)

    async def list_indexes(req: Request) -> dict[str, Any]:
        db, coll = _ns(req)
        if db in ("config", "admin"):
            return await config_read(req, "listIndexes")
        ns = f"{db}.{coll}"
        batch_size = (req.get("cursor") or {}).get("batchSize")
        shards = r.catalog.shards_for_ns(ns) or [r.read_primary(db)]
        if shards[0] is None:
            raise MongoError(26, f"ns does not exist: {ns}")
        body = forwardable(req.body)
        body["cursor"] = {"batchSize": BIG_BATCH}
        _, docs = await r.drain(shards[0], db, body)
        return await r.cursor_reply(ns, docs, req, batch_size)

    c.register("listIndexes", list_indexes)

    async def to_primary(req: Request) -> dict[str, Any]:
        shard = r.read_primary(req.db)
        if shard is None:
            raise MongoError(70, "No shards found")
        reply = await r.shard_command(shard, req.db, forwardable(req.body))
        return {k: v for k, v in reply.items() if k not in ("ok", "$clusterTime", "operationTime")}

    for name in ("dbStats", "collStats", "dataSize", "validate"):
        c.register(name, to_primary)

    # -- DDL --------------------------------------------------------------------------------
    async def broadcast_ddl(db: str, body: dict[str, Any], shards: list[str]) -> dict[str, Any]:
        """Run DDL on the primary (visible) then on the other owners with ``fromMigrate``."""
        if not shards:
            raise MongoError(70, "No shards found")
        reply = await r.shard_command(shards[0], db, body)
        if len(shards) > 1:
            quiet = dict(body)
            quiet["fromMigrate"] = True
            results = await asyncio.gather(*(r.shard_command(s, db, quiet, check=False)
                                             for s in shards[1:]))
            for res in results:
                if not res.get("ok") and res.get("code") not in (26, 27):
                    raise remote_error(res)
        return {k: v for k, v in reply.items() if k not in ("ok", "$clusterTime", "operationTime")}

    async def create(req: Request) -> dict[str, Any]:
        db, _ = _ns(req)
        primary = await r.ensure_database(db)
        return await broadcast_ddl(db, forwardable(req.body), [primary])

    c.register("create", create)

    async def on_owners(req: Request) -> dict[str, Any]:
        db, coll = _ns(req)
        ns = f"{db}.{coll}"
        name = r.commands.canonical(req.name)
        if name == "createIndexes":
            await r.ensure_database(db)
        shards = r.catalog.shards_for_ns(ns) or [r.read_primary(db)]
        if shards[0] is None:
            raise MongoError(26, f"ns does not exist: {ns}")
        reply = await broadcast_ddl(db, forwardable(req.body), shards)
        return reply

    c.register("createIndexes", on_owners)
    c.register("dropIndexes", on_owners, "deleteIndexes")
    c.register("collMod", on_owners)

    async def drop(req: Request) -> dict[str, Any]:
        db, coll = _ns(req)
        ns = f"{db}.{coll}"
        sharded = r.catalog.collection(ns) is not None
        shards = r.catalog.shards_for_ns(ns) or [r.read_primary(db)]
        if shards[0] is None:
            raise MongoError(26, "ns not found")
        try:
            return await broadcast_ddl(db, forwardable(req.body), shards)
        finally:
            if sharded:
                await r.config_command({"_configsvrDropCollection": ns})
                await r.catalog.refresh()

    c.register("drop", drop)

    async def rename(req: Request) -> dict[str, Any]:
        src, dst = req.arg, req.get("to")
        if not isinstance(src, str) or "." not in src:
            raise MongoError(73, f"Invalid source namespace: {src}")
        if not isinstance(dst, str) or "." not in dst:
            raise MongoError(73, f"Invalid target namespace: {dst}")
        sdb, ddb = src.split(".", 1)[0], dst.split(".", 1)[0]
        if sdb != ddb and r.catalog.primary_shard(sdb) != r.catalog.primary_shard(ddb):
            raise MongoError(20, "Source and destination collections must be on the same "
                                 "database primary shard")
        sharded = r.catalog.collection(src) is not None or r.catalog.collection(dst) is not None
        shards = r.catalog.shards_for_ns(src) or [r.read_primary(sdb)]
        for s in r.catalog.shards_for_ns(dst):
            if s not in shards:
                shards.append(s)
        if shards[0] is None:
            raise MongoError(26, "Source collection does not exist")
        try:
            return await broadcast_ddl("admin", forwardable(req.body), shards)
        finally:
            if sharded:
                await r.config_command({"_configsvrRenameCollection": src, "to": dst})
                await r.catalog.refresh()

    c.register("renameCollection", rename)

    async def drop_database(req: Request) -> dict[str, Any]:
        db = req.db
        if db in ("admin", "config", "local"):
            raise MongoError(20, f"Cannot drop '{db}' database through the router")
        primary = r.read_primary(db)
        if primary is None:
            return {}
        shards = [primary] + [s for s, _, _ in r.catalog.shards() if s != primary]
        known = r.catalog.primary_shard(db) is not None
        try:
            reply = await broadcast_ddl(db, forwardable(req.body), shards)
        finally:
            if known:
                await r.config_command({"_configsvrDropDatabase": db})
                await r.catalog.refresh()
        return reply

    c.register("dropDatabase", drop_database)

    # -- sharding administration ------------------------------------------------------------
    def admin_only(req: Request) -> None:
        if req.db != "admin":
            raise MongoError(13, f"{req.name} may only be run against the admin database.")

    def strip_reply(reply: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in reply.items() if k not in ("ok", "$clusterTime", "operationTime")}

    def with_fields(cmd: dict[str, Any], req: Request, fields: tuple[str, ...]) -> dict[str, Any]:
        """``cmd`` plus those of ``fields`` that the user's command carries."""
        cmd.update({k: req.body[k] for k in fields if k in req.body})
        return cmd

    async def run_on_config(cmd: dict[str, Any], hold_writes_to: str | None = None
                            ) -> dict[str, Any]:
        """Run ``cmd`` on the config server, refresh the routing cache, and return the reply
        without ok/$clusterTime/operationTime. With ``hold_writes_to`` (a namespace or a
        database), this router's writes there are held until it is done: a migration has no
        catch-up phase, so no write may land on the donor after its documents were copied."""
        if hold_writes_to is not None:
            gate = writes.gate_for(r, hold_writes_to)
            await gate.block()
            try:
                return await run_on_config(cmd)
            finally:
                await gate.unblock()
        reply = await r.config_command(cmd)
        await r.catalog.refresh()
        return strip_reply(reply)

    async def add_shard(req: Request) -> dict[str, Any]:
        admin_only(req)
        cmd: dict[str, Any] = {"_configsvrAddShard": req.arg}
        if req.get("name") is not None:
            cmd["name"] = req.get("name")
        return await run_on_config(cmd)

    c.register("addShard", add_shard, "addshard")

    async def list_shards(req: Request) -> dict[str, Any]:
        admin_only(req)
        await r.catalog.refresh()
        return {"shards": r.catalog.shard_docs()}

    c.register("listShards", list_shards, "listshards")

    async def remove_shard(req: Request) -> dict[str, Any]:
        admin_only(req)
        return await run_on_config({"_configsvrRemoveShard": req.arg})

    c.register("removeShard", remove_shard, "removeshard")

    async def enable_sharding(req: Request) -> dict[str, Any]:
        admin_only(req)
        cmd: dict[str, Any] = {"_configsvrCreateDatabase": req.arg}
        if req.get("primaryShard") is not None:
            cmd["primaryShard"] = req.get("primaryShard")
        await r.config_command(cmd)
        await r.catalog.refresh()
        return {}

    c.register("enableSharding", enable_sharding, "enablesharding")

    async def shard_collection(req: Request) -> dict[str, Any]:
        admin_only(req)
        check_type(req, "key", dict, "object", required=True)
        return await run_on_config(with_fields(
            {"_configsvrShardCollection": req.arg, "key": req.get("key")}, req,
            ("unique", "numInitialChunks", "presplitHashedZones", "collation")))

    c.register("shardCollection", shard_collection, "shardcollection")

    async def split(req: Request) -> dict[str, Any]:
        admin_only(req)
        return await run_on_config(with_fields({"_configsvrSplitChunk": req.arg}, req,
                                               ("middle", "find", "bounds")))

    c.register("split", split)

    async def move_chunk(req: Request) -> dict[str, Any]:
        admin_only(req)
        # This router's writes to the namespace are held during the migration.
        return await run_on_config(with_fields({"_configsvrMoveChunk": req.arg}, req,
                                               ("find", "bounds", "to")),
                                   hold_writes_to=str(req.arg))

    c.register("moveChunk", move_chunk, "movechunk")

    async def move_primary(req: Request) -> dict[str, Any]:
        admin_only(req)
        # This router's writes to the database are held while its collections are copied.
        return await run_on_config(with_fields({"_configsvrMovePrimary": req.arg}, req, ("to",)),
                                   hold_writes_to=str(req.arg))

    c.register("movePrimary", move_primary, "moveprimary")

    async def flush_router_config(req: Request) -> dict[str, Any]:
        await r.catalog.refresh()
        return {"flushed": True}

    c.register("flushRouterConfig", flush_router_config, "flushrouterconfig")

    async def balancer_status(req: Request) -> dict[str, Any]:
        return {"mode": "off", "inBalancerRound": False, "numBalancerRounds": 0}

    c.register("balancerStatus", balancer_status)

    async def balancer_noop(req: Request) -> dict[str, Any]:
        return {}

    c.register("balancerStart", balancer_noop)
    c.register("balancerStop", balancer_noop)

    async def isdbgrid(req: Request) -> dict[str, Any]:
        return {"isdbgrid": 1, "hostname": r.address}

    c.register("isdbgrid", isdbgrid)


def _strip(doc: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    out = dict(doc)
    for f in fields:
        top = f.split(".")[0]
        out.pop(top, None)
    return out

