"""An update that changes a document's owning shard, as mongos 8.0 runs it: the shard answers
WouldChangeOwningShard (283, ``{preImage, postImage, shouldUpsert}``:
:mod:`shard.shard_key_update`) and the router turns the update into a delete on the old owner
and an insert on the new one inside a transaction.

MongoDB 8.0 leaves ``featureFlagUpdateDocumentShardKeyUsingTransactionApi`` off by default
(jstests run its transaction-API path only with the flag set), so this follows its *legacy*
path (``src/mongo/s/commands/document_shard_key_update_util.cpp``,
``cluster_write_cmd.cpp`` ``ClusterWriteCmd::handleWouldChangeOwningShardError``,
``cluster_find_and_modify_cmd.cpp`` ``_handleWouldChangeOwningShardErrorRetryableWriteLegacy``
/ ``handleWouldChangeOwningShardErrorTransactionLegacy``):

* **in a transaction** (``updateShardKeyForDocumentLegacy``): ``delete {q: preImage, limit:
  1}`` then ``insert [postImage]`` as statements of the client's transaction. With
  ``shouldUpsert`` the delete must match nothing (ConflictingOperationInProgress 117 "Delete
  matched a document when it should not have."); without it a delete that matched nothing
  leaves the WouldChangeOwningShard write error as it is. A DuplicateKey (11000) on ``_id``
  gets the context "Failed to update document's shard key field. There is either an orphan for
  this document or _id for this collection is not globally unique." and fails the statement.
* **a retryable write** (``handleWouldChangeOwningShardErrorRetryableWriteLegacy``): the router
  starts a transaction on the client's own ``lsid`` and ``txnNumber`` (read concern
  ``local``, ``startTransactionForShardKeyUpdate``), re-runs the update in it (the shard
  answers 283 again, now inside the transaction), does the delete and the insert as above and
  commits (two-phase commit through the coordinator when both shards wrote). So the change
  events are the transaction's: a delete and an insert, each with the client's ``lsid`` and
  ``txnNumber`` and its ``txnOpIndex`` in the resume token. A failure aborts the transaction and
  becomes the statement's write error with the context "Update operation was converted into a
  distributed transaction because the document being updated would move shards and that
  transaction failed." (``kNonDuplicateKeyErrorContext``). A retry of the statement reaches a
  shard whose session ran that txnNumber as a transaction: IncompleteTransactionHistory (217)
  "Cannot retry a retryable write that has been converted into a transaction"
  (``TransactionParticipant::_beginOrContinueRetryableWrite``); nothing is applied twice.
* **neither**: the shard already refused the update (IllegalOperation 20).
* a client batch of more than one statement: each 283 becomes InvalidOptions (72) "Document
  shard key value updates that cause the doc to move shards must be sent with write batch of
  size 1" (in a transaction the command fails with it; ``getWouldChangeOwningShardErrorInfo``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.commands import Request
from shardsim.core.errors import MongoError

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

WCOS = 283
BATCH_OF_ONE = ("Document shard key value updates that cause the doc to move shards must be "
                "sent with write batch of size 1")
DUPLICATE_CONTEXT = ("Failed to update document's shard key field. There is either an orphan "
                     "for this document or _id for this collection is not globally unique.")
TXN_FAILED_CONTEXT = ("Update operation was converted into a distributed transaction because "
                      "the document being updated would move shards and that transaction "
                      "failed.")
_SESSION = ("lsid", "txnNumber")


def with_context(context: str, exc: MongoError) -> MongoError:
    """``exc`` with ``context`` in front (``Status::withContext``: "<context> :: caused by ::
    <errmsg>"), the same code and extra info."""
    return MongoError(exc.code, f"{context} :: caused by :: {exc.errmsg}", labels=exc.labels,
                      **exc.extra)


def txn_body(body: dict[str, Any], **more: Any) -> dict[str, Any]:
    """The session fields of ``body`` as a transaction statement's (``autocommit: false``)."""
    out = {k: body[k] for k in _SESSION if k in body}
    out["autocommit"] = False
    out.update(more)
    return out


def internal_request(req: Request, name: str, db: str, body: dict[str, Any]) -> Request:
    """A command the router runs for itself on the client's connection."""
    return Request(name, db, body, req.conn)


async def move_document(router: "RouterNode", req: Request, info: dict[str, Any]) -> bool:
    """``updateShardKeyForDocumentLegacy``: in the transaction of ``req`` (a statement with
    ``autocommit: false``), delete ``info["preImage"]`` and insert ``info["postImage"]``
    (each targeted by shard key, through :class:`router.writes.WriteExecutor`). Returns False
    when the delete matched nothing (not an upsert); raises 117 / the insert's error (a
    DuplicateKey on ``_id`` with :data:`DUPLICATE_CONTEXT`)."""
    from shardsim.router.writes import WriteExecutor
    db, coll = req.db, req.arg
    session = txn_body(req.body)
    delete = internal_request(req, "delete", db, {
        "delete": coll, "deletes": [{"q": info["preImage"], "limit": 1}], "ordered": True,
        **session})
    reply = await WriteExecutor(router, delete, "delete").execute()
    if reply.get("writeErrors"):
        e = reply["writeErrors"][0]
        raise MongoError(e["code"], f"During delete stage of updating a shard key :: caused by "
                                    f":: {e['errmsg']}")
    if info.get("shouldUpsert"):
        if reply["n"] != 0:
            raise MongoError(117, "Delete matched a document when it should not have.")
    elif reply["n"] != 1:
        return False
    insert = internal_request(req, "insert", db, {
        "insert": coll, "documents": [info["postImage"]], "ordered": True, **session})
    try:
        reply = await WriteExecutor(router, insert, "insert").execute()
    except MongoError as exc:
        raise _dup_context(exc)
    if reply.get("writeErrors"):
        e = reply["writeErrors"][0]
        extra = {k: e[k] for k in ("keyPattern", "keyValue") if k in e}
        raise _dup_context(MongoError(e["code"], e["errmsg"], **extra))
    return True


def _dup_context(exc: MongoError) -> MongoError:
    if exc.code == 11000 and "_id" in (exc.extra.get("keyPattern") or {}):
        return with_context(DUPLICATE_CONTEXT, exc)
    return exc


async def run_converted(router: "RouterNode", req: Request, rerun: Any) -> Any:
    """``handleWouldChangeOwningShardErrorRetryableWriteLegacy``: start a transaction on the
    retryable write's own ``lsid``/``txnNumber`` (read concern ``local``), await ``rerun(body)``
    (the statement again, with the transaction's fields ``body``: it meets 283 again and moves
    the document, :func:`move_document`), then commit with the client's write concern. Returns
    ``(rerun's result, commit reply)``. On an error the transaction is aborted and the error
    raised with :data:`TXN_FAILED_CONTEXT` (DuplicateKey on ``_id``: :data:`DUPLICATE_CONTEXT`)."""
    from shardsim.router.commands import transactions as txn_cmds
    start = txn_body(req.body, startTransaction=True, readConcern={"level": "local"})
    router.transactions.begin(start)
    try:
        result = await rerun(start)
        commit = txn_body(req.body, commitTransaction=1)
        if isinstance(req.get("writeConcern"), dict):
            commit["writeConcern"] = req.get("writeConcern")
        reply = await txn_cmds.commit_transaction(
            router, internal_request(req, "commitTransaction", "admin", commit))
    except MongoError as exc:
        await _abort(router, req)
        if exc.code == 11000 and exc.errmsg.startswith(DUPLICATE_CONTEXT):
            raise
        raise with_context(TXN_FAILED_CONTEXT, exc) from None
    return result, reply


async def _abort(router: "RouterNode", req: Request) -> None:
    """``implicitlyAbortTransaction``: abort on every participant, errors ignored."""
    from shardsim.router.commands import transactions as txn_cmds
    try:
        await txn_cmds.abort_transaction(router, internal_request(
            req, "abortTransaction", "admin", txn_body(req.body, abortTransaction=1)))
    except MongoError:
        router.transactions.end(req)
