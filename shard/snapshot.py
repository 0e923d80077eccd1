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
"""

from __future__ import annotations

import bisect
from typing import Any

from bson.timestamp import Timestamp

from shardsim.errors import MongoError

DEFAULT_WINDOW_S = 300  # minSnapshotHistoryWindowInSeconds


class History:
    """The shard's pending (not yet stamped) changes and the history window (seconds of
    cluster time kept, ``minSnapshotHistoryWindowInSeconds``)."""

    def __init__(self, window_s: int = DEFAULT_WINDOW_S) -> None:
        self.window_s = window_s
        self.pending: list[tuple[Any, Any, dict[str, Any] | None]] = []

    def record(self, coll: Any, key: Any, old: dict[str, Any] | None) -> None:
        """A document of ``coll`` at storage key ``key`` is about to change; ``old`` is the
        document before (None: it did not exist)."""
        self.pending.append((coll, key, old))

    def stamp(self, ts: Timestamp) -> None:
        """Give the pending changes the ``ts`` of the oplog entry that records them, and drop
        history older than the window."""
        if not self.pending:
            return
        floor = ts.time - self.window_s
        for coll, key, old in self.pending:
            hist = coll.history
            if hist and ts < hist[-1][0]:
                # a prepared transaction committed at its (older) commitTimestamp
                bisect.insort_right(hist, (ts, key, old), key=lambda h: h[0])
            else:
                hist.append((ts, key, old))
            if hist[0][0].time < floor:
                cut = 0
                while cut < len(hist) and hist[cut][0].time < floor:
                    cut += 1
                coll.history_floor = hist[cut - 1][0]
                del hist[:cut]
        self.pending.clear()


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
