"""Shared fixtures: a real local cluster (config server, shards, router) on free loopback ports.

* ``cluster`` (session scope): one :class:`shardsim.tools.launcher.Cluster` with 3 in-memory shards,
  started on first use and always stopped at the end of the session. Tests that use it share
  it, so give your databases/collections unique names and do not stop or kill its processes
  (build your own with ``cluster_factory`` for that).
* ``router_client`` (function scope): a pymongo ``MongoClient`` connected to ``cluster``'s
  router, closed after the test.
* ``cluster_factory`` (function scope): ``cluster_factory(shards=2, durable=True, ...)`` starts a
  private :class:`~shardsim.tools.launcher.Cluster` (same arguments) that is stopped after the test,
  pass or fail.

With ``SHARDSIM_TEST_CLUSTER=inprocess`` both build in-process clusters instead
(:class:`shardsim.testing.ShardedCluster` behind the launcher's interface,
``tests/inprocess_cluster.py``); the default is ``processes``. See docs/testing.md.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import os
import sys

import pymongo
import pytest

from shardsim.tools.launcher import Cluster

sys.path.insert(0, os.path.dirname(__file__))
from inprocess_cluster import InProcessCluster, in_process  # noqa: E402


def _cluster_class() -> Any:
    return InProcessCluster if in_process() else _TestCluster


def _TestCluster(**kwargs: Any) -> Cluster:
    """A launcher Cluster with the test-only commands on (off by default, as in mongod): the
    tests use fail points and the ``_shardsim*`` testing commands."""
    kwargs.setdefault("test_commands", True)
    return Cluster(**kwargs)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A 3-shard in-memory cluster shared by the whole session."""
    c = _cluster_class()(shards=3)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def first_shard_client(cluster: Cluster) -> Iterator[pymongo.MongoClient]:
    """A direct client (``directConnection=true``) to the shared cluster's first shard."""
    client: pymongo.MongoClient = pymongo.MongoClient(cluster.shards[0].address,
                                                      directConnection=True)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def router_client(cluster: Cluster) -> Iterator[pymongo.MongoClient]:
    """A pymongo client to the shared cluster's router."""
    client: pymongo.MongoClient = pymongo.MongoClient(cluster.router_uri,
                                                      serverSelectionTimeoutMS=10000)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def cluster_factory(tmp_path: Any) -> Iterator[Callable[..., Cluster]]:
    """Factory for private clusters (stopped after the test); ``base_dir`` defaults to a
    per-test temporary directory."""
    started: list[Cluster] = []

    def make(**kwargs: Any) -> Cluster:
        kwargs.setdefault("base_dir", str(tmp_path / f"cluster{len(started)}"))
        c = _cluster_class()(**kwargs)
        started.append(c)
        return c.start()

    try:
        yield make
    finally:
        for c in started:
            c.stop()


# -- running the suite on several workers (pytest-xdist, `make test`) ------------------------------
# `make test` runs `pytest -n 3 --dist loadscope --no-loadscope-reorder -m "not serial"`, then the
# tests marked `serial` (latency bounds, which need the machine to themselves) on one process. The
# suite waits far more than it computes (clusters starting, elections, timeouts), so several
# workers on two cores finish well under the serial time. The unit of work a worker takes is a
# scope (:func:`_scope_of`, through xdist's scheduler hook), and the scopes go out in the order of
# the collected items (:func:`pytest_collection_modifyitems`, longest first).
# * A module whose file declares a module- or class-scoped fixture (or uses the spec suites'
#   module-scoped ``single_shard``) is one scope: its fixture is built once.
# * The Docker tests are one scope: one image build, one compose project at a time.
# * Every other test is a scope of its own.
# (xdist's own ``loadgroup`` marks do nothing under pytest 9: xdist 3.8 renames ``item._nodeid``,
# which pytest 9 no longer reads, so the grouping is done here from the node ids.)
# LONG_FIRST was measured with --durations; only the order depends on it, so a stale entry costs
# wall time, never a result.
LONG_FIRST = (
    "tests/docker/",
    "tests/integration/test_router_change_stream_property.py",
    "tests/integration/test_router_change_stream.py::test_twenty_thousand_ops",
    "tests/spec/test_official_suites.py",
    "tests/load/test_load_cli.py",
    "tests/integration/test_launcher_replset.py",
    "tests/faults/",
    "tests/integration/test_retryable_writes.py",
    "tests/integration/test_migration_recovery.py",
    "tests/spec/",
    "tests/sim/",
    "tests/integration/test_fault_cli",
    "tests/testkit/test_pytest_plugin.py",
)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODULE_SCOPED = ('scope="module"', "scope='module'", 'scope="class"', "scope='class'",
                  "single_shard")
_shares_fixture: dict[str, bool] = {}


def _scope_of(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to (see above)."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/docker/"):
        return "tests/docker"
    if path not in _shares_fixture:
        try:
            with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
                text = f.read()
        except OSError:
            text = ""
        _shares_fixture[path] = any(m in text for m in _MODULE_SCOPED)
    return path if _shares_fixture[path] else nodeid


def _rank(nodeid: str) -> int:
    for i, prefix in enumerate(LONG_FIRST):
        if nodeid.startswith(prefix):
            return i
    return len(LONG_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker (it collects, the controller schedules in that order): the long
    scopes first."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: _rank(item.nodeid))  # stable: a scope's tests stay together


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope``: xdist's LoadScopeScheduling with :func:`_scope_of` as its scopes."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope_of(nodeid)

    return Scheduling(config, log)
