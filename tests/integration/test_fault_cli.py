"""``shardsim fault ...`` and ``shardsim top --once`` on a detached ``shardsim up`` cluster
(always stopped, nothing left running)."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import pymongo
import pytest

from detached_kit import detached_cluster, run_cli
from shardsim.testing.helpers import read_events, split_over_two_shards
from pymongo.errors import OperationFailure

pytestmark = pytest.mark.timeout(180)

@pytest.fixture
def detached(tmp_path: Any) -> Any:
    with detached_cluster(tmp_path, "--shards", "2", "--dbpath", str(tmp_path / "data"),
                          "--enable-test-commands") as run:
        uri = re.search(r"mongodb://[\d.]+:\d+/", run.stdout).group(0)
        yield run.run_dir, run.marker, uri


def test_pause_top_resume_kill_restart(detached: Any) -> None:
    run_dir, marker, uri = detached
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000) as client:
        primary, other = split_over_two_shards(client, "f.c")
        coll = client.f.c
        with coll.watch(max_await_time_ms=100) as stream:
            r = run_cli("fault", "pause-shard", other, run_dir=run_dir, marker=marker)
            assert r.returncode == 0, r.stderr
            coll.insert_one({"_id": 1, "x": -1})
            assert read_events(stream, 1, 1.0) == []             # held back by the stopped shard
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                top = run_cli("top", "--once", run_dir=run_dir, marker=marker)
                assert top.returncode == 0, top.stderr
                row = next((ln for ln in top.stdout.splitlines() if f" {other} " in ln), "")
                if "WAITING" in row:
                    break
                time.sleep(0.2)
            assert "WAITING" in row, top.stdout
            assert "f.c" in top.stdout and primary in top.stdout and "config" in top.stdout
            r = run_cli("fault", "resume-shard", other, run_dir=run_dir, marker=marker)
            assert r.returncode == 0, r.stderr
            assert [e["documentKey"]["_id"] for e in read_events(stream, 1, 10)] == [1]

            old_pid = next(p["pid"] for p in json.load(open(os.path.join(run_dir, "cluster.json")))
                           ["processes"] if p["name"] == other)
            r = run_cli("fault", "kill-shard", other, run_dir=run_dir, marker=marker)
            assert r.returncode == 0, r.stderr
            r = run_cli("fault", "restart-shard", other, run_dir=run_dir, marker=marker)
            assert r.returncode == 0, r.stderr
            new = next(p for p in json.load(open(os.path.join(run_dir, "cluster.json")))
                       ["processes"] if p["name"] == other)
            assert new["pid"] != old_pid
            coll.insert_many([{"_id": 2, "x": 5}, {"_id": 3, "x": -5}])
            got = read_events(stream, 2, 20)
        assert [e["documentKey"]["_id"] for e in got] == [2, 3]
        assert coll.count_documents({}) == 3                # durable: the shard kept _id 1..


def test_noop_interval_truncate_oplog_and_fail_point(detached: Any) -> None:
    run_dir, marker, uri = detached
    r = run_cli("fault", "noop-interval", "200", run_dir=run_dir, marker=marker)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("no-op interval 200 ms") == 3      # two shards and the config server
    state = json.load(open(os.path.join(run_dir, "cluster.json")))
    shard0 = next(p for p in state["processes"] if p["name"] == "shard0")
    with pymongo.MongoClient(shard0["host"], shard0["port"], directConnection=True) as d:
        assert d.admin.command("getParameter", 1,
                               periodicNoopIntervalSecs=1)["periodicNoopIntervalSecs"] == 0.2
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000) as client:
        coll = client.g.c
        coll.insert_one({"x": 1})
        with coll.watch() as stream:
            coll.insert_one({"x": 2})
            token = read_events(stream, 1, 10)[0]["_id"]
        coll.insert_one({"x": 3})
        primary = client.config.databases.find_one({"_id": "g"})["primary"]
        r = run_cli("fault", "truncate-oplog", primary, run_dir=run_dir, marker=marker)
        assert r.returncode == 0, r.stderr
        assert re.search(r"\d+ oplog entries removed", r.stdout)
        with pytest.raises(OperationFailure) as info:
            with coll.watch(resume_after=token) as s:
                s.next()
        assert info.value.code == 286
        assert info.value.has_error_label("NonResumableChangeStreamError")

        r = run_cli("fault", "fail-point", "router", "failCommand", "--mode", '{"times": 1}',
                    "--data", '{"failCommands": ["find"], "errorCode": 2}',
                    run_dir=run_dir, marker=marker)
        assert r.returncode == 0, r.stderr
        with pytest.raises(OperationFailure) as info:
            coll.find_one({})
        assert info.value.code == 2
        assert coll.find_one({"x": 3}) is not None          # times: 1, then off

    bad = run_cli("fault", "pause-shard", "nope", run_dir=run_dir, marker=marker)
    assert bad.returncode != 0 and "no shard named 'nope'" in bad.stderr


def test_stalled_promises_and_same_cluster_time(detached: Any) -> None:
    run_dir, marker, uri = detached

    def cli(*args: str) -> Any:
        r = run_cli("fault", *args, run_dir=run_dir, marker=marker)
        assert r.returncode == 0, r.stderr
        return r

    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000) as client:
        primary, other = split_over_two_shards(client, "pr.c")
        coll = client.pr.c
        coll.insert_many([{"x": -1000}, {"x": 1000}])
        with coll.watch(max_await_time_ms=100) as stream:
            assert "promises stalled" in cli("stall-promises", other).stdout
            coll.insert_one({"_id": 1, "x": -1})
            assert read_events(stream, 1, 1.5) == []             # held: the other shard promises nothing
            assert coll.count_documents({"x": {"$gte": 0}}) == 1  # ... but serves commands
            cli("clear-promises", other)
            assert [e["documentKey"]["_id"] for e in read_events(stream, 1, 10)] == [1]

            assert "delayed by 300 ms" in cli("slow-promises", other, "300").stdout
            cli("clear-promises", other)

            out = cli("same-cluster-time", primary, other).stdout
            secs, inc = re.search(r"next write at (\d+),(\d+)", out).groups()
            coll.insert_one({"_id": "b", "x": 1})
            coll.insert_one({"_id": "a", "x": -1})
            got = read_events(stream, 2, 10) + read_events(stream, 1, 1.0)
        assert [e["documentKey"]["_id"] for e in got] == ["a", "b"]  # token order, once each
        assert {(e["clusterTime"].time, e["clusterTime"].inc) for e in got} == \
            {(int(secs), int(inc))}
