"""The router retries a retryable findAndModify and a retryable bulkWrite's child batches itself
on the shard's new primary (issue 25 item 2), exactly once thanks to the shards' replicated
session records; a plain findAndModify / bulkWrite is sent once and its error reaches the
client (mongos: ``cluster_find_and_modify_cmd.cpp`` and ``bulk_write_exec.cpp`` choose
``RetryPolicy::kIdempotent`` for a retryable write, else ``kNoRetry``;
``router/retryable_writes.py``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pymongo
import pytest
from pymongo import monitoring
from pymongo.errors import ClientBulkWriteException, PyMongoError
from pymongo.operations import UpdateOne

from shardsim.core.errors import MongoError
from shardsim.testing import ShardedCluster

pytestmark = pytest.mark.timeout(120)
MAJORITY = pymongo.WriteConcern("majority", wtimeout=15000)


@pytest.fixture(scope="module")
def cluster():
    with ShardedCluster(shards=2, members=3, seed=2502) as c:
        yield c


class Sent(monitoring.CommandListener):
    """Counts the commands the client sent (to tell the router's retries from the driver's)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: Any) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass


def setup_doc(cluster: ShardedCluster, db: str) -> tuple[Any, str]:
    """An unsharded collection ``db.c`` holding ``{_id: 1, x: 0}`` on every member of its
    database's primary shard; returns (collection, shard)."""
    client = cluster.client()
    coll = client.get_database(db, write_concern=MAJORITY).c
    coll.insert_one({"_id": 1, "x": 0})
    shard = client.config.databases.find_one({"_id": db})["primary"]
    return coll, shard


def member_values(cluster: ShardedCluster, shard: str, db: str) -> list[Any]:
    """``x`` of ``{_id: 1}`` in each member's own storage."""
    out = []
    for host in cluster.members_of(shard):
        c = cluster.member_node(host).storage.get(db, "c")
        doc = None if c is None else next((d for d in c.docs.values() if d["_id"] == 1), None)
        out.append(None if doc is None else doc.get("x"))
    return out


def wait_members(cluster: ShardedCluster, shard: str, db: str, want: Any) -> None:
    deadline = time.time() + 15
    while member_values(cluster, shard, db) != [want] * 3:
        if time.time() > deadline:
            raise AssertionError(f"members hold {member_values(cluster, shard, db)}, want {want}")
        time.sleep(0.05)


def fail_point(cluster: ShardedCluster, host: str, mode: Any, data: dict[str, Any]) -> None:
    with pymongo.MongoClient(f"mongodb://{host}/?directConnection=true") as c:
        c.admin.command({"configureFailPoint": "failCommand", "mode": mode, "data": data})


def code_of(exc: Any) -> Any:
    """The server's error code of a pymongo error (OperationFailure or NotPrimaryError)."""
    return (getattr(exc, "details", None) or {}).get("code")


def _held_inc_across(cluster: ShardedCluster, db: str, fault: Any, join_s: float) -> tuple[str, str]:
    """A retryable findAndModify ``$inc`` on ``db.c``'s document 1 that the shard's primary
    holds 1 s before running it (failCommand ``blockConnection``), while ``fault(shard,
    primary)`` runs 0.3 s in: it must come back ``{_id: 1, x: 1}`` with the driver having sent
    it once (the router retried, not the driver). Returns ``(shard, the old primary)``."""
    coll, shard = setup_doc(cluster, db)
    sent = Sent()
    client = cluster.client(event_listeners=[sent])
    primary = cluster.primary_of(shard)
    fail_point(cluster, primary, {"times": 1},
               {"failCommands": ["findAndModify"], "blockConnection": True, "blockTimeMS": 1000})
    out: dict[str, Any] = {}

    def run() -> None:
        out["doc"] = client.get_database(db, write_concern=MAJORITY).c.find_one_and_update(
            {"_id": 1}, {"$inc": {"x": 1}}, return_document=pymongo.ReturnDocument.AFTER)
    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)
    fault(shard, primary)
    t.join(join_s)
    assert out["doc"] == {"_id": 1, "x": 1}
    assert sent.names.count("findAndModify") == 1  # the router retried, not the driver
    return shard, primary


def test_retryable_find_and_modify_goes_to_the_new_primary_after_a_stepdown(
        cluster: ShardedCluster) -> None:
    # The primary steps down while it holds the command, which then fails with
    # NotWritablePrimary (10107), and the router sends it again.
    shard, primary = _held_inc_across(cluster, "rfam1",
                                      lambda shard, _: cluster.step_down(shard), 20)
    assert cluster.primary_of(shard) != primary
    wait_members(cluster, shard, "rfam1", 1)


