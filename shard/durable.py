"""Durable shard storage (``--dbpath DIR``): SQLite (stdlib ``sqlite3``) in WAL mode.

One file ``DIR/shard.sqlite`` holds six tables: ``catalog`` (collection UUID -> BSON catalog
record: name, options, shard key, index specs), ``docs`` (one row per document, BSON, in
insertion order so a reload keeps ``$natural`` order), ``oplog`` (ts_key -> BSON entry, with its
scope and size columns, see :mod:`shard.oplog_disk`), ``preimages``, ``sessions``
(retryable-write history, like ``config.transactions``) and ``meta`` (the commit counter).
Every row carries ``crc``, its CRC32C; start-up verifies them, runs ``quick_check`` and
compares the counter with ``DIR/shard.ack`` (:mod:`shard.durable_integrity`). The node keeps
the documents, catalog, pre-images and sessions in memory, and of the oplog only a bounded
cache of its newest entries (:class:`shard.oplog_disk.DiskOplog` reads older ones from the
table); it journals each mutation (:attr:`shard.storage.Storage.journal`);
:meth:`DurableStore.commit` writes a command's whole journal in ONE SQLite transaction before
the reply is sent, so an acknowledged write, its oplog entry and its pre-image are on disk
together or not at all; a commit that fails is taken back out of memory too
(:mod:`shard.durable_undo`).

``synchronous=NORMAL`` (default) in WAL mode writes every commit to the WAL file without fsync:
it survives ``kill -9`` of the process (the OS has the pages) but not a power loss;
``--sync full`` fsyncs each commit and survives both (slower). On start-up the store is loaded
back (the oplog's counters and newest entries only) and the clock restarts after the newest
oplog ``ts``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
from typing import Any

import bson

from shardsim.core.clock import ts_from_key, ts_key
from shardsim.core.errors import MongoError
from shardsim.core.node import CODEC
from shardsim.shard import durable_integrity as integrity
from shardsim.shard.oplog_disk import PUT_OPLOG, migrate as migrate_oplog, oplog_row
from shardsim.shard.storage import Collection, id_key

SCHEMA = """
CREATE TABLE IF NOT EXISTS catalog (uuid BLOB PRIMARY KEY, crc INTEGER, rec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS docs (seq INTEGER PRIMARY KEY AUTOINCREMENT, uuid BLOB NOT NULL,
                                 id BLOB NOT NULL, crc INTEGER, doc BLOB NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS docs_id ON docs (uuid, id);
CREATE TABLE IF NOT EXISTS sessions (sid BLOB PRIMARY KEY, crc INTEGER, rec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS preimages (ts INTEGER NOT NULL, uuid BLOB NOT NULL, idx INTEGER NOT NULL,
                                      crc INTEGER, doc BLOB NOT NULL, PRIMARY KEY (ts, uuid, idx));
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
"""
# Tables of a store written before row checksums get the column (NULL: not verified).
_CRC_TABLES = ("catalog", "docs", "sessions", "preimages")


class DurableWriteError(MongoError):
    """A commit that did not reach the disk (OutOfDiskSpace 14031, or UnknownError 8 with
    SQLite's code: :func:`shard.durable_integrity.storage_error`); SQLite rolled it back."""


def _key_bytes(key: Any) -> bytes:
    """A stable byte form of an :func:`shard.storage.id_key` (the docs table's ``id``)."""
    return repr(key).encode()


def _enc(doc: Any) -> bytes:
    return bson.encode(doc, codec_options=CODEC)


def _dec(raw: bytes) -> dict[str, Any]:
    return bson.decode(raw, CODEC)


_DEL_DOC = "DELETE FROM docs WHERE uuid=? AND id=?"
_PUT_DOC = ("INSERT INTO docs (uuid, id, crc, doc) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (uuid, id) DO UPDATE SET crc=excluded.crc, doc=excluded.doc")
_PUT_PRE = "INSERT OR REPLACE INTO preimages (ts, uuid, idx, crc, doc) VALUES (?, ?, ?, ?, ?)"
_PUT_CATALOG = "INSERT OR REPLACE INTO catalog (uuid, crc, rec) VALUES (?, ?, ?)"
_PUT_SESSION = "INSERT OR REPLACE INTO sessions (sid, crc, rec) VALUES (?, ?, ?)"
_PUT_COMMITS = "INSERT OR REPLACE INTO meta (k, v) VALUES ('commits', ?)"


class DurableStore:
    """The SQLite file of one shard. ``sync`` is ``"normal"`` or ``"full"``.

    Opening checks the store (:mod:`shard.durable_integrity`): SQLite's ``quick_check``, the
    acknowledged-commit marker; :meth:`load` verifies every row's checksum. Raises
    :class:`~shard.durable_integrity.StorageCorruption` (the shard refuses to start) or
    RuntimeError ``DBPathInUse``."""

    def __init__(self, dbpath: str, *, sync: str = "normal") -> None:
        os.makedirs(dbpath, exist_ok=True)
        # One process per dbpath, like mongod's mongod.lock (released by the OS on kill -9).
        self._lock = open(os.path.join(dbpath, "shard.lock"), "a+")
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise RuntimeError(f"DBPathInUse: Unable to lock the lock file: {dbpath}/shard.lock "
                               f"(Resource temporarily unavailable). Another shardsim shard "
                               f"process is already running in {dbpath}") from None
        self.path = os.path.join(dbpath, "shard.sqlite")
        self.marker = integrity.AckMarker(dbpath)
        try:
            self._open(sync)
        except sqlite3.DatabaseError as exc:  # "file is not a database", "malformed", ...
            self._lock.close()
            raise integrity.StorageCorruption(self.path, f"SQLite: {exc}") from None
        except BaseException:
            self._lock.close()
            raise

    def _open(self, sync: str) -> None:
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={'FULL' if sync == 'full' else 'NORMAL'}")
        self.conn.execute("PRAGMA wal_autocheckpoint=10000")
        integrity.quick_check(self.conn, self.path)
        # Checked before anything is written: a refused store stays as it was found.
        self.commits = self._scalar("SELECT v FROM meta WHERE k = 'commits'")
        self.newest_ts = self._scalar("SELECT max(ts) FROM oplog")
        integrity.check_acknowledged(self.marker, self.commits, self.newest_ts,
                                     self.path + "-wal")
        self.conn.executescript(SCHEMA)
        for table in _CRC_TABLES:
            if "crc" not in [r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")]:
                self.conn.execute(f"ALTER TABLE {table} ADD COLUMN crc INTEGER")
        migrate_oplog(self.conn)  # the oplog table (shard.oplog_disk), from the first layouts

    def _scalar(self, sql: str) -> int:
        """An integer the store may not have yet (a table of a newer layout): 0 then."""
        try:
            row = self.conn.execute(sql).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return 0
            raise
        return int(row[0] or 0) if row else 0

    # -- start-up -----------------------------------------------------------------------------
    def load(self, node: Any) -> None:
        """Fill ``node.storage``, ``node.oplog`` and ``node.pre_images``; advance the clock.
        Every row's checksum is verified (the whole oplog too, read once without keeping it):
        StorageCorruption on a mismatch or when SQLite finds the file damaged."""
        try:
            self._load(node)
        except sqlite3.DatabaseError as exc:
            raise integrity.StorageCorruption(self.path, f"SQLite: {exc}") from None

    def _load(self, node: Any) -> None:
        storage = node.storage
        colls: dict[bytes, Collection] = {}
        for uuid, crc, rec in self.conn.execute("SELECT uuid, crc, rec FROM catalog"):
            coll = self.collection_from(bytes(uuid), crc, rec)
            colls[coll.uuid] = coll
            storage.dbs.setdefault(coll.db, {})[coll.name] = coll
            storage.by_uuid[coll.uuid] = coll
            coll.recorder = storage.history
        for uuid, key, crc, raw in self.conn.execute(
                "SELECT uuid, id, crc, doc FROM docs ORDER BY seq"):
            self._check(crc, integrity.doc_crc(uuid, key, raw), "docs")
            coll = colls.get(bytes(uuid))
            if coll is not None:
                doc = _dec(raw)
                coll.docs[id_key(doc["_id"])] = doc
        for coll in colls.values():
            self._add_indexes(coll)
        integrity.verify_rows(self.conn.execute("SELECT crc, ts, entry FROM oplog"), self.path,
                              "oplog", integrity.oplog_crc)
        node.oplog.load_from_disk()  # only its newest entries (shard.oplog_disk.DiskOplog)
        for ts, uuid, idx, crc, raw in self.conn.execute(
                "SELECT ts, uuid, idx, crc, doc FROM preimages ORDER BY ts"):
            self._check(crc, integrity.preimage_crc(ts, uuid, idx, raw), "preimages")
            node.pre_images.put(bytes(uuid), ts_from_key(ts), idx, _dec(raw))
        for sid, crc, raw in self.conn.execute("SELECT sid, crc, rec FROM sessions"):
            self._check(crc, integrity.keyed_crc(sid, raw), "sessions")
            node.sessions.restore(_dec(raw))
        last = node.oplog.last_ts()
        if last is not None:
            node.clock.restore(last)

    def _check(self, stored: int | None, actual: int, table: str) -> None:
        if stored is not None and stored != actual:
            raise integrity.StorageCorruption(self.path, f"checksum mismatch in table {table}: "
                                                         f"the stored record is not what was "
                                                         f"written")

    def collection_from(self, uuid: bytes, crc: int | None, rec: bytes) -> Collection:
        """A :class:`Collection` (no documents yet) from its ``catalog`` row; the index specs
        wait in ``coll._specs`` for :meth:`_add_indexes`."""
        self._check(crc, integrity.keyed_crc(uuid, rec), "catalog")
        r = _dec(rec)
        coll = Collection(r["db"], r["name"], uuid, r.get("options") or {}, r.get("shardKey"))
        coll._specs = r.get("indexes") or []  # type: ignore[attr-defined]
        return coll

    @staticmethod
    def _add_indexes(coll: Collection) -> None:
        for spec in getattr(coll, "_specs", ()):
            if spec.get("name") != "_id_" and not spec.get("clustered"):
                coll.add_index(spec)
        coll.__dict__.pop("_specs", None)

    def reload_collection(self, uuid: bytes) -> Collection | None:
        """The collection ``uuid`` as the last commit left it (documents in ``$natural`` order,
        indexes), or None when it did not exist then (rolling back a failed commit:
        :mod:`shard.durable_undo`)."""
        row = self.conn.execute("SELECT crc, rec FROM catalog WHERE uuid = ?", (uuid,)).fetchone()
        if row is None:
            return None
        coll = self.collection_from(uuid, row[0], row[1])
        for (raw,) in self.conn.execute("SELECT doc FROM docs WHERE uuid = ? ORDER BY seq",
                                        (uuid,)):
            doc = _dec(raw)
            coll.docs[id_key(doc["_id"])] = doc
        self._add_indexes(coll)
        return coll

    def committed_doc(self, uuid: bytes, key: Any) -> dict[str, Any] | None:
        """The document at storage key ``key`` of collection ``uuid`` as last committed."""
        row = self.conn.execute("SELECT doc FROM docs WHERE uuid = ? AND id = ?",
                                (uuid, _key_bytes(key))).fetchone()
        return _dec(row[0]) if row is not None else None

    def committed_session(self, sid: bytes) -> dict[str, Any] | None:
        """The session record ``sid`` as last committed (:meth:`shard.sessions.Session.record`)."""
        row = self.conn.execute("SELECT rec FROM sessions WHERE sid = ?", (sid,)).fetchone()
        return _dec(row[0]) if row is not None else None

    # -- commits ------------------------------------------------------------------------------
    def commit(self, journal: list[tuple]) -> None:
        """Write one command's journal in a single transaction.

        Rows are batched per table with ``executemany``; the order of document operations is
        kept, and catalog changes / oplog truncation act as barriers (everything before them
        is written first). Every row carries its checksum; the transaction also counts the
        commit (table ``meta``), and once it committed the acknowledged-commit marker is
        written (:mod:`shard.durable_integrity`). A failure leaves nothing written (SQLite
        rolls the transaction back, itself on SQLITE_FULL/IOERR) and raises
        :class:`DurableWriteError`: OutOfDiskSpace 14031 when the disk is full, else
        UnknownError 8; the caller undoes the journal in memory (:mod:`shard.durable_undo`)."""
        try:
            newest = self._commit(journal)
        except MongoError:
            raise
        except sqlite3.Error as exc:
            err = integrity.storage_error(exc, self.path)
            raise DurableWriteError(err.code, err.errmsg) from None
        except Exception:  # an unencodable record (a bug upstream): never Python text in a reply
            raise DurableWriteError(8, "storage engine write failed: a record could not be "
                                       "encoded") from None
        self.commits += 1
        if newest or any(r[0] == "discard_after" for r in journal):
            self.newest_ts = newest
        try:
            self.marker.write(self.commits, self.newest_ts)
        except OSError as exc:  # the commit stands; a stale marker only weakens the check
            logging.getLogger("shardsim.shard").warning("acknowledged-commit marker: %s", exc)

    def _commit(self, journal: list[tuple]) -> int:
        """Write ``journal``; returns the newest oplog ts_key written (0: none; after a
        ``("discard_after", key)`` record, a rollback's truncation of the oplog and pre-images
        after ``key``, at most ``key``)."""
        cur = self.conn.cursor()
        docs: list[tuple[str, tuple]] = []
        oplog_rows: list[tuple] = []
        pre_rows: list[tuple] = []
        newest = 0

        def flush() -> None:
            i = 0
            while i < len(docs):
                sql = docs[i][0]
                j = i
                while j < len(docs) and docs[j][0] == sql:
                    j += 1
                cur.executemany(sql, [r for _, r in docs[i:j]])
                i = j
            docs.clear()
            if oplog_rows:
                cur.executemany(PUT_OPLOG, oplog_rows)
                oplog_rows.clear()
            if pre_rows:
                cur.executemany(_PUT_PRE, pre_rows)
                pre_rows.clear()

        cur.execute("BEGIN")
        try:
            for rec in journal:
                kind = rec[0]
                if kind == "doc":
                    _, uuid, key, doc = rec
                    kb = _key_bytes(key)
                    if doc is None:
                        docs.append((_DEL_DOC, (uuid, kb)))
                    else:
                        raw = _enc(doc)
                        docs.append((_PUT_DOC, (uuid, kb, integrity.doc_crc(uuid, kb, raw), raw)))
                elif kind == "oplog":  # ("oplog", entry[, size the oplog accounts for it])
                    entry = rec[1]
                    row = oplog_row(entry, _enc(entry), rec[2] if len(rec) > 2 else None)
                    oplog_rows.append(row)
                    newest = row[0]
                elif kind == "preimage":
                    _, uuid, ts, idx, doc = rec
                    key, raw = ts_key(ts), _enc(doc)
                    pre_rows.append((key, uuid, idx, integrity.preimage_crc(key, uuid, idx, raw),
                                     raw))
                elif kind == "catalog":
                    flush()
                    _, uuid, coll = rec
                    if coll is None:
                        cur.execute("DELETE FROM catalog WHERE uuid=?", (uuid,))
                        cur.execute("DELETE FROM docs WHERE uuid=?", (uuid,))
                    else:
                        raw = _enc(coll.catalog_doc())
                        cur.execute(_PUT_CATALOG, (uuid, integrity.keyed_crc(uuid, raw), raw))
                elif kind == "session":
                    _, sid, sess = rec
                    raw = _enc(sess.record())
                    cur.execute(_PUT_SESSION, (sid, integrity.keyed_crc(sid, raw), raw))
                elif kind == "truncate":
                    flush()
                    cur.execute("DELETE FROM oplog WHERE ts <= ?", (rec[1],))
                    cur.execute("DELETE FROM preimages WHERE ts <= ?", (rec[1],))
                elif kind == "discard_after":  # a rollback (shard.replication.rollback)
                    flush()
                    cur.execute("DELETE FROM oplog WHERE ts > ?", (rec[1],))
                    cur.execute("DELETE FROM preimages WHERE ts > ?", (rec[1],))
                    newest = rec[1]
            flush()
            cur.execute(_PUT_COMMITS, (self.commits + 1,))
            cur.execute("COMMIT")
        except BaseException:
            # SQLite has already rolled back on SQLITE_FULL / IOERR / NOMEM: a second ROLLBACK
            # would fail with "cannot rollback - no transaction is active" (and hide the cause)
            if self.conn.in_transaction:
                cur.execute("ROLLBACK")
            raise
        return newest

    def crash(self) -> None:
        """Let go of the file as a process killed with ``kill -9`` does: the connection and the
        dbpath lock are released, no checkpoint is written (the WAL is replayed when the store
        is opened again, as SQLite recovers after a crash)."""
        try:
            self.conn.close()
        finally:
            self._lock.close()

    def close(self) -> None:
        try:
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self.conn.close()
            self.marker.close()
            self._lock.close()
