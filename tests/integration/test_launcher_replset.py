"""``shardsim up --topology replicaset --members 3`` and ``--members 3`` for the shards, with the
replica-set faults of ``shardsim fault`` (step-down, kill-primary, restart-member, isolate,
heal, freeze): real member processes on free loopback ports, always stopped (nothing of a run
may be left running: every process carries a marker in its environment)."""

from __future__ import annotations

import os
import re
import time
import uuid
from typing import Any, Iterator

import pymongo
import pymongo.errors
import pytest

from detached_kit import (FAST, count_on, detached_cluster, marked_pids, member_state, run_cli,
                          state_of, stop_run)
from shardsim.tools.launcher import Cluster

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def replset(tmp_path: Any) -> Iterator[tuple[str, str, str]]:
    # test commands on: isolate and heal cut and restore links with _shardsimCutLinks
    with detached_cluster(tmp_path, "--topology", "replicaset", "--members", "3",
                          "--enable-test-commands", *FAST) as run:
        uri = re.search(r"mongodb://\S+\?replicaSet=rs0", run.stdout).group(0)
        yield run.run_dir, run.marker, uri


def test_replica_set_up_status_failover_restart_step_down(replset: Any) -> None:
    run_dir, marker, uri = replset
    state = state_of(run_dir)
    assert state["topology"] == "replicaset" and state["uri"] == uri
    assert "router_uri" not in state
    assert state["sets"] == {"rs0": ["rs0", "rs0-1", "rs0-2"]}
    members = [f"{p['host']}:{p['port']}" for p in state["processes"]]
    assert uri == f"mongodb://{','.join(members)}/?replicaSet=rs0"
    for p in state["processes"]:  # never initiated again on a restart
        assert "--initiate" not in p["args"] and p["set"] == "rs0"
        assert p["args"][p["args"].index("--members") + 1] == ",".join(members)
    status = run_cli("status", run_dir=run_dir, marker=marker)
    assert status.returncode == 0, status.stdout
    assert status.stdout.count("PRIMARY") == 1 and status.stdout.count("SECONDARY") == 2

    client: Any = pymongo.MongoClient(uri, w="majority", serverSelectionTimeoutMS=20000,
                                      retryWrites=True)
    try:
        hello = client.admin.command("hello")
        assert hello["setName"] == "rs0" and sorted(hello["hosts"]) == sorted(members)
        client.test.c.insert_many([{"_id": i} for i in range(10)])  # w: majority

        killed = run_cli("fault", "kill-primary", run_dir=run_dir, marker=marker)
        assert killed.returncode == 0, killed.stderr
        old = re.search(r"primary (\S+) killed", killed.stdout).group(1)
        assert old in members
        started = time.monotonic()
        client.test.c.insert_many([{"_id": i} for i in range(10, 20)])  # on the new primary
        took = time.monotonic() - started
        new = "%s:%d" % client.primary
        assert new != old and member_state(new) == "PRIMARY"
        assert took < 15, took  # election timeout 1 s (+ jitter, catch-up, discovery)
        assert client.test.c.count_documents({}) == 20  # majority writes survive the failover

        restarted = run_cli("fault", "restart-member", old, run_dir=run_dir, marker=marker)
        assert restarted.returncode == 0, restarted.stderr
        assert f"{old} restarted on {old}" in restarted.stdout
        assert count_on(old, "c", want=20) == 20  # caught up (from its sync source)
        assert member_state(old) == "SECONDARY"

        stepped = run_cli("fault", "step-down", "--secs", "5", run_dir=run_dir, marker=marker)
        assert stepped.returncode == 0, stepped.stderr
        m = re.search(r"rs0: (\S+) stepped down; new primary (\S+)", stepped.stdout)
        assert m and m.group(1) == new and m.group(2) != new
        client.test.c.insert_one({"_id": 20})
        assert "%s:%d" % client.primary == m.group(2)
        assert all(count_on(h, "c", want=21) == 21 for h in members)
    finally:
        client.close()


