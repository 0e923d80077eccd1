"""Router commands outside the happy path: test commands off, config server unreachable,
transactions across shards, config-database access, bad input."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure

from shardsim.tools.procs import RoleProcess, free_port

pytestmark = pytest.mark.timeout(60)


def test_router_without_test_commands_and_without_config_server() -> None:
    dead = free_port()  # nothing listens there
    proc = RoleProcess("router", ["--port", "0", "--configdb", f"127.0.0.1:{dead}",
                                  "--no-test-commands"], name="router")
    proc.start()
    try:
        with pymongo.MongoClient(f"mongodb://{proc.address}/", serverSelectionTimeoutMS=5000) as c:
            assert c.admin.command("hello")["msg"] == "isdbgrid"
            assert c.admin.command({"getParameter": "*"})["enableTestCommands"] is False
            with pytest.raises(OperationFailure) as info:
                c.admin.command("listShards")
            assert info.value.code in (6, 9001)
            assert c.admin.command("ping")["ok"] == 1.0
    finally:
        proc.stop()


def test_transaction_spanning_shards_commits_or_aborts_on_all(
        router_client: pymongo.MongoClient) -> None:
    """A transaction over two shards commits on both (two-phase commit through a coordinator
    shard, docs/transactions.md) or, aborted, leaves nothing on either."""
    router_client.admin.command("shardCollection", "txn2_db.c", key={"x": 1})
    router_client.admin.command("split", "txn2_db.c", middle={"x": 0})
    router_client.admin.command("moveChunk", "txn2_db.c", find={"x": 5}, to="shard1")
    router_client.admin.command("moveChunk", "txn2_db.c", find={"x": -5}, to="shard2")
    coll = router_client.txn2_db.c
    with router_client.start_session() as s:
        s.start_transaction()
        coll.insert_one({"x": 1}, session=s)
        coll.insert_one({"x": -1}, session=s)
        assert coll.count_documents({}) == 0  # not visible outside before the commit
        s.abort_transaction()
    assert coll.count_documents({}) == 0
    with router_client.start_session() as s:
        with s.start_transaction():
            coll.insert_one({"x": 1}, session=s)
            coll.insert_one({"x": -1}, session=s)
            assert coll.count_documents({}, session=s) == 2
    assert sorted(d["x"] for d in coll.find({}, {"_id": 0})) == [-1, 1]


def test_config_database_through_the_router(router_client: pymongo.MongoClient) -> None:
    router_client.admin.command("shardCollection", "cfg_db.c", key={"_id": 1})
    assert router_client.config.collections.find_one({"_id": "cfg_db.c"})["key"] == {"_id": 1}
    assert router_client.config.databases.count_documents({"_id": "cfg_db"}) == 1
    assert "shards" in router_client.config.list_collection_names()
    router_client.config.settings.update_one({"_id": "balancer"}, {"$set": {"stopped": True}},
                                             upsert=True)
    assert router_client.config.settings.find_one({"_id": "balancer"})["stopped"] is True


def test_bad_input_gets_server_errors(router_client: pymongo.MongoClient) -> None:
    admin = router_client.admin
    with pytest.raises(OperationFailure) as info:
        admin.command("shardCollection", "nodot")
    assert info.value.code == 40414  # key missing
    with pytest.raises(OperationFailure) as info:
        admin.command("shardCollection", "nodot", key={"a": 1})
    assert info.value.code == 73
    with pytest.raises(OperationFailure) as info:
        router_client.bad_db.command("shardCollection", "bad_db.c", key={"a": 1})
    assert info.value.code == 13  # admin only
    with pytest.raises(OperationFailure) as info:
        admin.command("removeShard", "nope")
    assert info.value.code == 70
    with pytest.raises(OperationFailure) as info:
        router_client.bad_db.command("noSuchCommand")
    assert info.value.code == 59
    assert admin.command("ping")["ok"] == 1.0


def test_update_changing_the_owning_shard_moves_the_document(cluster, router_client) -> None:
    admin = router_client.admin
    admin.command("shardCollection", "skey_db.c", key={"x": 1})
    admin.command("split", "skey_db.c", middle={"x": 0})
    admin.command("moveChunk", "skey_db.c", find={"x": 5}, to="shard1")
    admin.command("moveChunk", "skey_db.c", find={"x": -5}, to="shard2")
    coll = router_client.skey_db.c
    coll.insert_many([{"_id": 1, "x": 5}, {"_id": 2, "x": 6}])

    def holder(_id: int) -> str:
        for proc in cluster.shards:
            with pymongo.MongoClient(f"mongodb://{proc.address}/?directConnection=true") as c:
                if c.skey_db.c.find_one({"_id": _id}):
                    return proc.name
        return "nowhere"

    assert holder(1) == "shard1"
    res = coll.update_one({"x": 5}, {"$set": {"x": -5}})  # retryable write (pymongo default)
    assert (res.matched_count, res.modified_count) == (1, 1)
    assert holder(1) == "shard2" and coll.find_one({"_id": 1}) == {"_id": 1, "x": -5}
    coll.replace_one({"_id": 2}, {"x": -6, "r": 1})
    assert holder(2) == "shard2" and coll.find_one({"_id": 2}) == {"_id": 2, "x": -6, "r": 1}
    # Same-shard key changes are plain updates.
    coll.update_one({"x": -6}, {"$set": {"x": -7}})
    assert holder(2) == "shard2"
    with pymongo.MongoClient(cluster.router_uri, retryWrites=False) as plain:
        with pytest.raises(pymongo.errors.WriteError) as info:
            plain.skey_db.c.update_one({"x": -5}, {"$set": {"x": 50}})
        assert info.value.code == 20
    assert coll.count_documents({}) == 2
