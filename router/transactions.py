"""The router's transaction state: mongos' ``TransactionRouter`` (``src/mongo/s/transaction_router.cpp``).

One :class:`TransactionRouter` per router process (``RouterNode.transactions``) keeps, per
transaction ``(lsid.id, txnNumber)``, a :class:`RouterTxn`: its participants in the order they
were first targeted (the first one is the coordinator), whether each has written, and the
transaction's read concern. Every command the router sends to a shard inside a transaction goes
through :meth:`TransactionRouter.attach` (``Participant::attachTxnFieldsIfNeeded``): the first
statement to a shard carries ``startTransaction: true``, ``autocommit: false`` and the
transaction's ``readConcern`` (``snapshot`` with the ``atClusterTime`` the router chose,
``setAtClusterTime``); later ones carry neither ``startTransaction`` nor ``readConcern``.
``commitTransaction``/``abortTransaction`` (:mod:`router.commands.transactions`) use
:meth:`TransactionRouter.get` to find the participants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from bson import Timestamp

from shardsim.core.commands import Request

# A transaction: (the session's lsid.id + lsid.uid bytes, txnNumber).
TxnKey = tuple[bytes, int]

# Statements that make a participant a writing one (mongod answers ``readOnly: false``): the
# CRUD writes, and ``create``/``createIndexes``, which create a collection or an index inside
# the transaction on the database's primary shard (cluster_create_cmd.cpp).
WRITE_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify", "findandmodify",
                            "bulkWrite", "create", "createIndexes"})
# Commands that end a transaction: never start one on a shard (isTransactionCommand).
TXN_COMMANDS = frozenset({"commitTransaction", "abortTransaction", "prepareTransaction",
                          "coordinateCommitTransaction"})


@dataclass
class RouterTxn:
    """One transaction as the router sees it.

    ``participants``: shard id -> ``{"read_only": bool}`` in first-targeted order (the first is
    the coordinator, ``isCoordinator``); ``read_concern``: the first statement's readConcern
    (with ``atClusterTime`` filled in for ``snapshot``); ``commit_started``: a commit was sent
    (a later ``abortTransaction`` does not go to the shards then)."""

    txn_number: int
    read_concern: dict[str, Any] | None = None
    participants: dict[str, dict[str, Any]] = field(default_factory=dict)
    commit_started: bool = False

    @property
    def coordinator(self) -> str | None:
        """The coordinator shard (the first participant), or None."""
        return next(iter(self.participants), None)

    @property
    def recovery_shard(self) -> str | None:
        """The first participant that wrote (``recoveryShardId`` of the recovery token)."""
        for shard, p in self.participants.items():
            if not p["read_only"]:
                return shard
        return None


class TransactionRouter:
    """The open transactions of this router, by :data:`TxnKey` (the newest one of a session
    only: a newer txnNumber forgets the older ones)."""

    def __init__(self, clock: Any = None) -> None:
        self._txns: dict[TxnKey, RouterTxn] = {}
        self.clock = clock

    @staticmethod
    def key(req: Request | dict[str, Any]) -> TxnKey:
        """``(lsid.id + lsid.uid, txnNumber)`` of ``req`` (``b""``/0 when absent): the uid
        is part of the session (``LogicalSessionId``), so two users' sessions with the same id
        are two sessions."""
        body = req.body if isinstance(req, Request) else req
        lsid = body.get("lsid") or {}
        return (bytes(lsid.get("id", b"")) + bytes(lsid.get("uid", b"")),
                int(body.get("txnNumber", 0) or 0))

    def get(self, req: Request | dict[str, Any]) -> RouterTxn | None:
        """The transaction of ``req``, or None when this router never saw it start."""
        return self._txns.get(self.key(req))

    def participant(self, req: Request, shards: Iterable[str]) -> None:
        """A statement of ``req``'s transaction is about to target ``shards``: with
        ``startTransaction`` the transaction begins here (:meth:`begin`). The shards become
        participants when the router actually sends them a command (:meth:`attach`)."""
        if req.get("startTransaction"):
            self.begin(req.body)

    def begin(self, body: dict[str, Any]) -> RouterTxn:
        """Start the transaction of ``body`` (a statement with ``startTransaction``), unless
        it is already started (a second shard of the same first statement). Forgets the
        session's older transactions. Picks ``atClusterTime`` for a ``snapshot`` read concern
        without one: the router's cluster time, or ``afterClusterTime`` if newer
        (``setAtClusterTime``)."""
        key = self.key(body)
        txn = self._txns.get(key)
        if txn is not None:
            return txn
        for k in [k for k in self._txns if k[0] == key[0] and k[1] < key[1]]:
            del self._txns[k]
        rc = body.get("readConcern")
        rc = dict(rc) if isinstance(rc, dict) else None
        if rc is not None and rc.get("level") == "snapshot" and "atClusterTime" not in rc:
            at = self.clock.now() if self.clock is not None else None
            after = rc.pop("afterClusterTime", None)
            if isinstance(after, Timestamp) and (at is None or (after.time, after.inc) > (at.time, at.inc)):
                at = after
            if at is not None:
                rc["atClusterTime"] = at
        txn = self._txns[key] = RouterTxn(key[1], rc)
        return txn

    def attach(self, shard: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """``cmd`` (a command inside a transaction, on its way to ``shard``) with the
        transaction fields that shard needs (``attachTxnFieldsIfNeeded``): the first command
        to a shard starts the transaction there; others lose ``startTransaction`` and
        ``readConcern``. Records ``shard`` as a participant and whether it wrote."""
        name = next(iter(cmd), "")
        if name in TXN_COMMANDS:
            return cmd
        key = self.key(cmd)
        txn = self._txns.get(key)
        if txn is None:
            if not cmd.get("startTransaction"):
                return cmd  # a transaction this router never saw start: the shard decides
            txn = self.begin(cmd)
        out = {k: v for k, v in cmd.items() if k not in ("startTransaction", "readConcern")}
        p = txn.participants.get(shard)
        if p is None:
            p = txn.participants[shard] = {"read_only": True}
            out["startTransaction"] = True
            if txn.read_concern:
                out["readConcern"] = dict(txn.read_concern)
        out["autocommit"] = False
        if name in WRITE_COMMANDS:
            p["read_only"] = False
        return out

    def recovery_token(self, req: Request) -> dict[str, Any] | None:
        """``{recoveryShardId?}`` for a reply to a statement of a transaction (mongos adds it
        to every reply in a transaction, ``appendRecoveryToken``), or None outside one."""
        txn = self.get(req)
        if txn is None:
            return None
        shard = txn.recovery_shard
        return {"recoveryShardId": shard} if shard is not None else {}

    def end(self, req: Request) -> None:
        """Forget the transaction of ``req`` (after ``abortTransaction``)."""
        self._txns.pop(self.key(req), None)
