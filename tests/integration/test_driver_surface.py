"""What drivers met through the router and on shards (issue 31), on one in-process cluster
(``shardsim.testing.ShardedCluster``): each behaviour through the router on a sharded and an
unsharded collection, and directly on a shard, as mongod/mongos 8.0 answer."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure

DB = "drv"


@pytest.fixture(scope="module")
def cluster() -> Any:
    """Two shards; ``drv.sharded`` split on ``k`` at 0 over both, ``drv.plain`` unsharded."""
    from shardsim.testing import ShardedCluster
    with ShardedCluster(shards=2, seed=31) as c:
        client = c.client()
        client.admin.command("enableSharding", DB)
        primary = client.config.databases.find_one({"_id": DB})["primary"]
        other = next(s for s in c.shard_names if s != primary)
        client.admin.command("shardCollection", f"{DB}.sharded", key={"k": 1})
        client.admin.command("split", f"{DB}.sharded", middle={"k": 0})
        client.admin.command("moveChunk", f"{DB}.sharded", find={"k": 0}, to=other)
        c.primary_shard = primary
        yield c


@pytest.fixture(params=["sharded", "plain", "shard"])
def coll(request: Any, cluster: Any) -> Any:
    """A fresh collection of 7 documents ``{_id: i, k: i - 3, t: 100 + i, a: [..]}``: through
    the router (sharded or unsharded), or directly on the database's primary shard."""
    if request.param == "shard":
        client = pymongo.MongoClient(cluster.shard_address(cluster.primary_shard),
                                     directConnection=True)
        c = client[DB]["direct"]
    else:
        client = None
        c = cluster.client()[DB][request.param]
    c.delete_many({})
    c.insert_many([{"_id": i, "k": i - 3, "t": 100 + i, "a": [i, i + 1, i + 2]} for i in range(7)])
    yield c
    if client is not None:
        client.close()


@pytest.mark.parametrize("spec", [{"_id": 1}, {"_id": True}, {"_id": 1.0}])
def test_an_id_only_inclusion_returns_only_the_id(coll, spec):
    """``{_id: 1}`` is an inclusion projection (``projection_parser.cpp`` ``parseAndAnalyze``:
    ``idIncludedEntirely``), not an empty exclusion."""
    assert sorted(d["_id"] for d in coll.find({}, spec)) == list(range(7))
    assert all(set(d) == {"_id"} for d in coll.find({}, spec))
    assert coll.find_one({"_id": 2}, spec) == {"_id": 2}
    # _id with a $slice is still an inclusion; {_id: 1, t: 0} an exclusion
    assert coll.find_one({"_id": 2}, {"_id": 1, "a": {"$slice": 1}}) == {"_id": 2, "a": [2]}
    assert coll.find_one({"_id": 2}, {"_id": 1, "t": 0}) == {"_id": 2, "k": -1, "a": [2, 3, 4]}
    assert list(coll.aggregate([{"$match": {"_id": 2}}, {"$project": {"_id": 1}}])) == [{"_id": 2}]


def test_an_aggregate_with_batch_size_zero_returns_an_empty_first_batch(coll):
    """``cursor: {batchSize: 0}``: no documents in ``firstBatch``, a live cursor, then the
    documents on getMore (``run_aggregate.cpp``; mongos ``cluster_aggregation_planner.cpp``)."""
    db = coll.database
    reply = db.command({"aggregate": coll.name, "pipeline": [{"$sort": {"_id": 1}}],
                        "cursor": {"batchSize": 0}})
    assert reply["cursor"]["firstBatch"] == [] and reply["cursor"]["id"] != 0
    more = db.command({"getMore": reply["cursor"]["id"], "collection": coll.name})
    assert [d["_id"] for d in more["cursor"]["nextBatch"]] == list(range(7))
    assert more["cursor"]["id"] == 0
    # the same through a driver's helper
    assert [d["_id"] for d in coll.aggregate([{"$sort": {"_id": 1}}], batchSize=0)] == list(range(7))
    # an empty result too: an empty first batch and a cursor, exhausted on getMore
    reply = db.command({"aggregate": coll.name, "pipeline": [{"$match": {"_id": -1}}],
                        "cursor": {"batchSize": 0}})
    assert reply["cursor"]["firstBatch"] == [] and reply["cursor"]["id"] != 0
    more = db.command({"getMore": reply["cursor"]["id"], "collection": coll.name})
    assert more["cursor"]["nextBatch"] == [] and more["cursor"]["id"] == 0


@pytest.mark.parametrize("key", [0, 1, "", False, None, "$k", {"a": "$k"}])
def test_group_puts_id_first_and_keeps_a_false_constant_key(coll, key):
    """``$group`` output documents are ``{_id, <accumulators in spec order>}``
    (``DocumentSourceGroup``); a constant key such as ``0`` stays ``0``."""
    docs = list(coll.aggregate([{"$group": {"_id": key, "n": {"$sum": 1}, "t": {"$sum": "$t"}}},
                                {"$sort": {"_id": 1}}]))
    assert all(list(d) == ["_id", "n", "t"] for d in docs)
    if key is None or not isinstance(key, (str, dict)) or key == "":
        assert docs == [{"_id": key, "n": 7, "t": 721}]
        assert type(docs[0]["_id"]) is type(key)
    else:
        assert len(docs) == 7 and sum(d["n"] for d in docs) == 7
