"""``shardsim load`` end to end: a mini cluster (launcher), Spark local mode, watchers through
the router, the verifier; and the same run with a planted reordering that must fail."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.spark,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("java") is None, reason="no Java runtime (Spark needs one)"),
]


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    result = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "shardsim.tools.cli", "load", "--ops", "20000", "--shards", "3",
           "--seed", "11", "--result", str(result), "--plot", str(tmp_path / "plot.png"),
           "--idle-timeout", "10", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=220, cwd=tmp_path)
    doc = json.loads(result.read_text()) if result.exists() else {}
    return proc, doc


def test_load_20k_ops_verifies(tmp_path):
    proc, doc = _run(tmp_path, "--collections", "2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert doc["ok"] is True
    w = doc["watchers"][0]
    assert w["matched"] == 20000 and w["events"] == 20000 and w["violation"] is None
    assert doc["figures"]["ops_written"] == 20000
    # every shard owned a share of the plan and its oplog showed it
    shards = doc["figures"]["shards"]
    assert len(shards) == 3 and all(s["planned_ops"] > 0 for s in shards.values())
    assert (tmp_path / "plot.png").stat().st_size > 0
    assert "PASS" in out


def test_load_with_injected_reorder_fails_naming_first_bad_event(tmp_path):
    proc, doc = _run(tmp_path, "--inject-fault", "reorder", "--skip-final-check")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    v = doc["watchers"][0]["violation"]
    assert v["kind"] == "token-order"
    swapped = int(doc["watchers"][0]["injected"].split("#")[1].split()[0])
    assert v["index"] == swapped + 1
    assert f"event #{swapped + 1}" in doc["first_violation"]
    assert "first bad event" in out


def test_load_against_unreachable_router_exits_2(tmp_path):
    from shardsim.tools.procs import free_port

    proc = subprocess.run(
        [sys.executable, "-m", "shardsim.tools.cli", "load", "--ops", "100", "--uri",
         f"mongodb://127.0.0.1:{free_port()}/", "--result", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "could not shard the target collections" in proc.stdout
