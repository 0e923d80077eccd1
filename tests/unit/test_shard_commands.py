"""Shard and common command handlers called directly, as module-level functions, on an
in-process node (no sockets, no dispatch)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shardsim import node_commands
from shardsim.commands import ConnectionInfo, Request
from shardsim.errors import MongoError
from shardsim.node import Node
from shard.commands import catalog, crud, reads, transactions
from shard.node import ShardNode


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
