"""The pytest plugin of shardsim (entry point ``pytest11: shardsim``; active once shardsim is
installed). Nothing starts unless a test asks for a fixture.

Fixtures:

* ``sharded_cluster`` (session scope): a :class:`shardsim.testing.ShardedCluster` with
  ``--shardsim-shards`` shards (default 3), started on first use, stopped at the end of the
  session. With ``--shardsim-uri URI`` an :class:`ExternalCluster` for an existing cluster
  instead (``uri`` and ``client()`` only; the fault methods need the in-process cluster).
* ``clean_sharded_cluster`` (function scope): the same cluster after every user database
  (all but ``admin``, ``config``, ``local``) was dropped, and any paused shard resumed.

Options: ``--shardsim-shards N``, ``--shardsim-uri URI``, ``--shardsim-server-version V``
(the release the in-process cluster behaves as, shardsim/core/server_version.py; 8.0).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

SYSTEM_DBS = ("admin", "config", "local")


class ExternalCluster:
    """A cluster the test session did not start (``--shardsim-uri``): ``uri`` and
    :meth:`client`. Fault methods are not available (AttributeError)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._clients: list[Any] = []

    def client(self, **kwargs: Any) -> Any:
        """A ``pymongo.MongoClient`` to ``uri`` (closed at the end of the session)."""
        import pymongo
        kwargs.setdefault("serverSelectionTimeoutMS", 10000)
        client: Any = pymongo.MongoClient(self.uri, **kwargs)
        self._clients.append(client)
        return client

    def stop(self) -> None:
        for c in self._clients:
            c.close()
        self._clients.clear()


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("shardsim", "shardsim sharded cluster fixtures")
    group.addoption("--shardsim-shards", type=int, default=3, metavar="N",
                    help="shards of the in-process cluster of the sharded_cluster fixture")
    group.addoption("--shardsim-uri", default=None, metavar="URI",
                    help="use the cluster at URI (e.g. a running `shardsim up`) instead of "
                         "starting one in process")
    group.addoption("--shardsim-server-version", default="8.0", metavar="V",
                    help="release the in-process cluster behaves as: 6.0, 7.0, 8.0, 8.2.0, "
                         "8.2 or 9.0 (docs/versions.md)")


@pytest.fixture(scope="session")
def sharded_cluster(request: Any) -> Iterator[Any]:
    """A sharded cluster for the session: in process, or the one at ``--shardsim-uri``."""
    uri = request.config.getoption("--shardsim-uri")
    if uri:
        ext = ExternalCluster(uri)
        try:
            yield ext
        finally:
            ext.stop()
        return
    from shardsim.testing import ShardedCluster
    cluster = ShardedCluster(shards=request.config.getoption("--shardsim-shards"),
                              server_version=request.config.getoption("--shardsim-server-version"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def drop_user_databases(cluster: Any) -> list[str]:
    """Drop every database but admin/config/local through the router; returns their names."""
    import pymongo
    with pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=10000) as client:
        names = [n for n in client.list_database_names() if n not in SYSTEM_DBS]
        for name in names:
            client.drop_database(name)
    return names


@pytest.fixture
def clean_sharded_cluster(sharded_cluster: Any) -> Any:
    """``sharded_cluster`` with no user database and no paused shard."""
    shards = getattr(sharded_cluster, "cluster", None)
    if shards is not None:
        for name in sharded_cluster.shard_names:
            if shards.shards[name].paused:
                sharded_cluster.resume_shard(name)
    drop_user_databases(sharded_cluster)
    return sharded_cluster
