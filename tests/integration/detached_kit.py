"""A detached ``shardsim up`` cluster for the tests of the launcher and of ``shardsim fault``
(tests/integration/test_launcher_replset.py, test_fault_cli.py, test_fault_cli_replsets.py).

:func:`detached_cluster` starts one with ``shardsim up --detach`` in a run directory of its own
and always stops it: every process it starts carries a marker in its environment
(:data:`MARK`), so whatever ``shardsim down`` leaves (a stopped or orphaned member) is found
in ``/proc`` and killed, and the test asserts nothing of the run is left. :func:`run_cli` runs
any ``shardsim`` command against the run directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pymongo

SHARDSIM = [sys.executable, "-m", "shardsim.tools.cli"]
MARK = "SHARDSIM_TEST_RUN"
# Small timeouts so that a failover takes about a second (the server's: 10 s election).
FAST = ["--election-timeout-ms", "1000", "--heartbeat-interval-ms", "200",
        "--heartbeat-timeout-ms", "2000"]


def run_cli(*args: str, run_dir: str, marker: str, timeout: float = 90) -> Any:
    """``shardsim ARGS --run-dir RUN_DIR`` with the run's marker; the CompletedProcess."""
    env = dict(os.environ, **{MARK: marker})
    return subprocess.run([*SHARDSIM, *args, "--run-dir", run_dir], capture_output=True,
                          text=True, timeout=timeout, env=env)


def marked_pids(marker: str) -> list[int]:
    """The live (not zombie) processes whose environment carries ``marker``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"{MARK}={marker}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        out.append(int(entry))
    return out


def state_of(run_dir: str) -> dict[str, Any]:
    """The run's state file (``cluster.json``)."""
    with open(os.path.join(run_dir, "cluster.json")) as f:
        return json.load(f)


def stop_run(run_dir: str, marker: str) -> None:
    """``shardsim down`` (stopped members woken first), then SIGKILL anything left."""
    state_file = os.path.join(run_dir, "cluster.json")
    if os.path.exists(state_file):
        with open(state_file) as f:
            for p in json.load(f)["processes"]:
                try:
                    os.kill(p["pid"], signal.SIGCONT)  # a paused member must be able to stop
                except OSError:
                    pass
    run_cli("down", run_dir=run_dir, marker=marker)
    for pid in marked_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@dataclass
class Run:
    """A detached cluster: its run directory, marker and the ``up`` output."""

    run_dir: str
    marker: str
    stdout: str

    def cli(self, *args: str, ok: bool = True, timeout: float = 90) -> Any:
        """``shardsim ARGS`` on this run; with ``ok`` it must exit 0."""
        r = run_cli(*args, run_dir=self.run_dir, marker=self.marker, timeout=timeout)
        if ok:
            assert r.returncode == 0, f"shardsim {' '.join(args)}: {r.stderr}{r.stdout}"
        return r

    def state(self) -> dict[str, Any]:
        return state_of(self.run_dir)


@contextlib.contextmanager
def detached_cluster(tmp_path: Any, *up_args: str) -> Iterator[Run]:
    """``shardsim up --detach --port 0 UP_ARGS`` in ``tmp_path/run``; stopped on exit, and
    nothing of it may be left running."""
    run_dir, marker = str(tmp_path / "run"), uuid.uuid4().hex
    try:
        up = run_cli("up", "--detach", "--port", "0", *up_args, run_dir=run_dir, marker=marker)
        assert up.returncode == 0, up.stderr + up.stdout
        yield Run(run_dir, marker, up.stdout)
    finally:
        stop_run(run_dir, marker)
    assert marked_pids(marker) == []


def direct(address: str, **kw: Any) -> Any:
    """A pymongo client on one member (``directConnection``)."""
    host, port = address.rsplit(":", 1)
    return pymongo.MongoClient(host, int(port), directConnection=True,
                               serverSelectionTimeoutMS=kw.pop("serverSelectionTimeoutMS",
                                                               5000), **kw)


def member_state(address: str) -> str:
    """``PRIMARY``, ``SECONDARY`` or ``OTHER`` by the member's ``hello``."""
    with direct(address, serverSelectionTimeoutMS=3000) as client:
        hello = client.admin.command("hello")
    return "PRIMARY" if hello.get("isWritablePrimary") else \
        "SECONDARY" if hello.get("secondary") else "OTHER"


def count_on(address: str, coll: str, timeout: float = 20.0, want: int | None = None) -> int:
    """Documents of ``test.<coll>`` on one member (secondary reads allowed), waiting up to
    ``timeout`` s for ``want`` of them."""
    with direct(address, readPreference="secondaryPreferred") as client:
        deadline = time.monotonic() + timeout
        while True:
            n = client.test[coll].count_documents({})
            if want is None or n == want or time.monotonic() > deadline:
                return n
            time.sleep(0.1)
