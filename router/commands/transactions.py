"""Ending a transaction through the router: ``commitTransaction``, ``abortTransaction``
(mongos' ``cluster_commit_transaction_cmd.cpp`` / ``cluster_abort_transaction_cmd.cpp`` over
``TransactionRouter::Router::commitTransaction``/``abortTransaction``,
``src/mongo/s/transaction_router.cpp``).

Commit paths (``_commitTransaction``): no participant -> ``{}``; one participant -> its
``commitTransaction``; only read-only participants -> ``commitTransaction`` to each; one
writing participant -> the read-only ones first, then it; several writing participants ->
two-phase commit handed to the coordinator (the first participant) with
``coordinateCommitTransaction {participants}`` (``_handOffCommitToCoordinator``). A commit
this router never saw start is recovered with the client's ``recoveryToken``
(``_commitWithRecoveryToken``: ``coordinateCommitTransaction`` with no participants on the
recovery shard, which answers from its coordinator or its participant; a token without
``recoveryShardId``: NoSuchTransaction 251); without a token: 50940. A retried commit
(``isFirstCommitAttempt`` false) of a single-write-shard transaction uses that protocol with a
synthetic token naming the write shard; a retried two-phase commit is handed to the
coordinator again, which never runs a second two-phase commit: once its coordination is over
it answers from its own participant (committed: ok; aborted: NoSuchTransaction). ``abortTransaction`` goes to every participant and
answers the first error (NoSuchTransaction 251 when the router sent nothing).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from shardsim.router.forwarding import reply_body
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("transactions")

# The commands that end a transaction: never aborted implicitly (they end it themselves).
END_COMMANDS = frozenset({"commitTransaction", "abortTransaction",
                          "coordinateCommitTransaction"})
# A statement failing with one of these does not abort the transaction (mongos'
# ``invokeInTransactionRouter``, ``src/mongo/s/service_entry_point_router_role.cpp``: "Don't
# abort on possibly retryable errors"): the SnapshotError and NeedRetargettingError categories,
# StaleDbVersion (249), WouldChangeOwningShard (283, the router goes on with the move),
# ShardCannotRefreshDueToLocksHeld and ShardInvalidatedForTargeting.
_NO_ABORT_NAMES = frozenset({"StaleDbVersion", "WouldChangeOwningShard",
                             "ShardCannotRefreshDueToLocksHeld", "ShardInvalidatedForTargeting"})
_WRITE_COMMANDS = frozenset({"insert", "update", "delete", "bulkWrite"})


def _aborts_transaction(code: int) -> bool:
    """False for the errors after which mongos leaves the transaction open (above)."""
    from shardsim.core.error_codes import codes_in_category
    from shardsim.core.errors import CODE_NAMES
    return not (code in codes_in_category("SnapshotError")
                or code in codes_in_category("NeedRetargettingError")
                or CODE_NAMES.get(code) in _NO_ABORT_NAMES)


async def invoke_in_transaction(node: "RouterNode", req: Request, run: Any) -> dict[str, Any]:
    """Run the statement ``req`` of a transaction (``run()``: the handler) as mongos'
    ``invokeInTransactionRouter`` does: when it fails (a MongoError other than the retryable
    ones of :func:`_aborts_transaction`), or when a write answers with ``writeErrors``
    (``ClusterWriteCmd::runImpl``: ``response.toStatus()`` not OK; ``nErrors`` of a
    ``bulkWrite``), the router aborts the transaction on every participant
    (:func:`implicitly_abort`) before the client gets the reply. The error itself is returned
    as it was (the shards' labels, TransientTransactionError where due, are added by
    ``RouterNode.error_labels``); a later statement on a participant gets NoSuchTransaction
    (251, TransientTransactionError) and the commit fails the same way."""
    try:
        reply = await run()
    except MongoError as exc:
        if _aborts_transaction(exc.code):
            await implicitly_abort(node, req)
        raise
    name = node.commands.canonical(req.name)
    if name in _WRITE_COMMANDS and isinstance(reply, dict) and \
            (reply.get("writeErrors") or reply.get("nErrors")):
        await implicitly_abort(node, req)
    return reply


async def implicitly_abort(node: "RouterNode", req: Request) -> None:
    """``TransactionRouter::Router::implicitlyAbortTransaction``
    (``src/mongo/s/transaction_router.cpp``): ``abortTransaction`` with the default write
    concern to every participant of ``req``'s transaction, concurrently, responses and errors
    ignored; nothing when the router knows no participant or a commit was begun (it may have
    been handed to the coordinator: commit types two-phase / recover-with-token). The
    participants are kept, as mongos keeps them: a later ``abortTransaction`` from the client
    still goes to them (and gets their NoSuchTransaction)."""
    txn = node.transactions.get(req)
    if txn is None or not txn.participants or txn.commit_started:
        return
    cmd = {"abortTransaction": 1, **_session(req), "writeConcern": {"w": 1, "wtimeout": 0}}
    await asyncio.gather(*(node.shard_command(s, "admin", dict(cmd))
                           for s in list(txn.participants)), return_exceptions=True)


def _session(req: Request) -> dict[str, Any]:
    return {"lsid": req.get("lsid"), "txnNumber": req.get("txnNumber"), "autocommit": False}


def _end_cmd(req: Request, name: str) -> dict[str, Any]:
    cmd: dict[str, Any] = {name: 1, **_session(req)}
    if isinstance(req.get("writeConcern"), dict):
        cmd["writeConcern"] = req.get("writeConcern")
    return cmd


async def _commit_each(node: "RouterNode", req: Request, shards: list[str]) -> dict[str, Any]:
    """``sendCommitDirectlyToShards``: commit on every shard; the first error is raised."""
    replies = await asyncio.gather(
        *(node.shard_command(s, "admin", _end_cmd(req, "commitTransaction")) for s in shards),
        return_exceptions=True)
    for r in replies:
        if isinstance(r, BaseException):
            raise r
    return reply_body(replies[-1]) if replies else {}


def _participant_list(node: "RouterNode", shards: list[str]) -> list[dict[str, Any]]:
    out = []
    for s in shards:
        conn = node.catalog.shard_connection_string(s)  # set/h1,h2,... for a replica set
        if conn is None:
            raise MongoError(70, f"Shard {s} not found")
        out.append({"shardId": s, "host": conn})
    return out


async def _commit_with_recovery_token(node: "RouterNode", req: Request,
                                      shard: str) -> dict[str, Any]:
    """``_commitWithRecoveryToken``: ``coordinateCommitTransaction {participants: []}`` on
    ``shard``, which answers from its coordinator's decision or its own participant
    (``txn_two_phase_commit_cmds.cpp``, :mod:`shard.commit_recovery`); the shard's reply body."""
    if node.catalog.shard_address(shard) is None:
        await node.catalog.refresh()  # ShardRegistry reload: a shard this router never used
    cmd = {"coordinateCommitTransaction": 1, "participants": [], **_session(req)}
    if isinstance(req.get("writeConcern"), dict):
        cmd["writeConcern"] = req.get("writeConcern")
    return reply_body(await node.shard_command(shard, "admin", cmd))


