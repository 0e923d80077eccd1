"""shardsim.configsvr.balancer_policy (balancer_policy.cpp's data-size policy), the shard's split
points (auto_split_vector.cpp) and the balancer's active window, without processes."""

from __future__ import annotations

import datetime

from bson import MaxKey, MinKey

from shardsim.configsvr.balancer import in_window
from shardsim.configsvr.balancer_policy import first_violation, select_for_collection
from shardsim.shard.commands.balancing import split_points
from shardsim.core.shard_key import KeyPattern

MB = 1024 * 1024
P = KeyPattern({"k": 1})


def _chunk(lo, hi, shard):
    return {"min": {"k": lo}, "max": {"k": hi}, "shard": shard}


def test_no_migration_below_three_chunk_sizes() -> None:
    chunks = [_chunk(MinKey(), MaxKey(), "a")]
    shards = ["a", "b"]
    assert select_for_collection("d.c", P, chunks, {"a": 3 * MB - 1}, shards, set(), MB,
                                 set(shards)) == []
    got = select_for_collection("d.c", P, chunks, {"a": 3 * MB}, shards, set(), MB, set(shards))
    assert [(m.donor, m.to, m.reason) for m in got] == [("a", "b", "chunksImbalance")]
    assert first_violation(P, chunks, {"a": 3 * MB}, shards, set(), MB) == "chunksImbalance"
    assert first_violation(P, chunks, {"a": MB}, shards, set(), MB) is None


def test_each_shard_once_per_round_and_first_chunk_moves() -> None:
    chunks = [_chunk(10, MaxKey(), "a"), _chunk(MinKey(), 10, "a"), _chunk(MinKey(), 0, "c")]
    shards = ["a", "b", "c", "d"]
    avail = set(shards)
    got = select_for_collection("d.c", P, chunks, {"a": 10 * MB, "c": 9 * MB}, shards, set(),
                                MB, avail)
    assert [(m.donor, m.to) for m in got] == [("a", "b"), ("c", "d")]
    assert got[0].chunk["min"] == {"k": MinKey()}  # lowest chunk of the donor
    assert avail == set()


def test_draining_first_to_least_loaded() -> None:
    chunks = [_chunk(MinKey(), 0, "a"), _chunk(0, MaxKey(), "b")]
    got = select_for_collection("d.c", P, chunks, {"a": 10, "b": 5, "c": 7}, ["a", "b", "c"],
                                {"a"}, MB, {"a", "b", "c"})
    assert [(m.donor, m.to, m.reason) for m in got] == [("a", "b", "drain")]
    assert first_violation(P, chunks, {}, ["a", "b", "c"], {"a"}, MB) == "draining"


def test_split_points_by_size() -> None:
    keyed = [((i,), 100) for i in range(100)]  # 10,000 bytes
    assert split_points(keyed, 20000) == ([], False)
    keys, more = split_points(keyed, 2500)
    assert keys == [(25,), (50,), (75,)] and more is False
    assert split_points(keyed, 2500, limit=1) == ([(25,)], True)
    # never between equal keys
    same = [((1,), 100)] * 50 + [((2,), 100)] * 50
    assert split_points(same, 1000) == ([(2,)], False)
    # a small last piece is merged into the one before
    assert split_points(keyed, 3000) == ([(30,), (60,)], False)


def test_active_window() -> None:
    at = datetime.datetime(2024, 1, 1, 23, 30)
    assert in_window(None, at)
    assert in_window({"start": "23:00", "stop": "06:00"}, at)
    assert not in_window({"start": "01:00", "stop": "06:00"}, at)
    assert in_window({"start": "bad"}, at)


def test_auto_merger_runs() -> None:
    from bson.timestamp import Timestamp

    from shardsim.configsvr.auto_merger import mergeable_runs

    def c(lo, hi, shard, since):
        return {**_chunk(lo, hi, shard), "onCurrentShardSince": Timestamp(since, 1)}

    chunks = [c(MinKey(), 0, "a", 10), c(0, 5, "a", 10), c(5, 8, "a", 995), c(8, 9, "a", 10),
              c(9, 20, "a", 10), c(20, 30, "b", 10), c(30, MaxKey(), "a", 10)]
    runs = mergeable_runs(P, list(reversed(chunks)), 1000, 300)
    assert [[(r["min"]["k"], r["max"]["k"]) for r in run] for run in runs] == [
        [(MinKey(), 0), (0, 5)], [(8, 9), (9, 20)]]
