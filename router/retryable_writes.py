"""Retryable writes through the router: which statements of a client's write command (by
``lsid``/``txnNumber``) were already applied, so that a retry applies only the rest and answers
with the totals of both attempts. Nothing is applied twice.

The shards keep their own retry history per command, but one client command becomes several
child batches on the router (one per shard, or several consecutive runs for an ordered batch),
so the router keeps the per-statement record itself. mongos relies on the shards'
``config.transactions`` instead; see ``src/mongo/s/write_ops/batch_write_exec.cpp``.

One :class:`RetryCache` per router process (``RouterNode.retryable_writes``), used by
:func:`router.writes.run_write` and :func:`router.writes.find_and_modify`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

RETRY_CACHE_SIZE = 10_000

# A retryable write: (the session's lsid.id bytes, txnNumber).
RetryKey = tuple[bytes, int]


class RetryCache:
    """Retryable write records by :data:`RetryKey` (LRU, at most ``size`` entries).

    A write command's record is ``{"done": set[int] (statement indexes applied), "n": int,
    "nModified": int, "upserted": list[{"index", "_id"}]}``, plus ``"complete": True`` once
    every statement was applied; a findAndModify's record is its reply body.
    """

    def __init__(self, size: int = RETRY_CACHE_SIZE) -> None:
        self._data: OrderedDict[RetryKey, dict[str, Any]] = OrderedDict()
        self._size = size

    @staticmethod
    def key(body: dict[str, Any]) -> RetryKey | None:
        """The record key of a command body, or None when it is not a retryable write (no
        ``lsid``/``txnNumber``, or inside a transaction: ``autocommit: false``)."""
        lsid, txn = body.get("lsid"), body.get("txnNumber")
        if not isinstance(lsid, dict) or txn is None or body.get("autocommit") is False:
            return None
        ident = lsid.get("id")
        return (bytes(ident) if ident is not None else b"", int(txn))

    def get(self, key: RetryKey) -> dict[str, Any] | None:
        """The record of ``key`` (marked recently used), or None."""
        reply = self._data.get(key)
        if reply is not None:
            self._data.move_to_end(key)
        return reply

    def record(self, key: RetryKey) -> dict[str, Any]:
        """The (new or existing) record ``{done: set, n, nModified, upserted}`` of ``key``."""
        rec = self.get(key)
        if rec is None:
            rec = {"done": set(), "n": 0, "nModified": 0, "upserted": []}
            self.put(key, rec)
        return rec

    def put(self, key: RetryKey, reply: dict[str, Any]) -> None:
        """Store ``reply`` as the record of ``key``, evicting the least recently used."""
        self._data[key] = reply
        if len(self._data) > self._size:
            self._data.popitem(last=False)
