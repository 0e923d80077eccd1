"""The config server as a replica set (CSRS, issue 24): a 2-shard x 3-member cluster with a
3-member config server; the config primary stepped down and killed while a change stream runs
through the router; DDL, migrations and addShard after each failover; the catalog on every
config member's own storage; the primary-only jobs on the primary only."""

from __future__ import annotations

import threading
import time
from typing import Any

import pymongo
import pymongo.errors
import pytest

from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import read_events, split_over_two_shards

MAJORITY = pymongo.WriteConcern("majority", wtimeout=15000)
CATALOG = ("shards", "databases", "collections", "chunks")


@pytest.fixture(scope="module")
def cluster():
    with ShardedCluster(shards=2, members=3, seed=24) as c:
        yield c


def wait_for(cond: Any, timeout: float = 15.0, what: str = "") -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def catalog_of(cluster: ShardedCluster, host: str) -> dict[str, list[Any]]:
    """The catalog collections as member ``host`` has them in its own storage."""
    node = cluster.member_node(host)
    out = {}
    for name in CATALOG:
        coll = node.storage.get("config", name)
        out[name] = [] if coll is None else sorted(coll.docs.values(),
                                                   key=lambda d: repr(d["_id"]))
    return out


def running_config_hosts(cluster: ShardedCluster) -> list[str]:
    return [h for h in cluster.members_of("config")
            if cluster.cluster._member_at(h).running]


def test_the_config_server_is_a_three_member_set_the_routers_and_shards_know(
        cluster: ShardedCluster) -> None:
    hosts = cluster.members_of("config")
    assert len(hosts) == 3
    primary = cluster.primary_of("config")
    with pymongo.MongoClient(primary, directConnection=True) as direct:
        hello = direct.admin.command("hello")
        assert hello["setName"] == "config" and hello["configsvr"] == 2
        assert sorted(hello["hosts"]) == sorted(hosts)
        conf = direct.admin.command("replSetGetConfig")["config"]
        assert conf["configsvr"] is True and conf["_id"] == "config"
        assert [m["host"] for m in conf["members"]] == hosts
    configdb = "config/" + ",".join(hosts)
    client = cluster.client()
    assert client.admin.command("serverStatus")["sharding"]["configsvrConnectionString"] \
        == configdb
    client.admin.command("shardCollection", "ident.c", key={"_id": "hashed"})
    for shard in cluster.shard_names:  # the shard identity names every config member
        node = cluster.member_node(cluster.primary_of(shard))
        assert node.sharding.config_connection_string() == configdb
    # the balancer, recoveries and keys run on the primary only
    jobs = {h: cluster.member_node(h).primary_jobs for h in hosts}
    assert jobs == {h: h == primary for h in hosts}


def test_a_stream_ddl_and_add_shard_across_config_failovers(cluster: ShardedCluster) -> None:
    client = cluster.client()
    coll = client.get_database("cfgfail", write_concern=MAJORITY).c
    split_over_two_shards(client, "cfgfail.c")
    acked: list[int] = []

    def write(n: int) -> None:
        for _ in range(n):
            i = len(acked)
            key = i if i % 2 else -i - 1  # both shards
            coll.insert_one({"x": key, "_id": key})
            acked.append(key)

    with client.cfgfail.watch(max_await_time_ms=200) as stream:
        write(10)
        old = cluster.step_down("config")
        new = cluster.primary_of("config")
        assert new != old
        write(10)
        # DDL and a migration on the new config primary
        client.admin.command("shardCollection", "cfgfail.d", key={"x": 1})
        client.admin.command("split", "cfgfail.d", middle={"x": 0})
        client.admin.command("moveChunk", "cfgfail.d", find={"x": 0},
                             to=cluster.shard_names[1])
        write(10)
        killed = cluster.kill_primary("config")
        assert cluster.primary_of("config") != killed
        write(10)
        client.admin.command("moveChunk", "cfgfail.c", find={"x": 5},
                             to=cluster.shard_names[0])
        client.admin.command("shardCollection", "cfgfail.e", key={"_id": "hashed"})
        added = cluster.add_shard()
        client.admin.command("moveChunk", "cfgfail.d", find={"x": 0}, to=added)
        write(10)
        events = read_events(stream, len(acked), timeout=20.0)
        events += read_events(stream, 1, timeout=1.0)  # nothing doubled after them
    inserts = [e["documentKey"]["_id"] for e in events if e["operationType"] == "insert"
               and e["ns"]["coll"] == "c"]
    assert sorted(inserts) == sorted(acked) and len(inserts) == len(set(inserts)) == 50
    for sign in (1, -1):  # per key range, in the order of the writes
        assert [k for k in inserts if (k >= 0) == (sign > 0)] == \
            [k for k in acked if (k >= 0) == (sign > 0)]
    assert coll.count_documents({}) == 50
    chunks = {c["shard"] for c in client.config.chunks.find(
        {"uuid": client.config.collections.find_one({"_id": "cfgfail.d"})["uuid"]})}
    assert added in chunks
    assert added in [s["_id"] for s in client.admin.command("listShards")["shards"]]
    # a shard that lost its filtering metadata (a restart) reads it again from the config
    # primary of now, through the set's connection string of its shard identity
    node = cluster.member_node(cluster.primary_of(cluster.shard_names[0]))
    known = node.sharding.metadata.pop("cfgfail.d")
    assert cluster._call(node.sharding.refresh("cfgfail.d"))
    assert node.sharding.metadata["cfgfail.d"].shard_version() == known.shard_version()
    # the killed member comes back empty and replays the config oplog: every member's own
    # catalog is the primary's
    cluster.restart_member(killed)
    primary = cluster.primary_of("config")
    expected = catalog_of(cluster, primary)
    assert len(expected["shards"]) == 3
    for host in cluster.members_of("config"):
        wait_for(lambda: catalog_of(cluster, host) == expected, what=f"{host}'s catalog")
    # only the current primary runs the jobs
    wait_for(lambda: [h for h in running_config_hosts(cluster)
                      if cluster.member_node(h).primary_jobs] == [primary],
             what="the jobs on the primary only")


