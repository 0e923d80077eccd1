"""Logical sessions on a shard: retryable writes and single-shard multi-document transactions.

Retryable writes (``lsid`` + ``txnNumber`` without ``autocommit``), as mongod's
``TransactionParticipant`` keeps them (``transaction_participant.cpp``): the session record
(``config.transactions``: lsid, txnNumber, the executed stmtIds) remembers each executed
statement with its result for the session's current txnNumber. A retry skips the statements
that already ran (``checkStatementExecuted``), answers with their first results (``n``,
``nModified``, ``upserted``; a findAndModify's whole reply, which stands in for mongod's
pre/post-image oplog entries) and lists them in ``retriedStmtIds``, and runs the rest, so a
write is never applied or logged twice. An older txnNumber fails with TransactionTooOld (225).
A command of a session first checks the session out (:meth:`Sessions.checkout`, mongod's
``SessionCatalog::checkOutSession``): a retry that arrives while the first attempt still runs
waits for it, then finds its statements executed. Durable shards write the record in the same
SQLite transaction as the documents and oplog entries of the write (:meth:`Sessions.note`,
:mod:`shard.durable`) and load it back on start-up (:meth:`Sessions.restore`), so a retry after
a restart is not applied again. The record keeps results rather than oplog opTimes, so its
history can never be incomplete (mongod's IncompleteTransactionHistory, 217, is not raised).

The API the write commands and (later) cross-shard transactions use: :meth:`Sessions.checkout`,
:meth:`Sessions.retryable` (the session of a retryable write, 225 for an older txnNumber),
:meth:`Session.lookup` (the recorded result of an executed stmtId), :meth:`Session.record_result`,
:meth:`Sessions.note` (durable write), :meth:`Sessions.restore` (start-up).

Transactions (``autocommit: false``; ``startTransaction: true`` on the first statement): writes
go to per-collection overlays (:class:`TxnView`) that only the transaction's own statements
see; their oplog operations are buffered. ``commitTransaction`` applies the overlays (all or
nothing; a unique key taken meanwhile gives WriteConflict 112), then writes ONE ``applyOps``
entry (``{op: "c", ns: "admin.$cmd", o: {applyOps: [...]}, lsid, txnNumber, prevOpTime}``) and
the pre-images with their ``applyOpsIndex``; ``abortTransaction`` (or a failed statement)
drops the overlays and writes nothing. A transaction reads one snapshot
(``Transaction.read_ts``, through :class:`shard.snapshot.SnapshotDocs`); a write meeting a
document another open transaction wrote, or one changed after the snapshot, is a WriteConflict
(112) at once, as WiredTiger's (docs/transactions.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from bson import Binary
from bson.int64 import Int64

from shardsim.core.commands import Request
from shardsim.core.errors import MongoError
from shardsim.shard.snapshot import SnapshotDocs
from shardsim.shard.storage import id_key

TRANSIENT = ["TransientTransactionError"]
# The uid of a session of an unauthenticated client: SHA-256 of the empty string
# (``kNoAuthDigest``, ``logical_session_id_helpers.cpp``); an authenticated user's is
# SHA-256("user@db").
NO_AUTH_UID = Binary(hashlib.sha256(b"").digest(), 0)


def full_lsid(lsid: Any) -> Any:
    """``lsid`` as mongod stores it: ``{id, uid}`` (``makeLogicalSessionId``,
    ``logical_session_id_helpers.cpp``); a client's ``{id}`` gets the no-auth uid. Anything
    that is not a dict is returned as it is."""
    if isinstance(lsid, dict) and "uid" not in lsid and "id" in lsid:
        out = {"id": lsid["id"], "uid": NO_AUTH_UID}
        out.update({k: v for k, v in lsid.items() if k not in ("id", "uid")})
        return out
    return lsid


def prepare_conflict(ns: str) -> MongoError:
    """WriteConflict (112, TransientTransactionError) for a write meeting a document of a
    prepared, undecided transaction (``transaction_participant.cpp``: prepared documents stay
    locked until commitTransaction/abortTransaction)."""
    return MongoError(112, f"Write conflict during plan execution and yielding is disabled. :: "
                           f"Please retry your operation or multi-document transaction. "
                           f"(a prepared transaction holds a document of {ns})",
                      labels=TRANSIENT)


class _NoCheckout:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: Any) -> None:
        return None


_NO_CHECKOUT = _NoCheckout()


def _session_id(lsid: Any) -> bytes | None:
    if isinstance(lsid, dict):
        sid = lsid.get("id")
        if isinstance(sid, (bytes, Binary)):
            return bytes(sid)
    return None


def session_key(lsid: Any) -> bytes | None:
    """The key of ``lsid``'s session: its ``id`` and ``uid`` (the no-auth uid when absent), so
    two users' sessions with the same id are two sessions, as mongod's ``LogicalSessionId``
    (``{id, uid}``, ``logical_session_id.idl``) keys the ``SessionCatalog``; None without a
    valid ``id``."""
    sid = _session_id(lsid)
    if sid is None:
        return None
    uid = lsid.get("uid", NO_AUTH_UID)
    return sid + (bytes(uid) if isinstance(uid, (bytes, Binary)) else repr(uid).encode())


def _refuse_if_prepared(s: "Session") -> None:
    """PreparedTransactionInProgress (267) when ``s`` has a prepared, undecided transaction: a
    newer txnNumber cannot start before it is decided (``transaction_participant.cpp``,
    ``beginOrContinue``)."""
    if s.txn is not None and s.txn.state == "prepared":
        raise MongoError(267, f"Cannot start a new transaction or retryable write on session "
                              f"{_session_id(s.lsid).hex()}: transaction {s.txn_number} is "
                              f"prepared and not yet committed or aborted")


class Transaction:
    """One open transaction: per-collection overlays of its writes (:class:`TxnView`) and the
    buffered oplog operations (``applyOps``) with their pre-images."""

    def __init__(self, session: "Session", txn_number: int) -> None:
        self.session = session
        self.txn_number = txn_number
        self.state = "in_progress"  # in_progress | prepared | committed | aborted
        self.started = time.monotonic()
        self.prepare_ts: Any = None  # Timestamp of the prepare entry once prepared
        # the cluster time its reads see (readConcern snapshot's atClusterTime, else the newest
        # oplog entry when the transaction started here): Sessions.transaction_for
        self.read_ts: Any = None
        self.ops: list[dict[str, Any]] = []
        self.pre_images: list[tuple[bytes, int, dict[str, Any]]] = []
        self.views: dict[bytes, TxnView] = {}
        # collections this transaction created, (db, name) -> Collection, published at commit
        # (shard.uncommitted_catalog); the read concern level of its first statement
        self.created: dict[tuple[str, str], Any] = {}
        self.read_level: str | None = None
        # writers and readers waiting for this transaction to end (shard.write_conflicts,
        # shard.prepare_conflicts), woken by unlock()
        self._end_waiters: list[asyncio.Future] | None = None

    async def wait_end(self, timeout_s: float) -> None:
        """Wait until the transaction commits or aborts (:meth:`unlock`), at most
        ``timeout_s`` seconds; returns at once when it is neither open nor prepared."""
        if self.state not in ("in_progress", "prepared"):
            return
        fut = asyncio.get_running_loop().create_future()
        if self._end_waiters is None:
            self._end_waiters = []
        self._end_waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            if self._end_waiters is not None and fut in self._end_waiters:
                self._end_waiters.remove(fut)

    def view(self, coll: Any) -> "TxnView":
        """The collection as this transaction sees it (its own writes over the committed data)."""
        v = self.views.get(coll.uuid)
        if v is None or v.coll is not coll:
            v = self.views[coll.uuid] = TxnView(coll, self.read_ts)
            v.txn = self
        return v

    def add_op(self, op: str, coll: Any, o: dict[str, Any], o2: dict[str, Any] | None,
               pre_image: dict[str, Any] | None) -> None:
        """Buffer one applyOps operation ``{op, ns, ui, o, o2?}``."""
        entry: dict[str, Any] = {"op": op, "ns": coll.ns, "ui": coll.ui, "o": o}
        if o2 is not None:
            entry["o2"] = o2
        if pre_image is not None:
            self.pre_images.append((coll.uuid, len(self.ops), pre_image))
        self.ops.append(entry)

    def check(self, storage: Any) -> None:
        """What :meth:`apply` would refuse, without applying (``prepareTransaction``): raises
        WriteConflict (112, TransientTransactionError) when a collection was dropped or a
        document the transaction wrote was changed by another writer since."""
        for v in self.views.values():
            base = v.coll
            if not v.overlay:
                continue
            if storage.by_uuid.get(base.uuid) is not base:
                raise prepare_conflict(base.ns)
            for key in v.overlay:
                if base.docs.get(key) is not v.seen.get(key) or \
                        base.prepared.get(key, self) is not self:
                    raise prepare_conflict(base.ns)

    def lock(self) -> None:
        """Hold every document the transaction writes against other writers until it is
        decided (a prepared transaction's documents: WriteConflict 112 for the others)."""
        for v in self.views.values():
            for key in v.overlay:
                v.coll.prepared[key] = self

    def unlock(self) -> None:
        """Release what :meth:`lock` took, and the write locks of :meth:`TxnView._remember`;
        wake the writers and readers waiting for the transaction to end (they run once the
        commit or abort that called this has finished: no await in between)."""
        waiters, self._end_waiters = self._end_waiters, None
        for fut in waiters or ():
            if not fut.done():
                fut.set_result(None)
        for v in self.views.values():
            for key in v.overlay:
                if v.coll.prepared.get(key) is self:
                    del v.coll.prepared[key]
                if v.coll.txn_writers.get(key) is self:
                    del v.coll.txn_writers[key]

    def apply(self, storage: Any, *, force: bool = False) -> None:
        """Commit the overlays to the collections (all or nothing). Raises WriteConflict (112,
        TransientTransactionError) when a collection was dropped or a unique key was taken by
        another writer since the transaction wrote. ``force``: a prepared transaction's commit,
        which cannot fail (its documents were locked since the prepare)."""
        applied: list[tuple[Any, Any, dict[str, Any] | None]] = []
        try:
            for v in self.views.values():
                base = v.coll
                if not v.overlay:
                    continue
                if storage.by_uuid.get(base.uuid) is not base:
                    if force:
                        continue
                    raise MongoError(112, "Collection dropped during the transaction")
                for key, doc in v.overlay.items():
                    old = base.docs.get(key)
                    if not force and old is not v.seen.get(key):
                        # Another writer changed this document after the transaction read it
                        # (stored documents are never mutated, so identity tells).
                        raise MongoError(112, "document changed by another writer")
                    if doc is None:
                        if old is not None:
                            base.delete(key)
                            applied.append((base, key, old))
                    elif old is None:
                        base.insert(doc)
                        applied.append((base, key, None))
                    else:
                        base.replace(key, doc)
                        applied.append((base, key, old))
        except MongoError as exc:
            for base, key, old in reversed(applied):
                if key in base.docs:
                    base.delete(key)
                if old is not None:
                    base.insert(old)
            # nothing was committed: the undo-log records of this attempt go (shard.snapshot)
            history = getattr(storage, "history", None)
            if history is not None:
                history.pending.clear()
            raise MongoError(112, f"Write conflict during plan execution and yielding is disabled. "
                                  f":: Please retry your operation or multi-document transaction. "
                                  f"({exc.errmsg})", labels=TRANSIENT) from None
        for base, key, _old in applied:
            storage.note_doc(base, key, base.docs.get(key))

    def rollback(self, storage: Any = None) -> None:
        """Forget the transaction's writes (nothing was applied to the collections)."""
        self.unlock()
        self.views.clear()
        self.ops.clear()
        self.pre_images.clear()
        self.created.clear()


class _MergedDocs:
    """``docs`` of a :class:`TxnView`: the committed documents with the overlay applied, in
    natural order (overlay inserts last). Mapping-like: get, items, values, keys, len, in."""

    __slots__ = ("_src", "overlay")

    def __init__(self, base: Any, overlay: dict[Any, Any]) -> None:
        self._src = base  # a dict (latest data) or a SnapshotDocs (the transaction's snapshot)
        self.overlay = overlay

    @property
    def base(self) -> dict[Any, Any]:
        """The committed documents this transaction reads (its snapshot when it has one)."""
        src = self._src
        return src.get() if isinstance(src, SnapshotDocs) else src

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self.overlay:
            doc = self.overlay[key]
            return default if doc is None else doc
        return self.base.get(key, default)

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None

    def __getitem__(self, key: Any) -> Any:
        doc = self.get(key)
        if doc is None:
            raise KeyError(key)
        return doc

    def __iter__(self):
        overlay = self.overlay
        for k in list(self.base):
            if k not in overlay or overlay[k] is not None:
                yield k
        for k, doc in list(overlay.items()):
            if doc is not None and k not in self.base:
                yield k

    def keys(self):
        return list(iter(self))

    def items(self):
        return [(k, self.get(k)) for k in self]

    def values(self):
        return [self.get(k) for k in self]

    def __len__(self) -> int:
        return sum(1 for _ in self)


class TxnView:
    """A collection seen from inside a transaction. Reads see committed documents plus the
    transaction's own writes; writes go to ``overlay`` (id_key -> new document, or None for
    deleted) until commit. Other attributes (ns, ui, uuid, indexes, document_key, ...) are the
    collection's."""

    def __init__(self, coll: Any, read_ts: Any = None) -> None:
        self.coll = coll
        self.overlay: dict[Any, dict[str, Any] | None] = {}
        self.seen: dict[Any, dict[str, Any] | None] = {}  # committed doc when first written
        self.snapshot = SnapshotDocs(coll, read_ts) if read_ts is not None else None
        self.docs = _MergedDocs(self.snapshot or coll.docs, self.overlay)
        self.txn: Transaction | None = None

    def _remember(self, key: Any) -> None:
        """About to write the document at ``key``: WriteConflict (112, TransientTransaction-
        Error) when a prepared transaction holds it, or another in-progress transaction wrote
        it (WiredTiger's write-write conflict between two uncommitted transactions); else the
        document is this transaction's until it ends."""
        holder = self.coll.prepared.get(key)
        if holder is not None and holder is not self.txn:
            raise prepare_conflict(self.coll.ns)
        writer = self.coll.txn_writers.get(key)
        if writer is not None and writer is not self.txn and writer.state == "in_progress":
            raise MongoError(112, "Write conflict during plan execution and yielding is "
                                  "disabled. :: Please retry your operation or multi-document "
                                  "transaction.", labels=TRANSIENT)
        if key not in self.seen and self.snapshot is not None and \
                self.coll.docs.get(key) is not self.snapshot.get().get(key):
            # committed by another writer after this transaction's snapshot
            raise MongoError(112, "Write conflict during plan execution and yielding is "
                                  "disabled. :: Please retry your operation or multi-document "
                                  "transaction.", labels=TRANSIENT)
        if self.txn is not None:
            self.coll.txn_writers[key] = self.txn
        if key not in self.seen:
            self.seen[key] = self.coll.docs.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.coll, name)

    def _check_unique(self, doc: dict[str, Any], own_key: Any = None) -> None:
        coll = self.coll
        for idx in coll.indexes.values():
            if not idx.unique:
                continue
            if idx.name == "_id_":
                k = id_key(doc["_id"])
                if k != own_key and self.docs.get(k) is not None:
                    raise coll._dup_error(idx, {"_id": doc["_id"]})
                continue
            for hk, kv in idx.keys_of(doc):
                holder = idx.entries.get(hk)
                if holder is not None and holder != own_key and holder not in self.overlay:
                    raise coll._dup_error(idx, kv)
                for ok, od in self.overlay.items():
                    if od is not None and ok != own_key and any(h == hk for h, _ in idx.keys_of(od)):
                        raise coll._dup_error(idx, kv)

    def insert(self, doc: dict[str, Any]) -> Any:
        """Insert into the overlay; DuplicateKey (11000) against committed and own documents."""
        self._check_unique(doc)
        k = id_key(doc["_id"])
        self._remember(k)
        self.overlay[k] = doc
        return k

    def replace(self, key: Any, new: dict[str, Any]) -> dict[str, Any]:
        """Replace in the overlay; returns the document it replaces (11000 as insert)."""
        old = self.docs[key]
        self._check_unique(new, own_key=key)
        self._remember(key)
        self.overlay[key] = new
        return old

    def delete(self, key: Any) -> dict[str, Any]:
        """Delete in the overlay; returns the deleted document."""
        old = self.docs[key]
        self._remember(key)
        self.overlay[key] = None
        return old


