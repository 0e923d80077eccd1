"""The oplog of a durable shard: on disk (SQLite), with a bounded cache of the newest entries.

mongod keeps ``local.oplog.rs`` in its storage engine and only what the WiredTiger cache holds
in memory; a change stream behind that reads the oplog collection from disk. A durable shardsim
shard (``--dbpath``, :mod:`shard.durable`) does the same: every entry is already written to the
SQLite table ``oplog`` when its command commits, so :class:`DiskOplog` keeps in memory only

* a **cache** of the newest entries, at most :attr:`DiskOplog.cache_bytes` bytes
  (``--oplog-cache-mb``, default 64 MiB) of entries that are already committed, plus the entries
  not yet committed (a command's own writes until its commit; they cannot be read back from
  disk before that). The cache is the in-memory :class:`shard.oplog.Oplog`'s lists, with its
  namespace/database/command position indexes covering the cached entries only;
* three counters for the older, disk-only part: how many entries, their bytes, and the lower
  bound of their ``ts`` (:attr:`DiskOplog._disk_from`), plus a small read-ahead window of the
  oldest entries' ``(ts_key, size)`` for exact size/age truncation.

Reads by key (:meth:`DiskOplog.scoped_batch`, which the change-stream scan uses, ``get``,
``entries_from``, ``entries_reversed``) read the disk part from SQLite in ts order, in batches
of at most the caller's limit, and go on in the cache: a stream that starts or resumes behind
the cache never loads the whole oplog. A scoped read uses the table's ``(ns, ts)`` /
``(db, ts)`` indexes and the partial index of command entries, like the in-memory indexes.
Truncation (size cap, ``oplogMinRetentionHours``, ``--oplog-max-age-s``, ``truncate_before``)
works on the counters and journals ``("truncate", key)``, which the next commit turns into a
``DELETE`` (:meth:`shard.durable.DurableStore.commit`). Start-up reads only the counters and
the newest ``cache_bytes`` of entries (the clock restarts after the newest ``ts``).

The table (created by :mod:`shard.durable`): ``oplog (ts INTEGER PRIMARY KEY, cmd, ns, db,
size, crc, entry)`` — ``ts`` the :func:`shardsim.core.clock.ts_key`, ``cmd`` 1 for ``op: "c"``
entries, ``ns``/``db`` the namespace and database of CRUD/no-op entries with a namespace (NULL
otherwise: what the in-memory indexes index), ``size`` the bytes the oplog accounts for the
entry, ``crc`` the CRC32C of ``ts`` and the entry (:func:`shard.durable_integrity.oplog_crc`;
checked at start-up and on every disk read: DataCorruptionDetected 301), ``entry`` its BSON.
The small columns come before the BLOB so counting and indexing never read the entries'
overflow pages.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import sqlite3
from typing import Any, Iterator

import bson
from bson.timestamp import Timestamp

from shardsim.core.clock import ts_from_key, ts_key
from shardsim.core.node import CODEC
from shardsim.shard.durable_integrity import oplog_corrupt, oplog_crc
from shardsim.shard.oplog import Oplog

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024

OPLOG_SCHEMA = """
CREATE TABLE IF NOT EXISTS oplog (ts INTEGER PRIMARY KEY, cmd INTEGER NOT NULL, ns TEXT, db TEXT,
                                  size INTEGER NOT NULL, crc INTEGER, entry BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS oplog_ns ON oplog (ns, ts) WHERE ns IS NOT NULL;
CREATE INDEX IF NOT EXISTS oplog_db ON oplog (db, ts) WHERE db IS NOT NULL;
CREATE INDEX IF NOT EXISTS oplog_cmd ON oplog (ts) WHERE cmd = 1;
"""

PUT_OPLOG = ("INSERT OR REPLACE INTO oplog (ts, cmd, ns, db, size, crc, entry) "
             "VALUES (?, ?, ?, ?, ?, ?, ?)")

_WINDOW = 256  # (ts_key, size) pairs of the oldest disk entries read ahead for truncation
_BATCH = 256  # entries per disk read of the iterators
_IN_CHUNK = 500  # keys per "ts IN (...)" query (below every SQLite's variable limit)
READ_BYTES = 4 * 1024 * 1024  # a disk read stops after this many bytes of entries


def oplog_row(entry: dict[str, Any], raw: bytes, size: int | None = None) -> tuple:
    """The ``oplog`` table row of ``entry`` (``raw`` its BSON; ``size`` the bytes the oplog
    accounts for it, ``len(raw)`` when None), with its checksum."""
    key = ts_key(entry["ts"])
    size = len(raw) if size is None else int(size)
    crc = oplog_crc(key, raw)
    if entry.get("op") == "c":
        return (key, 1, None, None, size, crc, raw)
    ns = entry.get("ns")
    if isinstance(ns, str) and ns:
        return (key, 0, ns, ns.partition(".")[0], size, crc, raw)
    return (key, 0, None, None, size, crc, raw)


def _entry(key: int, crc: int | None, raw: bytes) -> dict[str, Any]:
    """The decoded entry of an oplog row read from disk; DataCorruptionDetected (301) when its
    checksum fails (NULL: a row written before checksums)."""
    if crc is not None and crc != oplog_crc(key, raw):
        raise oplog_corrupt("shard.sqlite", key)
    return bson.decode(raw, CODEC)


def migrate(conn: sqlite3.Connection) -> None:
    """Bring an ``oplog`` table of the first layout (``ts, entry``) to the current one, in one
    transaction; one of the second layout (no ``crc``) gets the column, NULL for the rows it
    has (not verified). A store written by an earlier shardsim opens unchanged otherwise."""
    cols = [r[1] for r in conn.execute("PRAGMA table_info(oplog)")]
    if not cols or "size" in cols:
        if cols and "crc" not in cols:
            conn.execute("ALTER TABLE oplog ADD COLUMN crc INTEGER")
        conn.executescript(OPLOG_SCHEMA)
        return
    conn.execute("BEGIN")
    try:
        conn.execute("ALTER TABLE oplog RENAME TO oplog_v1")
        for stmt in OPLOG_SCHEMA.split(";"):  # (executescript would commit first)
            if stmt.strip():
                conn.execute(stmt)
        cur = conn.execute("SELECT entry FROM oplog_v1 ORDER BY ts")
        while True:
            rows = cur.fetchmany(1000)
            if not rows:
                break
            conn.executemany(PUT_OPLOG, [oplog_row(bson.decode(raw, CODEC), raw) for (raw,) in rows])
        conn.execute("DROP TABLE oplog_v1")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class DiskOplog(Oplog):
    """An :class:`shard.oplog.Oplog` whose older entries live only in the SQLite table (see the
    module docstring). ``conn`` — the shard's SQLite connection (:class:`shard.durable.
    DurableStore`); ``cache_bytes`` — the cache's size in bytes (committed entries); the other
    keywords as :class:`~shard.oplog.Oplog`. Call :meth:`load_from_disk` once at start-up and
    :meth:`mark_durable` after every successful commit."""

    # scoped_batch may return fewer entries than asked (never none) while more follow: a read
    # from disk stops after READ_BYTES, so large entries are read a few megabytes at a time.
    short_reads = True

    def __init__(self, conn: sqlite3.Connection, *, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._conn = conn
        self.cache_bytes = int(cache_bytes)
        self.durable_through = 0  # ts_key of the newest committed entry
        self._disk_count = 0
        self._disk_from = 0  # disk-only entries: ts_key in [_disk_from, cache's first key)
        self._window: collections.deque[tuple[int, int]] = collections.deque()
        self.disk_rows_read = 0  # entries read back from disk (serverStatus, tests)
        self._capped = False  # the last disk read stopped at READ_BYTES

    # -- start-up -----------------------------------------------------------------------------
    def load_from_disk(self) -> None:
        """Read the counters and the newest ``cache_bytes`` of entries (at least one)."""
        count, total, first, last = self._conn.execute(
            "SELECT count(*), coalesce(sum(size), 0), min(ts), max(ts) FROM oplog").fetchone()
        if not count:
            return
        tail: list[tuple[int, int, dict[str, Any]]] = []
        cached = 0
        for key, size, crc, raw in self._conn.execute(
                "SELECT ts, size, crc, entry FROM oplog ORDER BY ts DESC"):
            if tail and cached + size > self.cache_bytes:
                break
            tail.append((key, size, _entry(key, crc, raw)))
            cached += size
        tail.reverse()
        self._disk_count = count - len(tail)
        self._disk_bytes = total - cached
        self._disk_from = first
        for key, size, entry in tail:
            self._keys.append(key)
            self._entries.append(entry)
            self._sizes.append(size)
            self._bytes += size
            self._index(entry, self._base + len(self._entries) - 1)
        self.durable_through = last

    def load(self, entries: list[tuple[dict[str, Any], int]]) -> None:
        """Not used: a disk oplog loads itself (:meth:`load_from_disk`)."""
        raise TypeError("DiskOplog.load: use load_from_disk()")

    # -- sizes --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._disk_count + len(self._entries) - self._head

    @property
    def size_bytes(self) -> int:
        """Bytes of the retained entries, on disk and cached."""
        return self._disk_bytes + self._bytes

    @property
    def cached_bytes(self) -> int:
        """Bytes of the entries held in memory."""
        return self._bytes

    @property
    def cached_entries(self) -> int:
        """Number of entries held in memory."""
        return len(self._entries) - self._head

    def _cache_first(self) -> int:
        return self._keys[self._head] if len(self._keys) > self._head else 1 << 64

    def first_ts(self) -> Timestamp | None:
        """``ts`` of the oldest retained entry (on disk or cached), None when empty."""
        if self._disk_count:
            return ts_from_key(self._disk_head()[0])
        return super().first_ts()

    # -- reading ------------------------------------------------------------------------------
    def get(self, key: int) -> dict[str, Any] | None:
        """The entry whose ts_key is exactly ``key`` (from disk when older than the cache)."""
        if key >= self._cache_first() or not self._disk_count:
            return super().get(key)
        if key < self._disk_from:
            return None
        row = self._conn.execute("SELECT crc, entry FROM oplog WHERE ts = ?", (key,)).fetchone()
        self.disk_rows_read += row is not None
        return _entry(key, row[0], row[1]) if row is not None else None

    def scoped_batch(self, key: int, limit: int, *, ns: str | None = None,
                     db: str | None = None) -> tuple[Any, Any]:
        """As :meth:`shard.oplog.Oplog.scoped_batch`: the disk part first (read from SQLite in
        ts order, at most ``limit`` entries and about :data:`READ_BYTES`), then the cache. Unlike
        the in-memory oplog's, a batch may be shorter than ``limit`` while more entries follow
        (:attr:`short_reads`); it is empty only when the scope has no entry at or after ``key``."""
        first = self._cache_first()
        if key >= first or not self._disk_count:
            return super().scoped_batch(key, limit, ns=ns, db=db)
        keys, entries = self._read_disk(max(key, self._disk_from), first, limit, ns, db)
        if len(keys) < limit and not self._capped:
            more_keys, more = super().scoped_batch(first, limit - len(keys), ns=ns, db=db)
            keys.extend(more_keys)
            entries.extend(more)
        return keys, entries

    def _read_disk(self, lo: int, hi: int, limit: int, ns: str | None,
                   db: str | None) -> tuple[list[int], list[dict[str, Any]]]:
        """Entries with ``lo <= ts_key < hi`` in the scope (see ``scoped_batch``), at most
        ``limit``, from SQLite."""
        conn = self._conn
        if ns is None and db is None:
            rows: Any = conn.execute("SELECT ts, crc, entry FROM oplog WHERE ts >= ? AND ts < ? "
                                     "ORDER BY ts LIMIT ?", (lo, hi, limit))
        else:
            col, name = ("ns", ns) if ns is not None else ("db", db)
            cmds = [k for (k,) in conn.execute(
                "SELECT ts FROM oplog WHERE cmd = 1 AND ts >= ? AND ts < ? ORDER BY ts LIMIT ?",
                (lo, hi, limit))]
            if not cmds:
                rows = conn.execute(f"SELECT ts, crc, entry FROM oplog WHERE {col} = ? AND ts >= ? "
                                    f"AND ts < ? ORDER BY ts LIMIT ?", (name, lo, hi, limit))
            else:
                mine = [k for (k,) in conn.execute(
                    f"SELECT ts FROM oplog WHERE {col} = ? AND ts >= ? AND ts < ? "
                    f"ORDER BY ts LIMIT ?", (name, lo, hi, limit))]
                want = sorted(cmds + mine)[:limit]
                rows = itertools.chain.from_iterable(
                    conn.execute(f"SELECT ts, crc, entry FROM oplog WHERE ts IN "
                                 f"({','.join('?' * len(part))}) ORDER BY ts", part)
                    for part in (want[i:i + _IN_CHUNK] for i in range(0, len(want), _IN_CHUNK)))
        return self._decoded(rows)

    def _decoded(self, rows: Any) -> tuple[list[int], list[dict[str, Any]]]:
        """``(keys, entries)`` of ``(ts, crc, entry BLOB)`` rows (checksums verified), stopping
        after :data:`READ_BYTES` of BLOBs (at least one row; see :attr:`short_reads`)."""
        keys: list[int] = []
        entries: list[dict[str, Any]] = []
        total = 0
        self._capped = False
        for key, crc, raw in rows:
            keys.append(key)
            entries.append(_entry(key, crc, raw))
            total += len(raw)
            if total >= READ_BYTES:
                self._capped = True
                break
        self.disk_rows_read += len(keys)
        return keys, entries

    def scoped_entries_from(self, key: int, *, ns: str | None = None,
                            db: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
        """As :meth:`shard.oplog.Oplog.scoped_entries_from`, in batches of :meth:`scoped_batch`
        (live: it ends at the first empty batch)."""
        while True:
            keys, entries = self.scoped_batch(key, _BATCH, ns=ns, db=db)
            if not keys:
                return
            yield from zip(keys, entries)
            key = keys[-1] + 1

    def entries_from(self, key: int) -> Iterator[dict[str, Any]]:
        """Entries with ``ts_key >= key`` in ts order, read in batches (live)."""
        for _, entry in self.scoped_entries_from(key):
            yield entry

    def entries_reversed(self) -> Iterator[dict[str, Any]]:
        """Newest first from the newest entry at the time of the call: the cache, then the disk
        part in batches (lazy)."""
        hi = self.latest_key + 1
        while True:
            first = self._cache_first()
            if hi > first:  # cached entries below hi, newest first
                stop = self._head
                i = max(self._bisect(hi) - 1, stop - 1)
                if i < stop:
                    hi = first
                    continue
                hi = self._keys[i]
                yield self._entries[i]
                continue
            if not self._disk_count:
                return
            rows = self._conn.execute(
                "SELECT ts, crc, entry FROM oplog WHERE ts >= ? AND ts < ? "
                "ORDER BY ts DESC LIMIT ?",
                (self._disk_from, min(hi, first), _BATCH)).fetchall()
            if not rows:
                return
            self.disk_rows_read += len(rows)
            for key, crc, raw in rows:
                hi = key
                yield _entry(key, crc, raw)

    def _bisect(self, key: int) -> int:
        return bisect.bisect_left(self._keys, key, self._head)

    # -- the cache ----------------------------------------------------------------------------
    def mark_durable(self, key: int) -> None:
        """Entries up to ``key`` are committed to SQLite: the cache may now let them go."""
        if key > self.durable_through:
            self.durable_through = key
        if self._bytes > self.cache_bytes:
            self._evict()
            self._compact()

    def _evict(self) -> None:
        """Drop the oldest committed cached entries while the cache is over ``cache_bytes``
        (never the newest entry); they stay readable from disk."""
        head = self._head
        last = len(self._entries) - 1
        through = self.durable_through
        keys, sizes, entries = self._keys, self._sizes, self._entries
        while self._bytes > self.cache_bytes and head < last and keys[head] <= through:
            size = sizes[head]
            if not self._disk_count:
                self._disk_from = keys[head]
            entries[head] = None  # type: ignore[call-overload]
            self._bytes -= size
            self._disk_bytes += size
            self._disk_count += 1
            head += 1
        self._head = head

    # -- truncation ---------------------------------------------------------------------------
    def discard_after(self, key: int) -> int:
        """Remove the entries with ``ts_key > key`` (see :meth:`Oplog.discard_after`), also
        those only on disk: a rollback past the cache (:mod:`shard.replication.rollback`). The
        rows themselves are deleted by the caller's ``("discard_after", key)`` journal record
        (:meth:`shard.durable.DurableStore.commit`); the counters follow at once, and the newest
        remaining disk entry is read into the cache so :meth:`last_ts` stays right."""
        cache_first = self._cache_first()  # rows from here on were cached too
        count = super().discard_after(key)
        if len(self._entries) == self._head and self._disk_count:
            n, size = self._conn.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM oplog WHERE ts > ? AND ts >= ? "
                "AND ts < ?", (key, self._disk_from, cache_first)).fetchone()
            self._disk_count -= n
            self._disk_bytes -= size
            count += n
            self._window.clear()
            row = self._conn.execute(
                "SELECT ts, size, crc, entry FROM oplog WHERE ts <= ? AND ts >= ? "
                "ORDER BY ts DESC LIMIT 1", (key, self._disk_from)).fetchone()
            if row is not None:
                self._disk_count -= 1
                self._disk_bytes -= row[1]
                self._keys.append(row[0])
                self._entries.append(_entry(row[0], row[2], row[3]))
                self._sizes.append(row[1])
                self._bytes += row[1]
                self._index(self._entries[-1], self._base + len(self._entries) - 1)
        self.durable_through = min(self.durable_through, key)
        return count

    def _disk_head(self) -> tuple[int, int]:
        """``(ts_key, size)`` of the oldest disk-only entry (``_disk_count`` > 0)."""
        if not self._window:
            rows = self._conn.execute(
                "SELECT ts, size FROM oplog WHERE ts >= ? AND ts < ? ORDER BY ts LIMIT ?",
                (self._disk_from, self._cache_first(), _WINDOW)).fetchall()
            if not rows:  # the counters say otherwise: the file changed under us
                raise RuntimeError("durable oplog: disk entries missing")
            self._window.extend(rows)
        return self._window[0]

    def _drop_disk_head(self) -> None:
        key, size = self._window.popleft()
        self._disk_count -= 1
        self._disk_bytes -= size
        self._disk_from = key + 1

    def _drop_cache_head(self) -> None:
        head = self._head
        self._bytes -= self._sizes[head]
        self._entries[head] = None  # type: ignore[call-overload]
        self._head = head + 1

    def _enforce_retention(self) -> None:
        """Truncate from the oldest end (disk part first) as :class:`~shard.oplog.Oplog` does,
        then keep the cache within its size."""
        now = self._wall()
        removed_to = None
        while True:
            if self._disk_count:
                key, _ = self._disk_head()
            elif len(self._entries) - self._head > 1:  # never truncate the newest entry
                key = self._keys[self._head]
            else:
                break
            age = now - (key >> 32)
            too_old = self.max_age_s is not None and age > self.max_age_s
            too_big = self._disk_bytes + self._bytes > self.max_bytes and age >= self.min_retention_s
            if not (too_old or too_big):
                break
            if self._disk_count:
                self._drop_disk_head()
            else:
                self._drop_cache_head()
            removed_to = key
        if self._bytes > self.cache_bytes:
            self._evict()
        self._compact()
        if removed_to is not None:
            self._truncated(removed_to)

    def _truncated(self, key: int) -> None:
        self.truncated_through = key
        for cb in tuple(self.truncated_callbacks):
            cb(key)

    def truncate_before(self, key: int) -> int:
        """Remove every entry with ``ts_key < key`` (never the newest); returns how many."""
        count = 0
        removed_to = None
        if self._disk_count:
            hi = min(key, self._cache_first())
            n, size, newest = self._conn.execute(
                "SELECT count(*), coalesce(sum(size), 0), max(ts) FROM oplog "
                "WHERE ts >= ? AND ts < ?", (self._disk_from, hi)).fetchone()
            if n:
                self._window.clear()
                self._disk_count -= n
                self._disk_bytes -= size
                self._disk_from = newest + 1
                removed_to = newest
                count += n
        if not self._disk_count:
            while len(self._entries) - self._head > 1 and self._keys[self._head] < key:
                removed_to = self._keys[self._head]
                self._drop_cache_head()
                count += 1
        if removed_to is not None:
            self._truncated(removed_to)
        return count
