"""The launcher: ``shardsim up --detach`` / ``status`` / ``down``, foreground ``up`` stopped by
a signal, port clashes and a process dying at start (nothing may be left running)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pymongo
import pytest

from shardsim.launcher import Cluster, ClusterError, pid_is

pytestmark = pytest.mark.timeout(120)

SHARDSIM = [sys.executable, "-m", "shardsim.cli"]


def run_cli(*args: str, run_dir: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*SHARDSIM, *args, "--run-dir", run_dir], capture_output=True,
                          text=True, timeout=timeout)


def test_up_detach_status_down(tmp_path) -> None:
    run_dir = str(tmp_path / "run")
    up = run_cli("up", "--detach", "--shards", "2", "--port", "0", run_dir=run_dir)
    state = None
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        uri = re.search(r"mongodb://[\d.]+:\d+/", up.stdout).group(0)
        state = json.load(open(os.path.join(run_dir, "cluster.json")))
        assert state["router_uri"] == uri
        assert [p["name"] for p in state["processes"]] == ["configsvr", "shard0", "shard1", "router"]
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as c:
            assert len(c.admin.command("listShards")["shards"]) == 2
        st = run_cli("status", run_dir=run_dir)
        assert st.returncode == 0, st.stdout
        assert st.stdout.count("running") == 4
        again = run_cli("up", "--detach", "--port", "0", run_dir=run_dir)
        assert again.returncode != 0 and "already running" in again.stderr
    finally:
        down = run_cli("down", run_dir=run_dir)
    assert down.returncode == 0, down.stderr
    assert not os.path.exists(os.path.join(run_dir, "cluster.json"))
    for p in state["processes"]:
        assert not pid_is(p["pid"], p["module"])
    st = run_cli("status", run_dir=run_dir)
    assert st.returncode == 1 and "no detached cluster" in st.stdout


def test_foreground_up_stops_everything_on_sigint(tmp_path) -> None:
    proc = subprocess.Popen([*SHARDSIM, "up", "--shards", "1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids: list[tuple[int, str]] = []
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"pid (\d+)", line)
            if m:
                module = {"config": "configsvr", "shard": "shard", "router": "router"}[line.split()[1]]
                pids.append((int(m.group(1)), module))
            if "Ctrl-C" in line:
                break
        assert len(pids) == 3, "".join(lines)
        assert all(pid_is(pid, module) for pid, module in pids)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid, module in pids:
        assert not pid_is(pid, module)


def test_port_clash_is_reported_and_nothing_runs(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cluster = Cluster(shards=1, port=port, base_dir=str(tmp_path / "c"))
        with pytest.raises(ClusterError, match="already in use"):
            cluster.start()
        assert not any(p.alive() for p in cluster.processes)
        res = run_cli("up", "--port", str(port), run_dir=str(tmp_path / "run"))
        assert res.returncode == 1 and "already in use" in res.stderr


def test_process_dying_at_start_stops_the_others(tmp_path) -> None:
    cluster = Cluster(shards=2, base_dir=str(tmp_path / "c"), shard_args=["--no-such-flag"])
    with pytest.raises(ClusterError, match="shard0 did not start"):
        cluster.start()
    assert cluster.config is not None and not cluster.config.alive()
    assert not any(p.alive() for p in cluster.processes)


def test_cluster_context_manager_durable(tmp_path) -> None:
    base = tmp_path / "durable"
    with Cluster(shards=1, base_dir=str(base), durable=True) as cluster:
        with pymongo.MongoClient(cluster.router_uri) as c:
            c.d.c.insert_one({"_id": 1})
        procs = cluster.processes
    assert not any(p.alive() for p in procs)
    assert (base / "data" / "shard0").is_dir()


def test_durable_cluster_restarts_with_its_data(tmp_path) -> None:
    base = str(tmp_path / "d")
    with Cluster(shards=2, base_dir=base, durable=True) as cluster:
        with pymongo.MongoClient(cluster.router_uri) as c:
            c.admin.command("shardCollection", "keep.c", key={"_id": "hashed"})
            c.keep.c.insert_many([{"_id": i} for i in range(50)])
        ports = {p.name: p.port for p in cluster.shards}
    with Cluster(shards=2, base_dir=base, durable=True) as cluster:
        assert {p.name: p.port for p in cluster.shards} == ports
        with pymongo.MongoClient(cluster.router_uri) as c:
            assert c.keep.c.count_documents({}) == 50
            assert c.config.collections.find_one({"_id": "keep.c"})["key"] == {"_id": "hashed"}
