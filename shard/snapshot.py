"""Snapshot history of a shard: what each collection looked like at an earlier cluster time, for
``readConcern: {level: "snapshot"[, atClusterTime]}`` reads outside transactions.

mongod keeps ``minSnapshotHistoryWindowInSeconds`` (default 300 s) of WiredTiger history and
reads a snapshot at the requested timestamp; an older one fails with SnapshotTooOld (239)
(``snapshot_window_options.idl``, ``read_concern_mongod.cpp``). shardsim keeps an undo log
instead: every document change appends ``(coll, storage key, document before)`` to
:attr:`History.pending`, and the next oplog entry (the write's own: :meth:`stamp` is called by
``ShardNode.append_entry``) stamps them with its ``ts`` and moves them into the collection's
``history``. A read at ``T`` starts from the current documents and undoes, newest first, every
change stamped after ``T`` (:func:`documents_at`). Stored documents are never mutated in place
(:mod:`shard.storage`), so keeping the old dict is enough.

The history is bounded twice: by the window, and by a byte budget (``--snapshot-history-mb``,
default :data:`DEFAULT_MAX_BYTES`), as WiredTiger's history is bounded by its cache: under
pressure the oldest changes go first and a read older than what is left gets SnapshotTooOld,
so a write load cannot grow a shard's memory without bound. A change costs the size of the
oplog entry that records it (its share when one entry records several), a cheap stand-in for
the size of the document before.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

from bson.timestamp import Timestamp

from shardsim.core.errors import MongoError

DEFAULT_WINDOW_S = 300  # minSnapshotHistoryWindowInSeconds
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # --snapshot-history-mb 32
_MIN_COST = 64  # bytes charged for a change whose oplog entry size is unknown


class History:
    """The shard's pending (not yet stamped) changes and the kept history: at most ``window_s``
    seconds of cluster time (``minSnapshotHistoryWindowInSeconds``) and ``max_bytes`` bytes."""

    def __init__(self, window_s: int = DEFAULT_WINDOW_S,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.window_s = window_s
        self.max_bytes = max_bytes
        self.bytes = 0
        self.pending: list[tuple[Any, Any, dict[str, Any] | None]] = []
        # every kept change in stamp order: (collection, ts, cost in bytes)
        self.order: deque[tuple[Any, Timestamp, int]] = deque()

    def record(self, coll: Any, key: Any, old: dict[str, Any] | None) -> None:
        """A document of ``coll`` at storage key ``key`` is about to change; ``old`` is the
        document before (None: it did not exist)."""
        self.pending.append((coll, key, old))

    def stamp(self, ts: Timestamp, size: int | None = None) -> None:
        """Give the pending changes the ``ts`` of the oplog entry (``size`` bytes) that records
        them, then drop the oldest history beyond the window or the byte budget."""
        if not self.pending:
            return
        cost = max(_MIN_COST, (size or 0) // len(self.pending))
        order = self.order
        for coll, key, old in self.pending:
            hist = coll.history
            if hist and ts < hist[-1][0]:
                # a prepared transaction committed at its (older) commitTimestamp
                bisect.insort_right(hist, (ts, key, old), key=lambda h: h[0])
            else:
                hist.append((ts, key, old))
            order.append((coll, ts, cost))
        self.bytes += cost * len(self.pending)
        self.pending.clear()
        floor = ts.time - self.window_s
        while order and (self.bytes > self.max_bytes or order[0][1].time < floor):
            coll, _, old_cost = order.popleft()
            self.bytes -= old_cost
            if coll.history:  # its oldest change (a commit at an older time sorts first)
                dropped_ts = coll.history.popleft()[0]
                if coll.history_floor is None or dropped_ts > coll.history_floor:
                    coll.history_floor = dropped_ts


def documents_at(coll: Any, at: Timestamp) -> dict[Any, dict[str, Any]]:
    """``coll``'s documents (storage key -> document) as of cluster time ``at``. Raises
    SnapshotTooOld (239) when ``at`` is older than the history kept."""
    floor = getattr(coll, "history_floor", None)
    if floor is not None and at < floor:
        raise MongoError(239, f"Read timestamp {at} is older than the oldest available "
                              f"timestamp.")
    hist = getattr(coll, "history", None) or []
    if not hist or hist[-1][0] <= at:
        return coll.docs
    docs = dict(coll.docs)
    for ts, key, old in reversed(hist):
        if ts <= at:
            break
        if old is None:
            docs.pop(key, None)
        else:
            docs[key] = old
    return docs


class SnapshotView:
    """``coll`` as of cluster time ``at``: ``docs`` are the documents then; every other
    attribute is the collection's (reads only)."""

    def __init__(self, coll: Any, at: Timestamp) -> None:
        self.coll = coll
        self.docs = documents_at(coll, at)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.coll, name)


class SnapshotDocs:
    """The documents of ``coll`` as of cluster time ``at``, kept current while ``coll`` changes
    (a transaction's snapshot, :class:`shard.sessions.TxnView`): :meth:`get` recomputes
    :func:`documents_at` only when the collection's undo log changed since the last call."""

    __slots__ = ("coll", "at", "_key", "_docs")

    def __init__(self, coll: Any, at: Timestamp) -> None:
        self.coll = coll
        self.at = at
        self._key: Any = None
        self._docs: Any = None

    def get(self) -> dict[Any, dict[str, Any]]:
        """Storage key -> document as of ``at`` (SnapshotTooOld 239 past the history window)."""
        hist = self.coll.history
        key = (len(hist), hist[-1][0] if hist else None, len(self.coll.docs))
        if key != self._key or self._docs is None:
            self._docs = documents_at(self.coll, self.at)
            self._key = key
        return self._docs
