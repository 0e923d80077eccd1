"""CRUD commands of the shard: insert, update, delete, findAndModify, find, count, distinct,
aggregate (``$changeStream`` is handed to :mod:`shard.change_stream`), and ``find`` on
``local.oplog.rs`` (tailable, awaitData) and ``config.system.preimages``.

Reply shapes and error codes follow mongod 8.0 (``write_commands.cpp``, ``find_cmd.cpp``,
``find_and_modify.cpp``): write errors are ``{index, code, errmsg[, keyPattern, keyValue]}`` in
``writeErrors``; ordered batches stop at the first error; upserts report
``upserted: [{index, _id}]``.
"""

from __future__ import annotations

from typing import Any

import bson
from bson import ObjectId, Regex
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.bson_limits import check_insert_depth, check_update_depth
from shardsim.clock import ts_key
from shardsim.commands import GENERIC_FIELDS, Request, bson_type_name, check_type
from shardsim.cursors import Batch, Cursor, ListCursor
from shardsim.errors import MongoError
from shardsim import query as q
from shardsim import update as update_lang
from shard.change_stream import aggregate_change_stream
from shardsim.errors import view_error
from shard.node import ShardNode, WriteContext
from shard.storage import Collection, id_key

MAX_DOC = 16 * 1024 * 1024


# Command fields of the IDL (find_command.idl, write_ops.idl) besides the generic ones; anything
# else fails like mongod's IDL parser: 40415 "BSON field '<cmd>.<field>' is an unknown field."
_KNOWN_FIELDS = {
    "find": {"filter", "projection", "sort", "hint", "skip", "limit", "batchSize", "singleBatch",
             "max", "min", "returnKey", "showRecordId", "tailable", "oplogReplay",
             "noCursorTimeout", "awaitData", "allowPartialResults", "collation", "allowDiskUse",
             "let", "term", "readOnce", "allowSpeculativeMajorityRead", "$_requestResumeToken",
             "$_resumeAfter", "$_startAt", "includeQueryStatsMetrics", "encryptionInformation",
             "collectionUUID", "ntoreturn", "isViewCommand"},
    "insert": {"documents", "ordered", "bypassDocumentValidation", "stmtIds", "stmtId",
               "collectionUUID", "isTimeseriesNamespace", "encryptionInformation", "let",
               "bypassEmptyTsReplacement", "$_fromMongos"},
    "update": {"updates", "ordered", "bypassDocumentValidation", "let", "stmtIds", "stmtId",
               "collectionUUID", "isTimeseriesNamespace", "encryptionInformation",
               "bypassEmptyTsReplacement", "$_fromMongos"},
    "delete": {"deletes", "ordered", "let", "stmtIds", "stmtId", "collectionUUID",
               "isTimeseriesNamespace", "encryptionInformation", "bypassDocumentValidation",
               "$_fromMongos"},
}


def _check_fields(req: Request, cmd: str) -> None:
    known = _KNOWN_FIELDS[cmd]
    for k in req.body:
        if k == req.name or k in known or k in GENERIC_FIELDS or k == "fromMigrate":
            continue
        raise MongoError(40415, f"BSON field '{cmd}.{k}' is an unknown field.")


def _coll_name(req: Request) -> str:
    name = req.arg
    if not isinstance(name, str):
        raise MongoError(73, f"collection name has invalid type {bson_type_name(name)}")
    if not name:
        raise MongoError(73, f"Invalid namespace specified '{req.db}.'")
    return name


def _write_error(index: int, exc: MongoError) -> dict[str, Any]:
    err: dict[str, Any] = {"index": index, "code": exc.code}
    if exc.code in (11000,):
        err["keyPattern"] = exc.extra.get("keyPattern")
        err["keyValue"] = exc.extra.get("keyValue")
    err["errmsg"] = exc.errmsg
    return err


