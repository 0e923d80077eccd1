"""The pytest plugin: installed with the project (pytest11 entry point), a test file in a
temporary directory using only ``sharded_cluster`` passes; no cluster starts for tests that do
not ask for a fixture; ``clean_sharded_cluster`` drops user databases between tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)

USER_TEST = '''
import pymongo

def test_watch_through_the_router(sharded_cluster):
    client = pymongo.MongoClient(sharded_cluster.uri)
    client.admin.command("shardCollection", "app.orders", key={"_id": "hashed"})
    with client.app.orders.watch() as stream:
        client.app.orders.insert_many([{"_id": i} for i in range(20)])
        got = [stream.next()["documentKey"]["_id"] for _ in range(20)]
    assert sorted(got) == list(range(20))
    assert len(client.admin.command("listShards")["shards"]) == 2
    client.close()
'''

CLEAN_TEST = '''
import threading
import pymongo

def test_no_cluster_without_a_fixture():
    assert not any(t.name == "shardsim-testkit" for t in threading.enumerate())

def test_first(clean_sharded_cluster):
    pymongo.MongoClient(clean_sharded_cluster.uri).left.c.insert_one({"_id": 1})

def test_second_sees_a_clean_cluster(clean_sharded_cluster):
    client = pymongo.MongoClient(clean_sharded_cluster.uri)
    assert "left" not in client.list_database_names()
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project pip-installed (no dependencies: they are in this venv) into a directory."""
    target = tmp_path_factory.mktemp("site")
    src = tmp_path_factory.mktemp("src")  # pip builds in the tree: build from a copy
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("shardsim", "shard", "router", "configsvr"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(target), str(src)],
                   check=True, cwd=src, capture_output=True, timeout=240)
    assert list(target.glob("shardsim-*.dist-info/entry_points.txt"))
    return target


def _pytest(installed: Path, where: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    (where / "test_user.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_user.py", *args], cwd=where, env=env, capture_output=True,
                          text=True, timeout=240)


def test_the_install_adds_one_top_level_package(installed: Path) -> None:
    """Installed, the roles live under ``shardsim.`` (no top-level ``router``/``shard``/``configsvr``)."""
    top = sorted(p.name for p in installed.iterdir()
                 if p.is_dir() and not p.name.endswith((".dist-info", ".egg-info")) and p.name != "bin")
    assert top == ["shardsim"]
    assert {p.name for p in (installed / "shardsim").iterdir()} >= {"core", "tools", "testing", "router",
                                                                     "shard", "configsvr"}


def test_a_user_module_named_like_a_role_does_not_break_the_kit(installed: Path, tmp_path: Path) -> None:
    """A web service's own ``router.py`` beside its tests: the kit still starts its cluster."""
    (tmp_path / "router.py").write_text("raise ImportError('the user\'s own router module')\n")
    (tmp_path / "shard.py").write_text("raise ImportError('the user\'s own shard module')\n")
    run = _pytest(installed, tmp_path, USER_TEST, "--shardsim-shards", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_a_user_test_file_with_only_sharded_cluster_passes(installed: Path, tmp_path: Path) -> None:
    run = _pytest(installed, tmp_path, USER_TEST, "--shardsim-shards", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_clean_fixture_and_nothing_started_without_fixtures(installed: Path, tmp_path: Path) -> None:
    run = _pytest(installed, tmp_path, CLEAN_TEST)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout


def test_shardsim_uri_uses_an_existing_cluster(installed: Path, tmp_path: Path) -> None:
    from shardsim.testing import ShardedCluster
    body = '''
    def test_uses_the_given_uri(sharded_cluster):
        import os
        assert sharded_cluster.uri == os.environ["WANT_URI"]
        assert not hasattr(sharded_cluster, "pause_shard")
        sharded_cluster.client().admin.command("ping")
    '''
    with ShardedCluster(shards=1) as c:
        os.environ["WANT_URI"] = c.uri
        try:
            run = _pytest(installed, tmp_path, body, "--shardsim-uri", c.uri)
        finally:
            del os.environ["WANT_URI"]
    assert run.returncode == 0, run.stdout + run.stderr


def test_shardsim_server_version_option(installed: Path, tmp_path: Path) -> None:
    """``--shardsim-server-version`` chooses the release the fixture's cluster behaves as."""
    body = '''
    def test_the_release(sharded_cluster):
        admin = sharded_cluster.client().admin
        assert admin.command("buildInfo")["version"] == "6.0.20"
        assert admin.command("hello")["maxWireVersion"] == 17
    '''
    run = _pytest(installed, tmp_path, body, "--shardsim-shards", "1",
                  "--shardsim-server-version", "6.0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
