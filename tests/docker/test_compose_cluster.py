"""The docker compose mini cluster (deploy/): built offline on this machine, used from the host.

One compose project for the whole module (fixture ``compose_cluster`` in conftest.py): the
image is built with deploy/build-image.sh (wheels from the host, local debootstrap base image
when no registry is reachable), the cluster is brought up with a unique project name and the
router on a free loopback port, and it is always taken down with ``down -v``.

The tests run in file order: the shard-kill test disrupts the cluster and the last test checks
that ``down -v`` leaves nothing behind. They skip only when there is no usable Docker engine.
"""

from __future__ import annotations

import os
import sys
import subprocess
import time
from pathlib import Path

import pymongo
import pytest
from pymongo.errors import OperationFailure

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

SHARDS = ["shard0", "shard1", "shard2"]
ROLES = ["configsvr", *SHARDS, "router", "router2"]



def client_for(cluster) -> pymongo.MongoClient:
    return pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=10_000, connectTimeoutMS=5_000,
                               socketTimeoutMS=60_000)


def shard_count(cluster, shard: str, db: str, coll: str) -> int:
    """Documents of ``db.coll`` stored on ``shard``, asked of the shard itself inside its
    container (the shards are not published on the host)."""
    code = ("import pymongo; c = pymongo.MongoClient('127.0.0.1', 27017, directConnection=True, "
            "serverSelectionTimeoutMS=5000); "
            f"print(c[{db!r}][{coll!r}].count_documents({{}}))")
    r = cluster.exec(shard, "python", "-c", code)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def shard_collection(client: pymongo.MongoClient, db: str, coll: str) -> None:
    """Shard ``db.coll`` on a hashed _id: an empty collection gets chunks round-robin over all
    shards, so sequential _ids land on every shard."""
    client.admin.command("enableSharding", db)
    client.admin.command("shardCollection", f"{db}.{coll}", key={"_id": "hashed"})


def test_cluster_is_up_with_three_shards(compose_cluster):
    """init added the three shards; every role is healthy and runs as a non-root user."""
    c = compose_cluster
    with client_for(c) as client:
        assert client.admin.command("hello")["msg"] == "isdbgrid"
        shards = client.admin.command("listShards")["shards"]
    assert sorted(s["_id"] for s in shards) == SHARDS
    assert sorted(s["host"] for s in shards) == [f"{s}/{s}:27017" for s in SHARDS]
    for role in ROLES:
        assert c.health(role) == "healthy", role
        r = c.exec(role, "id", "-u")
        assert r.returncode == 0 and r.stdout.strip() != "0", (role, r.stdout, r.stderr)
    # The init service is a one-shot that succeeded.
    init = c.inspect(c.container("init"))["State"]
    assert (init["Status"], init["ExitCode"]) == ("exited", 0)


def test_up_again_is_harmless(compose_cluster):
    """`up -d` on a running cluster reruns the one-shot init, which skips the added shards."""
    c = compose_cluster
    c.up()
    assert "shard0 already added" in c.logs("init")
    with client_for(c) as client:
        assert sorted(s["_id"] for s in client.admin.command("listShards")["shards"]) == SHARDS


def test_spark_profile_services(compose_cluster):
    """The spark profile adds a master, a worker and the load job aimed at the router; without
    the profile none of them is part of the project. (Running it needs the ~1.6 GB Spark image:
    docs/docker.md.)"""
    c = compose_cluster
    plain = {"configsvr", *SHARDS, "router", "router2", "init"}
    spark = set(c.compose("--profile", "spark", "config", "--services").stdout.split())
    assert spark == plain | {"spark-master", "spark-worker", "load"}
    # `up` without the profile started only the plain services.
    running = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={c.project}",
         "--format", '{{.Label "com.docker.compose.service"}}'],
        capture_output=True, text=True, check=True, timeout=30).stdout.split()
    assert sorted(running) == sorted(plain)
    config = " ".join(c.compose("--profile", "spark", "config").stdout.split())  # YAML folds lines
    assert "shardsim load --spark-master spark://spark-master:7077 --uri mongodb://router:27017" in config
    assert "service_completed_successfully" in config


def test_watch_through_router_gets_every_event_in_order(compose_cluster):
    """A change stream on the router sees every write to a collection sharded over all three
    shards, in write order, with strictly increasing resume tokens."""
    c = compose_cluster
    n = 60
    with client_for(c) as client:
        shard_collection(client, "dockerwatch", "events")
        coll = client.dockerwatch.events
        with coll.watch(max_await_time_ms=500) as stream:
            for i in range(n):
                coll.insert_one({"_id": i, "payload": "x" * i})
            coll.update_one({"_id": 7}, {"$set": {"touched": True}})
            coll.delete_one({"_id": 8})
            events = []
            deadline = time.monotonic() + 60
            while len(events) < n + 2 and time.monotonic() < deadline:
                ev = stream.try_next()
                if ev is not None:
                    events.append(ev)
    assert len(events) == n + 2, f"got {len(events)} of {n + 2} events"
    assert [e["operationType"] for e in events] == ["insert"] * n + ["update", "delete"]
    assert [e["documentKey"]["_id"] for e in events] == list(range(n)) + [7, 8]
    assert events[0]["fullDocument"] == {"_id": 0, "payload": ""}
    assert events[n]["updateDescription"]["updatedFields"] == {"touched": True}
    tokens = [e["_id"]["_data"] for e in events]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    times = [e["clusterTime"] for e in events]
    assert times == sorted(times)
    # The writes really went to all three shards.
    counts = {s: shard_count(c, s, "dockerwatch", "events") for s in SHARDS}
    assert sum(counts.values()) == n - 1 and all(counts.values()), counts