def _check_writable(req: Request, name: str) -> None:
    if req.db == "local" and name == "oplog.rs":
        raise MongoError(73, "cannot write to 'local.oplog.rs'")
    if name.startswith("system.") and name not in ("system.js",):
        raise MongoError(73, f"cannot write to '{req.db}.{name}'")
    if req.db == "":
        raise MongoError(73, "Invalid database name: ''")


def _prepare_insert(doc: Any, raw_size: int | None) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise MongoError(14, "BSON field 'insert.documents' is the wrong type, expected type 'object'")
    size = raw_size if raw_size is not None else None
    if size is None or size > MAX_DOC - 1024:
        size = len(bson.encode(doc))
    if size > MAX_DOC:
        raise MongoError(2, f"object to insert too large. size in bytes: {size}, max size: {MAX_DOC}")
    check_insert_depth(doc)  # Overflow (15) beyond 180 levels, as fixDocumentForInsert
    if "_id" not in doc:
        doc = {"_id": ObjectId(), **doc}
    else:
        _id = doc["_id"]
        if isinstance(_id, list):
            raise MongoError(2, "can't use an array for _id")
        if isinstance(_id, Regex) or type(_id).__name__ == "Pattern":
            raise MongoError(2, "can't use a regex for _id")
        if isinstance(_id, dict) and any(isinstance(k, str) and k.startswith("$") for k in _id):
            raise MongoError(52, "_id fields may not contain '$'-prefixed fields: "
                                 f"{next(k for k in _id if k.startswith('$'))} is not valid for storage.")
        if next(iter(doc)) != "_id":
            doc = {"_id": _id, **{k: v for k, v in doc.items() if k != "_id"}}
    return doc


def _batch_opts(req: Request) -> tuple[bool, bool]:
    ordered = req.body.get("ordered", True)
    if not isinstance(ordered, bool):
        raise MongoError(14, f"BSON field '{req.name}.ordered' is the wrong type "
                             f"'{type(ordered).__name__}', expected type 'bool'")
    bypass = req.body.get("bypassDocumentValidation", False)
    return ordered, bool(bypass)


