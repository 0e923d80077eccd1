"""Shard and common command handlers called directly, as module-level functions, on an
in-process node (no sockets, no dispatch)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shardsim.core import node_commands
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError
from shardsim.core.node import Node
from shardsim.shard.commands import catalog, crud, reads, transactions
from shardsim.shard.node import ShardNode


def _req(name: str, db: str, body: dict[str, Any]) -> Request:
    return Request(name=name, db=db, body={name: body.pop(name), **body, "$db": db},
                   conn=ConnectionInfo(id=7, peer="127.0.0.1:1234"))


def test_crud_and_reads_handlers_alone():
    node = ShardNode(shard_name="direct")

    async def main() -> None:
        reply = await crud.insert(node, _req("insert", "db", {
            "insert": "c", "documents": [{"_id": 1, "a": 1}, {"_id": 2, "a": 2}]}))
        assert reply == {"n": 2}
        # one create entry for the implicit collection, then one insert entry per document
        ops = [(e["op"], e["ns"]) for e in node.oplog.entries_from(0)]
        assert ops == [("c", "db.$cmd"), ("i", "db.c"), ("i", "db.c")]
        reply = await crud.update(node, _req("update", "db", {
            "update": "c", "updates": [{"q": {"_id": 2}, "u": {"$set": {"a": 5}}}]}))
        assert reply == {"n": 1, "nModified": 1}
        assert await reads.count(node, _req("count", "db", {"count": "c", "query": {"a": 5}})) \
            == {"n": 1}
        dup = await crud.insert(node, _req("insert", "db", {"insert": "c",
                                                              "documents": [{"_id": 1}]}))
        assert dup["n"] == 0 and dup["writeErrors"][0]["code"] == 11000
        listed = await catalog.list_collections(node, _req("listCollections", "db",
                                                           {"listCollections": 1}))
        assert [c["name"] for c in listed["cursor"]["firstBatch"]] == ["c"]

    asyncio.run(main())


def test_transaction_handlers_alone_and_the_shard_overrides_common_session_commands():
    node = ShardNode(shard_name="direct")
    with pytest.raises(MongoError) as exc:
        asyncio.run(transactions.commit_transaction(node, _req("commitTransaction", "admin", {
            "commitTransaction": 1, "lsid": {"id": b"\x01" * 16}, "txnNumber": 1,
            "autocommit": False})))
    assert exc.value.code == 251 and "TransientTransactionError" in exc.value.labels
    # the shard's families are installed after the common one, so theirs win
    assert node.commands.lookup("endSessions").__wrapped__ is transactions.end_sessions
    assert node.commands.lookup("killSessions").__wrapped__ is transactions.end_sessions
    assert node.commands.lookup("ping").__wrapped__ is node_commands.ping


def test_common_handlers_alone():
    node = Node(port=27999)
    hello = asyncio.run(node_commands.hello(node, _req("isMaster", "admin", {"isMaster": 1})))
    assert hello["ismaster"] is True and hello["maxWireVersion"] == node_commands.MAX_WIRE_VERSION
    assert hello["connectionId"] == 7
    assert asyncio.run(node_commands.whatsmyuri(node, _req("whatsmyuri", "admin",
                                                           {"whatsmyuri": 1}))) \
        == {"you": "127.0.0.1:1234"}
    # the base node's session commands are the common no-ops
    assert node.commands.lookup("endSessions").__wrapped__ is node_commands.end_sessions


def test_a_retry_waits_for_the_session_checkout_and_answers_from_the_record():
    """mongod's SessionCatalog::checkOutSession: a retry arriving while the first attempt still
    holds the session waits, then finds the statement executed (n/nModified/upserted as the
    first time, ``retriedStmtIds``) and writes no second oplog entry."""
    node = ShardNode(shard_name="direct")
    lsid = {"id": b"\x05" * 16}

    def update() -> Request:
        return _req("update", "db", {"update": "c", "lsid": lsid, "txnNumber": 4,
                                     "updates": [{"q": {"_id": 1}, "u": {"$inc": {"x": 1}},
                                                  "upsert": True},
                                                 {"q": {"_id": 2}, "u": {"$inc": {"x": 1}}}]})

    async def main() -> None:
        checkout = node.sessions.checkout(lsid)
        await checkout.acquire()  # the first attempt holds the session
        retry = asyncio.ensure_future(node.run_command(update()))
        await asyncio.sleep(0.05)
        assert not retry.done()
        first = await crud.update(node, update())
        checkout.release()
        again = await retry
        assert first == {"n": 1, "upserted": [{"index": 0, "_id": 1}], "nModified": 0}
        assert again["n"] == 1 and again["upserted"] == first["upserted"]
        assert again["retriedStmtIds"] == [0, 1]
        ops = [e["op"] for e in node.oplog.entries_from(0) if e["ns"] == "db.c"]
        assert ops == ["i"]
        # an older txnNumber: TransactionTooOld (225)
        old = _req("update", "db", {"update": "c", "lsid": lsid, "txnNumber": 3,
                                    "updates": [{"q": {"_id": 1}, "u": {"$inc": {"x": 1}}}]})
        with pytest.raises(MongoError) as exc:
            await crud.update(node, old)
        assert exc.value.code == 225

    asyncio.run(main())


def test_recipient_clears_the_incoming_range_and_range_deletion_is_from_migrate():
    """``_shardsimRecvChunkStart`` deletes the orphans of an interrupted migration in the
    range and persists a pending task; an overlapping pending task of another migration is
    refused (117); running the task deletes the range with ``fromMigrate`` entries only."""
    from bson import Binary, MinKey
    from shardsim.shard.commands import migration
    from shardsim.shard.range_deleter import RANGE_DELETIONS
    node = ShardNode(shard_name="recipient")
    mid1, mid2 = Binary(b"\x01" * 16, 4), Binary(b"\x02" * 16, 4)
    rng = {"key": {"x": 1}, "min": {"x": 0}, "max": {"x": 10}}

    async def main() -> None:
        await crud.insert(node, _req("insert", "db", {"insert": "c", "documents": [
            {"_id": i, "x": i} for i in (-1, 3, 4, 12)]}))
        start = len(list(node.oplog.entries_from(0)))
        reply = await migration.recv_chunk_start(node, _req("_shardsimRecvChunkStart", "admin", {
            "_shardsimRecvChunkStart": "db.c", "migrationId": mid1, "from": "donor", **rng}))
        assert reply == {"deleted": 2}
        assert sorted(d["_id"] for d in node.storage.get("db", "c").docs.values()) == [-1, 12]
        deletes = [e for e in list(node.oplog.entries_from(0))[start:] if e["ns"] == "db.c"]
        assert [(e["op"], e.get("fromMigrate")) for e in deletes] == [("d", True)] * 2
        [task] = node.range_deleter.documents(RANGE_DELETIONS)
        assert task["pending"] is True and task["range"] == {"min": {"x": 0}, "max": {"x": 10}}
        with pytest.raises(MongoError) as exc:  # mid1's outcome is not known yet
            await migration.recv_chunk_start(node, _req("_shardsimRecvChunkStart", "admin", {
                "_shardsimRecvChunkStart": "db.c", "migrationId": mid2, "from": "donor",
                "key": {"x": 1}, "min": {"x": MinKey()}, "max": {"x": 5}}))
        assert exc.value.code == 117
        await crud.insert(node, _req("insert", "db", {"insert": "c", "documents": [
            {"_id": 5, "x": 5}], "fromMigrate": True}))  # cloned, then the migration aborted
        reply = await migration.range_deletion_task(node, _req("_shardsimRangeDeletionTask",
                                                               "admin", {
            "_shardsimRangeDeletionTask": mid1, "action": "run"}))
        assert reply == {"deleted": 1} and node.range_deleter.documents(RANGE_DELETIONS) == []
        for bad, code in (({"key": {"x": 1}, "min": {"x": 0}}, 40414),
                          ({"key": 1, "min": {"x": 0}, "max": {"x": 1}}, 14),
                          (rng, 40414)):  # no migrationId
            with pytest.raises(MongoError) as exc:
                await migration.recv_chunk_start(node, _req("_shardsimRecvChunkStart", "admin", {
                    "_shardsimRecvChunkStart": "db.c", **bad,
                    **({"migrationId": mid2} if bad is not rng else {})}))
            assert exc.value.code == code

    asyncio.run(main())
