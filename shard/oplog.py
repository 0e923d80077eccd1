"""The shard's oplog (``local.oplog.rs``) and pre-image store (``config.system.preimages``).

The oplog is an in-memory, append-only list of MongoDB oplog entries ordered by ``ts`` (a BSON
``Timestamp``), indexed by :func:`shardsim.core.clock.ts_key`. It is what the change-stream stages
scan and what ``find`` on ``local.oplog.rs`` reads. Durable shards use its subclass
:class:`shard.oplog_disk.DiskOplog`: the entries live in SQLite (:mod:`shard.durable`) and these
lists hold only a bounded cache of the newest ones.

Retention works like a capped oplog with ``oplogMinRetentionHours``: entries are truncated from
the oldest end while the oplog is larger than ``max_bytes`` (``replication.oplogSizeMB``) AND
older than ``min_retention_s``, or when older than ``max_age_s`` whatever the size. The oldest
kept entry is :meth:`Oplog.first_ts`, which change streams compare with their start point to
detect ChangeStreamHistoryLost (286), as ``document_source_change_stream_ensure_resume_token_present``
/ ``oplog_entry ... earliestOpTime`` do on the server.

Pre-images (``config.system.preimages``) are keyed like the server's ``ChangeStreamPreImageId``
``{nsUUID, ts, applyOpsIndex}`` and expire with the oplog: a pre-image older than the oldest
oplog entry is removed (the server's default ``expireAfterSeconds: off`` behaviour).
"""

from __future__ import annotations

import array
import asyncio
import bisect
import datetime
import operator
import time
from typing import Any, Callable, Iterator

import bson
from bson import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp
from sortedcontainers import SortedDict

from shardsim.core.clock import ts_from_key, ts_key

Listener = Callable[[dict[str, Any]], None]

DEFAULT_MAX_BYTES = 1024 * 1024 * 1024  # 1 GiB, bytes of BSON
DEFAULT_MIN_RETENTION_S = 0.0
DEFAULT_MAX_AGE_S: float | None = None


