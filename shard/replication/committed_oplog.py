"""The oplog as change streams on a replica-set member see it: only up to the commit point.

A change stream reads the oplog at the majority-committed snapshot, so an event is released only
once a majority of the set has its entry and can never be rolled back (the server's change
streams read with ``readConcern: majority``: ``DocumentSourceChangeStream``, and
``ReplicationCoordinatorImpl::getCurrentCommittedSnapshotOpTime`` bounds the oplog scan).
:class:`CommittedOplog` is the view the shard's change-stream cursors read on a member of more
than one node: the same interface as :class:`shard.oplog.Oplog` (``latest_key``,
``scoped_batch``, listeners, ``first_ts``, ``truncated_through``), bounded by the member's
readable point (``min(commit point, last applied)``). Its listeners are called when the point
moves over an entry, not when the entry is appended. ``find`` on ``local.oplog.rs`` still reads
the whole oplog, as on mongod (a tailer at ``local`` sees what may roll back).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

Listener = Callable[[dict[str, Any]], None]


class CommittedOplog:
    """A read-only view of ``oplog`` up to ``limit()`` (a ts key, see the module docstring).
    Call :meth:`advance` when the limit moves."""

    def __init__(self, oplog: Any, limit: Callable[[], int]) -> None:
        self._oplog = oplog
        self._limit = limit
        self._seen = min(oplog.latest_key, limit())  # listeners were told up to here
        self._listeners: dict[Listener, tuple[str | None, str | None]] = {}

    # -- what the cursors read ----------------------------------------------------------------
    @property
    def short_reads(self) -> bool:
        return self._oplog.short_reads

    @property
    def truncated_through(self) -> int:
        return self._oplog.truncated_through

    @property
    def size_bytes(self) -> int:
        return self._oplog.size_bytes

    def __len__(self) -> int:
        return len(self._oplog)  # a size estimate (the batch sizing reads bytes per entry)

    @property
    def latest_key(self) -> int:
        """``ts_key`` of the newest committed entry (0 when none)."""
        return min(self._oplog.latest_key, self._limit())

    def first_ts(self) -> Any:
        return self._oplog.first_ts()

    def get(self, key: int) -> dict[str, Any] | None:
        return self._oplog.get(key) if key <= self._limit() else None

    def scoped_batch(self, key: int, limit: int, *, ns: str | None = None,
                     db: str | None = None) -> tuple[Any, Any]:
        """:meth:`shard.oplog.Oplog.scoped_batch` cut at the commit point."""
        keys, entries = self._oplog.scoped_batch(key, limit, ns=ns, db=db)
        top = self._limit()
        if keys and keys[-1] > top:
            n = 0
            while n < len(keys) and keys[n] <= top:
                n += 1
            keys, entries = list(keys[:n]), list(entries[:n])
        return keys, entries

    def scoped_entries_from(self, key: int, *, ns: str | None = None,
                            db: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
        top = self._limit()
        for k, entry in self._oplog.scoped_entries_from(key, ns=ns, db=db):
            if k > top:
                return
            yield k, entry

    # -- listeners ----------------------------------------------------------------------------
    def add_listener(self, cb: Listener, *, ns: str | None = None, db: str | None = None) -> None:
        """Call ``cb(entry)`` for every entry the commit point passes (scoped as
        :meth:`shard.oplog.Oplog.add_listener`: a namespace's or database's CRUD/no-op entries and
        every command entry)."""
        self._listeners[cb] = (ns, db)

    def remove_listener(self, cb: Listener) -> None:
        self._listeners.pop(cb, None)

    @property
    def listener_count(self) -> int:
        return len(self._listeners)

    def advance(self) -> None:
        """The readable point moved: tell the listeners about the entries it passed."""
        top = min(self._oplog.latest_key, self._limit())
        if top <= self._seen:
            self._seen = min(self._seen, top)  # a rollback took entries back
            return
        start, self._seen = self._seen + 1, top
        if not self._listeners:
            return
        for key, entry in self._oplog.scoped_entries_from(start):
            if key > top:
                break
            op = entry.get("op")
            entry_ns = entry.get("ns", "")
            for cb, (ns, db) in tuple(self._listeners.items()):
                if ns is None and db is None or op == "c" or \
                        (ns is not None and entry_ns == ns) or \
                        (db is not None and entry_ns.partition(".")[0] == db):
                    cb(entry)