def register(node: ShardNode) -> None:
    """Register the CRUD commands on ``node.commands``."""
    storage = node.storage
    sessions = node.sessions
    c = node.commands

    def view(coll: Collection | None, req_or_ctx: Any) -> Any:
        """``coll`` as the request's transaction sees it (its own writes), else ``coll``."""
        txn = req_or_ctx.txn if isinstance(req_or_ctx, WriteContext) else node.txn_of(req_or_ctx)
        if coll is None or txn is None:
            return coll
        return txn.view(coll)

    def refuse_view_write(req: Request, name: str, count: int, ordered: bool,
                          reply: dict[str, Any]) -> dict[str, Any] | None:
        """Writes to a view fail per statement with CommandNotSupportedOnView (166), as
        ``write_ops_exec.cpp`` reports them (ordered batches stop at the first)."""
        if count == 0 or storage.view_def(req.db, name) is None:
            return None
        msg = view_error(f"{req.db}.{name}").errmsg
        reply["writeErrors"] = [{"index": i, "code": 166, "errmsg": msg}
                                for i in range(1 if ordered else count)]
        return reply

    def view_docs(req: Request, name: str) -> list[dict[str, Any]] | None:
        """The documents view ``req.db.name`` shows (its resolved pipeline run over the source
        collection, as ``ViewCatalog::resolveView`` + the aggregate rewrite do), or None when
        ``name`` is not a view."""
        resolved = storage.resolve_view(req.db, name)
        if resolved is None:
            return None
        source, pipeline = resolved
        raw_source = storage.get(req.db, source)
        if raw_source is not None and raw_source.shard_key:
            # The source is sharded: only the router can run the view (it retries the read as
            # an aggregate over the source with this pipeline; ResolvedView in mongod).
            raise MongoError(169, "Resolved views on sharded collections must be executed by "
                                  "mongos", resolvedView={"ns": f"{req.db}.{source}",
                                                          "pipeline": pipeline})
        coll = view(raw_source, req)
        docs = [q.deep_copy(d) for d in coll.docs.values()] if coll is not None else []
        return q.run_pipeline(docs, pipeline, _Database(node, req.db)) if pipeline else docs

    def begin_write(req: Request) -> WriteContext:
        ctx = node.write_context(req)
        ctx.retry = sessions.retryable(req)
        return ctx

    def stmt_id_of(req: Request, i: int) -> int:
        ids = req.body.get("stmtIds")
        if isinstance(ids, list) and i < len(ids):
            return int(ids[i])
        return int(req.body.get("stmtId", 0) or 0) + i

    def finish_write(req: Request, ctx: WriteContext, reply: dict[str, Any], retried: list[int],
                     errors: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch's reply: ``writeErrors`` (last) when there are any, ``retriedStmtIds``;
        inside a transaction the first write error aborts it and fails the command instead."""
        if errors:
            reply["writeErrors"] = errors
        if ctx.txn is not None and errors:
            err = errors[0]
            sessions.abort_on_error(req)
            raise MongoError(err["code"], err["errmsg"], labels=["TransientTransactionError"]
                             if err["code"] in (112, 251) else [],
                             **{k: v for k, v in err.items() if k in ("keyPattern", "keyValue")})
        if retried:
            reply["retriedStmtIds"] = retried
        if ctx.retry is not None:
            sessions.note(ctx.retry)
        return reply

    # -- insert -------------------------------------------------------------------------------
    async def insert(req: Request) -> dict[str, Any]:
        name = _coll_name(req)
        _check_fields(req, "insert")
        docs = check_type(req, "documents", list, "array", required=True)
        ordered, _ = _batch_opts(req)
        _check_writable(req, name)
        refused = refuse_view_write(req, name, len(docs), ordered, {"n": 0})
        if refused is not None:
            return refused
        ctx = begin_write(req)
        retry = ctx.retry
        retried: list[int] = []
        raw_docs = req.sequences.get("documents")
        coll = view(node.ensure_collection(req.db, name, ctx) if docs else storage.get(req.db, name),
                    ctx)
        txn = ctx.txn
        n = 0
        errors: list[dict[str, Any]] = []
        note = storage.journal is not None and txn is None
        for i, doc in enumerate(docs):
            try:
                if retry is not None:
                    sid = stmt_id_of(req, i)
                    if sid in retry.executed:
                        retried.append(sid)
                        n += 1
                        continue
                    ctx.stmt_id = sid
                raw_size = len(raw_docs[i]) if raw_docs is not None else None
                doc = _prepare_insert(doc, raw_size)
                k = coll.insert(doc)
                if note:
                    storage.note_doc(coll, k, doc)
                node.log_op("i", coll, doc, coll.document_key(doc), ctx=ctx, size=raw_size)
                if retry is not None:
                    retry.executed[ctx.stmt_id] = 1
                n += 1
            except MongoError as exc:
                errors.append(_write_error(i, exc))
                if ordered or txn is not None:
                    break
        reply: dict[str, Any] = {"n": n}
        return finish_write(req, ctx, reply, retried, errors)

    c.register("insert", insert)

    # -- update -------------------------------------------------------------------------------
    def do_update(coll: Collection | None, db: str, name: str, stmt: dict[str, Any],
                  ctx: WriteContext, index: int) -> tuple[int, int, Any]:
        """Returns (n matched, n modified, upserted _id or _NONE)."""
        if not isinstance(stmt, dict):
            raise MongoError(14, "BSON field 'update.updates' is the wrong type, expected type 'object'")
        if "q" not in stmt:
            raise MongoError(40414, "BSON field 'update.updates.q' is missing but a required field")
        if "u" not in stmt:
            raise MongoError(40414, "BSON field 'update.updates.u' is missing but a required field")
        filt, upd = stmt["q"], stmt["u"]
        if not isinstance(filt, dict):
            raise MongoError(14, f"BSON field 'update.updates.q' is the wrong type "
                                 f"'{type(filt).__name__}', expected type 'object'")
        multi = stmt.get("multi", False)
        upsert = stmt.get("upsert", False)
        if not isinstance(multi, bool) or not isinstance(upsert, bool):
            raise MongoError(14, "BSON field 'update.updates.multi' is the wrong type, expected type 'bool'")
        kind = update_lang.validate_update(upd)
        if multi and kind == "replacement" and upd:
            raise MongoError(9, "multi update is not supported for replacement-style update")
        array_filters = stmt.get("arrayFilters")
        update_lang.parse_array_filters(array_filters)
        matched = modified = 0
        for key, doc in q.select(coll, filt):
            concrete = update_lang.expand_positional(doc, upd, filt, array_filters)
            new = update_lang.apply_update(doc, concrete, filt)
            matched += 1
            if not update_lang.is_noop(doc, new, concrete):
                apply_replace(coll, key, doc, new, concrete, ctx)
                modified += 1
            if not multi:
                break
        if matched == 0 and upsert:
            seed = update_lang.upsert_seed(filt) if kind != "replacement" else \
                ({"_id": update_lang.upsert_seed(filt)["_id"]} if "_id" in update_lang.upsert_seed(filt) else {})
            new = update_lang.apply_update(seed, upd, filt, is_insert=True)
            if "_id" not in new:
                new = {"_id": ObjectId(), **new}
            if coll is None:
                coll = view(node.ensure_collection(db, name, ctx), ctx)
            new = _prepare_insert(new, None)
            k = coll.insert(new)
            if ctx.txn is None:
                storage.note_doc(coll, k, new)
            node.log_op("i", coll, new, coll.document_key(new), ctx=ctx)
            return 0, 0, new["_id"]
        return matched, modified, _NONE

    def apply_replace(coll: Collection, key: Any, doc: dict[str, Any], new: dict[str, Any],
                      upd: Any, ctx: WriteContext) -> None:
        check_update_depth(new)  # Overflow (15) beyond 180 levels, as storageValid
        if len(bson.encode(new)) > MAX_DOC:
            raise MongoError(17419, f"Resulting document after update is larger than {MAX_DOC}")
        coll.replace(key, new)
        if ctx.txn is None:
            storage.note_doc(coll, key, new)
        node.log_op("u", coll, update_lang.update_diff(doc, new, upd), coll.document_key(doc), ctx=ctx,
                    pre_image=doc)

    async def update(req: Request) -> dict[str, Any]:
        name = _coll_name(req)
        _check_fields(req, "update")
        stmts = check_type(req, "updates", list, "array", required=True)
        ordered, _ = _batch_opts(req)
        _check_writable(req, name)
        refused = refuse_view_write(req, name, len(stmts), ordered, {"n": 0, "nModified": 0})
        if refused is not None:
            return refused
        ctx = begin_write(req)
        retry = ctx.retry
        retried: list[int] = []
        n = n_modified = 0
        upserted: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for i, stmt in enumerate(stmts):
            try:
                done = None
                if retry is not None:
                    ctx.stmt_id = stmt_id_of(req, i)
                    done = retry.executed.get(ctx.stmt_id)
                if done is not None:
                    retried.append(ctx.stmt_id)
                    m, mod = int(done["n"]), int(done["m"])
                    up = done["u"][0] if done.get("u") else _NONE
                else:
                    coll = view(storage.get(req.db, name), ctx)
                    m, mod, up = do_update(coll, req.db, name, stmt, ctx, i)
                    if retry is not None:
                        retry.executed[ctx.stmt_id] = {"n": m, "m": mod,
                                                       "u": [up] if up is not _NONE else []}
                n += m
                n_modified += mod
                if up is not _NONE:
                    n += 1
                    upserted.append({"index": i, "_id": up})
            except MongoError as exc:
                errors.append(_write_error(i, exc))
                if ordered or ctx.txn is not None:
                    break
        reply: dict[str, Any] = {"n": n}
        if upserted:
            reply["upserted"] = upserted
        reply["nModified"] = n_modified
        return finish_write(req, ctx, reply, retried, errors)

    c.register("update", update)

    # -- delete -------------------------------------------------------------------------------
    def delete_doc(coll: Collection, key: Any, ctx: WriteContext) -> dict[str, Any]:
        old = coll.delete(key)
        if ctx.txn is None:
            storage.note_doc(coll, key, None)
        node.log_op("d", coll, coll.document_key(old), None, ctx=ctx, pre_image=old)
        return old

    async def delete(req: Request) -> dict[str, Any]:
        name = _coll_name(req)
        _check_fields(req, "delete")
        stmts = check_type(req, "deletes", list, "array", required=True)
        ordered, _ = _batch_opts(req)
        _check_writable(req, name)
        refused = refuse_view_write(req, name, len(stmts), ordered, {"n": 0})
        if refused is not None:
            return refused
        ctx = begin_write(req)
        retry = ctx.retry
        retried: list[int] = []
        n = 0
        errors: list[dict[str, Any]] = []
        for i, stmt in enumerate(stmts):
            try:
                if not isinstance(stmt, dict) or "q" not in stmt:
                    raise MongoError(40414, "BSON field 'delete.deletes.q' is missing but a required field")
                if "limit" not in stmt:
                    raise MongoError(40414, "BSON field 'delete.deletes.limit' is missing but a required field")
                limit = stmt["limit"]
                if limit not in (0, 1) or isinstance(limit, bool):
                    raise MongoError(9, f"The limit field in delete objects must be 0 or 1. Got {limit}")
                if not isinstance(stmt["q"], dict):
                    raise MongoError(14, "BSON field 'delete.deletes.q' is the wrong type, expected type 'object'")
                if retry is not None:
                    ctx.stmt_id = stmt_id_of(req, i)
                    if ctx.stmt_id in retry.executed:
                        retried.append(ctx.stmt_id)
                        n += int(retry.executed[ctx.stmt_id])
                        continue
                coll = view(storage.get(req.db, name), ctx)
                deleted = 0
                for key, _doc in q.select(coll, stmt["q"]):
                    delete_doc(coll, key, ctx)
                    deleted += 1
                    if limit == 1:
                        break
                n += deleted
                if retry is not None:
                    retry.executed[ctx.stmt_id] = deleted
            except MongoError as exc:
                errors.append(_write_error(i, exc))
                if ordered or ctx.txn is not None:
                    break
        reply: dict[str, Any] = {"n": n}
        return finish_write(req, ctx, reply, retried, errors)

    c.register("delete", delete)

    # -- findAndModify ------------------------------------------------------------------------
    async def find_and_modify(req: Request) -> dict[str, Any]:
        name = _coll_name(req)
        body = req.body
        filt = check_type(req, "query", dict, "object") or {}
        sort = check_type(req, "sort", dict, "object")
        fields = check_type(req, "fields", dict, "object")
        remove = body.get("remove", False)
        upd = body.get("update")
        new_opt = body.get("new", False)
        upsert = body.get("upsert", False)
        if remove and upd is not None:
            raise MongoError(9, "Cannot specify both an update and remove=true")
        if not remove and upd is None:
            raise MongoError(9, "Either an update or remove=true must be specified")
        if remove and (new_opt or upsert):
            raise MongoError(9, "Cannot specify both new=true and remove=true; 'remove' always "
                                "returns the deleted document")
        if upd is not None:
            update_lang.validate_update(upd)
        _check_writable(req, name)
        if storage.view_def(req.db, name) is not None:
            raise view_error(f"{req.db}.{name}")
        ctx = begin_write(req)
        if ctx.retry is not None:
            ctx.stmt_id = int(body.get("stmtId", 0) or 0)
            done = ctx.retry.executed.get(ctx.stmt_id)
            if done is not None:
                return {**done, "retriedStmtId": ctx.stmt_id}
        coll = view(storage.get(req.db, name), ctx)
        try:
            candidates = list(q.select(coll, filt))
            if sort and len(candidates) > 1:
                order = q.sort_docs([d for _, d in candidates], sort)
                by_id = {id(d): k for k, d in candidates}
                candidates = [(by_id[id(d)], d) for d in order]
            value = None
            leo: dict[str, Any] = {"n": 0}
            if remove:
                if candidates:
                    key, doc = candidates[0]
                    value = delete_doc(coll, key, ctx)
                    leo = {"n": 1}
            elif candidates:
                key, doc = candidates[0]
                concrete = update_lang.expand_positional(doc, upd, filt, body.get("arrayFilters"))
                new = update_lang.apply_update(doc, concrete, filt)
                if not update_lang.is_noop(doc, new, concrete):
                    apply_replace(coll, key, doc, new, concrete, ctx)
                value = new if new_opt else doc
                leo = {"n": 1, "updatedExisting": True}
            elif upsert:
                stmt = {"q": filt, "u": upd, "upsert": True}
                if body.get("arrayFilters") is not None:
                    stmt["arrayFilters"] = body["arrayFilters"]
                _, _, up = do_update(coll, req.db, name, stmt, ctx, 0)
                coll = view(storage.get(req.db, name), ctx)
                leo = {"n": 1, "updatedExisting": False, "upserted": up}
                value = coll.docs.get(id_key(up)) if new_opt else None
            else:
                leo = {"n": 0, "updatedExisting": False}
            if value is not None and fields:
                value = q.project([value], fields)[0]
        except MongoError:
            if ctx.txn is not None:
                sessions.abort_on_error(req)
            raise
        reply = {"lastErrorObject": leo, "value": value}
        if ctx.retry is not None:
            ctx.retry.executed[ctx.stmt_id] = reply
            sessions.note(ctx.retry)
        return reply

    c.register("findAndModify", find_and_modify, "findandmodify")

    # -- reads --------------------------------------------------------------------------------
    def read_docs(req: Request, coll: Collection | None, filt: dict[str, Any] | None,
                  sort: dict[str, Any] | None, skip: int, limit: int,
                  projection: dict[str, Any] | None) -> list[dict[str, Any]]:
        if not sort and limit and not skip:
            docs = []
            for _, d in q.select(coll, filt):
                docs.append(d)
                if len(docs) >= limit:
                    break
        else:
            docs = [d for _, d in q.select(coll, filt)]
            docs = q.sort_docs(docs, sort)
            if skip:
                docs = docs[skip:]
            if limit:
                docs = docs[:limit]
        return q.project(docs, projection)

    def _int_opt(req: Request, field: str, minimum: int = 0) -> int:
        v = check_type(req, field, (int, float), "long")
        if v is None:
            return 0
        if v < minimum:
            raise MongoError(51024, f"{field} value must be non-negative, but received: {v}") \
                if field == "batchSize" else MongoError(2, f"{field} value must be non-negative")
        return int(v)

    async def find(req: Request) -> dict[str, Any]:
        name = _coll_name(req)
        _check_fields(req, "find")
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
            cursor: Cursor = oplog_cursor(ns, filt, sort, skip, limit, projection, tailable, await_data)
        elif req.db == "config" and name == "system.preimages":
            docs = [d for d in node.pre_images.docs() if q.matches(filt, d)]
            cursor = ListCursor(ns, q.project(q.sort_docs(docs, sort)[skip:][:limit or None], projection))
        else:
            if tailable:
                raise MongoError(2, f"error processing query: ns={ns} tailable cursor requested on "
                                    f"non capped collection")
            vdocs = view_docs(req, name)
            if vdocs is not None:  # find on a view = aggregate over the view (find_cmd.cpp)
                vdocs = q.sort_docs([d for d in vdocs if q.matches(filt, d)], sort)[skip:]
                cursor = ListCursor(ns, q.project(vdocs[:limit] if limit else vdocs, projection))
            else:
                coll = view(storage.get(req.db, name), req)
                cursor = ListCursor(ns, read_docs(req, coll, filt, sort, skip, limit, projection))
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

    c.register("find", find)

    def oplog_cursor(ns: str, filt: dict[str, Any], sort: dict[str, Any] | None, skip: int,
                     limit: int, projection: dict[str, Any] | None, tailable: bool,
                     await_data: bool) -> Cursor:
        if sort and list(sort) in (["$natural"], ["ts"]) and next(iter(sort.values())) == -1:
            docs = (d for d in node.oplog.entries_reversed() if q.matches(filt, d))
            out = []
            for d in docs:
                if skip:
                    skip -= 1
                    continue
                out.append(d)
                if limit and len(out) >= limit:
                    break
            return ListCursor(ns, q.project(out, projection))
        if sort and list(sort) not in (["$natural"], ["ts"]):
            docs = [d for d in node.oplog.entries_from(0) if q.matches(filt, d)]
            docs = q.sort_docs(docs, sort)[skip:]
            return ListCursor(ns, q.project(docs[:limit] if limit else docs, projection))
        return OplogCursor(node, ns, filt, skip, limit, projection, tailable, await_data)

    async def count(req: Request) -> dict[str, Any]:
        name = _coll_name(req)
        filt = check_type(req, "query", dict, "object") or {}
        skip = _int_opt(req, "skip")
        limit = abs(int(check_type(req, "limit", (int, float), "long") or 0))
        vdocs = view_docs(req, name)
        if req.db == "local" and name == "oplog.rs":
            n = sum(1 for d in node.oplog.entries_from(0) if q.matches(filt, d))
        elif vdocs is not None:
            n = sum(1 for d in vdocs if q.matches(filt, d))
        else:
            coll = view(storage.get(req.db, name), req)
            n = len(coll.docs) if coll is not None and not filt else \
                sum(1 for _ in q.select(coll, filt))
        n = max(0, n - skip)
        if limit:
            n = min(n, limit)
        return {"n": n}

    c.register("count", count)

    async def distinct(req: Request) -> dict[str, Any]:
        name = _coll_name(req)
        key = check_type(req, "key", str, "string", required=True)
        filt = check_type(req, "query", dict, "object") or {}
        vdocs = view_docs(req, name)
        if vdocs is not None:
            return {"values": q.distinct_values((d for d in vdocs if q.matches(filt, d)), key)}
        coll = view(storage.get(req.db, name), req)
        return {"values": q.distinct_values((d for _, d in q.select(coll, filt)), key)}

    c.register("distinct", distinct)

    async def aggregate(req: Request) -> dict[str, Any]:
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
        if target == 1 or isinstance(target, (int, float)) and not isinstance(target, bool):
            if pipeline and isinstance(pipeline[0], dict) and "$documents" in pipeline[0]:
                docs = list(pipeline[0]["$documents"])
                pipeline = pipeline[1:]
                ns = f"{req.db}.$cmd.aggregate"
            else:
                raise MongoError(73, f"{{aggregate: 1}} is not valid for '{pipeline[0] if pipeline else ''}'; "
                                     f"a collection is required.")
        else:
            name = _coll_name(req)
            ns = f"{req.db}.{name}"
            vdocs = view_docs(req, name)
            if req.db == "local" and name == "oplog.rs":
                docs = list(node.oplog.entries_from(0))
            elif vdocs is not None:
                docs = vdocs
            else:
                coll = view(storage.get(req.db, name), req)
                docs = list(coll.docs.values()) if coll is not None else []
        for st in pipeline:
            if isinstance(st, dict) and ("$out" in st or "$merge" in st):
                raise MongoError(238, "$out and $merge are not supported by shardsim")
        docs = q.run_pipeline([q.deep_copy(d) for d in docs], pipeline, _Database(node, req.db))
        bs = cursor_opt.get("batchSize")
        if bs is not None and (isinstance(bs, bool) or not isinstance(bs, (int, float)) or bs < 0):
            raise MongoError(51024, f"BatchSize value must be non-negative, but received: {bs}")
        cursor = ListCursor(ns, docs)
        if bs == 0:
            reply = await node.cursors.run_first_batch(_EmptyFirst(cursor), 0)
        else:
            reply = await node.cursors.run_first_batch(cursor, int(bs) if bs else None)
        return {"cursor": reply}

    c.register("aggregate", aggregate)


_NONE = object()


class _EmptyFirst(Cursor):
    """``batchSize: 0``: an empty first batch, then the wrapped cursor."""

    def __init__(self, inner: Cursor) -> None:
        super().__init__(inner.ns)
        self.inner = inner
        self.tailable = inner.tailable
        self.await_data = inner.await_data
        self.no_timeout = inner.no_timeout

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        if first:
            return Batch([], exhausted=False)
        return await self.inner.fetch(batch_size, max_time_ms, first=False)

    async def close(self) -> None:
        await self.inner.close()


class _Database:
    """What mongomock's ``$lookup``/``$graphLookup`` need: ``get_collection(name).find(q)``."""

    def __init__(self, node: ShardNode, db: str) -> None:
        self.node = node
        self.db = db

    def get_collection(self, name: str) -> "_LookupColl":
        return _LookupColl(self.node.storage.get(self.db, name))


class _LookupColl:
    def __init__(self, coll: Collection | None) -> None:
        self.coll = coll

    def find(self, filt: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return [q.deep_copy(d) for _, d in q.select(self.coll, filt or {})]


class OplogCursor(Cursor):
    """``find`` on ``local.oplog.rs`` in natural (ts) order; tailable/awaitData as mongod's
    capped-collection cursors: an empty batch keeps the cursor open, awaitData waits up to
    ``maxTimeMS`` (default 1000 ms) for new entries. A lower bound on ``ts`` (``$gt``/``$gte``/
    equality) seeks instead of scanning."""

    def __init__(self, node: ShardNode, ns: str, filt: dict[str, Any], skip: int, limit: int,
                 projection: dict[str, Any] | None, tailable: bool, await_data: bool) -> None:
        super().__init__(ns)
        self.node = node
        self.filt = filt
        self.skip = skip
        self.limit = limit
        self.returned = 0
        self.projection = projection
        self.tailable = tailable
        self.await_data = await_data
        self.pos = _ts_lower_bound(filt)
        self.scanned = False

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        if not first and self.tailable and self.scanned and \
                self.node.oplog.truncated_through >= self.pos:
            # The entries after our position were truncated away (capped collection semantics).
            raise MongoError(136, "CollectionScan died due to position in capped collection "
                                  "being deleted.")
        limit = batch_size if batch_size else (101 if first else 1 << 62)
        if self.limit:
            limit = min(limit, self.limit - self.returned)
        out = self._scan(limit)
        if not out and self.await_data and not first:
            timeout = (max_time_ms if max_time_ms is not None else 1000) / 1000
            await self.node.oplog.wait_for_newer(self.pos - 1, timeout)
            out = self._scan(limit)
        self.returned += len(out)
        done = self.limit and self.returned >= self.limit
        if self.tailable and not done:
            return Batch(q.project(out, self.projection), exhausted=False)
        if done:
            return Batch(q.project(out, self.projection), exhausted=True)
        return Batch(q.project(out, self.projection), exhausted=self.node.oplog.latest_key < self.pos)

    def _scan(self, limit: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for entry in self.node.oplog.entries_from(self.pos):
            self.pos = ts_key(entry["ts"]) + 1
            self.scanned = True
            if q.matches(self.filt, entry):
                if self.skip:
                    self.skip -= 1
                    continue
                out.append(entry)
                if len(out) >= limit:
                    break
        return out


def _ts_lower_bound(filt: dict[str, Any]) -> int:
    conds = [filt]
    if isinstance(filt.get("$and"), list):
        conds += [c for c in filt["$and"] if isinstance(c, dict)]
    best = 0
    for c in conds:
        v = c.get("ts")
        if isinstance(v, Timestamp):
            best = max(best, ts_key(v))
        elif isinstance(v, dict):
            for op in ("$gte", "$gt", "$eq"):
                t = v.get(op)
                if isinstance(t, Timestamp):
                    best = max(best, ts_key(t) + (1 if op == "$gt" else 0))
    return best