def test_a_migration_goes_on_when_the_config_primary_dies_in_its_critical_section(
        cluster: ShardedCluster) -> None:
    """The config primary dies while the donor holds a migration in its critical section
    (the donor's ``moveChunkHangAtStep5``): the moveChunk request fails, but the donor, which
    drives the migration (:mod:`shard.migration_source`), goes on and commits it on the
    member elected next, so the donor's writes go on, no coordination is left on the shards,
    and every document sits once on its chunk's owner."""
    client = cluster.client()
    coll = client.get_database("cfgmig", write_concern=MAJORITY).c
    donor, recipient = split_over_two_shards(client, "cfgmig.c", middle=1000)
    coll.insert_many([{"_id": x, "x": x} for x in range(20)])
    donor_primary = cluster.primary_of(donor)

    def fail_point(mode: str) -> dict:
        with pymongo.MongoClient(donor_primary, directConnection=True) as d:
            return d.admin.command("configureFailPoint", "moveChunkHangAtStep5", mode=mode)
    fail_point("alwaysOn")
    errors: list[BaseException] = []

    def move() -> None:
        try:
            client.admin.command("moveChunk", "cfgmig.c", find={"x": 0}, to=recipient)
        except pymongo.errors.PyMongoError as exc:
            errors.append(exc)
    thread = threading.Thread(target=move, daemon=True)
    thread.start()
    wait_for(lambda: fail_point("alwaysOn")["count"] > 0, what="the critical section")
    killed = cluster.kill_primary("config")
    thread.join(30)
    assert not thread.is_alive()
    new = cluster.primary_of("config")
    assert new != killed
    fail_point("off")

    def settled() -> bool:
        for shard in cluster.shard_names:
            with pymongo.MongoClient(cluster.primary_of(shard), directConnection=True) as d:
                if d.config.migrationCoordinators.count_documents({}):
                    return False
        return True
    wait_for(settled, what="the migration completed by the donor")
    coll.insert_one({"_id": 100, "x": 100})  # the donor's critical section is released
    uuid = client.config.collections.find_one({"_id": "cfgmig.c"})["uuid"]
    owner = client.config.chunks.find_one({"uuid": uuid, "max": {"x": 1000}})["shard"]
    assert owner == recipient  # committed on the new config primary
    seen: dict[int, str] = {}
    for shard in cluster.shard_names:
        with pymongo.MongoClient(cluster.primary_of(shard), directConnection=True) as d:
            for doc in d.cfgmig.c.find({}):
                assert doc["_id"] not in seen
                seen[doc["_id"]] = shard
    assert sorted(seen) == list(range(20)) + [100]
    assert set(seen.values()) == {owner}  # [MinKey, 1000) is one chunk: on its owner only
    cluster.restart_member(killed)
