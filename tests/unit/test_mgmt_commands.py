"""Collection/index management and read concern on one in-process shard, through its command
dispatch (``ShardNode.run_command``: gossip, readConcern, handler, reply fields): search index
commands (31082), clustered and time-series collections, collMod prepareUnique/unique (359),
snapshot reads at atClusterTime and afterClusterTime."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from bson.timestamp import Timestamp

from shardsim.shard.node import ShardNode
from shardsim.shard.snapshot import documents_at
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError


def _run(node: ShardNode, db: str, body: dict[str, Any]) -> dict[str, Any]:
    name = next(iter(body))
    req = Request(name=name, db=db, body={**body, "$db": db},
                  conn=ConnectionInfo(id=1, peer="127.0.0.1:1"))
    return asyncio.run(node.run_command(req))


def _ok(node: ShardNode, db: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = _run(node, db, body)
    assert reply["ok"] == 1.0, reply
    return reply


def _first_batch(reply: dict[str, Any]) -> list[dict[str, Any]]:
    return reply["cursor"]["firstBatch"]


def test_search_index_commands_answer_search_not_enabled():
    node = ShardNode(shard_name="s")
    for body in ({"createSearchIndexes": "c", "indexes": [{"definition": {}}]},
                 {"updateSearchIndex": "c", "name": "i", "definition": {}},
                 {"dropSearchIndex": "c", "name": "i"},
                 {"aggregate": "c", "pipeline": [{"$listSearchIndexes": {}}], "cursor": {}}):
        reply = _run(node, "db", body)
        assert (reply["ok"], reply["code"], reply["codeName"]) == (0.0, 31082, "SearchNotEnabled")
        assert "Atlas" in reply["errmsg"]
    reply = _run(node, "db", {"aggregate": "c", "pipeline": [{"$vectorSearch": {}}],
                              "cursor": {}})
    assert reply["code"] == 31082 and "$vectorSearch" in reply["errmsg"]


def test_clustered_collection_options_and_index():
    node = ShardNode(shard_name="s")
    _ok(node, "db", {"create": "c", "clusteredIndex": {"key": {"_id": 1}, "unique": True,
                                                        "name": "ci"}})
    info = _first_batch(_ok(node, "db", {"listCollections": 1}))[0]
    assert info["options"]["clusteredIndex"] == {"v": 2, "key": {"_id": 1}, "name": "ci",
                                                 "unique": True}
    assert "idIndex" not in info
    idx = _first_batch(_ok(node, "db", {"listIndexes": "c"}))
    assert idx == [{"v": 2, "key": {"_id": 1}, "name": "ci", "unique": True, "clustered": True}]
    _ok(node, "db", {"insert": "c", "documents": [{"_id": 1}]})
    dup = _ok(node, "db", {"insert": "c", "documents": [{"_id": 1}]})
    assert dup["writeErrors"][0]["code"] == 11000
    bad = _run(node, "db", {"create": "d", "clusteredIndex": {"key": {"_id": 1},
                                                              "unique": False}})
    assert bad["code"] == 5979700
    bad = _run(node, "db", {"create": "d", "clusteredIndex": {"key": {"a": 1}, "unique": True}})
    assert bad["code"] == 5979701


def test_time_series_collection():
    node = ShardNode(shard_name="s")
    _ok(node, "db", {"create": "ts", "expireAfterSeconds": 60,
                     "timeseries": {"timeField": "t", "metaField": "m", "granularity": "minutes"}})
    info = _first_batch(_ok(node, "db", {"listCollections": 1, "filter": {"name": "ts"}}))[0]
    assert info["type"] == "timeseries"
    assert info["options"] == {"expireAfterSeconds": 60, "timeseries": {
        "timeField": "t", "metaField": "m", "granularity": "minutes",
        "bucketMaxSpanSeconds": 86400}}
    assert [i["name"] for i in _first_batch(_ok(node, "db", {"listIndexes": "ts"}))] == \
        ["m_1_t_1"]
    when = datetime.datetime(2019, 3, 18, 22, 53, 50)
    reply = _ok(node, "db", {"insert": "ts", "documents": [{"_id": 1, "t": when},
                                                             {"_id": 1, "t": when}]})
    assert reply["n"] == 2  # no _id index on a time series
    reply = _ok(node, "db", {"insert": "ts", "documents": [{"_id": 2}]})
    assert reply["writeErrors"][0]["code"] == 2
    assert len(_first_batch(_ok(node, "db", {"find": "ts", "filter": {}}))) == 2
    assert _run(node, "db", {"create": "x", "timeseries": {"timeField": "t",
                                                           "granularity": "days"}})["code"] == 72
    assert _run(node, "db", {"create": "x", "timeseries": {}})["code"] == 40414


def test_coll_mod_prepare_unique_then_unique():
    node = ShardNode(shard_name="s")
    _ok(node, "db", {"insert": "c", "documents": [{"_id": 1, "x": 1}, {"_id": 2, "x": 1}]})
    _ok(node, "db", {"createIndexes": "c", "indexes": [{"key": {"x": 1}, "name": "x_1"}]})
    early = _run(node, "db", {"collMod": "c", "index": {"keyPattern": {"x": 1}, "unique": True}})
    assert early["code"] == 72  # prepareUnique first
    _ok(node, "db", {"collMod": "c", "index": {"keyPattern": {"x": 1}, "prepareUnique": True}})
    dup = _ok(node, "db", {"insert": "c", "documents": [{"_id": 3, "x": 1}]})
    assert dup["writeErrors"][0]["code"] == 11000
    reply = _run(node, "db", {"collMod": "c", "index": {"keyPattern": {"x": 1}, "unique": True}})
    assert (reply["code"], reply["codeName"]) == (359, "CannotConvertIndexToUnique")
    assert reply["violations"] == [{"ids": [1, 2]}]
    _ok(node, "db", {"delete": "c", "deletes": [{"q": {"_id": 2}, "limit": 1}]})
    reply = _ok(node, "db", {"collMod": "c", "index": {"keyPattern": {"x": 1}, "unique": True}})
    assert reply["unique_new"] is True


def test_snapshot_reads_see_the_collection_at_their_cluster_time():
    node = ShardNode(shard_name="s")
    _ok(node, "db", {"insert": "c", "documents": [{"_id": 1, "x": 11}, {"_id": 2, "x": 11}]})
    first = _ok(node, "db", {"find": "c", "filter": {}, "readConcern": {"level": "snapshot"}})
    at = first["cursor"]["atClusterTime"]
    assert isinstance(at, Timestamp)
    _ok(node, "db", {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"x": 12}}}]})
    _ok(node, "db", {"insert": "c", "documents": [{"_id": 3, "x": 33}]})
    _ok(node, "db", {"delete": "c", "deletes": [{"q": {"_id": 2}, "limit": 1}]})
    rc = {"level": "snapshot", "atClusterTime": at}
    again = _ok(node, "db", {"find": "c", "filter": {}, "sort": {"_id": 1}, "readConcern": rc})
    assert _first_batch(again) == [{"_id": 1, "x": 11}, {"_id": 2, "x": 11}]
    assert again["cursor"]["atClusterTime"] == at
    values = _ok(node, "db", {"distinct": "c", "key": "x", "readConcern": rc})
    assert values["values"] == [11] and values["atClusterTime"] == at
    agg = _ok(node, "db", {"aggregate": "c", "pipeline": [{"$count": "n"}], "cursor": {},
                           "readConcern": rc})
    assert _first_batch(agg) == [{"n": 2}]
    now = _ok(node, "db", {"find": "c", "filter": {}, "sort": {"_id": 1}})
    assert _first_batch(now) == [{"_id": 1, "x": 12}, {"_id": 3, "x": 33}]


def test_read_concern_rules():
    node = ShardNode(shard_name="s")
    _ok(node, "db", {"insert": "c", "documents": [{"_id": 1}]})
    for body in ({"listCollections": 1}, {"listIndexes": "c"},
                 {"findAndModify": "c", "query": {}, "update": {"$set": {"a": 1}}},
                 {"insert": "c", "documents": [{"_id": 2}]}):
        reply = _run(node, "db", {**body, "readConcern": {"level": "snapshot"}})
        assert (reply["ok"], reply["code"]) == (0.0, 72), reply
        assert "does not support" in reply["errmsg"]
    future = Timestamp(node.clock.now().time + 1000, 1)
    assert _run(node, "db", {"find": "c", "readConcern": {"level": "snapshot",
                                                          "atClusterTime": future}})["code"] == 72
    assert _run(node, "db", {"find": "c", "readConcern": {"level": "nope"}})["code"] == 2
    assert _run(node, "db", {"find": "c", "readConcern": {
        "atClusterTime": node.clock.now()}})["code"] == 72


def test_after_cluster_time_beyond_the_oplog_writes_a_noop_first():
    node = ShardNode(shard_name="s")
    _ok(node, "db", {"insert": "c", "documents": [{"_id": 1}]})
    last = node.oplog.last_ts()
    target = Timestamp(last.time + 5, 0)
    node.clock.advance(target)
    _ok(node, "db", {"find": "c", "readConcern": {"afterClusterTime": target}})
    assert node.oplog.last_ts() > target
    assert list(node.oplog.entries_from(0))[-1]["op"] == "n"


def test_snapshot_too_old_outside_the_history_window():
    node = ShardNode(shard_name="s")
    node.storage.history.window_s = 0
    _ok(node, "db", {"insert": "c", "documents": [{"_id": 1}]})
    coll = node.storage.get("db", "c")
    old = node.oplog.last_ts()
    node.clock.advance(Timestamp(old.time + 10, 0))
    _ok(node, "db", {"insert": "c", "documents": [{"_id": 2}]})
    try:
        documents_at(coll, Timestamp(old.time - 5, 0))
    except MongoError as exc:
        assert exc.code == 239
    else:
        raise AssertionError("expected SnapshotTooOld")
