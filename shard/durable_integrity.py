"""Integrity of a durable shard's store (``--dbpath``): checksums, start-up checks, the
acknowledged-commit marker, and the storage errors a failed commit answers with.

WiredTiger checksums every block and log record and refuses to start on a mismatch
(``__wt_block_read_off``: "read checksum error", then ``WT_TRY_SALVAGE`` / ``WT_PANIC`` and
mongod's fatal assertion). SQLite checks much less: a WAL frame whose checksum fails is not an
error, SQLite silently ignores that frame **and every frame after it** (the WAL's checksums are
cumulative), so a shard would start on older data, or none, without a word; and a changed byte
inside a row's BLOB in the main file is served as it is. shardsim adds three checks:

* **Row checksums**: every row the store writes carries ``crc`` = CRC32C of its key columns and
  its BSON (:func:`row_crc`); start-up verifies every row (documents, catalog, sessions,
  pre-images and the whole oplog) and a disk read of an older oplog entry verifies it again
  (DataCorruptionDetected 301 at run time). Rows written before this column existed have
  ``crc`` NULL and are not verified.
* **SQLite's own check**: ``PRAGMA quick_check`` at start-up (page and b-tree structure of the
  main file and the valid part of the WAL).
* **The acknowledged-commit marker** (:class:`AckMarker`, ``DIR/shard.ack``): every commit
  increments a counter stored in the same SQLite transaction (table ``meta``) and, once the
  commit returned, writes the counter and the newest oplog ``ts`` to this small file outside
  SQLite. At start-up a store whose counter is behind the marker lost acknowledged commits
  (a dropped or damaged WAL frame, a deleted WAL) and the shard refuses to start. The marker is
  written after the commit, so it never runs ahead of what SQLite acknowledged; a kill between
  the two leaves the store one commit ahead, which is fine.

On any of these the shard refuses to start: :class:`StorageCorruption`, printed as one line
on stderr by ``python -m shardsim.shard`` / ``python -m shardsim.configsvr``, exit code 14 (mongod's
``ExitCode::abrupt``, what its fatal assertions exit with).
"""

from __future__ import annotations

import os
import sqlite3
import struct
from typing import Any, Iterable

import crc32c

from shardsim.core.errors import MongoError

#: exit code of a refused start-up on corruption (mongod: ExitCode::abrupt of fassert)
EXIT_CORRUPTION = 14
SQLITE_FULL = 13
MARKER_NAME = "shard.ack"
_MARKER = struct.Struct("<4sIQQ")  # magic, version, commits, newest oplog ts_key
_MAGIC = b"SSAK"
_Q = struct.Struct("<q")
_QQ = struct.Struct("<qq")


class StorageCorruption(RuntimeError):
    """The store is damaged or lost acknowledged data: the shard must not start. The message is
    one line: ``DataCorruptionDetected: <file>: <what is wrong>; ...``."""

    def __init__(self, path: str, what: str) -> None:
        what = " ".join(str(what).split())  # one line, whatever SQLite said
        super().__init__(f"DataCorruptionDetected: {path}: {what}; refusing to start (restore "
                         f"the dbpath from a backup, or move it away to start empty)")
        self.path = path


def row_crc(*parts: Any) -> int:
    """CRC32C (unsigned 32 bits) of ``parts`` in order: ``bytes`` as they are, ``int`` as 8
    little-endian bytes."""
    value = 0
    for p in parts:
        value = crc32c.crc32c(_Q.pack(p) if isinstance(p, int) else p, value)
    return value


def doc_crc(uuid: bytes, key: bytes, raw: bytes) -> int:
    """The ``docs`` row checksum (collection UUID, id key, BSON)."""
    return crc32c.crc32c(raw, crc32c.crc32c(key, crc32c.crc32c(uuid)))


def oplog_crc(ts: int, raw: bytes) -> int:
    """The ``oplog`` row checksum (ts_key, BSON entry)."""
    return crc32c.crc32c(raw, crc32c.crc32c(_Q.pack(ts)))


def preimage_crc(ts: int, uuid: bytes, idx: int, raw: bytes) -> int:
    """The ``preimages`` row checksum (ts_key, collection UUID, applyOps index, BSON)."""
    return crc32c.crc32c(raw, crc32c.crc32c(uuid, crc32c.crc32c(_QQ.pack(ts, idx))))


