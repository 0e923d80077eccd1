"""Transactions and session records (``config.transactions``) on a secondary.

The server's ``transaction_oplog_application.cpp`` and ``apply_ops.cpp``:

* an ``applyOps`` entry without ``prepare``/``partialTxn`` is an unprepared transaction's
  commit (``_applyTransactionFromOplogChain``): its operations, and those of the ``partialTxn``
  entries it chains back to through ``prevOpTime`` (``readTransactionOperationsFromOplogChain``;
  a shard writes one entry per transaction, larger transactions of the server several), are
  applied all at once with the primary's semantics (as :meth:`shard.sessions.Transaction.apply`:
  one overlay per collection, applied in first-write order, so ``$natural`` order is the
  primary's); ``create``/``createIndexes`` operations (collections made in the transaction)
  change the catalog first; pre-images get the entry's ``ts`` and their ``applyOpsIndex``;
* ``applyOps`` with ``prepare: true`` (``applyPrepareTransaction``) rebuilds the transaction as
  the primary holds it prepared: overlays, its documents locked (``Transaction.lock``), its
  pre-images stored at the prepare ``ts``, the session record with ``prepared``;
* ``commitTransaction`` / ``abortTransaction`` (``applyCommitTransaction`` /
  ``applyAbortTransaction``) decide it as ``commit_prepared`` / ``abort_transaction`` do on the
  primary (``commitTimestamp`` stamps the snapshot history).

Session records follow (``config.transactions``, the server's ``SessionUpdateTracker`` on
secondaries): a transaction sets the session's ``txnNumber``, ``lastWriteOpTime`` and
``state``; a retryable write (a CRUD entry with ``lsid``/``txnNumber``/``stmtId``) records
its statement as executed under that ``txnNumber``, so a retry on this member after a failover
is answered from history and never applied twice. The recorded result is what the server
derives from the entry when it answers a retry (``parseOplogEntryForUpdate``,
``parseOplogEntryForFindAndModify``): an ``i`` entry ``{n: 0, m: 0, u: [_id]}`` (an insert's
retry counts it, an upsert's retry answers ``upserted``), a ``u`` entry ``{n: 1, m: 1, u: []}``,
a ``d`` entry ``{n: <entries of the statement>}``; each with ``img: {op, pre, post}``, the
document before and after the entry, from which a retried ``findAndModify`` builds its reply
(:func:`shard.commands.crud.retry_image_reply`: ``value`` by the retry's ``new`` and
projection), as the server's retry reads the image that ``needsRetryImage`` points to in
``config.image_collection``.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from shardsim.core.clock import ts_key
from shardsim.core.errors import MongoError
from shardsim.core.values import id_key
from shardsim.shard.replication.documents import (IDEMPOTENT, collection_of, document_key_of,
                                                  short, updated_document, write_document)
from shardsim.shard.sessions import Session, Transaction

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

TXN_COMMANDS = frozenset({"applyOps", "commitTransaction", "abortTransaction"})
# prepared transactions met in the catch-up after a rollback whose session had moved on (the
# source's record is newer): node -> {(session id, txnNumber): Transaction}, until decided
_DETACHED: "weakref.WeakKeyDictionary[Any, dict[Any, Transaction]]" = weakref.WeakKeyDictionary()


def apply_txn_command(node: "ShardNode", entry: dict[str, Any], name: str) -> None:
    """Apply an ``applyOps`` / ``commitTransaction`` / ``abortTransaction`` entry and append it."""
    o = entry["o"]
    if name == "applyOps":
        if o.get("partialTxn"):  # applied with the entry that ends the chain
            node.op_observer.append(entry)
        elif o.get("prepare"):
            _prepare(node, entry)
        else:
            _commit_unprepared(node, entry)
    elif name == "commitTransaction":
        _commit_prepared(node, entry)
    else:
        _abort_prepared(node, entry)


def _session(node: "ShardNode", entry: dict[str, Any]) -> Session:
    s = node.sessions.get(entry.get("lsid"))
    if s is None or entry.get("txnNumber") is None:  # a plain applyOps: a throwaway session
        return Session({"id": b""})
    return s


def _chain_ops(node: "ShardNode", entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The operations of the ``partialTxn`` entries ``entry`` chains back to (oldest first)."""
    chain: list[list[dict[str, Any]]] = []
    prev = entry.get("prevOpTime")
    while isinstance(prev, dict) and isinstance(prev.get("ts"), Timestamp) \
            and ts_key(prev["ts"]) > 0:
        older = node.oplog.get(ts_key(prev["ts"]))
        if older is None:
            raise MongoError(2, f"transaction oplog chain broken: no entry at {prev['ts']} "
                                f"before {short(entry)}")
        oo = older.get("o") or {}
        if not oo.get("partialTxn"):
            break
        chain.append(list(oo.get("applyOps") or []))
        prev = older.get("prevOpTime")
    return [op for ops in reversed(chain) for op in ops]


