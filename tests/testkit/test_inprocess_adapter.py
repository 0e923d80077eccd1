"""``SHARDSIM_TEST_CLUSTER=inprocess``: the launcher's Cluster interface over the kit
(tests/inprocess_cluster.py), used by tests/conftest.py's ``cluster`` / ``cluster_factory``."""

from __future__ import annotations

import os
import sys

import pymongo
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from inprocess_cluster import InProcessCluster, in_process  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHARDSIM_TEST_CLUSTER", raising=False)
    assert in_process() is False                       # the default: processes
    monkeypatch.setenv("SHARDSIM_TEST_CLUSTER", "inprocess")
    assert in_process() is True
    monkeypatch.setenv("SHARDSIM_TEST_CLUSTER", "docker")
    with pytest.raises(ValueError):
        in_process()


def test_launcher_interface_and_shard_args() -> None:
    with pytest.raises(ValueError, match="--sync"):
        InProcessCluster(shards=1, shard_args=["--sync", "full"])
    c = InProcessCluster(shards=2, shard_args=["--noop-interval-ms", "300",
                                               "--promise-mode", "mongod"]).start()
    try:
        assert c.kit.cluster.noop_interval_ms == 300 and c.kit.cluster.promise_mode == "mongod"
        assert [p.name for p in c.shards] == ["shard0", "shard1"]
        with pymongo.MongoClient(c.router_uri) as client:
            hosts = {s["host"].split("/", 1)[1]
                     for s in client.admin.command("listShards")["shards"]}
        assert hosts == {p.address for p in c.shards}
        name = c.add_shard()
        assert c.shard(name).alive()
        c.shards[0].kill()
        assert not c.shards[0].alive()
        c.restart(c.shards[0])
        assert c.shards[0].alive()
    finally:
        c.stop()