def test_spec_command_against_compose_cluster(compose_cluster):
    """`shardsim spec --uri` (the unified change-stream spec tests) passes against the router."""
    shardsim = Path(sys.executable).with_name("shardsim")
    cmd = [str(shardsim)] if shardsim.exists() else [sys.executable, "-m", "shardsim.tools.cli"]
    r = subprocess.run([*cmd, "spec", "--uri", compose_cluster.uri], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, NO_COLOR="1", COLUMNS="200"))
    # The report is a table with one row per test: keep the rows that are not passes/skips.
    rows = [line for line in r.stdout.splitlines() if " passed " not in line and " skipped " not in line]
    report = "\n".join(rows)[-8000:]
    assert r.returncode == 0, f"shardsim spec failed ({r.returncode}):\n{report}\n{r.stderr[-3000:]}"
    assert " passed" in r.stdout.splitlines()[-1] or " passed" in r.stdout[-300:], r.stdout[-2000:]


def _is_resumable(exc: OperationFailure) -> bool:
    """pymongo's rule for a server >= 4.4 (change_stream_shared._resumable; driver
    change-streams spec "Resumable Error"): the ResumableChangeStreamError label, or
    CursorNotFound (43)."""
    return exc.has_error_label("ResumableChangeStreamError") or exc.code == 43


def test_killed_shard_fails_stream_resumably_and_resume_loses_nothing(compose_cluster):
    """SIGKILL one shard mid-stream: the router's getMore fails with a resumable error; after
    `start` the shard reopens its durable volume and a stream resumed from the last token
    delivers every remaining event in order, none lost or repeated."""
    c = compose_cluster
    db_name, coll_name = "dockerkill", "events"
    with client_for(c) as client, client.start_session() as session:
        shard_collection(client, db_name, coll_name)
        db, coll = client[db_name], client[db_name][coll_name]
        # A raw change-stream cursor, so the resumable error is seen instead of being resumed
        # silently by the driver.
        reply = db.command({"aggregate": coll_name, "pipeline": [{"$changeStream": {}}],
                            "cursor": {}}, session=session)
        cursor_id = reply["cursor"]["id"]
        seen = list(reply["cursor"]["firstBatch"])

        def get_more() -> list:
            r = db.command({"getMore": cursor_id, "collection": coll_name, "maxTimeMS": 1000},
                           session=session)
            return list(r["cursor"]["nextBatch"])

        for i in range(30):
            coll.insert_one({"_id": i})
        deadline = time.monotonic() + 60
        while len(seen) < 30 and time.monotonic() < deadline:
            seen += get_more()
        assert [e["documentKey"]["_id"] for e in seen] == list(range(30))

        # Acknowledged (hence durable) on every shard before the kill.
        for i in range(30, 60):
            coll.insert_one({"_id": i})
        assert shard_count(c, "shard1", db_name, coll_name) > 0
        c.compose("kill", "shard1")
        assert c.health("shard1") == "exited"

        error = None
        deadline = time.monotonic() + 90
        while error is None and time.monotonic() < deadline:
            try:
                seen += get_more()
            except OperationFailure as exc:
                error = exc
        assert error is not None, "the stream never failed with shard1 killed"
        assert _is_resumable(error), f"not a resumable change-stream error: {error.details}"
        # Whatever came before the failure is still an in-order prefix.
        got = [e["documentKey"]["_id"] for e in seen]
        assert got == list(range(len(got))), got
        last_token = seen[-1]["_id"]

    c.compose("start", "shard1")
    c.wait_healthy("shard1")

    with client_for(c) as client:
        coll = client[db_name][coll_name]
        for i in range(60, 90):
            coll.insert_one({"_id": i})
        rest = []
        with coll.watch(resume_after=last_token, max_await_time_ms=500) as stream:
            deadline = time.monotonic() + 90
            while len(got) + len(rest) < 90 and time.monotonic() < deadline:
                ev = stream.try_next()
                if ev is not None:
                    rest.append(ev["documentKey"]["_id"])
    assert got + rest == list(range(90)), f"resumed after {got[-1]}: {rest}"
    # The killed shard kept its documents (durable volume).
    assert sum(shard_count(c, s, db_name, coll_name) for s in SHARDS) == 90


def test_down_removes_containers_networks_and_volumes(compose_cluster):
    """`down -v` leaves no container, network or volume of the project behind."""
    c = compose_cluster
    before = c.leftovers()
    # configsvr, shard0-2, router, router2, init
    assert len(before["containers"]) == 7 and before["volumes"] and before["networks"], before
    c.down()
    assert c.leftovers() == {"containers": [], "networks": [], "volumes": []}
