"""Commit recovery through another router (``TransactionRouter::Router::
_commitWithRecoveryToken``): a client whose commit retry reaches a mongos that never saw the
transaction sends the ``recoveryToken``; that router asks the token's shard with
``coordinateCommitTransaction {participants: []}`` (shard/commit_recovery.py).

pymongo always puts its own session's lsid on a command, so these tests speak the wire
protocol with shardsim's client and choose lsid and txnNumber themselves."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from bson import Binary

from shardsim.core.client import Pool, parse_address
from shardsim.core.errors import MongoError
from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import split_over_two_shards



def _router(uri: str) -> Pool:
    return Pool(*parse_address(uri.removeprefix("mongodb://").rstrip("/")))


async def _write_both_shards(router: Pool, lsid: dict[str, Any], txn: int) -> dict[str, Any]:
    """Two inserts of transaction ``txn`` (one per shard) through ``router``; the last reply's
    recoveryToken."""
    fields = {"lsid": lsid, "txnNumber": txn, "autocommit": False}
    await router.command("r", {"insert": "c", "documents": [{"_id": txn * 10, "x": -txn}],
                               "startTransaction": True, **fields})
    reply = await router.command("r", {"insert": "c", "documents": [{"_id": txn * 10 + 1,
                                                                       "x": txn}], **fields})
    return reply["recoveryToken"]


def _commit(txn: int, lsid: dict[str, Any], token: dict[str, Any] | None) -> dict[str, Any]:
    cmd: dict[str, Any] = {"commitTransaction": 1, "lsid": lsid, "txnNumber": txn,
                           "autocommit": False}
    if token is not None:
        cmd["recoveryToken"] = token
    return cmd


@pytest.fixture(scope="module")
def cluster() -> Any:
    with ShardedCluster(shards=2, routers=2) as c:
        split_over_two_shards(c.client(), "r.c")
        yield c


def test_commit_retried_on_another_router_recovers_the_decision(cluster: Any) -> None:
    """Committed through router A, the retry through router B answers ok from the shard's
    coordinator (no second commit); the documents are there once."""
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        a, b = _router(cluster.uris[0]), _router(cluster.uris[1])
        try:
            token = await _write_both_shards(a, lsid, 1)
            first = await a.command("admin", _commit(1, lsid, token))
            retry = await b.command("admin", _commit(1, lsid, token))
            return first, retry
        finally:
            a.close()
            b.close()

    first, retry = asyncio.run(run())
    assert first["ok"] == 1 and retry["ok"] == 1
    assert sorted(d["_id"] for d in cluster.client().r.c.find({"_id": {"$in": [10, 11]}})) \
        == [10, 11]


def test_commit_on_a_router_that_never_saw_it_aborts_an_unfinished_transaction(
        cluster: Any) -> None:
    """The first commit never reached the shards: router B's recovery aborts the transaction
    in progress on the recovery shard and answers NoSuchTransaction (251,
    TransientTransactionError); router A's commit afterwards cannot commit it, and nothing
    of it is visible. Without a recoveryToken router B answers 50940."""
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}

    async def run() -> tuple[MongoError, MongoError, MongoError]:
        a, b = _router(cluster.uris[0]), _router(cluster.uris[1])
        try:
            token = await _write_both_shards(a, lsid, 2)
            errors = []
            for router, tok in ((b, None), (b, token), (a, token)):
                with pytest.raises(MongoError) as info:
                    await router.command("admin", _commit(2, lsid, tok))
                errors.append(info.value)
            return errors[0], errors[1], errors[2]
        finally:
            a.close()
            b.close()

    no_token, recovered, late = asyncio.run(run())
    assert no_token.code == 50940
    assert recovered.code == 251 and "TransientTransactionError" in recovered.labels
    assert late.code == 251
    assert cluster.client().r.c.count_documents({"_id": {"$in": [20, 21]}}) == 0


def test_retried_single_write_shard_commit_recovers_instead_of_committing_again(
        cluster: Any) -> None:
    """A transaction that read on one shard (the first participant) and wrote on the other:
    a retried commit through the same router uses the recovery-token protocol on the write
    shard (``_commitTransaction``, ``!isFirstCommitAttempt``), never a second commit. After a
    successful commit the retry answers ok; when the first commit failed on the write shard
    (failCommand), the retry finds the transaction still in progress there, aborts it and
    answers NoSuchTransaction (251, TransientTransactionError), as mongos 8.0 does."""
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
    primary = cluster.client().config.databases.find_one({"_id": "r"})["primary"]

    async def txn(router: Pool, n: int) -> None:
        fields = {"lsid": lsid, "txnNumber": n, "autocommit": False}
        await router.command("r", {"find": "c", "filter": {"x": 10 ** 6}, **fields,
                                   "startTransaction": True})  # read-only, first participant
        await router.command("r", {"insert": "c", "documents": [{"_id": n * 10, "x": -n}],
                                   **fields})

    async def commit_twice(n: int) -> list[Any]:
        a = _router(cluster.uris[0])
        out: list[Any] = []
        try:
            await txn(a, n)
            for _ in range(2):
                try:
                    out.append(await a.command("admin", _commit(n, lsid, None)))
                except MongoError as exc:
                    out.append(exc)
            return out
        finally:
            a.close()

    first, retry = asyncio.run(commit_twice(5))
    cluster.configure_fail_point(primary, "failCommand", {"times": 1}, {
        "failCommands": ["commitTransaction"], "errorCode": 91})
    failed, retried = asyncio.run(commit_twice(6))
    assert first["ok"] == 1 and retry["ok"] == 1
    assert isinstance(failed, MongoError) and failed.code == 91
    assert isinstance(retried, MongoError) and retried.code == 251
    assert "TransientTransactionError" in retried.labels
    assert sorted(d["_id"] for d in cluster.client().r.c.find({"_id": {"$in": [50, 60]}})) \
        == [50]
