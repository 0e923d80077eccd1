"""The shard's transaction and session commands: prepareTransaction, commitTransaction,
abortTransaction, coordinateCommitTransaction, endSessions, killSessions, killAllSessions (they
override the common no-op session commands).

Prepared transactions (two-phase commit, ``transaction_participant.cpp``
``prepareTransaction``/``commitPreparedTransaction``/``abortTransaction``): the prepare writes
``{op: "c", ns: "admin.$cmd", o: {applyOps: [...], prepare: true}, lsid, txnNumber}`` and
answers ``prepareTimestamp`` (that entry's ts); the transaction's documents stay invisible to
readers and locked against writers (WriteConflict 112) until ``commitTransaction
{commitTimestamp}`` writes ``{o: {commitTransaction: 1, commitTimestamp}, prevOpTime: <the
prepare>}`` and applies them, or ``abortTransaction`` writes ``{o: {abortTransaction: 1}}``.
The prepared state is part of the durable session record, so it survives a restart.

The state is the node's :class:`shard.sessions.Sessions` (``node.sessions``, declared in
``ShardNode.__init__``). A commit applies the transaction's overlays and writes ONE ``applyOps``
entry (``{op: "c", ns: "admin.$cmd", o: {applyOps: [...]}, lsid, txnNumber, prevOpTime}``) and
the pre-images with their ``applyOpsIndex`` (``transaction_participant.cpp``); an abort writes
nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson import Timestamp
from bson.int64 import Int64

from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.shard import uncommitted_catalog
from shardsim.shard.commit_recovery import decision_reply, recover_commit_decision, \
    recover_from_participant
from shardsim.shard.sessions import TRANSIENT, full_lsid
from shardsim.shard.write_context import WriteContext
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode

commands = CommandFamily("transactions")


@commands.handler("commitTransaction", privileges=priv.AUTH_ONLY)
async def commit_transaction(node: ShardNode, req: Request) -> dict[str, Any]:
    """``commitTransaction`` (``lsid``, ``txnNumber``, ``autocommit: false``): ``{}`` (again
    ``{}`` for an already committed one), with ``operationTime`` = the applyOps entry's ts.
    Errors: NoSuchTransaction (251, TransientTransactionError) for an aborted or unknown
    transaction, TransactionTooOld (225), 50768 (no session / autocommit), WriteConflict (112,
    TransientTransactionError) when the commit conflicts, also when a collection the
    transaction created was created by someone else meanwhile (:mod:`shard.uncommitted_catalog`;
    the transaction is then aborted)."""
    s, txn = node.sessions.txn_for_end(req)
    commit_ts = req.body.get("commitTimestamp")
    if txn.state == "committed":
        return {}
    if txn.state == "aborted":
        raise MongoError(251, f"Transaction with {{ txnNumber: {txn.txn_number} }} has "
                              f"been aborted.", labels=TRANSIENT)
    if txn.state == "prepared":
        return commit_prepared(node, s, txn, commit_ts)
    if commit_ts is not None:
        raise MongoError(72, "commitTimestamp may only be given for a prepared transaction")
    added: list[Any] = []
    try:
        # collections the transaction created join the catalog first (112 when taken)
        added = uncommitted_catalog.publish(node, txn)
        # its documents stop being held first, so the storage layer lets their owner write
        # them; the writers waiting on them run only after this commit (shard.write_conflicts)
        txn.unlock()
        txn.apply(node.storage)
    except MongoError:
        uncommitted_catalog.unpublish(node, added)
        txn.state = "aborted"
        txn.rollback()
        raise
    txn.state = "committed"
    if not txn.ops:
        return _with_write_concern(req, {})
    # lsid/txnNumber and prevOpTime, no stmtId: the applyOps entry of a transaction.
    entry = node.make_entry("c", "admin.$cmd", None, {"applyOps": list(txn.ops)},
                            ctx=WriteContext(s.lsid, txn.txn_number))
    node.append_entry(entry)
    for uuid, idx, doc in txn.pre_images:
        node.put_pre_image(uuid, entry["ts"], idx, doc)
    txn.views.clear()
    # config.transactions {state: "committed"} in the same storage transaction as the entry
    # (onTransactionCommit), so a commit retried after a restart still finds it committed
    s.last_write_ts = entry["ts"]
    node.sessions.note(s)
    return _with_write_concern(req, {"__operationTime": entry["ts"]})


def _with_write_concern(req: Request, reply: dict[str, Any]) -> dict[str, Any]:
    """``reply`` with the ``writeConcernError`` a one-node replica set gives for a numeric
    ``w`` above 1 (UnsatisfiableWriteConcern 100, "Not enough data-bearing nodes",
    ``write_concern.cpp`` ``validateWriteConcern``): the commit happened, the write concern
    cannot be satisfied."""
    wc = req.body.get("writeConcern")
    w = wc.get("w") if isinstance(wc, dict) else None
    if isinstance(w, (int, float)) and not isinstance(w, bool) and w > 1:
        reply["writeConcernError"] = {"code": 100, "codeName": "UnsatisfiableWriteConcern",
                                      "errmsg": "Not enough data-bearing nodes"}
    return reply


@commands.handler("abortTransaction", privileges=priv.AUTH_ONLY)
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
    prepared = txn.state == "prepared"
    txn.rollback(node.storage)
    txn.state = "aborted"
    if prepared:
        entry = node.make_entry("c", "admin.$cmd", None, {"abortTransaction": 1},
                                ctx=WriteContext(s.lsid, txn.txn_number))
        entry["prevOpTime"] = {"ts": txn.prepare_ts, "t": Int64(1)}
        node.append_entry(entry)
        s.last_write_ts = entry["ts"]
        node.sessions.note(s)
        node.sessions.decided()
        return {"__operationTime": entry["ts"]}
    return {}


@commands.handler("prepareTransaction", privileges=priv.INTERNAL)
async def prepare_transaction(node: ShardNode, req: Request) -> dict[str, Any]:
    """``prepareTransaction`` (internal, from a coordinator; ``lsid``, ``txnNumber``,
    ``autocommit: false``) -> ``{prepareTimestamp}``; again the same for a transaction already
    prepared. Errors: NoSuchTransaction (251) for an aborted or unknown one, TransactionCommitted
    (256), WriteConflict (112, the transaction is then aborted), OperationNotSupportedIn-
    Transaction (263) when it created a collection (``txn_two_phase_commit_cmds.cpp``; aborted
    too), 225, 50768."""
    s, txn = node.sessions.txn_for_end(req)
    if txn.state == "prepared":
        return {"prepareTimestamp": txn.prepare_ts}
    if txn.state == "committed":
        raise MongoError(256, f"Transaction with {{ txnNumber: {txn.txn_number} }} has "
                              f"been committed.")
    if txn.state == "aborted":
        raise MongoError(251, f"Transaction with {{ txnNumber: {txn.txn_number} }} has "
                              f"been aborted.", labels=TRANSIENT)
    try:
        uncommitted_catalog.refuse_prepare(txn)  # 263: no DDL in a distributed transaction
        txn.check(node.storage)
    except MongoError:
        txn.rollback(node.storage)
        txn.state = "aborted"
        raise
    # a copy: an abort clears txn.ops, the entry must keep them (a secondary applies it)
    entry = node.make_entry("c", "admin.$cmd", None, {"applyOps": list(txn.ops),
                                                      "prepare": True},
                            ctx=WriteContext(s.lsid, txn.txn_number))
    node.append_entry(entry)
    txn.prepare_ts = s.last_write_ts = entry["ts"]
    for uuid, idx, doc in txn.pre_images:
        node.put_pre_image(uuid, entry["ts"], idx, doc)
    txn.lock()
    txn.state = "prepared"
    node.sessions.note(s)
    return {"prepareTimestamp": entry["ts"], "__operationTime": entry["ts"]}


def commit_prepared(node: ShardNode, s: Any, txn: Any, commit_ts: Any) -> dict[str, Any]:
    """Commit a prepared transaction at ``commit_ts`` (``commitPreparedTransaction``): apply
    its documents and write the ``commitTransaction`` entry (its own, newer ts; the change
    events of the transaction take that ts, ``document_source_change_stream_unwind_transaction
    .cpp``). InvalidOptions (72) without ``commitTimestamp`` or with one older than the
    prepare."""
    if not isinstance(commit_ts, Timestamp):
        raise MongoError(72, "commitTransaction for a prepared transaction cannot be run "
                             "without a commitTimestamp")
    if (commit_ts.time, commit_ts.inc) < (txn.prepare_ts.time, txn.prepare_ts.inc):
        raise MongoError(72, f"commitTimestamp {commit_ts} cannot be less than the "
                             f"prepareTimestamp {txn.prepare_ts}")
    node.clock.restore(commit_ts)
    txn.unlock()
    txn.apply(node.storage, force=True)
    # Snapshot readers see the documents from the commit timestamp on, on every participant
    # alike (the commit entry below gets this shard's own, possibly later, ts).
    node.storage.history.stamp(commit_ts)
    txn.state = "committed"
    entry = node.make_entry("c", "admin.$cmd", None,
                            {"commitTransaction": 1, "commitTimestamp": commit_ts},
                            ctx=WriteContext(s.lsid, txn.txn_number))
    entry["prevOpTime"] = {"ts": txn.prepare_ts, "t": Int64(1)}
    node.append_entry(entry)
    txn.views.clear()
    s.last_write_ts = entry["ts"]
    node.sessions.note(s)
    node.sessions.decided()
    return {"__operationTime": entry["ts"]}


@commands.handler("coordinateCommitTransaction", privileges=priv.INTERNAL)
async def coordinate_commit_transaction(node: ShardNode, req: Request) -> dict[str, Any]:
    """``coordinateCommitTransaction {participants: [{shardId, host}]}`` with ``lsid``,
    ``txnNumber``, ``autocommit: false`` (from the router): run two-phase commit
    (:mod:`shard.transaction_coordinator`) and answer ``{}`` once committed everywhere, else
    the abort reason (NoSuchTransaction 251 with TransientTransactionError when a participant
    could not prepare, ``txn_two_phase_commit_cmds.cpp``; OperationNotSupportedInTransaction
    (263) when it refused because the transaction created a collection). BadValue (2) for a
    bad list. When this shard has no coordinator for the transaction any more (a retried
    commit after the coordination completed, also across a restart) the outcome is recovered
    from this shard's participant instead of starting two-phase commit again; an empty list
    recovers the decision (:mod:`shard.commit_recovery`)."""
    parts = req.get("participants")
    if isinstance(parts, list) and not parts and isinstance(req.get("lsid"), dict) \
            and req.get("txnNumber") is not None:
        return await recover_commit_decision(node, req)  # a router recovering the decision
    if not isinstance(parts, list) or not parts or \
            not all(isinstance(p, dict) and isinstance(p.get("host"), str) for p in parts):
        raise MongoError(2, "coordinateCommitTransaction needs participants [{shardId, host}]")
    lsid = req.get("lsid")
    if not isinstance(lsid, dict) or req.get("txnNumber") is None:
        raise MongoError(50768, "coordinateCommitTransaction must be run within a transaction")
    decision = await node.coordinators.coordinate(full_lsid(lsid), int(req.get("txnNumber")),
                                                  parts)
    if decision is None:  # no coordinator in memory: "recover decision from local participant"
        return await recover_from_participant(node, req)
    return decision_reply(decision)


@commands.handler("endSessions", secondary="always", privileges=priv.AUTH_ONLY)
async def end_sessions(node: ShardNode, req: Request) -> dict[str, Any]:
    """``endSessions: [lsid, ...]`` (``killSessions`` too): abort the sessions' open
    transactions and forget them; ``{}``. TypeMismatch (14) when not an array."""
    ids = req.arg
    if not isinstance(ids, list):
        raise MongoError(14, f"BSON field '{req.name}.{req.name}' is the wrong type, "
                             f"expected type 'array'")
    node.sessions.end(ids)
    return {}


commands.add("killSessions", end_sessions, privileges=priv.AUTH_ONLY)


@commands.handler("killAllSessions", secondary="always", privileges=priv.on_cluster("killAnySession"))
async def kill_all_sessions(node: ShardNode, req: Request) -> dict[str, Any]:
    """``killAllSessions``: end every session (open transactions aborted); ``{}``."""
    node.sessions.end(node.sessions.lsids())
    return {}