def keyed_crc(key: bytes, raw: bytes) -> int:
    """The ``catalog`` / ``sessions`` row checksum (UUID or session id, BSON record)."""
    return crc32c.crc32c(raw, crc32c.crc32c(key))


def oplog_corrupt(path: str, ts: int) -> MongoError:
    """DataCorruptionDetected (301) for an oplog row read at run time whose checksum fails."""
    return MongoError(301, f"{path}: checksum mismatch in the oplog entry at ts_key {ts}: the "
                           f"stored entry is not what was written")


def storage_error(exc: sqlite3.Error, path: str) -> MongoError:
    """The MongoDB error of a commit SQLite refused: OutOfDiskSpace (14031) for SQLITE_FULL (the
    errmsg names the file, like mongod's ``File::write`` of a spill file, ``sorter_file.cpp``),
    else UnknownError (8) with SQLite's code and message, as ``wtRCToStatus_slow``
    (``wiredtiger_error_util.cpp``) turns an engine code it does not map."""
    code = getattr(exc, "sqlite_errorcode", None)
    name = getattr(exc, "sqlite_errorname", None) or "SQLITE_ERROR"
    if code is not None and code & 0xFF == SQLITE_FULL:
        return MongoError(14031, f"No space left on device: {path} (SQLite: {exc})")
    return MongoError(8, f"{code if code is not None else 1}: {exc} ({name}): {path}")


def quick_check(conn: sqlite3.Connection, path: str) -> None:
    """``PRAGMA quick_check``; StorageCorruption with SQLite's first complaint unless "ok"."""
    rows = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
    if rows != ["ok"]:
        raise StorageCorruption(path, f"SQLite integrity check failed: {'; '.join(rows)}")


def verify_rows(rows: Iterable[tuple], path: str, table: str, crc_of: Any) -> None:
    """Check ``(crc, *columns)`` rows with ``crc_of(*columns)``; NULL crc = a row written before
    checksums (not checked). StorageCorruption on the first mismatch."""
    for row in rows:
        stored = row[0]
        if stored is not None and stored != crc_of(*row[1:]):
            raise StorageCorruption(path, f"checksum mismatch in table {table}: the stored "
                                          f"record is not what was written")


class AckMarker:
    """``DIR/shard.ack``: the number of commits the store acknowledged and the newest oplog
    ts_key then (see the module docstring). ``read()`` -> ``(commits, ts)`` or None when the
    file does not exist yet; StorageCorruption when it is unreadable."""

    def __init__(self, dbpath: str) -> None:
        self.path = os.path.join(dbpath, MARKER_NAME)
        self._fd: int | None = None

    def read(self) -> tuple[int, int] | None:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        size = _MARKER.size
        if len(raw) != size + 4 or crc32c.crc32c(raw[:size]) != struct.unpack("<I", raw[size:])[0]:
            raise StorageCorruption(self.path, "the acknowledged-commit marker is damaged")
        magic, version, commits, ts = _MARKER.unpack(raw[:size])
        if magic != _MAGIC or version != 1:
            raise StorageCorruption(self.path, "not a shardsim acknowledged-commit marker")
        return commits, ts

    def write(self, commits: int, ts: int) -> None:
        """Record ``commits`` acknowledged commits (one ``pwrite``, no fsync: see the module
        docstring)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        body = _MARKER.pack(_MAGIC, 1, commits, ts)
        os.pwrite(self._fd, body + struct.pack("<I", crc32c.crc32c(body)), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def check_acknowledged(marker: AckMarker, commits: int, newest_ts: int, wal_path: str) -> None:
    """StorageCorruption when the store holds fewer commits than the marker says were
    acknowledged (``commits``: the store's counter; ``newest_ts``: its newest oplog ts_key)."""
    acked = marker.read()
    if acked is None or acked[0] <= commits:
        return
    missing = acked[0] - commits
    raise StorageCorruption(
        wal_path, f"{missing} acknowledged commit(s) are missing: the store ends at commit "
                  f"{commits} (newest oplog ts_key {newest_ts}) but {marker.path} records "
                  f"commit {acked[0]} (oplog ts_key {acked[1]}); the write-ahead log lost "
                  f"frames (SQLite ignores a frame whose checksum fails and every frame after "
                  f"it)")
