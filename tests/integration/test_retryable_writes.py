"""Retryable writes are exactly-once end to end (issue 17, item 2): the router forwards
``lsid``/``txnNumber``/``stmtIds`` and each shard answers a retried statement from its session
record (``config.transactions``), across a client timeout, a router ``kill -9`` and a durable
shard restart; bulk writes with a shard down answer with write errors and counts as mongos does
(issue 17, item 4). Each test starts its own cluster."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pymongo
import pytest
from bson import Binary
from bson.int64 import Int64
from pymongo import UpdateOne
from pymongo.errors import BulkWriteError, PyMongoError

from shardsim.core.client import Pool, parse_address

pytestmark = pytest.mark.timeout(240)

N = 5000


def _sharded(client: pymongo.MongoClient, ns: str) -> None:
    client.admin.command("shardCollection", ns, key={"_id": "hashed"})


def _raw(address: str, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
    """One command on a fresh connection (the same lsid/txnNumber can be sent twice)."""
    async def run() -> dict[str, Any]:
        pool = Pool(*parse_address(address))
        try:
            return await pool.command(db, cmd, check=False)
        finally:
            pool.close()
    return asyncio.run(run())


def _block(address: str, command: str, ms: int, times: int = 1) -> None:
    """failCommand blockConnection on one process (a slow shard)."""
    with pymongo.MongoClient(f"mongodb://{address}/?directConnection=true") as c:
        c.admin.command("configureFailPoint", "failCommand", mode={"times": times},
                        data={"failCommands": [command], "blockConnection": True,
                              "blockTimeMS": ms})


class _Watch:
    """A change stream read in a thread until :meth:`stop`."""

    def __init__(self, uri: str, db: str, coll: str) -> None:
        self.client: pymongo.MongoClient = pymongo.MongoClient(uri)
        self.stream = self.client[db][coll].watch(max_await_time_ms=100)
        self.events: list[dict[str, Any]] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            ev = self.stream.try_next()
            if ev is not None:
                self.events.append(ev)

    def wait_for(self, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Events once ``count`` arrived and nothing more came for a second."""
        deadline = time.time() + timeout
        while time.time() < deadline and len(self.events) < count:
            time.sleep(0.1)
        time.sleep(1.0)  # anything doubled would arrive now
        self._stop = True
        self.thread.join(10)
        self.stream.close()
        self.client.close()
        return self.events


def _assert_incremented_once(coll: Any, events: list[dict[str, Any]]) -> None:
    assert coll.count_documents({"x": 1}) == N, _histogram(coll)
    updates = [e for e in events if e["operationType"] == "update"]
    assert len(updates) == N
    assert len({e["documentKey"]["_id"] for e in updates}) == N
    # mongod adds lsid/txnNumber to change events of transactions only
    # (change_stream_event_transform.cpp: addTransactionIdFieldsIfPresent when txnOpIndex).
    assert all("lsid" not in e and "txnNumber" not in e for e in updates)


def _histogram(coll: Any) -> dict[Any, int]:
    """``{x value: number of documents}``."""
    out: dict[Any, int] = {}
    for d in coll.find({}, {"x": 1}):
        out[d["x"]] = out.get(d["x"], 0) + 1
    return out


def test_client_timeout_retry_of_an_unordered_inc_bulk_is_exactly_once(cluster_factory) -> None:
    cluster = cluster_factory(shards=2)
    admin = pymongo.MongoClient(cluster.router_uri)
    try:
        _sharded(admin, "rw.inc")
        admin.rw.inc.insert_many([{"_id": i, "x": 0} for i in range(N)])
        watch = _Watch(cluster.router_uri, "rw", "inc")
        time.sleep(0.5)
        # The first attempt stalls on shard0 past the client's socket timeout; the driver
        # retries with the same txnNumber while that attempt is still running.
        _block(cluster.shard("shard0").address, "update", 1500)
        client = pymongo.MongoClient(cluster.router_uri, socketTimeoutMS=300, retryWrites=True)
        try:
            result = client.rw.inc.bulk_write(
                [UpdateOne({"_id": i}, {"$inc": {"x": 1}}) for i in range(N)], ordered=False)
            # The retry answered with the first attempt's counts.
            assert result.matched_count == N and result.modified_count == N
        except PyMongoError:
            pass  # the retry may itself time out; the data must still be exactly once
        finally:
            client.close()
        events = watch.wait_for(N)
        _assert_incremented_once(admin.rw.inc, events)
    finally:
        admin.close()