class Session:
    """Per-lsid state: the highest txnNumber, its transaction, and which statements of that
    txnNumber already ran (retryable writes, by stmtId, with their results)."""

    def __init__(self, lsid: dict[str, Any]) -> None:
        self.lsid = full_lsid(lsid)
        self.txn_number = -1
        self.txn: Transaction | None = None
        self.executed: dict[int, Any] = {}  # stmtId -> result, for txn_number
        self.lock = asyncio.Lock()  # the session checkout (Sessions.checkout)
        # ts of the newest oplog entry of its transaction (config.transactions lastWriteOpTime)
        self.last_write_ts: Any = None

    def lookup(self, stmt_id: int) -> Any:
        """The recorded result of ``stmt_id`` when it was executed under the current
        txnNumber (``TransactionParticipant::checkStatementExecuted``), else None. Results are
        ``1`` (insert), the count deleted (delete), ``{n, m, u: [upserted _id]}`` (update) or
        the reply body (findAndModify); on a member that applied the statement's oplog entry
        instead, ``{n, m?, u?, img}`` derived from the entry (:mod:`shard.replication.apply_txn`)."""
        return self.executed.get(stmt_id)

    def record_result(self, stmt_id: int, result: Any) -> None:
        """Remember that ``stmt_id`` ran with ``result`` (see :meth:`lookup`); made durable by
        :meth:`Sessions.note` with the rest of the command's writes."""
        self.executed[stmt_id] = result

    def record(self) -> dict[str, Any]:
        """The persisted form: ``{lsid, txnNumber, stmts: [{i: stmtId, r: result}],
        txnState?, lastWriteTs?, prepared?}``. ``txnState`` is ``"committed"`` or
        ``"aborted"`` once the session's transaction ended (mongod's ``config.transactions``
        ``state``, written with the commit / the abort of a prepared transaction,
        ``transaction_participant.cpp``), so the outcome survives a restart; ``prepared`` (a
        prepared, undecided transaction, which must survive a restart like mongod's prepared
        transactions recovered from the oplog) is ``{prepareTs, ops, writes: [{ui, _id,
        doc|null, seen|null}], preImages: [...]}``."""
        rec: dict[str, Any] = {"lsid": self.lsid, "txnNumber": Int64(self.txn_number),
                               "stmts": [{"i": k, "r": v} for k, v in self.executed.items()]}
        if self.last_write_ts is not None:
            rec["lastWriteTs"] = self.last_write_ts
        txn = self.txn
        if txn is not None and txn.state in ("committed", "aborted"):
            rec["txnState"] = txn.state
        if txn is not None and txn.state == "prepared":
            writes = []
            for v in txn.views.values():
                for key, doc in v.overlay.items():
                    seen = v.seen.get(key)
                    _id = (doc or seen or {}).get("_id")
                    writes.append({"ui": Binary(v.coll.uuid, 4), "_id": _id, "doc": doc})
            rec["prepared"] = {"prepareTs": txn.prepare_ts, "ops": txn.ops, "writes": writes,
                               "preImages": [{"ui": Binary(u, 4), "i": i, "doc": d}
                                             for u, i, d in txn.pre_images]}
        return rec


