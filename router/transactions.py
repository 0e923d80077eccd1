"""Which shard each transaction through this router runs on: mongos' ``TransactionRouter``
(``src/mongo/s/transaction_router.cpp``) reduced to a single participant, because the router
does not run two-phase commit. A transaction whose statements would reach a second shard fails
with OperationNotSupportedInTransaction (263).

One :class:`TransactionRouter` per router process (``RouterNode.transactions``); the read and
write paths call :meth:`TransactionRouter.participant` with the shards a statement targets, and
``commitTransaction``/``abortTransaction`` (:mod:`router.commands.transactions`) look the shard
up with :meth:`TransactionRouter.shard_of`.
"""

from __future__ import annotations

from typing import Iterable

from shardsim.commands import Request
from shardsim.errors import MongoError

# A transaction: (the session's lsid.id bytes, txnNumber).
TxnKey = tuple[bytes, int]


class TransactionRouter:
    """The participant shard of every open transaction, by :data:`TxnKey`.

    Entries are forgotten when the session starts a newer transaction or the transaction is
    aborted through the router; a committed transaction keeps its entry (a retried
    ``commitTransaction`` goes to the same shard).
    """

    def __init__(self) -> None:
        self._participants: dict[TxnKey, str] = {}

    @staticmethod
    def key(req: Request) -> TxnKey:
        """``(lsid.id, txnNumber)`` of ``req`` (``b""``/0 when absent)."""
        lsid = req.get("lsid") or {}
        return (bytes(lsid.get("id", b"")), int(req.get("txnNumber", 0)))

    def participant(self, req: Request, shards: Iterable[str]) -> str | None:
        """Record that ``req`` (a statement of a transaction) targets ``shards``, and return the
        transaction's one shard (None while no statement has targeted a shard).

        ``startTransaction`` starts afresh and forgets the session's older transactions.
        Raises OperationNotSupportedInTransaction (263) when the transaction would use more
        than one shard."""
        key = self.key(req)
        txns = self._participants
        if req.get("startTransaction"):
            txns.pop(key, None)
            # forget older transactions of the same session
            for k in [k for k in txns if k[0] == key[0] and k[1] < key[1]]:
                del txns[k]
        current = txns.get(key)
        wanted = set(shards)
        if current is not None:
            wanted.add(current)
        if len(wanted) > 1:
            raise MongoError(263, "shardsim: a transaction through the router may only use one "
                                  f"shard; this one would use {sorted(wanted)}")
        if wanted:
            txns[key] = next(iter(wanted))
        return txns.get(key)

    def shard_of(self, req: Request) -> str | None:
        """The shard the transaction of ``req`` runs on, or None if it has not touched one."""
        return self._participants.get(self.key(req))

    def end(self, req: Request) -> None:
        """Forget the transaction of ``req`` (after ``abortTransaction``)."""
        self._participants.pop(self.key(req), None)