def _overlay(node: "ShardNode", txn: Transaction, ops: list[dict[str, Any]]) -> None:
    """Fill ``txn``'s overlays from ``ops`` (catalog operations applied at once) and collect
    its pre-images ``(uuid, applyOpsIndex, document before)``."""
    from shardsim.shard.replication.apply_commands import apply_catalog_op
    for index, op in enumerate(ops):
        kind = op.get("op")
        if kind == "c":
            apply_catalog_op(node, op)
            continue
        if kind not in ("i", "u", "d"):
            raise MongoError(14825, f"error in applyOperation : unknown opType {kind!r}")
        coll = collection_of(node, op)
        if coll is None:
            continue
        view = txn.view(coll)
        if kind == "i":
            key = id_key(op["o"]["_id"])
            cur, new = None, op["o"]
        else:
            doc_key = op.get("o2") if kind == "u" else op.get("o")
            key = _view_key(view, coll, doc_key or {})
            cur = view.docs.get(key) if key is not None else None
            if cur is None and IDEMPOTENT.get():
                if kind == "d" or op["o"].get("$v") == 2:
                    continue  # already deleted (refetched after a rollback)
                key, new = id_key((doc_key or {}).get("_id")), updated_document(
                    {"_id": (doc_key or {}).get("_id")}, op["o"])
            elif cur is None:
                raise MongoError(218 if kind == "u" else 47,
                                 f"Failed to apply operation due to missing document: "
                                 f"{short(op)}")
            else:
                new = updated_document(cur, op["o"]) if kind == "u" else None
        if key not in view.seen:
            view.seen[key] = coll.docs.get(key)
        view.overlay[key] = new
        if cur is not None and coll.pre_post_images:
            txn.pre_images.append((coll.uuid, index, cur))
    txn.ops = list(ops)


def _view_key(view: Any, coll: Any, doc_key: dict[str, Any]) -> Any:
    key = id_key(doc_key.get("_id"))
    if key in view.overlay:
        return key
    return document_key_of(coll, doc_key)


def _apply_overlays(node: "ShardNode", txn: Transaction) -> None:
    """Commit ``txn``'s overlays as :meth:`shard.sessions.Transaction.apply` does with
    ``force`` (first-write order per collection), through
    :func:`shard.replication.documents.write_document` (unique keys relaxed in idempotent
    application)."""
    storage = node.storage
    for view in txn.views.values():
        base = view.coll
        if storage.by_uuid.get(base.uuid) is not base:
            continue
        for key, doc in view.overlay.items():
            old = base.docs.get(key)
            if doc is None:
                if old is not None:
                    base.delete(key)
                    storage.note_doc(base, key, None)
            else:
                write_document(node, base, key if old is not None else None, doc)


def _begin(s: Session, txn_number: int) -> None:
    if txn_number > s.txn_number:
        s.txn_number = txn_number
        s.executed = {}


def _commit_unprepared(node: "ShardNode", entry: dict[str, Any]) -> None:
    s = _session(node, entry)
    tn = int(entry.get("txnNumber") or 0)
    txn = Transaction(s, tn)
    _overlay(node, txn, _chain_ops(node, entry) + list(entry["o"].get("applyOps") or []))
    _apply_overlays(node, txn)
    node.op_observer.append(entry)
    for uuid, idx, doc in txn.pre_images:
        node.put_pre_image(uuid, entry["ts"], idx, doc)
    txn.state = "committed"
    txn.views.clear()
    if s.lsid.get("id") and tn >= s.txn_number:  # (an older one: the catch-up after a rollback)
        _begin(s, tn)
        s.txn = txn
        s.last_write_ts = entry["ts"]
        node.sessions.note(s)


