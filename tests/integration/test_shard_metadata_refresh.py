"""Shards own their routing metadata (issue 25, item 3): a shard whose filtering metadata is
old or missing refreshes it from the config server when a routed request names a version it
does not know, and serves the request instead of answering StaleConfig
(``onCollectionPlacementVersionMismatch``); a new primary of a replica-set shard forgets its
metadata on step-up and recovers it by refresh, so a router that is behind is told
StaleConfig instead of having its write accepted by a secondary's old metadata; secondaries
serving routed reads refresh too and filter orphans."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp

from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import split_over_two_shards

pytestmark = pytest.mark.timeout(180)
MAJORITY = pymongo.WriteConcern("majority", wtimeout=15000)


def _version_of(client: Any, ns: str, shard: str) -> dict[str, Any]:
    """``{e, t, v}`` of ``shard`` for ``ns`` by the config server's catalog."""
    entry = client.config.collections.find_one({"_id": ns})
    top = Timestamp(0, 0)
    for c in client.config.chunks.find({"uuid": entry["uuid"], "shard": shard}):
        if (c["lastmod"].time, c["lastmod"].inc) > (top.time, top.inc):
            top = c["lastmod"]
    return {"e": entry["lastmodEpoch"], "t": entry["timestamp"], "v": top}


def _old_metadata(client: Any, ns: str, owner: str) -> dict[str, Any]:
    """The metadata of ``ns`` as it was before any migration: every chunk on ``owner``."""
    entry = client.config.collections.find_one({"_id": ns})
    chunks = sorted(client.config.chunks.find({"uuid": entry["uuid"]}),
                    key=lambda c: (c["lastmod"].time, c["lastmod"].inc))
    return {"epoch": entry["lastmodEpoch"], "timestamp": entry["timestamp"],
            "uuid": entry["uuid"], "key": entry["key"],
            "chunks": [{"min": c["min"], "max": c["max"], "lastmod": Timestamp(1, i),
                        "shard": owner} for i, c in enumerate(chunks)]}


def test_a_shard_with_old_or_no_metadata_refreshes_instead_of_failing() -> None:
    with ShardedCluster(shards=2, seed=31) as cluster:
        client = cluster.client()
        ns = "mr.c"
        primary, other = split_over_two_shards(client, ns)
        client.mr.c.insert_many([{"_id": i, "x": i} for i in range(-5, 5)])
        node = cluster.member_node(cluster.shard_address(other))
        want = _version_of(client, ns, other)
        assert node.sharding.wanted(ns) == want

        # the shard's metadata goes back to before the migration: it owns nothing
        cluster.command(other, {"_shardsimSetFilteringMetadata": ns,
                                "metadata": _old_metadata(client, ns, primary)})
        assert node.sharding.wanted(ns)["v"] == Timestamp(0, 0)
        direct = pymongo.MongoClient(f"mongodb://{cluster.shard_address(other)}/",
                                     directConnection=True)
        direct.mr.c.insert_one({"_id": 100, "x": -100})  # an orphan of the other chunk
        refreshes, stale = node.sharding.refreshes, node.sharding.stale_config_errors
        # the router's version is newer: the shard refreshes and serves the read, orphan
        # filtered by the refreshed metadata
        assert sorted(d["_id"] for d in client.mr.c.find()) == list(range(-5, 5))
        assert node.sharding.refreshes == refreshes + 1
        assert node.sharding.stale_config_errors == stale
        assert node.sharding.wanted(ns) == want

        # the shard believes the collection unsharded: a routed write refreshes it as well
        cluster.command(other, {"_shardsimSetFilteringMetadata": ns, "metadata": None})
        client.mr.c.insert_one({"_id": 7, "x": 7})
        assert node.sharding.refreshes == refreshes + 2
        assert node.sharding.stale_config_errors == stale
        assert direct.mr.c.find_one({"_id": 7}) == {"_id": 7, "x": 7}

        # a request older than the shard's version is still told StaleConfig, at once
        old = dict(want, v=Timestamp(want["v"].time - 1, 0))
        with pytest.raises(pymongo.errors.OperationFailure) as info:
            direct.mr.command({"find": "c", "filter": {}, "shardVersion": old})
        assert info.value.code == 13388
        assert info.value.details["vWanted"] == want
        assert node.sharding.refreshes == refreshes + 2
        direct.close()


def test_a_new_primary_recovers_its_metadata_and_tells_a_stale_router() -> None:
    """Shard X's secondaries learn X's version V1 by serving routed reads; a migration gives X
    version V2 (pushed to X's primary only); X's primary steps down and a secondary (still at
    V1) is elected. A router that is behind (V1) writes a document of the migrated range: the
    new primary forgets its metadata on step-up, refreshes, answers StaleConfig, and the
    router writes to the new owner (with the secondary's V1 kept, the write would have been
    accepted on X and hidden as an orphan)."""
    with ShardedCluster(shards=2, members=3, routers=2, seed=32) as cluster:
        a = cluster.client()
        b = pymongo.MongoClient(cluster.uris[1], serverSelectionTimeoutMS=10000)
        try:
            ns = "su.c"
            owner0, x = split_over_two_shards(a, ns)
            a.admin.command("split", ns, middle={"x": 100})
            coll_a = a.get_database("su", write_concern=MAJORITY).c
            coll_b = b.get_database("su", write_concern=MAJORITY).c
            coll_a.insert_many([{"_id": i, "x": i} for i in (-1, 1, 150)])
            assert coll_b.find_one({"x": 150})["_id"] == 150  # b caches the table (V1)
            v1 = _version_of(a, ns, x)
            primary = cluster.primary_of(x)
            secondaries = [h for h in cluster.members_of(x) if h != primary]
            for host in secondaries:  # a routed read served by each secondary
                sec = pymongo.MongoClient(f"mongodb://{host}/", directConnection=True,
                                          readPreference="secondaryPreferred")
                try:
                    reply = sec.su.command({"find": "c", "filter": {}, "shardVersion": v1})
                    assert sorted(d["_id"] for d in reply["cursor"]["firstBatch"]) == [1, 150]
                finally:
                    sec.close()
                assert cluster.member_node(host).sharding.wanted(ns) == v1

            a.admin.command("moveChunk", ns, find={"x": 150}, to=owner0)
            v2 = _version_of(a, ns, x)
            assert (v2["v"].time, v2["v"].inc) > (v1["v"].time, v1["v"].inc)
            old = cluster.step_down(x)
            new = cluster.primary_of(x)
            assert new != old and new in secondaries

            coll_b.insert_one({"_id": 151, "x": 151})  # b still routes x: 151 to X at V1
            node = cluster.member_node(new)
            assert node.sharding.wanted(ns) == v2  # recovered by refresh
            assert coll_a.find_one({"_id": 151}) == {"_id": 151, "x": 151}
            assert node.find_document(ns, {"_id": 151}) is None
            owner_primary = cluster.member_node(cluster.primary_of(owner0))
            assert owner_primary.find_document(ns, {"_id": 151}) is not None
            assert sorted(d["_id"] for d in coll_b.find()) == [-1, 1, 150, 151]
        finally:
            b.close()