def test_retried_insert_many_reports_no_duplicate_key(cluster_factory) -> None:
    cluster = cluster_factory(shards=2)
    admin = pymongo.MongoClient(cluster.router_uri)
    try:
        _sharded(admin, "rw.ins")
        _block(cluster.shard("shard1").address, "insert", 1500)
        client = pymongo.MongoClient(cluster.router_uri, socketTimeoutMS=300, retryWrites=True)
        try:
            try:
                result = client.rw.ins.insert_many([{"_id": i} for i in range(N)],
                                                   ordered=False)
                assert len(result.inserted_ids) == N
            except BulkWriteError as exc:  # pragma: no cover - the defect this test guards
                pytest.fail(f"retry reported write errors: {exc.details['writeErrors'][:2]}")
            except PyMongoError:
                pass  # a second timeout; checked below
        finally:
            client.close()
        # A retry sent by hand with the same lsid/txnNumber: every statement is answered from
        # the shards' session records, with the first result and no E11000.
        lsid = {"id": Binary(b"\x07" * 16, 4)}
        cmd = {"insert": "ins2", "documents": [{"_id": i} for i in range(200)],
               "ordered": True, "lsid": lsid, "txnNumber": Int64(1)}
        _sharded(admin, "rw.ins2")
        first = _raw(cluster.router.address, "rw", dict(cmd))
        again = _raw(cluster.router.address, "rw", dict(cmd))
        assert first["n"] == again["n"] == 200 and "writeErrors" not in again
        assert again["retriedStmtIds"] == list(range(200))
        deadline = time.time() + 10
        while admin.rw.ins.count_documents({}) < N and time.time() < deadline:
            time.sleep(0.1)
        assert admin.rw.ins.count_documents({}) == N
        assert admin.rw.ins2.count_documents({}) == 200
        # An older txnNumber on the session: TransactionTooOld (225), as a write error on mongos.
        cmd["txnNumber"] = Int64(2)
        _raw(cluster.router.address, "rw", dict(cmd, documents=[{"_id": 1000}]))
        old = _raw(cluster.router.address, "rw", dict(cmd, txnNumber=Int64(1)))
        assert old["writeErrors"][0]["code"] == 225
    finally:
        admin.close()


def test_router_kill_mid_bulk_then_driver_retry_is_exactly_once(cluster_factory) -> None:
    cluster = cluster_factory(shards=2)
    admin = pymongo.MongoClient(cluster.router_uri)
    try:
        _sharded(admin, "rw.kill")
        admin.rw.kill.insert_many([{"_id": i, "x": 0} for i in range(N)])
        watch = _Watch(cluster.router_uri, "rw", "kill")
        time.sleep(0.5)
        _block(cluster.shard("shard0").address, "update", 2000)
        outcome: list[Any] = []

        def bulk() -> None:
            client = pymongo.MongoClient(cluster.router_uri, retryWrites=True,
                                         serverSelectionTimeoutMS=30000,
                                         heartbeatFrequencyMS=500)
            try:
                outcome.append(client.rw.kill.bulk_write(
                    [UpdateOne({"_id": i}, {"$inc": {"x": 1}}) for i in range(N)],
                    ordered=False))
            except PyMongoError as exc:
                outcome.append(exc)
            finally:
                client.close()

        t = threading.Thread(target=bulk)
        t.start()
        time.sleep(0.8)  # shard1's half applied, shard0's half stalled
        cluster.router.kill()
        cluster.restart(cluster.router)
        t.join(120)
        assert outcome and not isinstance(outcome[0], BaseException), outcome
        assert outcome[0].modified_count == N
        events = _Watch.wait_for(watch, N)
        _assert_incremented_once(admin.rw.kill, events)
    finally:
        admin.close()


