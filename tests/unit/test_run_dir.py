"""Detached clusters' run directories: one per user and router port, the only one found when no
port is given, a clear error when there are several, and ``shardsim down`` refusing a state
file another user owns (``shardsim.tools.launcher.default_run_dir`` / ``check_owner``)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from shardsim.tools import launcher
from shardsim.tools.launcher import ClusterError, check_owner, default_run_dir, state_path
from shardsim.tools.launcher_cli import down


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    monkeypatch.delenv("SHARDSIM_RUN_DIR", raising=False)
    monkeypatch.setattr(launcher.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path


def _state(run_dir: str, port: int) -> None:
    launcher.write_state(run_dir, {"router_uri": f"mongodb://127.0.0.1:{port}/",
                                   "processes": [{"name": "router", "module": "shardsim.router",
                                                  "host": "127.0.0.1", "port": port,
                                                  "pid": 999999}]})


def test_one_directory_per_port(tmp_root) -> None:
    uid = os.getuid()
    assert default_run_dir(27017) == str(tmp_root / f"shardsim-{uid}-27017")
    assert default_run_dir(28000) == str(tmp_root / f"shardsim-{uid}-28000")
    assert default_run_dir() == str(tmp_root / f"shardsim-{uid}-27017")  # none running yet


def test_without_port_the_only_cluster_or_an_error(tmp_root) -> None:
    _state(default_run_dir(28000), 28000)
    assert default_run_dir() == default_run_dir(28000)
    _state(default_run_dir(27017), 27017)
    with pytest.raises(ClusterError) as exc:
        default_run_dir()
    assert "several detached clusters" in str(exc.value) and "28000" in str(exc.value)
    res = CliRunner().invoke(down, [])
    assert res.exit_code == 1 and "choose one with --port" in res.output
    assert os.path.exists(state_path(default_run_dir(27017)))


def test_env_override(tmp_root, monkeypatch) -> None:
    monkeypatch.setenv("SHARDSIM_RUN_DIR", str(tmp_root / "mine"))
    assert default_run_dir(27017) == str(tmp_root / "mine")


def test_down_refuses_another_users_cluster(tmp_root, monkeypatch) -> None:
    run_dir = default_run_dir(27017)
    _state(run_dir, 27017)
    check_owner(run_dir)  # ours: fine
    real_uid = os.getuid()
    monkeypatch.setattr(launcher.os, "getuid", lambda: real_uid + 4242)
    with pytest.raises(ClusterError):
        check_owner(run_dir)
    res = CliRunner().invoke(down, ["--run-dir", run_dir])
    assert res.exit_code == 1 and "not touching that cluster" in res.output
    assert json.load(open(state_path(run_dir)))["router_uri"].endswith(":27017/")
