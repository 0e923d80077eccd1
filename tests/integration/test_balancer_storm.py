"""The issue-16 "migration storm" with the balancer: the balancer on with a 1 MB chunk size and a
short round interval, four writers (inserts and ``$inc`` updates, retryable) through two
routers, a watcher with ``fullDocument: "updateLookup"``; at least 10 balancer migrations
(counted from ``config.changelog``'s ``moveChunk.commit`` entries) happen during the writes.
Every acknowledged write is in the data once and in the stream exactly once, tokens strictly
increase and no post-image is ``null``. Seeded; bounded well under 60 s."""

from __future__ import annotations

import time
from typing import Any

import pytest

from storm_kit import Watcher, Writers, check_data, check_stream, clients_for, run_until

pytestmark = pytest.mark.timeout(120)

SEED = 1616
WRITERS = 4
MIN_MIGRATIONS = 10
PAD = 24 * 1024  # ~24 KB documents: ~40 per 1 MB chunk
NS_DB, NS_COLL = "bstorm", "docs"


def _commits(client: Any) -> int:
    return client.config.changelog.count_documents({"what": "moveChunk.commit",
                                                    "ns": f"{NS_DB}.{NS_COLL}"})


def test_balancer_storm_two_routers(cluster_factory: Any) -> None:
    """See the module docstring."""
    started = time.monotonic()
    cluster = cluster_factory(shards=3, routers=2)
    clients = clients_for(cluster.router_uris)
    try:
        admin = clients[0].admin
        admin.command("balancerStop")
        clients[0].config.settings.update_one({"_id": "chunksize"}, {"$set": {"value": 1}},
                                              upsert=True)
        clients[0].config.settings.update_one(
            {"_id": "balancer"}, {"$set": {"_shardsimRoundIntervalMs": 100}}, upsert=True)
        admin.command("enableSharding", NS_DB, primaryShard="shard0")
        admin.command("shardCollection", f"{NS_DB}.{NS_COLL}", key={"_id": 1})
        watcher = Watcher(clients[0][NS_DB][NS_COLL]).start()
        writers = Writers([c[NS_DB][NS_COLL] for c in clients], WRITERS, SEED, pad=PAD).start()
        admin.command("balancerStart")
        reached = run_until(lambda: _commits(clients[1]) >= MIN_MIGRATIONS or
                            bool(writers.failures), started + 40, step=0.5)
        writers.stop()
        migrations = _commits(clients[1])
        admin.command("balancerStop")
        assert reached and migrations >= MIN_MIGRATIONS, migrations
        watcher.wait_for(writers.expected_events)

        check_data(clients[1][NS_DB][NS_COLL], writers)
        n_updates = check_stream(watcher.events, writers)
        uuid = clients[0].config.collections.find_one({"_id": f"{NS_DB}.{NS_COLL}"})["uuid"]
        owners = {c["shard"] for c in clients[0].config.chunks.find({"uuid": uuid})}
        assert len(owners) >= 2, owners  # the balancer spread the collection
        elapsed = time.monotonic() - started
        print(f"migrations={migrations} inserts={len(writers.acked_inserts)} "
              f"updates={n_updates} elapsed={elapsed:.1f}s")
        assert elapsed < 60
    finally:
        for c in clients:
            c.close()
