"""The router's command handlers and their state, called directly (no sockets): the
transaction router, the retryable-write cache, and a few module-level handlers on a stub node."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from bson import Timestamp

from shardsim.router.commands import FAMILIES, admin, sharding, transactions
from shardsim.router.node import RouterNode
from shardsim.router import retryable_writes as rw
from shardsim.router.transactions import TransactionRouter
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError

LSID = {"id": b"\x01" * 16}


def _req(name: str, db: str = "admin", **fields: Any) -> Request:
    return Request(name=name, db=db, body={name: 1, "$db": db, **fields},
                   conn=ConnectionInfo(id=1))


def _txn(name: str, txn_number: int, **fields: Any) -> Request:
    return _req(name, db="d", lsid=LSID, txnNumber=txn_number, autocommit=False, **fields)


def test_transaction_router_attaches_start_fields_per_participant() -> None:
    """attachTxnFieldsIfNeeded: the first command to each shard starts the transaction there
    with the transaction's read concern (snapshot gets atClusterTime); later ones do not."""
    txns = TransactionRouter()
    first = _txn("insert", 1, startTransaction=True,
                 readConcern={"level": "snapshot", "atClusterTime": Timestamp(5, 1)})
    txns.participant(first, {"shard0", "shard1"})
    a = txns.attach("shard0", dict(first.body))
    assert a["startTransaction"] is True and a["readConcern"]["atClusterTime"] == Timestamp(5, 1)
    b = txns.attach("shard1", dict(first.body))
    assert b["startTransaction"] is True and b["autocommit"] is False
    again = txns.attach("shard0", dict(_txn("find", 1).body))
    assert "startTransaction" not in again and "readConcern" not in again
    txn = txns.get(_txn("commitTransaction", 1))
    assert list(txn.participants) == ["shard0", "shard1"] and txn.coordinator == "shard0"
    assert txn.recovery_shard == "shard0"
    # commit/abort commands pass through untouched
    end = {"commitTransaction": 1, "lsid": LSID, "txnNumber": 1, "autocommit": False}
    assert txns.attach("shard1", end) is end
    # A newer transaction of the session forgets the older one.
    txns.participant(_txn("insert", 2, startTransaction=True), {"shard1"})
    assert txns.get(_txn("commitTransaction", 1)) is None
    txns.end(_txn("abortTransaction", 2))
    assert txns.get(_txn("abortTransaction", 2)) is None


def test_retryable_write_stmt_ids_and_idempotent_send() -> None:
    assert not rw.is_retryable({"insert": "c"})
    assert not rw.is_retryable({"lsid": LSID, "txnNumber": 3, "autocommit": False})
    assert rw.is_retryable({"lsid": LSID, "txnNumber": 3})
    # write_ops::getStmtIdForWriteAt: stmtIds[i], else stmtId + i, else i.
    assert rw.stmt_id_at({"stmtIds": [7, 9]}, 1) == 9
    assert rw.stmt_id_at({"stmtId": 10}, 2) == 12
    assert rw.stmt_id_at({}, 4) == 4
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise MongoError(6, "connection refused")
        return "ok"
    assert asyncio.run(rw.send_idempotent(flaky, True)) == "ok" and len(calls) == 3
    calls.clear()
    with pytest.raises(MongoError):  # not retryable: one attempt
        asyncio.run(rw.send_idempotent(flaky, False))
    assert len(calls) == 1
    # AsyncRequestsSender: kMaxNumFailedHostRetryAttempts (3) retries, so 4 attempts in all.
    async def down() -> str:
        calls.append(1)
        raise MongoError(10107, "not primary")
    calls.clear()
    with pytest.raises(MongoError):
        asyncio.run(rw.send_idempotent(down, True))
    assert len(calls) == 4
    # A RetryableWriteError label is retried too (Shard::remoteIsRetriableError); other errors not.
    async def labelled() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise MongoError(50, "x", labels=["RetryableWriteError"])
        raise MongoError(11000, "dup")
    calls.clear()
    with pytest.raises(MongoError) as info:
        asyncio.run(rw.send_idempotent(labelled, True))
    assert info.value.code == 11000 and len(calls) == 2
    err = rw.unavailable_error(4, "shard1", MongoError(6, "boom"))
    assert err == {"index": 4, "code": 6,
                   "errmsg": "Write results unavailable from shard1 :: caused by :: boom"}