def test_isolate_heal_freeze(replset: Any) -> None:
    run_dir, marker, uri = replset
    members = [f"{p['host']}:{p['port']}" for p in state_of(run_dir)["processes"]]
    client: Any = pymongo.MongoClient(uri, w="majority", serverSelectionTimeoutMS=20000)
    try:
        client.test.c.insert_one({"_id": 0})
        old = "%s:%d" % client.primary
        cut = run_cli("fault", "isolate", old, run_dir=run_dir, marker=marker)
        assert cut.returncode == 0 and f"{old} isolated" in cut.stdout, cut.stderr
        assert [p for p in state_of(run_dir)["processes"] if p.get("isolated")]
        client.test.c.insert_one({"_id": 1})  # the two others elect a primary
        new = "%s:%d" % client.primary
        assert new != old
        healed = run_cli("fault", "heal", run_dir=run_dir, marker=marker)
        assert healed.returncode == 0, healed.stderr
        assert not [p for p in state_of(run_dir)["processes"] if p.get("isolated")]
        deadline = time.monotonic() + 20
        while member_state(old) != "SECONDARY":  # woke up, heard of the new term
            assert time.monotonic() < deadline, member_state(old)
            time.sleep(0.1)
        assert count_on(old, "c", want=2) == 2

        secondary = next(h for h in members if h != new)
        frozen = run_cli("fault", "freeze", secondary, "30", run_dir=run_dir, marker=marker)
        assert frozen.returncode == 0 and f"{secondary} frozen for 30 s" in frozen.stdout
        refused = run_cli("fault", "freeze", new, "30", run_dir=run_dir, marker=marker)
        assert refused.returncode == 1
        assert "Cannot freeze node when primary" in refused.stderr and "(code 95)" in refused.stderr
        # The frozen secondary cannot stand: a step-down hands off to the other one.
        stepped = run_cli("fault", "step-down", "rs0", run_dir=run_dir, marker=marker)
        assert stepped.returncode == 0, stepped.stderr
        third = next(h for h in members if h not in (new, secondary))
        assert stepped.stdout.strip().endswith(f"new primary {third}"), stepped.stdout
        unknown = run_cli("fault", "step-down", "rs9", run_dir=run_dir, marker=marker)
        assert unknown.returncode == 1 and "no replica set named 'rs9'" in unknown.stderr
    finally:
        client.close()


def test_durable_replica_set_comes_back_without_initiating_again(tmp_path: Any) -> None:
    """``--dbpath``: a member directory each; ``down`` then ``up`` on the same dbpath starts
    the same set (same ports, no --initiate) with every member's oplog, and elects a primary.
    (Documents applied on secondaries are not checked here: the interim applier,
    shard/replication/applier.py, applies them in memory only; docs/replication.md.)"""
    run_dir, marker = str(tmp_path / "run"), uuid.uuid4().hex
    data = str(tmp_path / "data")
    try:
        up = run_cli("up", "--detach", "--topology", "replicaset", "--members", "3", "--port",
                     "0", "--dbpath", data, *FAST, run_dir=run_dir, marker=marker)
        assert up.returncode == 0, up.stderr + up.stdout
        uri = state_of(run_dir)["uri"]
        assert sorted(os.listdir(os.path.join(data, "data"))) == \
            ["ports.json", "rs0", "rs0-1", "rs0-2"]
        with pymongo.MongoClient(uri, w="majority", serverSelectionTimeoutMS=20000) as client:
            client.test.c.insert_many([{"_id": i} for i in range(5)])
        assert run_cli("down", run_dir=run_dir, marker=marker).returncode == 0
        again = run_cli("up", "--detach", "--topology", "replicaset", "--members", "3",
                        "--port", "0", "--dbpath", data, *FAST, run_dir=run_dir, marker=marker)
        assert again.returncode == 0, again.stderr + again.stdout
        assert state_of(run_dir)["uri"] == uri  # same ports: the members know each other
        with pymongo.MongoClient(uri, w="majority", serverSelectionTimeoutMS=20000) as client:
            client.test.c.insert_one({"_id": 5})  # a primary, and a majority behind it
        inserts = []
        for p in state_of(run_dir)["processes"]:  # every member: its oplog survived, and the
            assert "--initiate" not in p["args"]  # set was initiated exactly once
            with pymongo.MongoClient(p["host"], p["port"], directConnection=True,
                                     serverSelectionTimeoutMS=10000) as member:
                oplog = member.local["oplog.rs"]
                assert oplog.count_documents({"o.msg": "initiating set"}) == 1, p["name"]
                deadline = time.monotonic() + 20
                while oplog.count_documents({"op": "i", "ns": "test.c"}) < 6:
                    assert time.monotonic() < deadline, p["name"]
                    time.sleep(0.1)
                inserts.append([e["o"]["_id"] for e in oplog.find({"op": "i", "ns": "test.c"})])
        assert inserts == [[0, 1, 2, 3, 4, 5]] * 3
    finally:
        stop_run(run_dir, marker)
    assert marked_pids(marker) == []


