"""``splitVector``'s choice of split keys (``split_vector.cpp``) and the router's sum of the
shards' ``collStats`` (``cluster_coll_stats_cmd.cpp``), as pure functions."""

from __future__ import annotations

from bson.int64 import Int64

from shardsim.router.commands.stats import merge_coll_stats, scale_shard_stats
from shardsim.shard.commands.split_vector import split_keys


def _keys(n):
    return [(i,) for i in range(n)]


def test_every_key_count_th_key():
    # avgObjSize 100, maxChunkSize 1000 -> keyCount = 1000 / (2 * 100) = 5: a key every 6
    assert split_keys(_keys(20), 2000, 20, 1000, 250000, None, False) == [(5,), (11,), (17,)]


def test_max_chunk_objects_and_max_split_points():
    assert split_keys(_keys(20), 2000, 20, 10 ** 6, 3, None, False) == [
        (3,), (7,), (11,), (15,), (19,)]
    assert split_keys(_keys(20), 2000, 20, 10 ** 6, 3, 2, False) == [(3,), (7,)]


def test_same_key_never_twice_and_single_value_range():
    keyed = [(1,)] * 8 + [(2,)] * 2
    assert split_keys(keyed, 1000, 10, 400, 250000, None, False) == [(2,)]
    assert split_keys([(7,)] * 10, 1000, 10, 100, 250000, None, False) == []


def test_force_splits_in_half():
    assert split_keys(_keys(10), 1000, 10, 1000, 250000, None, True) == [(5,)]


def test_coll_stats_sums_and_keeps_per_shard_stats():
    a = {"ns": "d.c", "size": Int64(1000), "count": Int64(10), "avgObjSize": Int64(100),
         "storageSize": Int64(1000), "capped": False, "nindexes": 2, "indexDetails": {},
         "totalIndexSize": Int64(8192), "totalSize": Int64(9192),
         "indexSizes": {"_id_": Int64(4096), "x_1": Int64(4096)}, "scaleFactor": 1, "ok": 1.0}
    b = dict(a, size=Int64(3000), count=Int64(20), avgObjSize=Int64(150),
             storageSize=Int64(3000), totalSize=Int64(11192))
    out = merge_coll_stats([("s0", a), ("s1", b)], 1024)
    assert out["count"] == 30 and out["size"] == 3 and out["storageSize"] == 3
    assert out["totalIndexSize"] == 16 and out["indexSizes"] == {"_id_": 8, "x_1": 8}
    assert out["avgObjSize"] == (100 * 10 + 150 * 20) / 30
    assert out["nindexes"] == 2 and out["scaleFactor"] == 1024 and out["capped"] is False
    assert list(out["_shards"]) == ["s0", "s1"]
    assert out["_shards"]["s1"]["size"] == 2 and out["_shards"]["s1"]["scaleFactor"] == 1024
    assert scale_shard_stats(a, 1)["indexSizes"] == a["indexSizes"]
