"""The shard's CRUD write commands: insert, update, delete, findAndModify.

Reply shapes and error codes follow mongod 8.0 (``write_commands.cpp``,
``find_and_modify.cpp``): write errors are ``{index, code, errmsg[, keyPattern, keyValue]}`` in
``writeErrors``; ordered batches stop at the first error; upserts report
``upserted: [{index, _id}]``. Retryable writes skip the statements that already ran
(``retriedStmtIds``); in a transaction the writes go to the transaction's overlay and the first
error aborts it (:mod:`shard.sessions`).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import bson
from bson import ObjectId, Regex

from shardsim.core.bson_limits import check_insert_depth, check_update_depth
from shardsim.core.commands import CommandFamily, Request, check_type
from shardsim.core.collation import collation_scope
from shardsim.core.expressions import let_scope
from shardsim.core.errors import MongoError
from shardsim.core import query as q
from shardsim.core import update as update_lang
from shardsim.shard.commands.helpers import (begin_write, check_fields, coll_name, finish_write,
                                    refuse_view_write, stmt_id_of, txn_view)
from shardsim.core.errors import view_error
from shardsim.shard.storage import Collection, id_key
from shardsim.shard import capped, hints, shard_key_update, validation
from shardsim.shard.write_conflicts import WriteConflictWait, check_statement, write_conflict_retry
from shardsim.shard.write_context import WriteContext
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode

MAX_DOC = 16 * 1024 * 1024
_NONE = object()  # "no upserted _id" (None is a valid _id)

commands = CommandFamily("crud")


def _write_error(index: int, exc: MongoError) -> dict[str, Any]:
    """One ``writeErrors`` element: ``{index, code[, keyPattern, keyValue][, errInfo],
    errmsg}`` (the error's extra info before ``errmsg``, as ``WriteError::serialize``)."""
    err: dict[str, Any] = {"index": index, "code": exc.code}
    if exc.code in (11000,):
        err["keyPattern"] = exc.extra.get("keyPattern")
        err["keyValue"] = exc.extra.get("keyValue")
    if "errInfo" in exc.extra:
        err["errInfo"] = exc.extra["errInfo"]
    if exc.code == shard_key_update.WCOS:  # WouldChangeOwningShardInfo
        for k in ("preImage", "postImage", "shouldUpsert"):
            err[k] = exc.extra.get(k)
    err["errmsg"] = exc.errmsg
    return err


def _check_writable(req: Request, name: str) -> None:
    """InvalidNamespace (73) for the oplog, ``system.*`` (but ``system.js``, and resharding's
    own ``fromMigrate`` writes to ``system.resharding.*``) and the empty db."""
    if req.db == "local" and name == "oplog.rs":
        raise MongoError(73, "cannot write to 'local.oplog.rs'")
    if name.startswith("system.") and name not in ("system.js",) and not (
            name.startswith("system.resharding.") and req.body.get("fromMigrate") is True):
        raise MongoError(73, f"cannot write to '{req.db}.{name}'")
    if req.db == "":
        raise MongoError(73, "Invalid database name: ''")


def _prepare_insert(doc: Any, raw_size: int | None) -> dict[str, Any]:
    """The document to store: size-checked (BadValue 2 over 16 MiB; ``raw_size`` saves the
    encode), with ``_id`` first (generated when missing) and checked (2, 52)."""
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


def _interrupted(node: ShardNode, ctx: WriteContext, exc: MongoError) -> None:
    """Re-raise an interruption (MaxTimeMSExpired 50 while waiting for a write conflict): it
    fails the whole batch, not one statement (``write_ops_exec.cpp`` ``handleError``); the
    statements that ran stay recorded for a retryable write."""
    if exc.code == 50:
        if ctx.retry is not None:
            node.sessions.note(ctx.retry)
        raise exc


def _batch_opts(req: Request) -> tuple[bool, bool]:
    """``(ordered, bypassDocumentValidation)``; TypeMismatch (14) for a non-bool ordered."""
    ordered = req.body.get("ordered", True)
    if not isinstance(ordered, bool):
        raise MongoError(14, f"BSON field '{req.name}.ordered' is the wrong type "
                             f"'{type(ordered).__name__}', expected type 'bool'")
    bypass = req.body.get("bypassDocumentValidation", False)
    return ordered, bool(bypass)


# -- insert -------------------------------------------------------------------------------
@commands.handler("insert", versioned=True, retryable_write=True, privileges=priv.insert_privileges)
async def insert(node: ShardNode, req: Request) -> dict[str, Any]:
    """``insert: <coll>, documents: [...]`` (``write_commands.cpp``): ``{n[, writeErrors]
    [, retriedStmtIds]}``. Creates the collection implicitly; one oplog entry per document
    (buffered in a transaction). Errors per statement in ``writeErrors`` (DuplicateKey 11000
    with keyPattern/keyValue, 2, 52, 166 on a view); command errors 14, 40414, 40415, 73, 225."""
    storage = node.storage
    name = coll_name(req)
    check_fields(req, "insert")
    docs = check_type(req, "documents", list, "array", required=True)
    ordered, _ = _batch_opts(req)
    validation.set_bypass(req.body)
    _check_writable(req, name)
    refused = refuse_view_write(node, req, name, len(docs), ordered, {"n": 0})
    if refused is not None:
        return refused
    ctx = begin_write(node, req)
    retry = ctx.retry
    retried: list[int] = []
    raw_docs = req.sequences.get("documents")
    coll = txn_view(node, node.ensure_collection(req.db, name, ctx) if docs
                    else storage.get(req.db, name), ctx)
    txn = ctx.txn
    n = 0
    errors: list[dict[str, Any]] = []
    note = storage.journal is not None and txn is None
    for i, doc in enumerate(docs):
        try:
            if retry is not None:
                sid = stmt_id_of(req, i)
                if retry.lookup(sid) is not None:
                    retried.append(sid)
                    n += 1
                    continue
                ctx.stmt_id = sid
            raw_size = len(raw_docs[i]) if raw_docs is not None else None
            doc = _prepare_insert(doc, raw_size)
            validation.check(coll, doc)
            try:
                k = coll.insert(doc)
            except WriteConflictWait as exc:  # writeConflictRetry (shard.write_conflicts)
                k = await write_conflict_retry(req, exc, lambda: coll.insert(doc), node.flush)
            if note:
                storage.note_doc(coll, k, doc)
            node.log_op("i", coll, doc, coll.document_key(doc), ctx=ctx, size=raw_size)
            if txn is None and getattr(coll, "capped", False):
                capped.evict(node, coll, k)
            if retry is not None:
                retry.record_result(ctx.stmt_id, 1)
            n += 1
        except MongoError as exc:
            _interrupted(node, ctx, exc)
            errors.append(_write_error(i, exc))
            if ordered or txn is not None:
                break
    reply: dict[str, Any] = {"n": n}
    return finish_write(node, req, ctx, reply, retried, errors)


# -- update -------------------------------------------------------------------------------
def do_update(node: ShardNode, coll: Collection | None, db: str, name: str, stmt: dict[str, Any],
              ctx: WriteContext, index: int) -> tuple[int, int, Any]:
    """Run one update statement ``{q, u, multi?, upsert?, arrayFilters?}`` on ``coll`` (None
    when missing: an upsert creates it). Returns (n matched, n modified, upserted _id or
    ``_NONE``). Raises 9, 14, 40414 for a bad statement and the update language's errors."""
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
    # 2 for an unknown index (a write error)
    hints.check_hint(node.storage.get(db, name), stmt.get("hint"))
    # a statement's constants ($$ variables of its pipeline, 8.0 bulkWrite) and collation
    with let_scope(stmt.get("c")), collation_scope(stmt.get("collation")):
        return _do_update(node, coll, db, name, stmt, ctx, filt, upd, multi, upsert, kind,
                          array_filters)


# The keys a paced pre-scan found for the statement being run (None: scan the collection).
_PRESCANNED: ContextVar[list[Any] | None] = ContextVar("shard_prescanned", default=None)


class _Prescanned:
    """``coll`` seen through the keys of a pre-scan (what :func:`shardsim.core.query.select`
    reads); each document is matched again when the write visits it."""

    def __init__(self, coll: Any, keys: list[Any]) -> None:
        docs = coll.docs
        self.docs = {k: docs[k] for k in keys if k in docs}


def _scope(coll: Any) -> Any:
    keys = _PRESCANNED.get()
    return coll if keys is None or coll is None else _Prescanned(coll, keys)


async def _prescan(node: ShardNode, req: Request, name: str, stmt: Any,
                   ctx: WriteContext, multi: bool) -> list[Any] | None:
    """The keys of the documents a multi-document update or delete statement outside a
    transaction may touch, found by a scan that yields to the loop and honours maxTimeMS
    (:func:`shardsim.core.query.select_paced`, issue 28): the write then visits only those, matching
    each again, so a slow filter (a backtracking ``$regex``) stalls no other client. None when
    the statement is run as before (single-document, in a transaction, sorted, or a
    collection with prepared or transaction writers)."""
    if not multi or ctx.txn is not None or not isinstance(stmt, dict) \
            or not isinstance(stmt.get("q"), dict) or stmt.get("sort"):
        return None
    coll = txn_view(node, node.storage.get(req.db, name), ctx)
    if coll is None or coll.prepared or coll.txn_writers:
        return None
    with let_scope(stmt.get("c")), collation_scope(stmt.get("collation")):
        return [k for k, _ in await q.select_paced(coll, stmt["q"])]


def _candidates(coll: Collection | None, filt: dict[str, Any], sort: Any) -> Any:
    """The documents an update visits: natural order, or ``sort`` order (8.0's
    ``updateOne``/``replaceOne`` ``sort``: the first document in that order is updated)."""
    if not sort:
        return q.select(_scope(coll), filt)
    if not isinstance(sort, dict):
        raise MongoError(14, "BSON field 'update.updates.sort' is the wrong type, expected "
                             "type 'object'")
    pairs = list(q.select(coll, filt))
    by_id = {id(d): k for k, d in pairs}
    return [(by_id[id(d)], d) for d in q.sort_docs([d for _, d in pairs], sort)]


def _do_update(node: ShardNode, coll: Collection | None, db: str, name: str,
               stmt: dict[str, Any], ctx: WriteContext, filt: dict[str, Any], upd: Any,
               multi: bool, upsert: bool, kind: str, array_filters: Any) -> tuple[int, int, Any]:
    storage = node.storage
    if ctx.txn is None and coll is not None and (coll.prepared or coll.txn_writers):
        check_statement(coll, filt, multi)  # waits before it starts (shard.write_conflicts)
    matched = modified = 0
    for key, doc in _candidates(coll, filt, stmt.get("sort") if not multi else None):
        concrete = update_lang.expand_positional(doc, upd, filt, array_filters)
        new = update_lang.apply_update(doc, concrete, filt)
        matched += 1
        if not update_lang.is_noop(doc, new, concrete):
            shard_key_update.check_update(node, ctx, f"{db}.{name}", doc, new, multi)
            apply_replace(node, coll, key, doc, new, concrete, ctx)
            modified += 1
        if not multi:
            break
    if matched == 0 and upsert:
        seed = update_lang.upsert_seed(filt) if kind != "replacement" else \
            ({"_id": update_lang.upsert_seed(filt)["_id"]} if "_id" in update_lang.upsert_seed(filt) else {})
        new = update_lang.apply_update(seed, upd, filt, is_insert=True)
        if "_id" not in new:
            new = {"_id": ObjectId(), **new}
        shard_key_update.check_upsert(node, ctx, f"{db}.{name}", filt, new)
        if coll is None:
            coll = txn_view(node, node.ensure_collection(db, name, ctx), ctx)
        new = _prepare_insert(new, None)
        validation.check(coll, new)
        k = coll.insert(new)
        if ctx.txn is None:
            storage.note_doc(coll, k, new)
        node.log_op("i", coll, new, coll.document_key(new), ctx=ctx)
        if ctx.txn is None and getattr(coll, "capped", False):
            capped.evict(node, coll, k)
        return 0, 0, new["_id"]
    return matched, modified, _NONE


def apply_replace(node: ShardNode, coll: Collection, key: Any, doc: dict[str, Any],
                  new: dict[str, Any], upd: Any, ctx: WriteContext) -> None:
    """Store ``new`` over ``doc`` and log the update (``$v: 2`` diff, pre-image ``doc``).
    17419 when the result is over 16 MiB."""
    check_update_depth(new)  # Overflow (15) beyond 180 levels, as storageValid
    if len(bson.encode(new)) > MAX_DOC:
        raise MongoError(17419, f"Resulting document after update is larger than {MAX_DOC}")
    validation.check(coll, new, doc)
    coll.replace(key, new)
    if ctx.txn is None:
        node.storage.note_doc(coll, key, new)
    node.log_op("u", coll, update_lang.update_diff(doc, new, upd), coll.document_key(doc), ctx=ctx,
                pre_image=doc)


@commands.handler("update", versioned=True, retryable_write=True, privileges=priv.update_privileges)
async def update(node: ShardNode, req: Request) -> dict[str, Any]:
    """``update: <coll>, updates: [{q, u, multi, upsert, arrayFilters}]``: ``{n[, upserted:
    [{index, _id}]], nModified[, writeErrors][, retriedStmtIds]}``; ordered batches stop at the
    first error (``write_commands.cpp``)."""
    storage = node.storage
    name = coll_name(req)
    check_fields(req, "update")
    stmts = check_type(req, "updates", list, "array", required=True)
    ordered, _ = _batch_opts(req)
    validation.set_bypass(req.body)
    _check_writable(req, name)
    refused = refuse_view_write(node, req, name, len(stmts), ordered, {"n": 0, "nModified": 0})
    if refused is not None:
        return refused
    ctx = begin_write(node, req)
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
                done = retry.lookup(ctx.stmt_id)
            if done is not None:
                retried.append(ctx.stmt_id)
                if isinstance(done, dict):
                    m, mod = int(done["n"]), int(done["m"])
                    up = done["u"][0] if done.get("u") else _NONE
                else:  # the delete/insert pair of an update that moved its document's shard
                    m, mod, up = int(done), int(done), _NONE
            else:
                keys = await _prescan(node, req, name, stmt, ctx,
                                      isinstance(stmt, dict) and "u" in stmt
                                      and stmt.get("multi") is True)
                coll = txn_view(node, storage.get(req.db, name), ctx)
                token = _PRESCANNED.set(keys)
                try:
                    m, mod, up = do_update(node, coll, req.db, name, stmt, ctx, i)
                except WriteConflictWait as exc:  # writeConflictRetry (shard.write_conflicts)
                    _PRESCANNED.reset(token)  # the retry scans the collection again
                    token = _PRESCANNED.set(None)
                    m, mod, up = await write_conflict_retry(req, exc, lambda: do_update(
                        node, txn_view(node, storage.get(req.db, name), ctx), req.db, name,
                        stmt, ctx, i), node.flush)
                finally:
                    _PRESCANNED.reset(token)
                if retry is not None:
                    retry.record_result(ctx.stmt_id, {"n": m, "m": mod,
                                                      "u": [up] if up is not _NONE else []})
            n += m
            n_modified += mod
            if up is not _NONE:
                n += 1
                upserted.append({"index": i, "_id": up})
        except MongoError as exc:
            _interrupted(node, ctx, exc)
            errors.append(_write_error(i, exc))
            if ordered or ctx.txn is not None:
                break
    reply: dict[str, Any] = {"n": n}
    if upserted:
        reply["upserted"] = upserted
    reply["nModified"] = n_modified
    return finish_write(node, req, ctx, reply, retried, errors)


# -- delete -------------------------------------------------------------------------------
def delete_doc(node: ShardNode, coll: Collection, key: Any, ctx: WriteContext) -> dict[str, Any]:
    """Delete the document at ``key`` and log it (pre-image kept); returns the old document."""
    old = coll.delete(key)
    if ctx.txn is None:
        node.storage.note_doc(coll, key, None)
    node.log_op("d", coll, coll.document_key(old), None, ctx=ctx, pre_image=old)
    return old


def _delete_stmt(node: ShardNode, req: Request, name: str, stmt: dict[str, Any],
                 ctx: WriteContext) -> int:
    """Run one checked delete statement ``{q, limit}``; returns how many it deleted. Outside a
    transaction, :class:`WriteConflictWait` before anything is deleted when another
    transaction holds a document it meets."""
    coll = txn_view(node, node.storage.get(req.db, name), ctx)
    limit = stmt["limit"]
    if ctx.txn is None and coll is not None and (coll.prepared or coll.txn_writers):
        with collation_scope(stmt.get("collation")):
            check_statement(coll, stmt["q"], limit == 0)
    deleted = 0
    matched: Any = q.select(_scope(coll), stmt["q"])
    if stmt.get("collation") is not None:
        with collation_scope(stmt["collation"]):
            matched = list(matched)
    for key, _doc in matched:
        delete_doc(node, coll, key, ctx)
        deleted += 1
        if limit == 1:
            break
    return deleted


@commands.handler("delete", versioned=True, retryable_write=True, privileges=priv.on_coll("remove"))
async def delete(node: ShardNode, req: Request) -> dict[str, Any]:
    """``delete: <coll>, deletes: [{q, limit: 0|1}]``: ``{n[, writeErrors][, retriedStmtIds]}``;
    40414 for a missing q/limit, FailedToParse (9) for another limit."""
    storage = node.storage
    name = coll_name(req)
    check_fields(req, "delete")
    stmts = check_type(req, "deletes", list, "array", required=True)
    ordered, _ = _batch_opts(req)
    _check_writable(req, name)
    refused = refuse_view_write(node, req, name, len(stmts), ordered, {"n": 0})
    if refused is not None:
        return refused
    ctx = begin_write(node, req)
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
                done = retry.lookup(ctx.stmt_id)
                if done is not None:
                    retried.append(ctx.stmt_id)
                    n += int(done) if not isinstance(done, dict) else int(done.get("n", 0))
                    continue
            hints.check_hint(storage.get(req.db, name), stmt.get("hint"))
            token = _PRESCANNED.set(await _prescan(node, req, name, stmt, ctx, limit == 0))
            try:
                deleted = _delete_stmt(node, req, name, stmt, ctx)
            except WriteConflictWait as exc:  # writeConflictRetry (shard.write_conflicts)
                _PRESCANNED.reset(token)
                token = _PRESCANNED.set(None)
                deleted = await write_conflict_retry(
                    req, exc, lambda: _delete_stmt(node, req, name, stmt, ctx), node.flush)
            finally:
                _PRESCANNED.reset(token)
            n += deleted
            if retry is not None:
                retry.record_result(ctx.stmt_id, deleted)
        except MongoError as exc:
            _interrupted(node, ctx, exc)
            errors.append(_write_error(i, exc))
            if ordered or ctx.txn is not None:
                break
    reply: dict[str, Any] = {"n": n}
    return finish_write(node, req, ctx, reply, retried, errors)


# -- findAndModify ------------------------------------------------------------------------
def _find_and_modify_once(node: ShardNode, req: Request, name: str, ctx: WriteContext,
                          filt: dict[str, Any], sort: Any, fields: Any) -> tuple[dict, Any]:
    """One attempt of a findAndModify: ``(lastErrorObject, value)``. Outside a transaction,
    :class:`WriteConflictWait` before anything changed when another transaction holds the
    document it would modify (or a prepared one its scan meets)."""
    storage = node.storage
    body = req.body
    remove = body.get("remove", False)
    upd = body.get("update")
    new_opt = body.get("new", False)
    upsert = body.get("upsert", False)
    coll = txn_view(node, storage.get(req.db, name), ctx)
    if ctx.txn is None and coll is not None and coll.prepared:
        check_statement(coll, filt, False)  # a prepare conflict of its scan
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
            value = delete_doc(node, coll, key, ctx)
            leo = {"n": 1}
    elif candidates:
        key, doc = candidates[0]
        concrete = update_lang.expand_positional(doc, upd, filt, body.get("arrayFilters"))
        new = update_lang.apply_update(doc, concrete, filt)
        if not update_lang.is_noop(doc, new, concrete):
            shard_key_update.check_update(node, ctx, f"{req.db}.{name}", doc, new, False)
            apply_replace(node, coll, key, doc, new, concrete, ctx)
        value = new if new_opt else doc
        leo = {"n": 1, "updatedExisting": True}
    elif upsert:
        stmt = {"q": filt, "u": upd, "upsert": True}
        if body.get("arrayFilters") is not None:
            stmt["arrayFilters"] = body["arrayFilters"]
        _, _, up = do_update(node, coll, req.db, name, stmt, ctx, 0)
        coll = txn_view(node, storage.get(req.db, name), ctx)
        leo = {"n": 1, "updatedExisting": False, "upserted": up}
        value = coll.docs.get(id_key(up)) if new_opt else None
    else:
        leo = {"n": 0, "updatedExisting": False}
    if value is not None and fields:
        value = q.project([value], fields)[0]
    return leo, value


@commands.handler("findAndModify", "findandmodify", versioned=True, retryable_write=True, privileges=priv.find_and_modify_privileges)
async def find_and_modify(node: ShardNode, req: Request) -> dict[str, Any]:
    """``findAndModify`` (``find_and_modify.cpp``): ``{lastErrorObject: {n, updatedExisting?,
    upserted?}, value}``; a retry returns the recorded reply with ``retriedStmtId``. Errors:
    FailedToParse (9) for conflicting options, 166 on a view; inside a transaction a failure
    aborts it."""
    storage = node.storage
    name = coll_name(req)
    body = req.body
    validation.set_bypass(body)
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
    ctx = begin_write(node, req)
    if ctx.retry is not None:
        ctx.stmt_id = int(body.get("stmtId", 0) or 0)
        done = ctx.retry.lookup(ctx.stmt_id)
        if isinstance(done, dict) and "img" in done:  # recorded by a member from the entry
            done = retry_image_reply(done, new_opt, fields)
        if isinstance(done, dict):
            return {**done, "retriedStmtId": ctx.stmt_id}
    hints.check_hint(storage.get(req.db, name), body.get("hint"))
    args = (node, req, name, ctx, filt, sort, fields)
    try:
        try:
            leo, value = _find_and_modify_once(*args)
        except WriteConflictWait as exc:  # writeConflictRetry (shard.write_conflicts)
            leo, value = await write_conflict_retry(req, exc,
                                                    lambda: _find_and_modify_once(*args),
                                                    node.flush)
    except MongoError as exc:
        if ctx.txn is not None and exc.code != shard_key_update.WCOS:
            node.sessions.abort_on_error(req)  # WouldChangeOwningShard leaves it open
        raise
    reply = {"lastErrorObject": leo, "value": value}
    if ctx.retry is not None:
        ctx.retry.record_result(ctx.stmt_id, reply)
        node.sessions.note(ctx.retry)
    return reply


def retry_image_reply(done: dict[str, Any], new_opt: Any, fields: Any) -> dict[str, Any]:
    """The reply to a findAndModify retried on a member that applied the statement's entry
    rather than ran it (:mod:`shard.replication.apply_txn` keeps the document before and after
    as ``img``), as the server answers from the image the entry's ``needsRetryImage`` points to
    (``parseOplogEntryForFindAndModify``): ``lastErrorObject`` from the entry's kind, ``value``
    the document after with ``new: true``, else before, with this request's projection."""
    img = done["img"]
    op = img.get("op")
    if op == "d":
        leo: dict[str, Any] = {"n": 1}
        value = img.get("pre")
    elif op == "i":
        leo = {"n": 1, "updatedExisting": False, "upserted": (img.get("post") or {}).get("_id")}
        value = img.get("post") if new_opt else None
    else:
        leo = {"n": 1, "updatedExisting": True}
        value = img.get("post") if new_opt else img.get("pre")
    if value is not None and fields:
        value = q.project([value], fields)[0]
    return {"lastErrorObject": leo, "value": value}