def _lose_reply_once(cluster: ShardedCluster, shard: str, command: str) -> list[str]:
    """Patch the router so that the first ``command`` it sends to ``shard`` runs there (w:
    majority), then the shard steps down and the reply is lost (HostUnreachable 6, as a
    connection closed after the write). Returns the hosts the router sent ``command`` to."""
    router = cluster.cluster.node("router")
    original = router.shard_command_at
    hosts: list[str] = []

    async def patched(s: str, db: str, cmd: dict[str, Any], **kw: Any) -> Any:
        host, reply = await original(s, db, cmd, **kw)
        if s == shard and next(iter(cmd)) == command:
            hosts.append(host)
            if len(hosts) == 1:
                await cluster.cluster.step_down(shard)
                raise MongoError(6, "connection closed after the write (test)")
        return host, reply
    router.shard_command_at = patched
    return hosts


def test_retryable_find_and_modify_whose_reply_was_lost_is_applied_once(
        cluster: ShardedCluster) -> None:
    coll, shard = setup_doc(cluster, "rfam2")
    sent = Sent()
    client = cluster.client(event_listeners=[sent])
    router = cluster.cluster.node("router")
    hosts = _lose_reply_once(cluster, shard, "findAndModify")
    try:
        doc = client.get_database("rfam2", write_concern=MAJORITY).c.find_one_and_update(
            {"_id": 1}, {"$inc": {"x": 1}}, return_document=pymongo.ReturnDocument.AFTER)
    finally:
        del router.shard_command_at
    # The new primary answered the retry from its session record and retry image.
    assert doc == {"_id": 1, "x": 1}
    assert sent.names.count("findAndModify") == 1
    assert len(hosts) >= 2 and hosts[-1] != hosts[0]
    wait_members(cluster, shard, "rfam2", 1)


def test_plain_find_and_modify_is_not_retried(cluster: ShardedCluster) -> None:
    coll, shard = setup_doc(cluster, "rfam3")
    client = cluster.client(retryWrites=False)
    fail_point(cluster, cluster.primary_of(shard), {"times": 1},
               {"failCommands": ["findAndModify"], "errorCode": 10107})
    with pytest.raises(PyMongoError) as info:  # pymongo's NotPrimaryError
        client.rfam3.c.find_one_and_update({"_id": 1}, {"$inc": {"x": 1}})
    assert code_of(info.value) == 10107  # kNoRetry: the shard's error as is
    assert client.rfam3.c.find_one({"_id": 1}) == {"_id": 1, "x": 0}
    # a network error after it was sent is not retried either (it may have run)
    router = cluster.cluster.node("router")
    hosts = _lose_reply_once(cluster, shard, "findAndModify")
    try:
        with pytest.raises(PyMongoError) as info:
            client.rfam3.c.find_one_and_update({"_id": 1}, {"$inc": {"x": 1}})
    finally:
        del router.shard_command_at
    assert code_of(info.value) == 6 and len(hosts) == 1
    wait_members(cluster, shard, "rfam3", 1)  # it ran once, on the old primary


def test_retryable_bulk_write_child_batch_is_retried_and_applied_once(
        cluster: ShardedCluster) -> None:
    coll, shard = setup_doc(cluster, "rbw1")
    sent = Sent()
    client = cluster.client(event_listeners=[sent])
    router = cluster.cluster.node("router")
    hosts = _lose_reply_once(cluster, shard, "update")
    try:
        result = client.bulk_write([UpdateOne({"_id": 1}, {"$inc": {"x": 1}},
                                              namespace="rbw1.c")], write_concern=MAJORITY)
    finally:
        del router.shard_command_at
    assert result.modified_count == 1
    assert sent.names.count("bulkWrite") == 1
    assert len(hosts) >= 2 and hosts[-1] != hosts[0]
    wait_members(cluster, shard, "rbw1", 1)


def test_plain_bulk_write_is_not_retried(cluster: ShardedCluster) -> None:
    coll, shard = setup_doc(cluster, "rbw2")
    client = cluster.client(retryWrites=False)
    fail_point(cluster, cluster.primary_of(shard), {"times": 1},
               {"failCommands": ["update"], "errorCode": 10107})
    with pytest.raises(ClientBulkWriteException) as info:
        client.bulk_write([UpdateOne({"_id": 1}, {"$inc": {"x": 1}}, namespace="rbw2.c")])
    errors = info.value.write_errors or []
    assert [e["code"] for e in errors] == [10107]
    assert client.rbw2.c.find_one({"_id": 1}) == {"_id": 1, "x": 0}


def test_retryable_find_and_modify_goes_to_the_new_primary_after_the_primary_died(
        cluster: ShardedCluster) -> None:
    # The primary is killed while it holds the command: the router's connection breaks (a
    # network error), the monitor learns it, the retry goes to the elected member.
    def kill(shard: str, primary: str) -> None:
        assert cluster.kill_primary(shard) == primary
    shard, primary = _held_inc_across(cluster, "rfam4", kill, 30)
    cluster.restart_member(primary)  # it catches up: every member holds x: 1
    wait_members(cluster, shard, "rfam4", 1)