class _StubNode:
    """What the transaction handlers use of a RouterNode, with shard replies recorded."""

    def __init__(self) -> None:
        self.transactions = TransactionRouter()
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        self.address = "127.0.0.1:27017"

    async def shard_command(self, shard: str, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        if cmd.get("autocommit") is False:
            cmd = self.transactions.attach(shard, cmd)
        self.sent.append((shard, db, cmd))
        return {"ok": 1.0, "operationTime": 5, "$clusterTime": {}}

    async def config_command(self, cmd: dict[str, Any], db: str = "admin") -> dict[str, Any]:
        self.sent.append(("config", db, cmd))
        return {"ok": 1.0, "mode": "full", "inBalancerRound": False, "numBalancerRounds": 3,
                "$clusterTime": {}}


def test_end_transaction_handlers_on_a_stub_node() -> None:
    node = _StubNode()
    # A commit of a transaction this router never saw needs a recoveryToken (50940); one
    # that started but reached no shard commits as a no-op; abort is NoSuchTransaction.
    with pytest.raises(MongoError) as err:
        asyncio.run(transactions.commit_transaction(node, _txn("commitTransaction", 7)))
    assert err.value.code == 50940
    node.transactions.participant(_txn("find", 7, startTransaction=True), set())
    assert asyncio.run(transactions.commit_transaction(node, _txn("commitTransaction", 7))) == {}
    with pytest.raises(MongoError) as err:
        asyncio.run(transactions.abort_transaction(node, _txn("abortTransaction", 7)))
    assert err.value.code == 251 and err.value.labels == ["TransientTransactionError"]
    assert node.sent == []
    insert = _txn("insert", 8, startTransaction=True)
    node.transactions.participant(insert, {"shard1"})
    asyncio.run(node.shard_command("shard1", "d", dict(insert.body)))
    assert asyncio.run(transactions.commit_transaction(node, _txn("commitTransaction", 8))) == {}
    shard, db, cmd = node.sent[-1]
    assert (shard, db, cmd["commitTransaction"]) == ("shard1", "admin", 1) and "$db" not in cmd
    assert asyncio.run(transactions.abort_transaction(node, _txn("abortTransaction", 8))) == {}
    assert node.transactions.get(_txn("abortTransaction", 8)) is None


def test_admin_and_sharding_handlers_on_a_stub_node() -> None:
    node = _StubNode()
    assert asyncio.run(admin.isdbgrid(node, _req("isdbgrid"))) == {
        "isdbgrid": 1, "hostname": "127.0.0.1:27017"}
    with pytest.raises(MongoError) as err:
        asyncio.run(sharding.add_shard(node, _req("addShard", db="test")))
    assert err.value.code == 13
    status = asyncio.run(sharding.balancer_status(node, _req("balancerStatus")))
    assert status == {"mode": "full", "inBalancerRound": False, "numBalancerRounds": 3}
    assert node.sent[-1] == ("config", "admin", {"_configsvrBalancerStatus": 1})


def test_router_node_installs_every_family() -> None:
    node = RouterNode(configdb="127.0.0.1:1")
    try:
        names = set(node.commands.names())
        for family in FAMILIES:
            assert set(family.names()) <= names, family.name
        assert node.commands.canonical("findandmodify") == "findAndModify"
        assert node.commands.canonical("deleteIndexes") == "dropIndexes"
        assert node.commands.lookup("commitTransaction").__wrapped__ is \
            transactions.commit_transaction
    finally:
        node.config_pool.close()
