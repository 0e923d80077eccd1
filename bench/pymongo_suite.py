"""pymongo's own tests against the in-process kit (issue 31: "pymongo's collection, cursor,
database, bulk, session and transaction tests ... pass at 98 % or better").

The driver's tests come from a checkout of the driver's repository (``pymongo/``, ``bson/``,
``gridfs/`` and ``test/`` at one commit, so the tests and the driver they test match); the
checkout's ``pyproject.toml`` is set aside (its pytest settings need plugins this project does
not install) for a plain ``pytest.ini``. A 3-shard ``ShardedCluster`` runs in this process;
pytest runs in a child process with ``DB_IP``/``DB_PORT`` naming the router (pymongo's
``test/__init__.py`` reads them) and the checkout first on ``PYTHONPATH``. Without C
extensions the checkout's driver is pure Python, so 100,000-document inserts take about a
minute each; ``--timeout`` is per test.

Usage::

    python bench/pymongo_suite.py --driver /path/to/mongo-python-driver \\
        [--shards 3] [--timeout 300] [test/test_collection.py ...]

Prints pytest's summary (``N failed, N passed, N skipped``); the exit code is pytest's.
Figures: docs/testing.md ("pymongo's own tests").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from shardsim.testing import ShardedCluster

DEFAULT_FILES = ["test/test_collection.py", "test/test_cursor.py", "test/test_database.py",
                 "test/test_bulk.py", "test/test_session.py", "test/test_transactions.py"]


def prepare(driver: Path) -> None:
    """Set the checkout's pyproject.toml aside and give it a minimal pytest.ini."""
    pyproject = driver / "pyproject.toml"
    if pyproject.exists():
        shutil.move(str(pyproject), str(driver / "pyproject.toml.orig"))
    (driver / "pytest.ini").write_text("[pytest]\naddopts = -p no:randomly\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--driver", required=True, type=Path,
                    help="checkout of the driver's repository (pymongo/, bson/, test/)")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per test")
    ap.add_argument("files", nargs="*", default=DEFAULT_FILES)
    args = ap.parse_args()
    driver = args.driver.resolve()
    if not (driver / "test" / "__init__.py").exists():
        ap.error(f"{driver} has no test/ package")
    prepare(driver)
    with ShardedCluster(shards=args.shards, seed=31) as cluster:
        host, port = cluster.uri.split("//", 1)[1].split("/", 1)[0].split(",")[0].split(":")
        env = dict(os.environ, DB_IP=host, DB_PORT=port, PYTHONPATH=str(driver))
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
             f"--timeout={args.timeout}", "-o", "addopts=", *args.files],
            cwd=driver, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
