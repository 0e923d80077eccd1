"""Durable shard storage (``--dbpath DIR``): SQLite (stdlib ``sqlite3``) in WAL mode.

One file ``DIR/shard.sqlite`` holds five tables: ``catalog`` (collection UUID -> BSON catalog
record: name, options, shard key, index specs), ``docs`` (one row per document, BSON, in
insertion order so a reload keeps ``$natural`` order), ``oplog`` (ts_key -> BSON entry, with its
scope and size columns, see :mod:`shard.oplog_disk`), ``preimages`` and ``sessions``
(retryable-write history, like ``config.transactions``). The node keeps the documents, catalog,
pre-images and sessions in memory, and of the oplog only a bounded cache of its newest entries
(:class:`shard.oplog_disk.DiskOplog` reads older ones from the table); it journals each mutation
(:attr:`shard.storage.Storage.journal`); :meth:`DurableStore.commit` writes a command's whole
journal in ONE SQLite transaction before the reply is sent, so an acknowledged write, its oplog
entry and its pre-image are on disk together or not at all.

``synchronous=NORMAL`` (default) in WAL mode writes every commit to the WAL file without fsync:
it survives ``kill -9`` of the process (the OS has the pages) but not a power loss;
``--sync full`` fsyncs each commit and survives both (slower). On start-up the store is loaded
back (the oplog's counters and newest entries only) and the clock restarts after the newest
oplog ``ts``.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from typing import Any

import bson

from shardsim.core.clock import ts_from_key, ts_key
from shardsim.core.errors import MongoError
from shardsim.core.node import CODEC
from shardsim.shard.oplog_disk import PUT_OPLOG, migrate as migrate_oplog, oplog_row
from shardsim.shard.storage import Collection, id_key

SCHEMA = """
CREATE TABLE IF NOT EXISTS catalog (uuid BLOB PRIMARY KEY, rec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS docs (seq INTEGER PRIMARY KEY AUTOINCREMENT, uuid BLOB NOT NULL,
                                 id BLOB NOT NULL, doc BLOB NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS docs_id ON docs (uuid, id);
CREATE TABLE IF NOT EXISTS sessions (sid BLOB PRIMARY KEY, rec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS preimages (ts INTEGER NOT NULL, uuid BLOB NOT NULL, idx INTEGER NOT NULL,
                                      doc BLOB NOT NULL, PRIMARY KEY (ts, uuid, idx));
"""


class DurableWriteError(MongoError):
    """A commit that did not reach the disk (code 14031 or 8); nothing of it was written."""


def _key_bytes(key: Any) -> bytes:
    """A stable byte form of an :func:`shard.storage.id_key` (the docs table's ``id``)."""
    return repr(key).encode()


def _enc(doc: Any) -> bytes:
    return bson.encode(doc, codec_options=CODEC)


def _dec(raw: bytes) -> dict[str, Any]:
    return bson.decode(raw, CODEC)


_DEL_DOC = "DELETE FROM docs WHERE uuid=? AND id=?"
_PUT_DOC = ("INSERT INTO docs (uuid, id, doc) VALUES (?, ?, ?) "
            "ON CONFLICT (uuid, id) DO UPDATE SET doc=excluded.doc")
_PUT_PRE = "INSERT OR REPLACE INTO preimages (ts, uuid, idx, doc) VALUES (?, ?, ?, ?)"


class DurableStore:
    """The SQLite file of one shard. ``sync`` is ``"normal"`` or ``"full"``."""

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
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={'FULL' if sync == 'full' else 'NORMAL'}")
        self.conn.execute("PRAGMA wal_autocheckpoint=10000")
        self.conn.executescript(SCHEMA)
        migrate_oplog(self.conn)  # the oplog table (shard.oplog_disk), from the first layout

    # -- start-up -----------------------------------------------------------------------------
    def load(self, node: Any) -> None:
        """Fill ``node.storage``, ``node.oplog`` and ``node.pre_images``; advance the clock."""
        storage = node.storage
        colls: dict[bytes, Collection] = {}
        specs: dict[bytes, list[dict[str, Any]]] = {}
        for uuid, rec in self.conn.execute("SELECT uuid, rec FROM catalog"):
            r = _dec(rec)
            coll = Collection(r["db"], r["name"], bytes(uuid), r.get("options") or {},
                              r.get("shardKey"))
            colls[bytes(uuid)] = coll
            specs[bytes(uuid)] = r.get("indexes") or []
            storage.dbs.setdefault(coll.db, {})[coll.name] = coll
            storage.by_uuid[coll.uuid] = coll
            coll.recorder = storage.history
        for uuid, raw in self.conn.execute("SELECT uuid, doc FROM docs ORDER BY seq"):
            coll = colls.get(bytes(uuid))
            if coll is not None:
                doc = _dec(raw)
                coll.docs[id_key(doc["_id"])] = doc
        for uuid, coll in colls.items():
            for spec in specs[uuid]:
                if spec.get("name") != "_id_" and not spec.get("clustered"):
                    coll.add_index(spec)
        node.oplog.load_from_disk()  # only its newest entries (shard.oplog_disk.DiskOplog)
        for ts, uuid, idx, raw in self.conn.execute(
                "SELECT ts, uuid, idx, doc FROM preimages ORDER BY ts"):
            node.pre_images.put(bytes(uuid), ts_from_key(ts), idx, _dec(raw))
        for (raw,) in self.conn.execute("SELECT rec FROM sessions"):
            node.sessions.restore(_dec(raw))
        last = node.oplog.last_ts()
        if last is not None:
            node.clock.restore(last)

    # -- commits ------------------------------------------------------------------------------
    def commit(self, journal: list[tuple]) -> None:
        """Write one command's journal in a single transaction.

        Rows are batched per table with ``executemany``; the order of document operations is
        kept, and catalog changes / oplog truncation act as barriers (everything before them
        is written first). A failure rolls the transaction back and raises
        :class:`DurableWriteError` (OutOfDiskSpace 14031 when the disk is full, else UnknownError
        8, as ``wtRCToStatus`` maps storage-engine errors); the caller keeps the journal."""
        try:
            self._commit(journal)
        except MongoError:
            raise
        except sqlite3.Error as exc:
            msg = str(exc)
            code = 14031 if "full" in msg else 8
            raise DurableWriteError(code, f"storage engine write failed: {msg}") from None
        except Exception:  # an unencodable record (a bug upstream): never Python text in a reply
            raise DurableWriteError(8, "storage engine write failed: a record could not be "
                                       "encoded") from None

    def _commit(self, journal: list[tuple]) -> None:
        cur = self.conn.cursor()
        docs: list[tuple[str, tuple]] = []
        oplog_rows: list[tuple] = []
        pre_rows: list[tuple] = []

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
                    if doc is None:
                        docs.append((_DEL_DOC, (uuid, _key_bytes(key))))
                    else:
                        docs.append((_PUT_DOC, (uuid, _key_bytes(key), _enc(doc))))
                elif kind == "oplog":  # ("oplog", entry[, size the oplog accounts for it])
                    entry = rec[1]
                    oplog_rows.append(oplog_row(entry, _enc(entry), rec[2] if len(rec) > 2 else None))
                elif kind == "preimage":
                    _, uuid, ts, idx, doc = rec
                    pre_rows.append((ts_key(ts), uuid, idx, _enc(doc)))
                elif kind == "catalog":
                    flush()
                    _, uuid, coll = rec
                    if coll is None:
                        cur.execute("DELETE FROM catalog WHERE uuid=?", (uuid,))
                        cur.execute("DELETE FROM docs WHERE uuid=?", (uuid,))
                    else:
                        cur.execute("INSERT OR REPLACE INTO catalog (uuid, rec) VALUES (?, ?)",
                                    (uuid, _enc(coll.catalog_doc())))
                elif kind == "session":
                    _, sid, sess = rec
                    cur.execute("INSERT OR REPLACE INTO sessions (sid, rec) VALUES (?, ?)",
                                (sid, _enc(sess.record())))
                elif kind == "truncate":
                    flush()
                    cur.execute("DELETE FROM oplog WHERE ts <= ?", (rec[1],))
                    cur.execute("DELETE FROM preimages WHERE ts <= ?", (rec[1],))
            flush()
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

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
            self._lock.close()
