"""docs/testing.md's pytest examples are runnable: every ``python`` block from the "pytest"
section on, concatenated into one module, passes under ``python -m pytest``."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def test_docs_testing_examples_pass(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    text = text[text.index("## pytest"):]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 5
    (tmp_path / "test_docs.py").write_text("\n\n".join(blocks))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    installed = any(ep.group == "pytest11" and ep.value == "shardsim.testing.pytest_plugin"
                    for d in importlib.metadata.distributions() for ep in d.entry_points)
    plugin = [] if installed else ["-p", "shardsim.testing.pytest_plugin"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *plugin, "test_docs.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{len(re.findall(chr(10) + 'def test_', chr(10) + chr(10).join(blocks)))} passed" \
        in run.stdout
