"""A durable shard's failed commit is taken back in memory (``shard.durable_undo``): catalog
changes, documents in ``$natural`` order, unique indexes, oplog entries, transactions, and the
writes of another command that was waiting mid-way; the errors are MongoDB errors."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from shardsim.core.commands import ConnectionInfo, Request
from shardsim.shard import durable
from shardsim.shard.commands import crud
from shardsim.shard.node import ShardNode
from shardsim.shard.storage import WRITE_SCOPE, WriteScope


def _req(name: str, db: str, body: dict[str, Any]) -> Request:
    return Request(name=name, db=db, body={name: body.pop(name), **body, "$db": db},
                   conn=ConnectionInfo(id=7, peer="127.0.0.1:1234"))


def _fail_commits(monkeypatch, code: int = 13, name: str = "SQLITE_FULL",
                  msg: str = "database or disk is full") -> None:
    def failing(self, journal):
        exc = sqlite3.OperationalError(msg)
        exc.sqlite_errorcode, exc.sqlite_errorname = code, name
        raise exc
    monkeypatch.setattr(durable.DurableStore, "_commit", failing)


def _state(node: ShardNode) -> Any:
    colls = {}
    for coll in node.storage.collections():
        colls[coll.ns] = (coll.uuid, list(coll.docs.items()), sorted(coll.indexes),
                          dict(coll.options))
    entries = [e["ts"] for e in node.oplog.entries_from(0)]
    return colls, entries, len(node.pre_images)


@pytest.fixture
def node(tmp_path):
    n = ShardNode(shard_name="s", options={"dbpath": str(tmp_path / "db"),
                                           "noop_interval_ms": 600000})
    yield n
    n.durable.close()


def test_failed_ddl_and_writes_leave_memory_as_committed(node, monkeypatch):
    async def main() -> None:
        run = node.run_command
        await run(_req("insert", "a", {"insert": "x", "documents": [
            {"_id": i, "k": i} for i in range(6)]}))
        await run(_req("createIndexes", "a", {"createIndexes": "x", "indexes": [
            {"key": {"k": 1}, "name": "k_1", "unique": True}]}))
        await run(_req("insert", "a", {"insert": "target", "documents": [{"_id": "t"}]}))
        before = _state(node)
        with monkeypatch.context() as m:
            _fail_commits(m)
            for name, db, body in [
                    ("delete", "a", {"delete": "x", "deletes": [{"q": {"k": {"$lt": 3}},
                                                                  "limit": 0}]}),
                    ("update", "a", {"update": "x", "updates": [{"q": {"_id": 4},
                                                                  "u": {"$set": {"k": 40}}}]}),
                    ("renameCollection", "admin", {"renameCollection": "a.x", "to": "a.target",
                                                   "dropTarget": True}),
                    ("drop", "a", {"drop": "x"}),
                    ("dropIndexes", "a", {"dropIndexes": "x", "index": "k_1"}),
                    ("collMod", "a", {"collMod": "x", "validator": {"k": {"$type": "int"}}}),
                    ("create", "a", {"create": "new"}),
                    ("dropDatabase", "a", {"dropDatabase": 1})]:
                reply = await run(_req(name, db, body))
                assert reply["code"] == 14031 and reply["codeName"] == "OutOfDiskSpace", reply
                assert _state(node) == before, name
        # The unique index still refuses duplicates and allows what the rollback freed.
        dup = await run(_req("insert", "a", {"insert": "x", "documents": [{"_id": 9, "k": 1}]}))
        assert dup["writeErrors"][0]["code"] == 11000
        ok = await run(_req("update", "a", {"update": "x", "updates": [
            {"q": {"_id": 4}, "u": {"$set": {"k": 40}}}]}))
        assert ok["nModified"] == 1

    asyncio.run(main())


def test_other_errors_are_unknown_error_with_sqlite_s_reason(node, monkeypatch):
    async def main() -> None:
        _fail_commits(monkeypatch, 778, "SQLITE_IOERR_WRITE", "disk I/O error")
        reply = await node.run_command(_req("insert", "a", {"insert": "x",
                                                             "documents": [{"_id": 1}]}))
        assert reply["ok"] == 0 and reply["code"] == 8 and reply["codeName"] == "UnknownError"
        assert reply["errmsg"].startswith("778: disk I/O error (SQLITE_IOERR_WRITE): ")
        assert node.storage.get("a", "x") is None and node.oplog.latest_key == 0

    asyncio.run(main())


def test_a_waiting_command_whose_writes_were_taken_back_gets_the_error(node, monkeypatch):
    async def main() -> None:
        await node.run_command(_req("insert", "a", {"insert": "x", "documents": [{"_id": 0}]}))
        # Command A wrote (journaled, not committed yet) and is waiting mid-way ...
        scope_a = WriteScope()
        node._scopes.add(scope_a)
        token = WRITE_SCOPE.set(scope_a)
        node.command_depth += 1  # inside a command: its end commits
        await crud.insert(node, _req("insert", "a", {"insert": "x", "documents": [{"_id": 1}]}))
        node.command_depth -= 1
        WRITE_SCOPE.reset(token)
        assert scope_a.wrote
        # ... when command B's commit (which carries A's records too) fails.
        with monkeypatch.context() as m:
            _fail_commits(m)
            reply = await node.run_command(_req("insert", "a", {"insert": "x",
                                                                 "documents": [{"_id": 2}]}))
        assert reply["code"] == 14031
        assert scope_a.lost is not None and scope_a.lost.code == 14031
        assert [d["_id"] for d in node.storage.get("a", "x").docs.values()] == [0]
        node._scopes.discard(scope_a)
        # A read that journaled nothing keeps its reply while commits fail.
        with monkeypatch.context() as m:
            _fail_commits(m)
            count = await node.run_command(_req("count", "a", {"count": "x"}))
        assert count["n"] == 1

    asyncio.run(main())


def test_a_failed_transaction_commit_is_aborted(node, monkeypatch):
    from bson import Binary
    from bson.int64 import Int64
    lsid = {"id": Binary(b"\x01" * 16, 4)}

    def stmt(name, body, **extra):
        return _req(name, "a" if name != "commitTransaction" else "admin",
                    {name: body.pop(name), **body, "lsid": lsid, "txnNumber": Int64(1),
                     "autocommit": False, **extra})

    async def main() -> None:
        await node.run_command(_req("insert", "a", {"insert": "x", "documents": [{"_id": 0}]}))
        reply = await node.run_command(stmt("insert", {"insert": "x", "documents": [{"_id": 1}]},
                                            startTransaction=True))
        assert reply["n"] == 1
        with monkeypatch.context() as m:
            _fail_commits(m)
            reply = await node.run_command(stmt("commitTransaction", {"commitTransaction": 1}))
        assert reply["code"] == 14031
        assert [d["_id"] for d in node.storage.get("a", "x").docs.values()] == [0]
        assert not [e for e in node.oplog.entries_from(0) if "applyOps" in e.get("o", {})]
        retry = await node.run_command(stmt("commitTransaction", {"commitTransaction": 1}))
        assert retry["ok"] == 0 and retry["code"] == 251  # NoSuchTransaction: it was aborted

    asyncio.run(main())


def test_a_store_of_the_previous_layout_opens_and_is_checked_from_then_on(tmp_path):
    """A store without checksum columns, counter or marker (written before them) loads; new
    rows get checksums, and from its first commit on the marker guards the WAL."""
    import bson
    from bson import Binary
    from shardsim.shard.durable_integrity import AckMarker
    dbpath = tmp_path / "old"
    dbpath.mkdir()
    c = sqlite3.connect(dbpath / "shard.sqlite", isolation_level=None)
    c.executescript("""
        CREATE TABLE catalog (uuid BLOB PRIMARY KEY, rec BLOB NOT NULL);
        CREATE TABLE docs (seq INTEGER PRIMARY KEY AUTOINCREMENT, uuid BLOB NOT NULL,
                           id BLOB NOT NULL, doc BLOB NOT NULL);
        CREATE UNIQUE INDEX docs_id ON docs (uuid, id);
        CREATE TABLE sessions (sid BLOB PRIMARY KEY, rec BLOB NOT NULL);
        CREATE TABLE preimages (ts INTEGER NOT NULL, uuid BLOB NOT NULL, idx INTEGER NOT NULL,
                                doc BLOB NOT NULL, PRIMARY KEY (ts, uuid, idx));
        CREATE TABLE oplog (ts INTEGER PRIMARY KEY, cmd INTEGER NOT NULL, ns TEXT, db TEXT,
                            size INTEGER NOT NULL, entry BLOB NOT NULL);""")
    uuid = b"\x02" * 16
    c.execute("INSERT INTO catalog VALUES (?, ?)", (uuid, bson.encode(
        {"db": "a", "name": "x", "uuid": Binary(uuid, 4), "options": {}, "shardKey": None,
         "indexes": [{"v": 2, "key": {"_id": 1}, "name": "_id_"}]})))
    c.execute("INSERT INTO docs (uuid, id, doc) VALUES (?, ?, ?)",
              (uuid, repr(("n", 1)).encode(), bson.encode({"_id": 1})))
    c.close()
    node = ShardNode(shard_name="s", options={"dbpath": str(dbpath), "noop_interval_ms": 600000})
    try:
        assert [d["_id"] for d in node.storage.get("a", "x").docs.values()] == [1]
        asyncio.run(node.run_command(_req("insert", "a", {"insert": "x",
                                                           "documents": [{"_id": 2}]})))
        assert AckMarker(str(dbpath)).read()[0] == node.durable.commits >= 1
        rows = node.durable.conn.execute("SELECT crc FROM docs ORDER BY seq").fetchall()
        assert rows[0][0] is None and rows[1][0] is not None
    finally:
        node.durable.close()


def _index_keys_match_the_documents(coll: Any) -> None:
    """Every sorted index of ``coll`` (issue 29) holds exactly the keys of its documents."""
    for idx in coll.indexes.values():
        if idx.sorted is None:
            continue
        want = sorted((kb, coll.docs.rids[k], k) for k, d in coll.docs.items()
                      for kb in idx.sorted.keys_of(d))
        assert list(idx.sorted.entries) == want, idx.name


def test_index_keys_follow_the_undo_of_a_failed_commit_and_a_reload(tmp_path, monkeypatch):
    path = str(tmp_path / "db")

    async def main() -> None:
        n = ShardNode(shard_name="s", options={"dbpath": path, "noop_interval_ms": 600000})
        run = n.run_command
        await run(_req("insert", "a", {"insert": "x", "documents": [
            {"_id": i, "k": i % 3, "m": [i, -i]} for i in range(9)]}))
        await run(_req("createIndexes", "a", {"createIndexes": "x", "indexes": [
            {"key": {"k": 1}, "name": "k_1"}, {"key": {"m": -1, "k": 1}, "name": "mk"}]}))
        with monkeypatch.context() as m:
            _fail_commits(m)
            for name, body in [
                    ("delete", {"delete": "x", "deletes": [{"q": {"k": 1}, "limit": 0}]}),
                    ("update", {"update": "x", "updates": [{"q": {"k": 2}, "multi": True,
                                                            "u": {"$set": {"k": 7}}}]}),
                    ("insert", {"insert": "x", "documents": [{"_id": 50, "k": 1}]})]:
                reply = await run(_req(name, "a", body))
                assert reply["code"] == 14031, reply
                _index_keys_match_the_documents(n.storage.get("a", "x"))
        reply = await run(_req("find", "a", {"find": "x", "filter": {"k": 1}}))
        assert [d["_id"] for d in reply["cursor"]["firstBatch"]] == [1, 4, 7]
        await run(_req("update", "a", {"update": "x", "updates": [
            {"q": {"k": 2}, "u": {"$set": {"k": 5}}, "multi": True}]}))
        n.durable.close()
        again = ShardNode(shard_name="s", options={"dbpath": path, "noop_interval_ms": 600000})
        coll = again.storage.get("a", "x")
        _index_keys_match_the_documents(coll)
        assert sum(1 for _ in coll.indexes["k_1"].sorted.scan(b"", None)) == 9
        reply = await again.run_command(_req("find", "a", {"find": "x", "filter": {"k": 5}}))
        assert [d["_id"] for d in reply["cursor"]["firstBatch"]] == [2, 5, 8]
        again.durable.close()

    asyncio.run(main())
