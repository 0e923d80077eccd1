"""``explain`` through the router of the shared cluster, in mongos' shape: SINGLE_SHARD /
SHARD_MERGE / SHARD_MERGE_SORT / SHARD_WRITE with each shard's plan (COLLSCAN, IXSCAN,
EXPRESS_IXSCAN, COUNT, UPDATE, DELETE), executionStats with the verbosity, aggregate's
splitPipeline, and the errors."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def db(cluster: Any) -> Any:
    client: pymongo.MongoClient = pymongo.MongoClient(cluster.router_uri)
    client.drop_database("explain_t")
    client.admin.command("enableSharding", "explain_t")
    client.admin.command("shardCollection", "explain_t.s", key={"_id": 1})
    client.admin.command("split", "explain_t.s", middle={"_id": 5})
    primary = client.config.databases.find_one({"_id": "explain_t"})["primary"]
    other = next(s["_id"] for s in client.admin.command("listShards")["shards"]
                 if s["_id"] != primary)
    client.admin.command("moveChunk", "explain_t.s", find={"_id": 5}, to=other)
    client.explain_t.s.insert_many([{"_id": i, "x": i % 3} for i in range(10)])
    client.explain_t.s.create_index("x")
    client.explain_t.u.insert_many([{"_id": i, "x": i % 3} for i in range(4)])
    yield client.explain_t
    client.close()


def _leaf(plan: dict[str, Any]) -> dict[str, Any]:
    while "inputStage" in plan:
        plan = plan["inputStage"]
    return plan


def test_find_merge_sort_with_execution_stats(db: Any) -> None:
    out = db.command("explain", {"find": "s", "filter": {"x": 1}, "sort": {"_id": 1}},
                     verbosity="executionStats")
    qp = out["queryPlanner"]
    assert qp["mongosPlannerVersion"] == 1
    assert qp["winningPlan"]["stage"] == "SHARD_MERGE_SORT"
    shards = qp["winningPlan"]["shards"]
    assert len(shards) == 2
    for s in shards:
        assert s["connectionString"].startswith(s["shardName"] + "/")
        assert set(s["serverInfo"]) >= {"host", "port", "version", "gitVersion"}
        assert s["namespace"] == "explain_t.s"
        assert s["parsedQuery"] == {"x": {"$eq": 1}}
        assert s["winningPlan"]["stage"] == "SORT"
        leaf = _leaf(s["winningPlan"])
        assert (leaf["stage"], leaf["indexName"], leaf["indexBounds"]) == \
            ("IXSCAN", "x_1", {"x": ["[1, 1]"]})
    st = out["executionStats"]
    assert st["nReturned"] == 3 and st["totalDocsExamined"] == 3
    stages = st["executionStages"]
    assert stages["stage"] == "SHARD_MERGE_SORT" and len(stages["shards"]) == 2
    assert sum(s["executionStages"]["nReturned"] for s in stages["shards"]) == 3
    assert {"serverInfo", "serverParameters", "command"} <= set(out)
    assert out["command"]["find"] == "s"


def test_targeted_and_unsharded_reads(db: Any) -> None:
    out = db.command("explain", {"find": "s", "filter": {"_id": 3}}, verbosity="queryPlanner")
    plan = out["queryPlanner"]["winningPlan"]
    assert plan["stage"] == "SINGLE_SHARD" and len(plan["shards"]) == 1
    assert plan["shards"][0]["winningPlan"]["stage"] == "EXPRESS_IXSCAN"
    assert "executionStats" not in out
    # pymongo's Cursor.explain (default verbosity: allPlansExecution)
    out = db.u.find({"x": 2}).explain()
    shard_plan = out["queryPlanner"]["winningPlan"]["shards"][0]["winningPlan"]
    assert shard_plan == {"stage": "COLLSCAN", "filter": {"x": {"$eq": 2}},
                          "direction": "forward"}
    assert out["executionStats"]["nReturned"] == 1
    assert out["executionStats"]["totalDocsExamined"] == 4
    out = db.command("explain", {"count": "s", "query": {"x": 0}})
    assert out["queryPlanner"]["winningPlan"]["stage"] == "SHARD_MERGE"
    assert all(s["winningPlan"]["stage"] == "COUNT"
               for s in out["queryPlanner"]["winningPlan"]["shards"])
    out = db.command("explain", {"distinct": "u", "key": "x"}, verbosity="executionStats")
    assert out["queryPlanner"]["winningPlan"]["shards"][0]["winningPlan"]["stage"] == \
        "PROJECTION_SIMPLE"
    assert out["executionStats"]["nReturned"] == 3


def test_writes_are_planned_not_applied(db: Any) -> None:
    out = db.command("explain", {"delete": "s", "deletes": [{"q": {"x": 2}, "limit": 0}]},
                     verbosity="executionStats")
    assert out["queryPlanner"]["winningPlan"]["stage"] == "SHARD_WRITE"
    shards = out["executionStats"]["executionStages"]["shards"]
    assert sum(s["executionStages"]["nWouldDelete"] for s in shards) == 3
    assert all(s["executionStages"]["stage"] == "DELETE" for s in shards)
    out = db.command("explain", {"update": "u", "updates": [
        {"q": {"x": 1}, "u": {"$set": {"y": 1}}, "multi": True}]}, verbosity="executionStats")
    stage = out["executionStats"]["executionStages"]["shards"][0]["executionStages"]
    assert (stage["stage"], stage["nMatched"], stage["nWouldModify"]) == ("UPDATE", 1, 1)
    out = db.command("explain", {"findAndModify": "s", "query": {"_id": 7},
                                 "update": {"$set": {"y": 1}}})
    assert out["queryPlanner"]["winningPlan"]["stage"] == "SINGLE_SHARD"
    assert db.s.count_documents({"x": 2}) == 3 and db.u.count_documents({"y": 1}) == 0


def test_aggregate_split_pipeline(db: Any) -> None:
    out = db.command("explain", {"aggregate": "s", "cursor": {}, "pipeline": [
        {"$match": {"x": 1}}, {"$group": {"_id": None, "n": {"$sum": 1}}}]},
        verbosity="queryPlanner")
    assert out["mergeType"] == "mongos"
    assert out["splitPipeline"]["shardsPart"] == [{"$match": {"x": 1}}]
    assert list(out["splitPipeline"]["mergerPart"][0]) == ["$mergeCursors"]
    assert out["splitPipeline"]["mergerPart"][1:] == [{"$group": {"_id": None,
                                                                  "n": {"$sum": 1}}}]
    assert len(out["shards"]) == 2
    for shard in out["shards"].values():
        assert "host" in shard and _leaf(shard["queryPlanner"]["winningPlan"])["stage"] == \
            "IXSCAN"
    out = db.command("aggregate", "u", pipeline=[{"$group": {"_id": "$x"}}], explain=True)
    assert out["splitPipeline"] is None
    (shard,) = out["shards"].values()
    assert shard["stages"][0]["$cursor"]["queryPlanner"]["namespace"] == "explain_t.u"
    assert shard["stages"][1] == {"$group": {"_id": "$x"}}


def test_explain_errors(db: Any) -> None:
    for cmd, kw, code in (({"find": "s", "hint": "nope"}, {}, 2),
                          ({"find": "s"}, {"verbosity": "loud"}, 9),
                          ({"insert": "s", "documents": [{}]}, {}, 20),
                          ({"listIndexes": "s"}, {}, 59),
                          ({"delete": "s", "deletes": [{"q": {}, "limit": 0}] * 2}, {}, 16)):
        with pytest.raises(OperationFailure) as info:
            db.command("explain", cmd, **kw)
        assert info.value.code == code, cmd


def test_the_plan_reported_is_the_plan_run(db: Any) -> None:
    """Issue 29: the index a find reads through, its direction and the counters of running it;
    an index that gives the sort leaves no SORT stage; a hinted sparse index holds only the
    documents with the field."""
    c = db.ix
    c.insert_many([{"_id": i, "x": i % 10, "y": i, **({"z": i} if i < 4 else {})}
                   for i in range(30)])
    c.create_index("x")
    c.create_index([("y", -1)])
    c.create_index("z", sparse=True)

    def shard(out: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        return (out["queryPlanner"]["winningPlan"]["shards"][0]["winningPlan"],
                out["executionStats"]["executionStages"]["shards"][0]["executionStages"])

    plan, stats = shard(c.find({"x": 3}).explain())
    leaf = _leaf(stats)
    assert (plan["stage"], _leaf(plan)["indexName"]) == ("FETCH", "x_1")
    assert (leaf["stage"], leaf["keysExamined"]) == ("IXSCAN", 3)
    assert (stats["docsExamined"], stats["nReturned"]) == (3, 3)
    out = c.find({"y": {"$gte": 10}}).sort("y", 1).limit(2).explain()
    plan, stats = shard(out)
    assert plan["stage"] == "LIMIT" and "SORT" not in str(plan)
    assert (_leaf(plan)["indexName"], _leaf(plan)["direction"]) == ("y_-1", "backward")
    assert _leaf(stats)["keysExamined"] == 2 and out["executionStats"]["nReturned"] == 2
    assert [d["y"] for d in c.find({"y": {"$gte": 10}}).sort("y", 1).limit(2)] == [10, 11]
    plan, stats = shard(c.find({"w": 1}).explain())
    assert plan["stage"] == "COLLSCAN" and stats["docsExamined"] == 30
    assert [d["_id"] for d in c.find({}).hint("z_1")] == [0, 1, 2, 3]
    assert c.count_documents({}) == 30 and len(list(c.find({}))) == 30
