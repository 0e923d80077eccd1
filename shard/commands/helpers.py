"""What several shard command families share: namespace checks, the write context of a batch
(session, transaction, retryable-write bookkeeping), and reads through views and transactions.

Plain functions of ``(node, req, ...)``; ``node`` is a :class:`shard.node.ShardNode`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.commands import GENERIC_FIELDS, Request, bson_type_name
from shardsim.core.errors import MongoError
from shardsim.core import query as q
from shardsim.core.errors import view_error
from shardsim.shard.storage import Collection, validate_collection_name, validate_db_name
from shardsim.shard.write_context import WriteContext
from shardsim.shard.read_concern import SNAPSHOT_AT
from shardsim.shard.snapshot import SnapshotView
from shardsim.core.protocol.versions import UNSHARDED_EPOCH

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode


# Command fields of the IDL (find_command.idl, write_ops.idl) besides the generic ones; anything
# else fails like mongod's IDL parser: 40415 "BSON field '<cmd>.<field>' is an unknown field."
KNOWN_FIELDS = {
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


# -- namespaces --------------------------------------------------------------------------------
def check_fields(req: Request, cmd: str) -> None:
    """Refuse fields ``cmd``'s IDL does not know: UnknownField (40415)."""
    known = KNOWN_FIELDS[cmd]
    for k in req.body:
        if k == req.name or k in known or k in GENERIC_FIELDS or k == "fromMigrate":
            continue
        raise MongoError(40415, f"BSON field '{cmd}.{k}' is an unknown field.")


def coll_name(req: Request) -> str:
    """The collection a CRUD command names (its first value). InvalidNamespace (73) when it is
    not a string or empty."""
    name = req.arg
    if not isinstance(name, str):
        raise MongoError(73, f"collection name has invalid type {bson_type_name(name)}")
    if not name:
        raise MongoError(73, f"Invalid namespace specified '{req.db}.'")
    return name


def ddl_name(req: Request) -> str:
    """The collection a catalog command names, with the database and collection names
    validated (:func:`shard.storage.validate_db_name`/``validate_collection_name``: 73).
    BadValue (2) when it is not a string."""
    name = req.arg
    if not isinstance(name, str):
        raise MongoError(2, f"collection name has invalid type {bson_type_name(name)}")
    validate_db_name(req.db)
    validate_collection_name(req.db, name)
    return name


def ns_missing(ns: str) -> MongoError:
    """NamespaceNotFound (26) "ns does not exist: <ns>"."""
    return MongoError(26, f"ns does not exist: {ns}")


def existing_collection(node: ShardNode, db: str, name: str) -> Collection:
    """The collection ``db.name``: CommandNotSupportedOnView (166) when it is a view,
    NamespaceNotFound (26) "ns does not exist" when there is neither."""
    coll = node.storage.get(db, name)
    if coll is None and node.storage.view_def(db, name) is not None:
        raise view_error(f"{db}.{name}")
    if coll is None:
        raise ns_missing(f"{db}.{name}")
    return coll


# -- the write context of a command --------------------------------------------------------------
def ddl_context(req: Request) -> WriteContext:
    """A catalog command's context: only ``fromMigrate`` (DDL is never part of a session)."""
    return WriteContext(from_migrate=req.body.get("fromMigrate") is True)


def begin_write(node: ShardNode, req: Request) -> WriteContext:
    """A CRUD batch's context (:meth:`ShardNode.write_context`) with its retryable-write
    session (:meth:`Sessions.retryable`; raises TransactionTooOld 225)."""
    ctx = node.write_context(req)
    ctx.retry = node.sessions.retryable(req)
    sv = req.body.get("shardVersion")
    ctx.routed = isinstance(sv, dict) and sv.get("e") != UNSHARDED_EPOCH
    return ctx


def stmt_id_of(req: Request, i: int) -> int:
    """The stmtId of the batch's ``i``-th statement: ``stmtIds[i]``, else ``stmtId + i``."""
    ids = req.body.get("stmtIds")
    if isinstance(ids, list) and i < len(ids):
        return int(ids[i])
    return int(req.body.get("stmtId", 0) or 0) + i