def test_sharded_cluster_with_replica_set_shards_plumbing(tmp_path: Any) -> None:
    """``Cluster(shards=2, members=3)``: every shard three processes (shardN, shardN-1,
    shardN-2) of set shardN, a primary each, added as ``shardN/h1,h2,h3``; the config server
    three processes (configsvr, configsvr-1, configsvr-2) of set ``config`` (``configsvr:
    true``), the router on ``--configdb config/h1,h2,h3``, still serving DDL after its primary
    is killed; ``members=1`` keeps one process per shard and one config server."""
    with Cluster(shards=2, members=3, base_dir=str(tmp_path / "c"),
                 repl_args=FAST) as cluster:
        names = [p.name for p in cluster.shards]
        assert names == ["shard0", "shard0-1", "shard0-2", "shard1", "shard1-1", "shard1-2"]
        configs = [p.name for p in cluster.config_members]
        assert configs == ["configsvr", "configsvr-1", "configsvr-2"]
        assert sorted(cluster.sets) == ["config", "shard0", "shard1"]
        state = cluster.state()
        assert state["topology"] == "sharded" and state["uri"] == cluster.router_uri
        assert state["sets"] == {"config": configs, "shard0": names[:3], "shard1": names[3:]}
        for name in ("shard0", "shard1"):
            members = cluster.sets[name]
            assert cluster.shard_connection_string(name) == \
                f"{name}/" + ",".join(m.address for m in members)
            primaries = [m for m in members if member_state(m.address) == "PRIMARY"]
            assert len(primaries) == 1
            hello = cluster._member_command(members[1], {"hello": 1})
            assert hello["setName"] == name
            assert hello["hosts"] == [m.address for m in members]
        shards = cluster.admin_command({"listShards": 1})["shards"]
        assert sorted(s["_id"] for s in shards) == ["shard0", "shard1"]
        config_hosts = [m.address for m in cluster.config_members]
        assert cluster.configdb == "config/" + ",".join(config_hosts)
        status = cluster.admin_command({"serverStatus": 1})
        assert status["sharding"]["configsvrConnectionString"] == cluster.configdb
        conf = cluster._member_command(cluster.config_members[1], {"replSetGetConfig": 1})
        assert conf["config"]["configsvr"] is True and conf["config"]["_id"] == "config"
        primary = next(m for m in cluster.config_members if member_state(m.address) == "PRIMARY")
        primary.kill()
        deadline = time.monotonic() + 30
        while True:  # the router finds the new config primary
            try:
                cluster.admin_command({"shardCollection": "after.c", "key": {"_id": "hashed"}})
                break
            except pymongo.errors.PyMongoError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert cluster.admin_command({"listShards": 1})["ok"] == 1
    with Cluster(shards=2, base_dir=str(tmp_path / "one")) as cluster:
        assert [p.name for p in cluster.shards] == ["shard0", "shard1"]
        assert cluster.sets == {} and "--members" not in cluster.shards[0].args
        assert [p.name for p in cluster.config_members] == ["configsvr"]
        assert "--members" not in cluster.config.args


def test_replica_set_faults_need_a_cluster_of_replica_sets(tmp_path: Any) -> None:
    """On a detached cluster without sets the replica-set faults say what to start; unknown
    members are named with the ones there are; bad topologies are refused."""
    from click.testing import CliRunner

    from shardsim.tools import fault_cli
    from shardsim.tools.launcher import write_state

    run_dir = str(tmp_path / "run")
    write_state(run_dir, {"topology": "sharded", "uri": "mongodb://127.0.0.1:1/",
                          "router_uri": "mongodb://127.0.0.1:1/", "processes": [
                              {"name": "shard0", "module": "shard", "pid": 0,
                               "host": "127.0.0.1", "port": 1, "log": "", "args": []}]})
    for args in (["step-down"], ["kill-primary", "shard0"]):
        out = CliRunner().invoke(fault_cli.fault, [*args, "--run-dir", run_dir])
        assert out.exit_code == 1
        assert "no replica set of more than one member" in out.output
        assert "--topology replicaset --members 3" in out.output
    out = CliRunner().invoke(fault_cli.fault, ["freeze", "127.0.0.1:9", "5", "--run-dir", run_dir])
    assert out.exit_code == 1 and "no member at '127.0.0.1:9'" in out.output
    assert "shard0 (127.0.0.1:1)" in out.output
    out = CliRunner().invoke(fault_cli.fault, ["heal", "--run-dir", run_dir])
    assert out.exit_code == 0 and "healed: nothing was isolated" in out.output
    with pytest.raises(ValueError):
        Cluster(topology="single")
    with pytest.raises(ValueError):
        Cluster(topology="replicaset", members=0)