def _prepare(node: "ShardNode", entry: dict[str, Any]) -> None:
    s = _session(node, entry)
    tn = int(entry.get("txnNumber") or 0)
    txn = Transaction(s, tn)
    _overlay(node, txn, _chain_ops(node, entry) + list(entry["o"].get("applyOps") or []))
    node.op_observer.append(entry)
    for uuid, idx, doc in txn.pre_images:
        node.put_pre_image(uuid, entry["ts"], idx, doc)
    txn.prepare_ts = entry["ts"]
    if tn < s.txn_number:  # the catch-up after a rollback: the session moved on since
        _DETACHED.setdefault(node, {})[(_sid(s), tn)] = txn  # its decision follows
        return
    txn.lock()
    txn.state = "prepared"
    _begin(s, tn)
    s.txn = txn
    s.last_write_ts = entry["ts"]
    node.sessions.note(s)


def _sid(s: Session) -> Any:
    lid = s.lsid.get("id")
    return (bytes(lid) if lid is not None else b"", repr(s.lsid.get("uid")))


def _prepared_txn(node: "ShardNode", entry: dict[str, Any]) -> tuple[Session | None, Transaction]:
    """The prepared transaction a decision entry names, with its session (None for one of the
    catch-up after a rollback whose session moved on: it is decided without touching it)."""
    s = _session(node, entry)
    txn = s.txn
    tn = entry.get("txnNumber")
    if txn is None or txn.state != "prepared" or tn is None or txn.txn_number != int(tn):
        detached = _DETACHED.get(node, {}).pop((_sid(s), int(tn or 0)), None)
        if detached is not None:
            return None, detached
        if IDEMPOTENT.get():
            return s, None  # type: ignore[return-value]
        raise MongoError(251, f"no prepared transaction {tn} on the session of "
                              f"{short(entry)}")
    return s, txn


def _commit_prepared(node: "ShardNode", entry: dict[str, Any]) -> None:
    s, txn = _prepared_txn(node, entry)
    if txn is None:  # idempotent: prepared before the rollback's common point
        node.op_observer.append(entry)
        return
    commit_ts = entry["o"].get("commitTimestamp")
    if not isinstance(commit_ts, Timestamp):
        raise MongoError(2, f"commitTransaction entry without commitTimestamp: {short(entry)}")
    txn.unlock()
    _apply_overlays(node, txn)
    node.storage.history.stamp(commit_ts)  # as commit_prepared on the primary
    txn.state = "committed"
    node.op_observer.append(entry)
    txn.views.clear()
    if s is not None:
        s.last_write_ts = entry["ts"]
        node.sessions.note(s)
    node.sessions.decided()


def _abort_prepared(node: "ShardNode", entry: dict[str, Any]) -> None:
    s, txn = _prepared_txn(node, entry)
    if txn is None:
        node.op_observer.append(entry)
        return
    txn.rollback(node.storage)
    txn.state = "aborted"
    node.op_observer.append(entry)
    if s is not None:
        s.last_write_ts = entry["ts"]
        node.sessions.note(s)
    node.sessions.decided()


def note_retryable_write(node: "ShardNode", entry: dict[str, Any],
                         pre: dict[str, Any] | None = None,
                         post: dict[str, Any] | None = None) -> None:
    """Record the statement of a retryable write's CRUD entry in its session (see the module
    docstring for the results; ``pre``/``post`` the document before and after, kept as the
    statement's retry image); journaled for durable members."""
    s = node.sessions.get(entry.get("lsid"))
    if s is None:
        return
    tn = int(entry["txnNumber"])
    if tn < s.txn_number:
        return
    if tn > s.txn_number:
        s.txn_number = tn
        s.executed = {}
        s.txn = None
    stmt = entry.get("stmtId")
    if stmt is not None:
        for sid in (stmt if isinstance(stmt, list) else [stmt]):
            s.executed[int(sid)] = _result(entry, s.executed.get(int(sid)), pre, post)
    node.sessions.note(s)


def _result(entry: dict[str, Any], before: Any, pre: Any, post: Any) -> dict[str, Any]:
    op = entry["op"]
    img = {"op": op, "pre": pre, "post": post}
    if op == "i":
        return {"n": 0, "m": 0, "u": [entry["o"].get("_id")], "img": img}
    if op == "u":
        return {"n": 1, "m": 1, "u": [], "img": img}
    count = before.get("n", 0) if isinstance(before, dict) else 0
    return {"n": count + 1, "img": img}


__all__ = ["apply_txn_command", "note_retryable_write", "TXN_COMMANDS"]
