"""A sharded cluster of replica-set shards in process (issues 24 and 25): the merged change
stream through the router across a stepdown and a dead primary, a stream read on secondaries,
and every member's own data after each fault."""

from __future__ import annotations

import time
from typing import Any

import pymongo
import pytest

from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import split_over_two_shards

MAJORITY = pymongo.WriteConcern("majority", wtimeout=15000)


@pytest.fixture(scope="module")
def cluster():
    with ShardedCluster(shards=2, members=3, seed=25) as c:
        yield c


def member_docs(cluster: ShardedCluster, host: str, ns: str) -> list[Any]:
    db, _, coll = ns.partition(".")
    c = cluster.member_node(host).storage.get(db, coll)
    return [] if c is None else sorted(c.docs.values(), key=lambda d: repr(d["_id"]))


def wait_for(cond: Any, timeout: float = 15.0, what: str = "") -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_list_shards_names_every_member(cluster: ShardedCluster) -> None:
    shards = cluster.client().admin.command("listShards")["shards"]
    for s in shards:
        assert s["host"] == f"{s['_id']}/" + ",".join(cluster.members_of(s["_id"]))


def test_the_merged_stream_survives_a_stepdown_and_a_dead_primary(
        cluster: ShardedCluster) -> None:
    client = cluster.client()
    coll = client.get_database("failover", write_concern=MAJORITY).c
    split_over_two_shards(client, "failover.c")
    acked: list[int] = []
    with coll.watch() as stream:
        for i in range(60):
            key = i if i % 2 else -i - 1  # both shards
            coll.insert_one({"_id": key})
            acked.append(key)
            if i == 20:
                cluster.step_down("shard0")
            if i == 40:
                killed = cluster.kill_primary("shard1")
        seen = [stream.next()["documentKey"]["_id"] for _ in range(60)]
    assert sorted(seen) == sorted(acked) and len(set(seen)) == 60
    # per shard, events come in the order of the writes
    for sign in (1, -1):
        mine = [k for k in seen if (k > 0) == (sign > 0)]
        assert mine == [k for k in acked if (k > 0) == (sign > 0)]
    # every live member of each shard has every acknowledged write of its chunk
    for shard in cluster.shard_names:
        primary = cluster.primary_of(shard)
        expected = member_docs(cluster, primary, "failover.c")
        for host in cluster.members_of(shard):
            node = cluster.member_node(host)
            if host != primary and node is not None and node.repl.state.name != "DOWN":
                wait_for(lambda: member_docs(cluster, host, "failover.c") == expected
                         or not _alive(cluster, host), what=f"{host} caught up")
    total = sum(len(member_docs(cluster, cluster.primary_of(s), "failover.c"))
                for s in cluster.shard_names)
    assert total == 60
    # the dead member comes back (empty: no dbpath), replays the oplog and has it all
    cluster.restart_member(killed)
    expected = member_docs(cluster, cluster.primary_of("shard1"), "failover.c")
    wait_for(lambda: member_docs(cluster, killed, "failover.c") == expected,
             what="the restarted member caught up")


def _alive(cluster: ShardedCluster, host: str) -> bool:
    member = cluster.cluster._member_at(host)
    return member.running


def test_a_stream_on_secondaries_sees_every_event_in_order(cluster: ShardedCluster) -> None:
    client = cluster.client()
    coll = client.get_database("onsec", write_concern=MAJORITY).c
    split_over_two_shards(client, "onsec.c")
    secondary = client.get_database("onsec", read_preference=pymongo.ReadPreference.SECONDARY).c
    with secondary.watch(full_document="updateLookup") as stream:
        for i in range(20):
            coll.insert_one({"_id": i if i % 2 else -i - 1, "n": i})
        coll.update_one({"_id": 1}, {"$set": {"n": 100}})
        events = [stream.next() for _ in range(21)]
    assert [e["fullDocument"]["n"] for e in events[:20]] == list(range(20)) or \
        sorted(e["fullDocument"]["n"] for e in events[:20]) == list(range(20))
    assert events[-1]["operationType"] == "update"
    assert events[-1]["fullDocument"] == {"_id": 1, "n": 100}


def test_a_secondary_stream_with_a_lagging_secondary_and_a_stepdown_misses_nothing(
        cluster: ShardedCluster) -> None:
    client = cluster.client()
    coll = client.get_database("lagged", write_concern=MAJORITY).c
    split_over_two_shards(client, "lagged.c")
    for shard in cluster.shard_names:
        primary = cluster.primary_of(shard)
        cluster.lag(next(h for h in cluster.members_of(shard) if h != primary), 150)
    on_secondaries = client.get_database(
        "lagged", read_preference=pymongo.ReadPreference.SECONDARY).c
    with on_secondaries.watch(max_await_time_ms=200) as stream:
        for i in range(30):
            coll.insert_one({"_id": i, "x": i if i % 2 else -i - 1})
            if i == 15:
                cluster.step_down("shard0")
        got = [stream.next()["documentKey"]["_id"] for _ in range(30)]
    cluster.heal()
    assert sorted(got) == list(range(30))
    for parity in (0, 1):  # each shard's events in the order of its writes
        assert [g for g in got if g % 2 == parity] == [i for i in range(30) if i % 2 == parity]


def test_a_held_commit_point_holds_majority_writes_and_the_stream(
        cluster: ShardedCluster) -> None:
    client = cluster.client()
    coll = client.get_database("held").c
    client.held.command({"insert": "c", "documents": [{"_id": 0}],
                         "writeConcern": {"w": "majority"}})
    shard = client.config.databases.find_one({"_id": "held"})["primary"]
    with coll.watch(max_await_time_ms=100) as stream:
        cluster.hold_commit_point(shard)
        reply = client.held.command({"insert": "c", "documents": [{"_id": 1}],
                                     "writeConcern": {"w": "majority", "wtimeout": 300}})
        assert reply["n"] == 1 and reply["writeConcernError"]["code"] == 64
        assert stream.try_next() is None  # the write is not majority-committed: no event
        cluster.heal()
        assert stream.next()["documentKey"] == {"_id": 1}


def test_a_cross_shard_transaction_commits_after_its_participants_failed_over(
        cluster: ShardedCluster) -> None:
    client = cluster.client()
    coll = client.get_database("txn2pc", write_concern=MAJORITY).c
    split_over_two_shards(client, "txn2pc.c")
    coll.insert_many([{"_id": -1, "x": -1}, {"_id": 1, "x": 1}])
    for shard in cluster.shard_names:  # neither member 0 is primary any more
        if cluster.primary_of(shard) == cluster.members_of(shard)[0]:
            cluster.step_down(shard)
    with client.start_session() as s:
        with s.start_transaction(write_concern=MAJORITY):
            coll.update_one({"_id": -1}, {"$set": {"t": 1}}, session=s)
            coll.update_one({"_id": 1}, {"$set": {"t": 1}}, session=s)
    assert sorted(d["_id"] for d in coll.find({"t": 1})) == [-1, 1]
    for shard in cluster.shard_names:  # the two-phase commit reached each shard's new primary
        docs = member_docs(cluster, cluster.primary_of(shard), "txn2pc.c")
        assert [d.get("t") for d in docs] == [1]