class Sessions:
    """All sessions of a shard node (their commands are in :mod:`shard.commands.transactions`)."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self._sessions: dict[bytes, Session] = {}
        self.lifetime_s = 60  # transactionLifetimeLimitSeconds
        self._reaper: asyncio.Task | None = None
        self._decision_waiters: list[asyncio.Future] = []  # shard.commit_recovery

    async def wait_decision(self, timeout_s: float) -> None:
        """Wait until a prepared transaction is committed or aborted (:meth:`decided`), at most
        ``timeout_s`` seconds."""
        fut = asyncio.get_running_loop().create_future()
        self._decision_waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            if fut in self._decision_waiters:
                self._decision_waiters.remove(fut)

    def decided(self) -> None:
        """A prepared transaction was committed or aborted: wake the readers waiting on it."""
        waiters, self._decision_waiters = self._decision_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def start_reaper(self, interval_s: float = 1.0) -> None:
        """Abort transactions older than ``lifetime_s`` seconds (mongod's periodic
        ``abortExpiredTransactions``), so an abandoned transaction's writes are rolled back."""
        async def reap() -> None:
            while True:
                await asyncio.sleep(interval_s)
                self.abort_expired()
        self._reaper = asyncio.get_running_loop().create_task(reap())

    def stop_reaper(self) -> None:
        """Cancel the transaction reaper of :meth:`start_reaper` (if running)."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None

    def abort_expired(self) -> int:
        """Roll back every in-progress transaction past its lifetime; returns how many."""
        deadline = time.monotonic() - self.lifetime_s
        n = 0
        for s in list(self._sessions.values()):
            txn = s.txn
            if txn is not None and txn.state == "in_progress" and txn.started < deadline:
                txn.rollback(self.node.storage)
                txn.state = "aborted"
                n += 1
        if n:
            self.node.flush()
        return n

    def end(self, lsids: list[Any]) -> None:
        """endSessions/killSessions: abort their open transactions and forget them."""
        for lsid in lsids:
            sid = session_key(lsid)
            s = self._sessions.get(sid) if sid is not None else None
            if s is not None and s.txn is not None and s.txn.state == "prepared":
                continue  # a prepared transaction outlives its session until decided
            s = self._sessions.pop(sid, None) if sid is not None else None
            if s is not None and s.txn is not None and s.txn.state == "in_progress":
                s.txn.rollback(self.node.storage)
                s.txn.state = "aborted"

    def lsids(self) -> list[Any]:
        """The lsid of every known session (killAllSessions)."""
        return [s.lsid for s in list(self._sessions.values())]

    def checkout(self, lsid: Any) -> Any:
        """``async with sessions.checkout(lsid):`` run one command of the session alone
        (mongod's ``SessionCatalog::checkOutSession`` / ``OperationContextSession``): a second
        command of the same session (a retry arriving while the first attempt still runs)
        waits until the first one has finished. A no-op without a valid ``lsid.id``."""
        s = self.get(lsid)
        return s.lock if s is not None else _NO_CHECKOUT

    def get(self, lsid: Any) -> Session | None:
        """The session of ``lsid`` (created on first use), or None without a valid ``lsid.id``."""
        sid = session_key(lsid)
        if sid is None:
            return None
        s = self._sessions.get(sid)
        if s is None:
            s = self._sessions[sid] = Session(lsid)
        return s

    # -- retryable writes ---------------------------------------------------------------------
    def retryable(self, req: Request) -> Session | None:
        """The session of a retryable write (``txnNumber`` without ``autocommit``), whose
        ``executed`` map (stmtId -> result) belongs to the request's txnNumber; None otherwise.

        Raises TransactionTooOld (225) when ``txnNumber`` is older than the session's;
        IncompleteTransactionHistory (217) when it ran as a transaction (a retry of a
        shard-key-changing retryable write the router converted), 267 while that one is
        prepared (``_beginOrContinueRetryableWrite``)."""
        tn = req.body.get("txnNumber")
        if tn is None or req.body.get("autocommit") is False:
            return None
        s = self.get(req.body.get("lsid"))
        if s is None:
            raise MongoError(50768, "Transaction numbers are only allowed on a replica set member "
                                    "or mongos with a session")
        tn = int(tn)
        if tn < s.txn_number:
            raise MongoError(225, f"Retryable write with txnNumber {tn} is prohibited on session "
                                  f"{_session_id(s.lsid).hex()} because a newer retryable write with "
                                  f"txnNumber {s.txn_number} has already started on this session.")
        if tn == s.txn_number and s.txn is not None:
            # _beginOrContinueRetryableWrite: this txnNumber ran as a transaction, e.g. the
            # router converted a shard-key-changing retryable write into one
            if s.txn.state == "prepared":
                raise MongoError(267, "Retryable write that has been converted to a transaction "
                                      "is in prepare")
            raise MongoError(217, "Cannot retry a retryable write that has been converted into "
                                  "a transaction")
        if tn > s.txn_number:
            _refuse_if_prepared(s)
            if s.txn is not None and s.txn.state == "in_progress":
                s.txn.rollback(self.node.storage)
                s.txn.state = "aborted"
            s.txn_number = tn
            s.executed = {}
            s.txn = None
        return s

    def note(self, s: Session) -> None:
        """Journal a session's retryable-write history (durable shards keep it, like
        ``config.transactions``, so a retry after a restart is not applied twice)."""
        if self.node.storage.journal is not None:
            self.node.storage.journal.append(("session", session_key(s.lsid), s))

    def restore(self, rec: dict[str, Any]) -> None:
        """Load one persisted session record (see :meth:`Session.record`)."""
        s = self.get(rec["lsid"])
        if s is not None:
            s.txn_number = int(rec["txnNumber"])
            s.executed = {int(x["i"]): x["r"] for x in rec.get("stmts", [])}
            s.last_write_ts = rec.get("lastWriteTs")
            prep = rec.get("prepared")
            if prep:
                self._restore_prepared(s, prep)
            elif rec.get("txnState") in ("committed", "aborted"):
                # the transaction's outcome (refreshFromStorageIfNeeded: kExecutedCommitted /
                # kAbortedWithPrepare from the config.transactions state)
                s.txn = Transaction(s, s.txn_number)
                s.txn.state = rec["txnState"]

    def _restore_prepared(self, s: Session, prep: dict[str, Any]) -> None:
        """Rebuild a prepared transaction after a restart: its overlays, locked again."""
        txn = Transaction(s, s.txn_number)
        txn.state = "prepared"
        txn.prepare_ts = prep["prepareTs"]
        txn.ops = list(prep.get("ops") or [])
        txn.pre_images = [(bytes(p["ui"]), int(p["i"]), p["doc"]) for p in prep.get("preImages", [])]
        for w in prep.get("writes", []):
            coll = self.node.storage.by_uuid.get(bytes(w["ui"]))
            if coll is None:
                continue
            v = txn.view(coll)
            key = id_key(w["_id"])
            v.seen[key] = coll.docs.get(key)
            v.overlay[key] = w.get("doc")
        txn.lock()
        s.txn = txn

    def records(self) -> list[dict[str, Any]]:
        """The session records as mongod's ``config.transactions`` shows them (read with
        ``find`` on a shard): ``{_id: lsid, txnNum, lastWriteOpTime: {ts, t}, state?}``, with
        ``state`` ``"prepared"``, ``"committed"`` or ``"aborted"`` for a transaction (an
        in-progress one has none, as in mongod); sessions that never wrote are left out."""
        out = []
        for s in list(self._sessions.values()):
            txn = s.txn
            if s.txn_number < 0 or (not s.executed and s.last_write_ts is None):
                continue
            doc: dict[str, Any] = {"_id": s.lsid, "txnNum": Int64(s.txn_number)}
            if s.last_write_ts is not None:
                doc["lastWriteOpTime"] = {"ts": s.last_write_ts, "t": Int64(1)}
            if txn is not None and txn.state != "in_progress":
                doc["state"] = txn.state
            out.append(doc)
        return out

    def txn_state(self, lsid: Any, txn_number: int) -> str | None:
        """The state of transaction ``txn_number`` of ``lsid`` on this shard
        (``"in_progress"``, ``"prepared"``, ``"committed"``, ``"aborted"``), or None when this
        shard does not know it (another txnNumber, a session it never saw). Creates nothing."""
        sid = session_key(lsid)
        s = self._sessions.get(sid) if sid is not None else None
        if s is None or s.txn is None or s.txn_number != int(txn_number):
            return None
        return s.txn.state

    def prepared(self) -> list[Transaction]:
        """The prepared, undecided transactions of this shard."""
        return [s.txn for s in self._sessions.values()
                if s.txn is not None and s.txn.state == "prepared"]

    # -- transactions -------------------------------------------------------------------------
    def transaction_for(self, req: Request) -> Transaction:
        """The transaction a statement with ``autocommit: false`` runs in (starting it when
        ``startTransaction: true``). Raises NoSuchTransaction (251), TransactionTooOld (225)."""
        body = req.body
        if body.get("autocommit") is not False:
            raise MongoError(50768, "autocommit must be false")
        tn = body.get("txnNumber")
        if tn is None:
            raise MongoError(50768, "'autocommit' field requires a transaction number to also be specified")
        s = self.get(body.get("lsid"))
        if s is None:
            raise MongoError(50768, "Transaction numbers are only allowed on a replica set member "
                                    "or mongos with a session")
        tn = int(tn)
        if body.get("startTransaction") is True:
            if tn < s.txn_number:
                raise MongoError(225, f"Cannot start transaction {tn} on session "
                                      f"{_session_id(s.lsid).hex()} because a newer transaction "
                                      f"with txnNumber {s.txn_number} has already started on this session.")
            if tn == s.txn_number and s.txn is None and s.executed:
                # _beginMultiDocumentTransaction: a retryable write that executed statements
                raise MongoError(50911, f"Cannot start a transaction at given transaction number "
                                        f"{tn} a transaction with the same number is in state "
                                        f"TxnState::ExecutedRetryableWrite")
            if tn == s.txn_number and s.txn is not None:
                raise MongoError(251, f"Given transaction number {tn} does not match any "
                                      f"in-progress transactions. The active transaction number is "
                                      f"{s.txn_number}", labels=TRANSIENT)
            _refuse_if_prepared(s)
            if s.txn is not None and s.txn.state == "in_progress":
                s.txn.rollback(self.node.storage)
            s.txn_number = tn
            s.executed = {}
            s.txn = Transaction(s, tn)
            s.txn.read_ts = self._read_ts(body)
            rc = body.get("readConcern")
            s.txn.read_level = rc.get("level") if isinstance(rc, dict) else None
            return s.txn
        if s.txn is None or s.txn_number != tn:
            raise MongoError(251, f"Given transaction number {tn} does not match any in-progress "
                                  f"transactions. The active transaction number is {s.txn_number}",
                             labels=TRANSIENT)
        if s.txn.state == "aborted":
            raise MongoError(251, f"Transaction with {{ txnNumber: {tn} }} has been aborted.",
                             labels=TRANSIENT)
        if s.txn.state == "committed":
            raise MongoError(256, f"Transaction with {{ txnNumber: {tn} }} has been committed.")
        if s.txn.state == "prepared":
            raise MongoError(267, "Cannot run a statement of a prepared transaction")
        return s.txn

    def _read_ts(self, body: dict[str, Any]) -> Any:
        """The snapshot of a transaction starting here: ``readConcern.atClusterTime`` of a
        ``snapshot`` transaction (the router's choice, the same on every shard), else the newest
        oplog entry (mongod opens the storage snapshot at the transaction's first statement on
        the shard; ``local``/``majority`` read concern, ``transaction_participant.cpp``)."""
        rc = body.get("readConcern")
        if isinstance(rc, dict) and rc.get("level") == "snapshot" and \
                rc.get("atClusterTime") is not None:
            return rc["atClusterTime"]
        node = self.node
        return node.oplog.last_ts() or node.clock.now()

    def abort_on_error(self, req: Request) -> None:
        """A statement failed inside a transaction: mongod aborts the whole transaction."""
        s = self.get(req.body.get("lsid"))
        if s is not None and s.txn is not None and s.txn.state == "in_progress":
            s.txn.rollback(self.node.storage)
            s.txn.state = "aborted"

    def txn_for_end(self, req: Request) -> tuple[Session, Transaction]:
        """The session and transaction a commitTransaction/abortTransaction names. Raises
        50768 (no session, no txnNumber, no ``autocommit: false``), TransactionTooOld (225),
        NoSuchTransaction (251, TransientTransactionError)."""
        tn = req.body.get("txnNumber")
        s = self.get(req.body.get("lsid"))
        if tn is None or s is None:
            raise MongoError(50768, f"{req.name} must be run within a transaction")
        if req.body.get("autocommit") is not False:
            raise MongoError(50768, "'autocommit' field is required for transaction commands")
        tn = int(tn)
        if tn < s.txn_number:
            raise MongoError(225, f"txnNumber {tn} is less than last txnNumber {s.txn_number} "
                                  f"seen in session {_session_id(s.lsid).hex()}")
        if s.txn is None or tn != s.txn_number:
            raise MongoError(251, f"Given transaction number {tn} does not match any in-progress "
                                  f"transactions. The active transaction number is {s.txn_number}",
                             labels=TRANSIENT)
        return s, s.txn