def finish_write(node: ShardNode, req: Request, ctx: WriteContext, reply: dict[str, Any],
                 retried: list[int], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch's reply: ``writeErrors`` (last) when there are any, ``retriedStmtIds``;
    inside a transaction the first write error aborts it and fails the command instead (with
    TransientTransactionError for WriteConflict 112 / NoSuchTransaction 251)."""
    if errors:
        reply["writeErrors"] = errors
    if ctx.txn is not None and errors and errors[0]["code"] != 283:
        # WouldChangeOwningShard leaves the transaction open: the router continues it with
        # a delete and an insert (shard.shard_key_update)
        err = errors[0]
        node.sessions.abort_on_error(req)
        raise MongoError(err["code"], err["errmsg"], labels=["TransientTransactionError"]
                         if err["code"] in (112, 251) else [],
                         **{k: v for k, v in err.items() if k in ("keyPattern", "keyValue")})
    if retried:
        reply["retriedStmtIds"] = retried
    if ctx.retry is not None:
        node.sessions.note(ctx.retry)
    return reply


# -- reads through transactions and views ------------------------------------------------------
def txn_view(node: ShardNode, coll: Collection | None, req_or_ctx: Request | WriteContext) -> Any:
    """``coll`` as the request's transaction sees it (a :class:`shard.sessions.TxnView` with its
    own writes), as of a snapshot read's atClusterTime (:class:`shard.snapshot.SnapshotView`),
    else ``coll`` itself (None stays None)."""
    txn = req_or_ctx.txn if isinstance(req_or_ctx, WriteContext) else node.txn_of(req_or_ctx)
    if coll is None:
        return coll
    if txn is None:
        at = SNAPSHOT_AT.get() if isinstance(req_or_ctx, Request) else None
        # a snapshot read: the collection as of atClusterTime (shard.read_concern)
        return SnapshotView(coll, at) if at is not None else coll
    return txn.view(coll)


def refuse_view_write(node: ShardNode, req: Request, name: str, count: int, ordered: bool,
                      reply: dict[str, Any]) -> dict[str, Any] | None:
    """Writes to a view fail per statement with CommandNotSupportedOnView (166), as
    ``write_ops_exec.cpp`` reports them (ordered batches stop at the first): ``reply`` with
    ``writeErrors``, or None when ``name`` is not a view (or the batch is empty)."""
    if count == 0 or node.storage.view_def(req.db, name) is None:
        return None
    msg = view_error(f"{req.db}.{name}").errmsg
    reply["writeErrors"] = [{"index": i, "code": 166, "errmsg": msg}
                            for i in range(1 if ordered else count)]
    return reply


def view_docs(node: ShardNode, req: Request, name: str) -> list[dict[str, Any]] | None:
    """The documents view ``req.db.name`` shows (its resolved pipeline run over the source
    collection, as ``ViewCatalog::resolveView`` + the aggregate rewrite do), or None when
    ``name`` is not a view. CommandOnShardedViewNotSupportedOnMongod (169, with
    ``resolvedView: {ns, pipeline}``) when the source collection is sharded."""
    storage = node.storage
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
    coll = txn_view(node, raw_source, req)
    docs = [q.deep_copy(d) for d in coll.docs.values()] if coll is not None else []
    return q.run_pipeline(docs, pipeline, Database(node, req.db)) if pipeline else docs


class Database:
    """What mongomock's ``$lookup``/``$graphLookup`` need of a database:
    ``get_collection(name).find(filter)`` over the shard's storage (copies of the documents)."""

    def __init__(self, node: ShardNode, db: str) -> None:
        self.node = node
        self.db = db

    def get_collection(self, name: str) -> "_LookupColl":
        """The collection ``name`` of this database, for a lookup."""
        return _LookupColl(self.node.storage.get(self.db, name))


class _LookupColl:
    def __init__(self, coll: Collection | None) -> None:
        self.coll = coll

    def find(self, filt: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Copies of the documents matching ``filt``."""
        return [q.deep_copy(d) for _, d in q.select(self.coll, filt or {})]
