"""reshardCollection under the storm load (issue 16): four writers (inserts and ``$inc``
updates, retryable) through two routers and a watcher with ``updateLookup`` while the
collection is resharded twice, once through each router (``{_id: 1}`` -> ``{_id: "hashed"}`` ->
``{_id: 1}``). The donors' critical section during the commit makes the writes of every router
wait, then fail with StaleConfig, and the routers retry them by the new routing table: every
acknowledged write is in the data once and in the stream exactly once, tokens strictly
increase, no post-image is ``null``. Seeded; bounded."""

from __future__ import annotations

import time
from typing import Any

import pytest

from storm_kit import Watcher, Writers, check_data, check_stream, clients_for, run_until

pytestmark = pytest.mark.timeout(120)

SEED = 1617
WRITERS = 4
NS_DB, NS_COLL = "rstorm", "docs"
NS = f"{NS_DB}.{NS_COLL}"


def test_reshard_under_load_two_routers(cluster_factory: Any) -> None:
    """See the module docstring."""
    started = time.monotonic()
    cluster = cluster_factory(shards=3, routers=2)
    clients = clients_for(cluster.router_uris)
    try:
        admin = clients[0].admin
        admin.command("balancerStop")
        admin.command("enableSharding", NS_DB, primaryShard="shard0")
        admin.command("shardCollection", NS, key={"_id": 1})
        admin.command("split", NS, middle={"_id": 2000})
        admin.command("moveChunk", NS, find={"_id": 2000}, to="shard1")
        old_uuid = clients[0].config.collections.find_one({"_id": NS})["uuid"]
        watcher = Watcher(clients[1][NS_DB][NS_COLL]).start()
        writers = Writers([c[NS_DB][NS_COLL] for c in clients], WRITERS, SEED, pad=64).start()
        assert run_until(lambda: len(writers.acked_inserts) >= 300, started + 30, 0.05)
        clients[0].admin.command("reshardCollection", NS, key={"_id": "hashed"})
        mid = clients[0].config.collections.find_one({"_id": NS})
        assert mid["key"] == {"_id": "hashed"} and mid["uuid"] != old_uuid
        n_after_first = len(writers.acked_inserts)
        assert run_until(lambda: len(writers.acked_inserts) >= n_after_first + 300,
                         started + 45, 0.05)
        clients[1].admin.command("reshardCollection", NS, key={"_id": 1})
        n_after_second = len(writers.acked_inserts)
        assert run_until(lambda: len(writers.acked_inserts) >= n_after_second + 200,
                         started + 50, 0.05)
        writers.stop()
        end = clients[0].config.collections.find_one({"_id": NS})
        assert end["key"] == {"_id": 1} and end["uuid"] not in (old_uuid, mid["uuid"])
        watcher.wait_for(writers.expected_events)

        check_data(clients[0][NS_DB][NS_COLL], writers)
        check_data(clients[1][NS_DB][NS_COLL], writers)
        n_updates = check_stream(watcher.events, writers)
        # Writes through both routers landed before, between and after the two reshardings.
        assert n_after_first >= 300 and n_after_second > n_after_first
        elapsed = time.monotonic() - started
        print(f"inserts={len(writers.acked_inserts)} updates={n_updates} "
              f"elapsed={elapsed:.1f}s")
        assert elapsed < 60
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("to_shard", ["shard0", "shard1"])
def test_stale_router_after_unshard_is_told(cluster_factory: Any, to_shard: str) -> None:
    """A router that did not run ``unshardCollection`` still writes with the old placement
    version to the shard the collection left (its copy dropped there). That shard answers
    StaleConfig instead of creating the collection again, and the router writes to the new
    owner: to the primary (the collection untracked, every shard told it is unsharded) or to
    another shard (tracked as unsplittable, the former owner owning no chunk)."""
    cluster = cluster_factory(shards=2, routers=2)
    a, b = clients_for(cluster.router_uris)
    try:
        a.admin.command("balancerStop")
        a.admin.command("enableSharding", "us", primaryShard="shard0")
        a.admin.command("shardCollection", "us.c", key={"_id": 1})
        a.admin.command("split", "us.c", middle={"_id": 0})
        a.admin.command("moveChunk", "us.c", find={"_id": 0}, to="shard1")
        b.us.c.insert_many([{"_id": -1}, {"_id": 1}])  # b's cache: both shards own a chunk
        a.admin.command("unshardCollection", "us.c", toShard=to_shard)
        b.us.c.insert_many([{"_id": -2}, {"_id": 2}])  # stale: StaleConfig, refresh, retry
        assert sorted(d["_id"] for d in b.us.c.find()) == [-2, -1, 1, 2]
        other = "shard1" if to_shard == "shard0" else "shard0"
        direct = {name: clients_for([f"mongodb://{cluster.shard(name).address}/"
                                     "?directConnection=true"])[0]
                  for name in ("shard0", "shard1")}
        try:
            assert direct[to_shard].us.c.count_documents({}) == 4
            assert "c" not in direct[other].us.list_collection_names()
        finally:
            for c in direct.values():
                c.close()
    finally:
        a.close()
        b.close()
