"""The shard's transaction and session commands: commitTransaction, abortTransaction,
endSessions, killSessions, killAllSessions (they override the common no-op session commands).

The state is the node's :class:`shard.sessions.Sessions` (``node.sessions``, declared in
``ShardNode.__init__``). A commit applies the transaction's overlays and writes ONE ``applyOps``
entry (``{op: "c", ns: "admin.$cmd", o: {applyOps: [...]}, lsid, txnNumber, prevOpTime}``) and
the pre-images with their ``applyOpsIndex`` (``transaction_participant.cpp``); an abort writes
nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.commands import CommandFamily, Request
from shardsim.errors import MongoError
from shard.sessions import TRANSIENT
from shard.write_context import WriteContext

if TYPE_CHECKING:
    from shard.node import ShardNode

commands = CommandFamily("transactions")


@commands.handler("commitTransaction")
async def commit_transaction(node: ShardNode, req: Request) -> dict[str, Any]:
    """``commitTransaction`` (``lsid``, ``txnNumber``, ``autocommit: false``): ``{}`` (again
    ``{}`` for an already committed one), with ``operationTime`` = the applyOps entry's ts.
    Errors: NoSuchTransaction (251, TransientTransactionError) for an aborted or unknown
    transaction, TransactionTooOld (225), 50768 (no session / autocommit), WriteConflict (112,
    TransientTransactionError) when the commit conflicts (the transaction is then aborted)."""
    s, txn = node.sessions.txn_for_end(req)
    if txn.state == "committed":
        return {}
    if txn.state == "aborted":
        raise MongoError(251, f"Transaction with {{ txnNumber: {txn.txn_number} }} has "
                              f"been aborted.", labels=TRANSIENT)
    try:
        txn.apply(node.storage)
    except MongoError:
        txn.state = "aborted"
        txn.rollback()
        raise
    txn.state = "committed"
    if not txn.ops:
        return {}
    # lsid/txnNumber and prevOpTime, no stmtId: the applyOps entry of a transaction.
    entry = node.make_entry("c", "admin.$cmd", None, {"applyOps": txn.ops},
                            ctx=WriteContext(s.lsid, txn.txn_number))
    node.append_entry(entry)
    for uuid, idx, doc in txn.pre_images:
        node.put_pre_image(uuid, entry["ts"], idx, doc)
    txn.views.clear()
    return {"__operationTime": entry["ts"]}


@commands.handler("abortTransaction")
async def abort_transaction(node: ShardNode, req: Request) -> dict[str, Any]:
    """``abortTransaction``: ``{}``; drops the transaction's writes. Errors:
    TransactionCommitted (256) once committed, NoSuchTransaction (251) when already aborted or
    unknown, 225, 50768."""
    s, txn = node.sessions.txn_for_end(req)
    if txn.state == "committed":
        raise MongoError(256, f"Transaction with {{ txnNumber: {txn.txn_number} }} has "
                              f"been committed.")
    if txn.state == "aborted":
        raise MongoError(251, f"Transaction with {{ txnNumber: {txn.txn_number} }} has "
                              f"been aborted.", labels=TRANSIENT)
    txn.rollback(node.storage)
    txn.state = "aborted"
    return {}


@commands.handler("endSessions")
async def end_sessions(node: ShardNode, req: Request) -> dict[str, Any]:
    """``endSessions: [lsid, ...]`` (``killSessions`` too): abort the sessions' open
    transactions and forget them; ``{}``. TypeMismatch (14) when not an array."""
    ids = req.arg
    if not isinstance(ids, list):
        raise MongoError(14, f"BSON field '{req.name}.{req.name}' is the wrong type, "
                             f"expected type 'array'")
    node.sessions.end(ids)
    return {}


commands.add("killSessions", end_sessions)


@commands.handler("killAllSessions")
async def kill_all_sessions(node: ShardNode, req: Request) -> dict[str, Any]:
    """``killAllSessions``: end every session (open transactions aborted); ``{}``."""
    node.sessions.end(node.sessions.lsids())
    return {}