class Oplog:
    """Append-only oplog with key-ordered lookup, waiting, listeners and retention.

    ``max_bytes`` — size cap in bytes (BSON size of the entries); ``min_retention_s`` —
    entries younger than this are never truncated for size; ``max_age_s`` — entries older than
    this many seconds are truncated even under the size cap (``None`` = no age limit).
    """

    # scoped_batch returns fewer entries than asked only at the end of its scope (the disk oplog,
    # shard.oplog_disk, also after a few megabytes read from disk).
    short_reads = False

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 min_retention_s: float = DEFAULT_MIN_RETENTION_S,
                 max_age_s: float | None = DEFAULT_MAX_AGE_S,
                 wall: Callable[[], float] = time.time) -> None:
        self.max_bytes = int(max_bytes)
        self.min_retention_s = float(min_retention_s)
        self.max_age_s = max_age_s
        self._wall = wall
        # Parallel lists; index i in the lists is absolute position ``_base + i``.
        self._keys: list[int] = []
        self._entries: list[dict[str, Any]] = []
        self._sizes: list[int] = []
        self._head = 0  # entries[:_head] are truncated (compacted lazily)
        self._base = 0
        self._bytes = 0
        self._disk_bytes = 0  # bytes of retained entries held only on disk (shard.oplog_disk)
        # Listeners indexed by what they can match (see add_listener): every entry, CRUD/no-op
        # entries of one namespace, CRUD/no-op entries of one database.
        self._listeners: list[Listener] = []
        self._by_ns: dict[str, list[Listener]] = {}
        self._by_db: dict[str, list[Listener]] = {}
        self._scope_of: dict[Listener, tuple[str, str] | None] = {}
        # Scan indexes (absolute positions, ascending): CRUD/no-op entries per namespace and per
        # database, and every command entry. A scoped scan (scoped_entries_from) visits only
        # these, so an idle stream's getMore skips the writes on other namespaces.
        self._ns_pos: dict[str, array.array] = {}
        self._db_pos: dict[str, array.array] = {}
        self._cmd_pos = array.array("q")
        self._index_gen = 0  # bumped when the index arrays are trimmed (positions shift)
        self._event: asyncio.Event | None = None
        self.truncated_callbacks: list[Callable[[int], None]] = []
        self.truncated_through = 0  # ts_key of the newest entry ever truncated (0 = none)

    # -- reading ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries) - self._head

    @property
    def size_bytes(self) -> int:
        """BSON bytes of the retained entries."""
        return self._bytes

    @property
    def latest_key(self) -> int:
        """``ts_key`` of the newest entry, 0 when empty."""
        return self._keys[-1] if len(self._keys) > self._head else 0

    def first_ts(self) -> Timestamp | None:
        """``ts`` of the oldest retained entry (history-loss checks), None when empty."""
        if len(self._keys) > self._head:
            return ts_from_key(self._keys[self._head])
        return None

    def last_ts(self) -> Timestamp | None:
        """``ts`` of the newest entry, None when empty."""
        if len(self._keys) > self._head:
            return ts_from_key(self._keys[-1])
        return None

    def entries_from(self, key: int) -> Iterator[dict[str, Any]]:
        """Entries with ``ts_key(entry['ts']) >= key`` in ts order.

        The iterator is live: entries appended while iterating are yielded too, and it survives
        truncation (it continues from the oldest retained entry if it fell behind).
        """
        pos = self._base + max(bisect.bisect_left(self._keys, key, self._head), self._head)
        while True:
            idx = pos - self._base
            if idx < self._head:
                idx = self._head
                pos = self._base + idx
            if idx >= len(self._entries):
                return
            yield self._entries[idx]
            pos += 1

    def entries_after(self, key: int) -> Iterator[dict[str, Any]]:
        """Entries with ``ts_key(entry['ts']) > key`` in ts order."""
        return self.entries_from(key + 1)

    def entries_reversed(self) -> Iterator[dict[str, Any]]:
        """Newest first (for ``find`` sorted by ``$natural: -1``), starting from the newest entry
        at the time of the call; lazy, so ``limit(1)`` costs O(1)."""
        pos = self._base + len(self._entries) - 1
        while True:
            idx = pos - self._base
            if idx < self._head or idx >= len(self._entries):
                return
            yield self._entries[idx]
            pos -= 1

    def get(self, key: int) -> dict[str, Any] | None:
        """The entry whose ts_key is exactly ``key``, or None."""
        i = bisect.bisect_left(self._keys, key, self._head)
        if i < len(self._keys) and self._keys[i] == key:
            return self._entries[i]
        return None

    # -- writing ----------------------------------------------------------------------------
    def append(self, entry: dict[str, Any], size: int | None = None) -> int:
        """Append ``entry`` (must have ``ts`` newer than every entry so far).

        ``size`` is the entry's BSON size in bytes when the caller already encoded it (or its
        estimate). Returns the size the oplog accounts for the entry (bytes). Raises ValueError
        on an out-of-order ``ts``. Wakes waiters and calls listeners.
        """
        key = ts_key(entry["ts"])
        if len(self._keys) > self._head and key <= self._keys[-1]:
            raise ValueError(f"oplog entry {entry['ts']} is not newer than {ts_from_key(self._keys[-1])}")
        if size is None:
            size = len(bson.encode(entry))
        self._keys.append(key)
        self._entries.append(entry)
        self._sizes.append(size)
        self._bytes += size
        self._index(entry, self._base + len(self._entries) - 1)
        if self._bytes + self._disk_bytes > self.max_bytes or self.max_age_s is not None:
            self._enforce_retention()
        ev = self._event
        if ev is not None:
            self._event = None
            ev.set()
        if self._scope_of:
            self._notify(entry)
        return size

    def _notify(self, entry: dict[str, Any]) -> None:
        # CRUD ("i"/"u"/"d") and no-op ("n") entries go to the listeners of their namespace and
        # database only; commands ("c": DDL, applyOps, renames across databases) to everyone.
        if entry.get("op") == "c":
            groups = [*self._by_ns.values(), *self._by_db.values()]
        else:
            ns = entry.get("ns", "")
            groups = [self._by_ns.get(ns), self._by_db.get(ns.partition(".")[0])] if ns else []
        groups.append(self._listeners)
        for group in groups:
            if group:
                for cb in tuple(group):
                    cb(entry)

    def load(self, entries: list[tuple[dict[str, Any], int]]) -> None:
        """Bulk-load ``(entry, size)`` pairs in ts order at start-up (no listeners called)."""
        for entry, size in entries:
            self._keys.append(ts_key(entry["ts"]))
            self._entries.append(entry)
            self._sizes.append(size)
            self._bytes += size
            self._index(entry, self._base + len(self._entries) - 1)

    def _index(self, entry: dict[str, Any], pos: int) -> None:
        if entry.get("op") == "c":
            self._cmd_pos.append(pos)
            return
        ns = entry.get("ns")
        if not ns or not isinstance(ns, str):
            return  # periodic no-ops (ns "") never match a scoped stream
        arr = self._ns_pos.get(ns)
        if arr is None:
            arr = self._ns_pos[ns] = array.array("q")
        arr.append(pos)
        db = ns.partition(".")[0]
        arr = self._db_pos.get(db)
        if arr is None:
            arr = self._db_pos[db] = array.array("q")
        arr.append(pos)

    def scoped_entries_from(self, key: int, *, ns: str | None = None,
                            db: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(ts_key, entry)`` in ts order from ``key`` on, restricted like a scoped listener
        (:meth:`add_listener`): with ``ns``, the CRUD/no-op entries of that namespace and every
        command entry; with ``db``, the same for the database; with neither, every entry.

        Every skipped entry is one a change stream on that namespace/database cannot match
        (``oplog_match.build``), so a reader that exhausts the iterator has in effect scanned to
        :attr:`latest_key`. Live like :meth:`entries_from` (appends are seen; truncated entries
        are skipped).
        """
        if ns is None and db is None:
            for entry in self.entries_from(key):
                ts = entry["ts"]
                yield (ts.time << 32) | ts.inc, entry
            return
        index = self._ns_pos if ns is not None else self._db_pos
        name = ns if ns is not None else db
        # Absolute position of the first entry with ts_key >= key.
        pos = self._base + max(bisect.bisect_left(self._keys, key, self._head), self._head)
        cmds = self._cmd_pos
        while True:
            gen = self._index_gen
            arr = index.get(name)
            ia = bisect.bisect_left(arr, pos) if arr is not None else 0
            ic = bisect.bisect_left(cmds, pos)
            while gen == self._index_gen:
                if arr is None:
                    arr = index.get(name)  # created by a write since
                na = arr[ia] if arr is not None and ia < len(arr) else -1
                nc = cmds[ic] if ic < len(cmds) else -1
                if na < 0 and nc < 0:
                    return
                if nc < 0 or 0 <= na < nc:
                    p = na
                    ia += 1
                else:
                    p = nc
                    ic += 1
                pos = p + 1
                idx = p - self._base
                if idx < self._head:
                    continue  # truncated
                yield self._keys[idx], self._entries[idx]

    def scoped_batch(self, key: int, limit: int, *, ns: str | None = None,
                     db: str | None = None) -> tuple[list[int] | tuple[int, ...],
                                                     list[dict[str, Any]] | tuple[Any, ...]]:
        """The first ``limit`` entries :meth:`scoped_entries_from` would yield from ``key`` with
        the same ``ns``/``db`` scope, as ``(ts_keys, entries)``: two sequences of equal length
        in ts order, shorter than ``limit`` only when the scope has no more entries (so a
        reader that gets fewer has scanned to :attr:`latest_key`). A snapshot, not live: call
        again from the last key + 1 for more. Per entry it costs a slice, not an iterator step
        (the change-stream catch-up reads the oplog through it)."""
        head = self._head
        start = max(bisect.bisect_left(self._keys, key, head), head)
        if ns is None and db is None:
            return self._keys[start:start + limit], self._entries[start:start + limit]
        base = self._base
        pos = base + start
        arr = (self._ns_pos if ns is not None else self._db_pos).get(ns if ns is not None else db)
        cmds = self._cmd_pos
        ic = bisect.bisect_left(cmds, pos)
        nc = len(cmds)
        ia = bisect.bisect_left(arr, pos) if arr is not None else 0
        na = len(arr) if arr is not None else 0
        if ic == nc or (na - ia >= limit and arr[ia + limit - 1] < cmds[ic]):  # type: ignore[index]
            positions: Any = arr[ia:ia + limit] if arr is not None else ()
        else:  # merge the runs of index positions with the command positions between them
            positions = []
            while len(positions) < limit:
                c = cmds[ic] if ic < nc else -1
                if ia < na:
                    ja = min(na, ia + limit - len(positions))
                    if c >= 0:
                        ja = bisect.bisect_left(arr, c, ia, ja)  # type: ignore[arg-type]
                    if ja > ia:
                        positions.extend(arr[ia:ja])  # type: ignore[index]
                        ia = ja
                        continue
                if c < 0:
                    break
                positions.append(c)
                ic += 1
        if not positions:
            return [], []
        if base:
            positions = [p - base for p in positions]
        if len(positions) == 1:
            i = positions[0]
            return [self._keys[i]], [self._entries[i]]
        get = operator.itemgetter(*positions)
        return get(self._keys), get(self._entries)

    def _enforce_retention(self) -> None:
        now = self._wall()
        removed_to = None
        n = len(self._entries)
        while self._head < n - 1:  # never truncate the newest entry
            age = now - (self._keys[self._head] >> 32)
            too_old = self.max_age_s is not None and age > self.max_age_s
            too_big = self._bytes > self.max_bytes and age >= self.min_retention_s
            if not (too_old or too_big):
                break
            self._bytes -= self._sizes[self._head]
            self._entries[self._head] = None  # type: ignore[call-overload]
            removed_to = self._keys[self._head]
            self._head += 1
        self._compact()
        if removed_to is not None:
            self.truncated_through = removed_to
            for cb in tuple(self.truncated_callbacks):
                cb(removed_to)

    def _compact(self) -> None:
        """Drop the list slots before ``_head`` once they are most of the lists (amortised)."""
        if self._head > 1024 and self._head * 2 > len(self._entries):
            del self._keys[:self._head]
            del self._entries[:self._head]
            del self._sizes[:self._head]
            self._base += self._head
            self._head = 0
            self._trim_indexes()

    def _trim_indexes(self) -> None:
        """Drop index positions of compacted entries (keeps the indexes as long as the oplog)."""
        first = self._base + self._head
        self._index_gen += 1
        for index in (self._ns_pos, self._db_pos):
            for name in list(index):
                arr = index[name]
                cut = bisect.bisect_left(arr, first)
                if cut == len(arr):
                    del index[name]
                elif cut:
                    del arr[:cut]
        cut = bisect.bisect_left(self._cmd_pos, first)
        if cut:
            del self._cmd_pos[:cut]

    def mark_durable(self, key: int) -> None:
        """Entries up to ``key`` are committed to disk (durable shards). The in-memory oplog
        keeps every entry anyway; :class:`shard.oplog_disk.DiskOplog` evicts from its cache."""

    def discard_after(self, key: int) -> int:
        """Remove the newest entries, those with ``ts_key > key`` (a durable commit that failed
        took them back: :mod:`shard.durable_undo`); returns how many. Listeners are not called:
        nothing read them, the commit ran before any other command could."""
        count = 0
        while len(self._keys) > self._head and self._keys[-1] > key:
            self._keys.pop()
            self._entries.pop()
            self._bytes -= self._sizes.pop()
            count += 1
        if count:
            first = self._base + len(self._entries)  # absolute position of the first removed
            for index in (self._ns_pos, self._db_pos):
                for name in list(index):
                    arr = index[name]
                    while arr and arr[-1] >= first:
                        arr.pop()
                    if not arr:
                        del index[name]
            while self._cmd_pos and self._cmd_pos[-1] >= first:
                self._cmd_pos.pop()
            self._index_gen += 1  # live scans re-seek
        return count

    def truncate(self) -> None:
        """Apply the retention settings now (after they change)."""
        self._enforce_retention()

    def truncate_before(self, key: int) -> int:
        """Remove every entry with ``ts_key < key`` (never the newest), as capped truncation
        of the oldest entries does; returns how many were removed. Change streams starting
        before the new :meth:`first_ts` then get ChangeStreamHistoryLost (286). Used by the
        test kit's ``truncate_oplog`` (history loss on demand)."""
        removed_to = None
        n = len(self._entries)
        count = 0
        while self._head < n - 1 and self._keys[self._head] < key:
            self._bytes -= self._sizes[self._head]
            self._entries[self._head] = None  # type: ignore[call-overload]
            removed_to = self._keys[self._head]
            self._head += 1
            count += 1
        if removed_to is not None:
            self.truncated_through = removed_to
            for cb in tuple(self.truncated_callbacks):
                cb(removed_to)
        return count

    # -- waiting ----------------------------------------------------------------------------
    async def wait_for_newer(self, key: int, timeout_s: float) -> bool:
        """Wait until an entry with ts_key > ``key`` exists; False after ``timeout_s`` seconds."""
        if self.latest_key > key:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        while self.latest_key <= key:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._event is None:
                self._event = asyncio.Event()
            try:
                await asyncio.wait_for(self._event.wait(), remaining)
            except asyncio.TimeoutError:
                return self.latest_key > key
        return True

    def add_listener(self, cb: Listener, *, ns: str | None = None, db: str | None = None) -> None:
        """Call ``cb(entry)`` synchronously after appends.

        Unscoped (neither ``ns`` nor ``db``): after every append. ``ns="db.coll"``: only for CRUD
        and no-op entries on exactly that namespace, plus every command (``op: "c"``) entry.
        ``db="db"``: the same for every namespace of that database. Scoped listeners let a write
        skip the change-stream cursors that cannot match it (their oplog filter needs the
        namespace of a CRUD/no-op entry to be watched, ``oplog_match.build``), so idle streams
        on other namespaces cost nothing per write. A callback is registered at most once.
        """
        if cb in self._scope_of:
            return
        if ns is not None:
            scope: tuple[str, str] | None = ("ns", ns)
            self._by_ns.setdefault(ns, []).append(cb)
        elif db is not None:
            scope = ("db", db)
            self._by_db.setdefault(db, []).append(cb)
        else:
            scope = None
            self._listeners.append(cb)
        self._scope_of[cb] = scope

    def remove_listener(self, cb: Listener) -> None:
        """Stop calling ``cb``; ignores unknown callbacks."""
        if cb not in self._scope_of:
            return
        scope = self._scope_of.pop(cb)
        if scope is None:
            self._listeners.remove(cb)
            return
        index = self._by_ns if scope[0] == "ns" else self._by_db
        group = index[scope[1]]
        group.remove(cb)
        if not group:
            del index[scope[1]]

    @property
    def listener_count(self) -> int:
        """Number of registered listeners (all scopes)."""
        return len(self._scope_of)


class PreImages:
    """``config.system.preimages``: ``(nsUUID, ts, applyOpsIndex) -> document before the write``.

    Documents are stored as given (dict, field order kept). ``truncate_before(key)`` removes
    pre-images whose ts_key is older than ``key`` (called when the oplog truncates).
    """

    def __init__(self) -> None:
        self._docs: SortedDict = SortedDict()  # (ts_key, ns_uuid, index) -> doc

    def __len__(self) -> int:
        return len(self._docs)

    def put(self, ns_uuid: bytes, ts: Timestamp, apply_ops_index: int, doc: dict[str, Any]) -> None:
        """Store the pre-image of the write at ``ts`` (``apply_ops_index`` within applyOps, else 0)."""
        self._docs[(ts_key(ts), bytes(ns_uuid), int(apply_ops_index))] = doc

    def get(self, ns_uuid: bytes, ts: Timestamp, apply_ops_index: int = 0) -> dict[str, Any] | None:
        """The stored pre-image or None (expired or never recorded)."""
        return self._docs.get((ts_key(ts), bytes(ns_uuid), int(apply_ops_index)))

    def truncate_before(self, key: int) -> int:
        """Drop pre-images with ts_key < ``key``; returns how many were removed."""
        stop = self._docs.bisect_left((key, b"", -1))
        keys = list(self._docs.keys()[:stop])
        for k in keys:
            del self._docs[k]
        return len(keys)

    def discard_from(self, key: int) -> int:
        """Drop pre-images with ts_key >= ``key`` (a failed durable commit's); returns how many."""
        start = self._docs.bisect_left((key, b"", -1))
        keys = list(self._docs.keys()[start:])
        for k in keys:
            del self._docs[k]
        return len(keys)

    def items(self) -> Iterator[tuple[tuple[int, bytes, int], dict[str, Any]]]:
        """``((ts_key, ns_uuid, index), doc)`` in ts order."""
        return iter(self._docs.items())

    def docs(self) -> Iterator[dict[str, Any]]:
        """Pre-images as ``config.system.preimages`` documents ``{_id: {nsUUID, ts,
        applyOpsIndex}, operationTime, preImage}`` (for ``find``)."""
        for (key, uuid, idx), doc in self._docs.items():
            ts = ts_from_key(key)
            when = datetime.datetime.fromtimestamp(ts.time, datetime.timezone.utc).replace(tzinfo=None)
            yield {"_id": {"nsUUID": Binary(uuid, 4), "ts": ts, "applyOpsIndex": Int64(idx)},
                   "operationTime": when, "preImage": doc}
