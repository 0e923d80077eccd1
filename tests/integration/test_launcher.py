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
import uuid

import pymongo
import pymongo.errors
import pytest

from shardsim.tools.launcher import Cluster, ClusterError, pid_is

pytestmark = pytest.mark.timeout(120)

SHARDSIM = [sys.executable, "-m", "shardsim.tools.cli"]


# Every process of one `shardsim up` run inherits this variable; /proc/<pid>/environ finds them
# all (also a child that a broken launcher left behind, reparented to init).
MARK = "SHARDSIM_TEST_RUN"


def run_processes(marker: str) -> dict[int, list[str]]:
    """pid -> argv of every live (non-zombie) process of the run tagged ``marker``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0") if a]
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"{MARK}={marker}".encode() in env and state != "Z":
            found[int(entry)] = argv
    return found


def role_of(argv: list[str]) -> str | None:
    """``configsvr``/``shard``/``router`` for a role process's argv (after its exec)."""
    if "-m" in argv and argv.index("-m") + 1 < len(argv):
        module = argv[argv.index("-m") + 1]
        role = module.removeprefix("shardsim.")
        return role if module.startswith("shardsim.") and role in ("configsvr", "shard", "router") else None
    return None


def kill_run(marker: str, launcher: subprocess.Popen | None = None) -> None:
    """SIGKILL whatever of the run is left, the launcher first when given (so a failing test
    leaves nothing running)."""
    if launcher is not None and launcher.poll() is None:
        launcher.kill()
        launcher.wait()
    for pid in run_processes(marker):
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
                break
            except OSError:
                pass


def assert_run_gone(marker: str, launcher: subprocess.Popen) -> None:
    """After the launcher exited, no process of its run may be alive. The launcher waits for
    (reaps) every child before it exits, so this checks at once: no grace period, in which an
    orphan that has not printed its ready line yet would die of EPIPE and hide the leak."""
    assert launcher.poll() is not None
    assert run_processes(marker) == {}


def start_up(marker: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, **{MARK: marker})
    return subprocess.Popen([*SHARDSIM, "up", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def run_cli(*args: str, run_dir: str, timeout: float = 60,
            marker: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, **{MARK: marker}) if marker else None
    return subprocess.run([*SHARDSIM, *args, "--run-dir", run_dir], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_up_detach_status_down(tmp_path) -> None:
    run_dir = str(tmp_path / "run")
    marker = uuid.uuid4().hex
    state = None
    try:
        up = run_cli("up", "--detach", "--shards", "2", "--port", "0", run_dir=run_dir,
                     marker=marker)
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
        leftovers = run_processes(marker)
        kill_run(marker)
    assert down.returncode == 0, down.stderr
    assert leftovers == {}
    assert not os.path.exists(os.path.join(run_dir, "cluster.json"))
    for p in state["processes"]:
        assert not pid_is(p["pid"], p["module"])
    st = run_cli("status", run_dir=run_dir)
    assert st.returncode == 1 and "no detached cluster" in st.stdout


def test_foreground_up_stops_everything_on_sigint(tmp_path) -> None:
    marker = uuid.uuid4().hex
    proc = start_up(marker, "--shards", "1", "--port", "0")
    pids: list[tuple[int, str]] = []
    try:
        lines = []
        while True:  # bounded by the test timeout; EOF if the launcher dies
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
        assert {pid for pid, _ in pids} <= set(run_processes(marker))
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert "stopped" in out and "Aborted!" not in out, out
        assert proc.returncode == 0, out
        for pid, module in pids:
            assert not pid_is(pid, module)
        assert_run_gone(marker, proc)
    finally:
        kill_run(marker, proc)


def _wait_for_role(marker: str, launcher: subprocess.Popen, role: str) -> None:
    while launcher.poll() is None:  # bounded by the test timeout
        if any(role_of(argv) == role for argv in run_processes(marker).values()):
            return
        time.sleep(0.002)
    raise AssertionError(f"launcher exited before {role} started: {launcher.stdout.read()}")


def _wait_for_first_shard(launcher: subprocess.Popen, port: int) -> None:
    """Until the router lists shard0: the launcher is then adding shard1 (or just finished)."""
    with pymongo.MongoClient("127.0.0.1", port, directConnection=True,
                             serverSelectionTimeoutMS=200, connectTimeoutMS=200) as client:
        while launcher.poll() is None:  # bounded by the test timeout
            try:
                if client.admin.command("listShards")["shards"]:
                    return
            except pymongo.errors.PyMongoError:
                pass
            time.sleep(0.002)
    raise AssertionError(f"launcher exited before addShard: {launcher.stdout.read()}")


@pytest.mark.parametrize("moment", ["configsvr", "shard", "router", "addShard"])
def test_sigint_during_start_up_leaves_nothing_running(moment) -> None:
    """Ctrl-C while `up` is still starting: at the moment the config server, the shard or the
    router process exists but is not ready yet, or when the router listens (addShard runs).
    Wherever the signal lands, every child is stopped, `up` says so and click never prints
    "Aborted!" (that is a KeyboardInterrupt escaping the cleanup)."""
    marker = uuid.uuid4().hex
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = start_up(marker, "--shards", "2", "--port", str(port))
    try:
        if moment == "addShard":
            _wait_for_first_shard(proc, port)
        else:
            _wait_for_role(marker, proc, moment)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert "Aborted!" not in out and "Traceback" not in out, out
        if proc.returncode == 130:  # stopped during start-up
            assert "interrupted; everything stopped" in out, out
        else:  # the signal came after start-up had finished (a loaded machine)
            assert proc.returncode == 0 and "stopped" in out, out
        assert_run_gone(marker, proc)
    finally:
        kill_run(marker, proc)


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