@commands.handler("commitTransaction", privileges=priv.AUTH_ONLY)
async def commit_transaction(node: "RouterNode", req: Request) -> dict[str, Any]:
    """Commit the transaction (module docstring for the paths); returns the (last) shard's
    reply body. Errors: the participants' (NoSuchTransaction 251 with
    TransientTransactionError when the coordinator aborted), 50940 when a transaction this
    router does not know comes without a ``recoveryToken``."""
    txn = node.transactions.get(req)
    if txn is None:
        token = req.get("recoveryToken")
        shard = token.get("recoveryShardId") if isinstance(token, dict) else None
        if not isinstance(token, dict):
            raise MongoError(50940, "Cannot recover the transaction decision without a "
                                    "recoveryToken")
        if shard is None:  # _commitWithRecoveryToken: a read-only transaction
            raise MongoError(251, "Recovery token is empty, meaning the transaction only "
                                  "performed reads and can be safely retried",
                             labels=["TransientTransactionError"])
        return await _commit_with_recovery_token(node, req, shard)
    if not txn.participants:
        return {}
    first_attempt = not txn.commit_started
    txn.commit_started = True
    shards = list(txn.participants)
    writers = [s for s in shards if not txn.participants[s]["read_only"]]
    readers = [s for s in shards if txn.participants[s]["read_only"]]
    if len(shards) == 1:
        return await _commit_each(node, req, shards)
    if len(writers) == 1 and not first_attempt:
        # a retried single-write-shard commit: the recovery-token protocol with a synthetic
        # token naming the write shard, never the read-only shards' commit again
        return await _commit_with_recovery_token(node, req, writers[0])
    if len(writers) <= 1:
        if readers:
            await _commit_each(node, req, readers)
        return await _commit_each(node, req, writers) if writers else {}
    coordinator = txn.coordinator
    cmd = {"coordinateCommitTransaction": 1, "participants": _participant_list(node, shards),
           **_session(req)}
    if isinstance(req.get("writeConcern"), dict):
        cmd["writeConcern"] = req.get("writeConcern")
    return reply_body(await node.shard_command(coordinator, "admin", cmd))


@commands.handler("abortTransaction", privileges=priv.AUTH_ONLY)
async def abort_transaction(node: "RouterNode", req: Request) -> dict[str, Any]:
    """Abort on every participant, forget the transaction, return the last reply body or
    raise the first participant error. NoSuchTransaction (251, TransientTransactionError)
    when the router sent the transaction to no shard."""
    txn = node.transactions.get(req)
    if txn is None or not txn.participants:
        txn_number = node.transactions.key(req)[1]
        raise MongoError(251, f"Transaction with {{ txnNumber: {txn_number} }} has been aborted.",
                         labels=["TransientTransactionError"])
    replies = await asyncio.gather(
        *(node.shard_command(s, "admin", _end_cmd(req, "abortTransaction"))
          for s in txn.participants), return_exceptions=True)
    node.transactions.end(req)
    for r in replies:
        if isinstance(r, BaseException):
            raise r
    return reply_body(replies[-1])