def test_durable_shard_restart_between_attempt_and_retry(cluster_factory) -> None:
    cluster = cluster_factory(shards=2, durable=True)
    admin = pymongo.MongoClient(cluster.router_uri)
    try:
        _sharded(admin, "rw.dur")
        admin.rw.dur.insert_many([{"_id": i, "x": 0} for i in range(500)])
        lsid = {"id": Binary(b"\x09" * 16, 4)}
        cmd = {"update": "dur", "ordered": False, "lsid": lsid, "txnNumber": Int64(3),
               "updates": [{"q": {"_id": i}, "u": {"$inc": {"x": 1}}} for i in range(500)]
               + [{"q": {"_id": 9999}, "u": {"$set": {"x": 1}}, "upsert": True}]}
        first = _raw(cluster.router.address, "rw", dict(cmd))
        assert first["n"] == 501 and first["nModified"] == 500
        for shard in cluster.shards:
            shard.kill()
            cluster.restart(shard)
        again = _raw(cluster.router.address, "rw", dict(cmd))
        assert (again["n"], again["nModified"], again["upserted"]) == \
            (first["n"], first["nModified"], first["upserted"])
        assert again["retriedStmtIds"] == list(range(501))
        assert admin.rw.dur.count_documents({"x": 1}) == 501
        # each statement is in the oplogs once
        entries = 0
        for shard in cluster.shards:
            with pymongo.MongoClient(f"mongodb://{shard.address}/?directConnection=true") as c:
                entries += c.local["oplog.rs"].count_documents(
                    {"ns": "rw.dur", "op": {"$in": ["u", "i"]}, "lsid.id": lsid["id"]})
        assert entries == 501
    finally:
        admin.close()


def test_ordered_bulk_with_a_shard_down_reports_what_was_applied(cluster_factory) -> None:
    cluster = cluster_factory(shards=2, durable=True)
    admin = pymongo.MongoClient(cluster.router_uri, retryWrites=True)
    try:
        admin.admin.command("shardCollection", "rw.down", key={"k": 1})
        admin.admin.command("split", "rw.down", middle={"k": 10})
        admin.admin.command("moveChunk", "rw.down", find={"k": 10}, to="shard1",
                            _waitForDelete=True)
        # how long the router waits for the dead shard's primary (mongos: 15 s), then 133
        admin.admin.command("setParameter", 1, defaultFindReplicaSetHostTimeoutMS=1000)
        victim = cluster.shard("shard1")
        victim.kill()
        # statements 0..9 go to shard0 (k < 10), 10..19 to the dead shard1
        docs = [{"_id": i, "k": i} for i in range(20)]
        with pytest.raises(BulkWriteError) as info:
            admin.rw.down.insert_many(docs, ordered=True)
        details = info.value.details
        assert details["nInserted"] == 10
        errs = details["writeErrors"]
        # the network error, or FailedToSatisfyReadPreference once the router's monitor of
        # shard1 knows its only member is down ("failing to target a host in the shard")
        assert len(errs) == 1 and errs[0]["index"] == 10
        assert errs[0]["code"] in (6, 89, 9001, 133)
        assert errs[0]["errmsg"].startswith(("Write results unavailable from shard1 :: ",
                                             "Write results unavailable from failing to target "
                                             "a host in the shard shard1 :: caused by :: "))
        # unordered: every statement of the dead shard fails, the others are applied
        with pytest.raises(BulkWriteError) as info:
            admin.rw.down.insert_many([{"_id": 100 + i, "k": i} for i in range(20)],
                                      ordered=False)
        details = info.value.details
        assert details["nInserted"] == 10
        assert [e["index"] for e in details["writeErrors"]] == list(range(10, 20))
        cluster.restart(victim)
        assert admin.rw.down.count_documents({}) == 20
    finally:
        admin.close()
