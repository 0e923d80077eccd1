"""Mixed-version clusters (issue 27): members on different releases during a rolling upgrade,
the featureCompatibilityVersion (shardsim/core/fcv.py) and what it gates, and the router merging
events of shards of different releases (the fields each release adds, TOOLS-3803)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pymongo
import pytest

from shardsim.core import resume_token as rt
from shardsim.testing import ShardedCluster


def _fcvs(cluster: ShardedCluster) -> dict[str, str]:
    out = {}
    targets = {"router": cluster.uri}
    targets.update({n: "mongodb://" + cluster.shard_address(n) + "/" for n in cluster.shard_names})
    for name, uri in targets.items():
        with pymongo.MongoClient(uri, directConnection=True) as c:
            doc = c.admin.command("getParameter", 1, featureCompatibilityVersion=1)
            out[name] = doc["featureCompatibilityVersion"]["version"]
    return out


def _read(stream: Any, n: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
    return out


def test_a_binary_must_run_at_the_cluster_fcv() -> None:
    with pytest.raises(ValueError, match="cannot run at featureCompatibilityVersion 6.0"):
        ShardedCluster(2, server_version={"router": "6.0", "shards": "8.0"})


def test_fcv_starts_at_the_lowest_binary_and_set_fcv_upgrades() -> None:
    versions = {"router": "8.0", "config": "8.0", "shards": "8.0", "shard0": "7.0"}
    with ShardedCluster(2, server_version=versions) as cluster, \
            pymongo.MongoClient(cluster.uri) as client:
        assert _fcvs(cluster) == {"router": "7.0", "shard0": "7.0", "shard1": "7.0"}
        with pytest.raises(pymongo.errors.OperationFailure) as exc:
            client.admin.command("setFeatureCompatibilityVersion", "8.0")
        assert exc.value.code == 7369100
        assert exc.value.details["errmsg"].startswith("Once you have upgraded to 8.0, you will not")
        # shard0 still runs a 7.0 binary: it refuses, shard1 is set back
        with pytest.raises(pymongo.errors.OperationFailure) as exc:
            client.admin.command("setFeatureCompatibilityVersion", "8.0", confirm=True)
        assert exc.value.code == 2
        assert "Expected one of the following versions: ''6.0', '6.3', '7.0'" \
            in exc.value.details["errmsg"]
        assert _fcvs(cluster) == {"router": "7.0", "shard0": "7.0", "shard1": "7.0"}
        with pytest.raises(pymongo.errors.OperationFailure) as exc:
            client.admin.command("setFeatureCompatibilityVersion", "9.0", confirm=True)
        assert exc.value.code == 2  # the 8.0 config server does not know 9.0
        client.admin.command("setFeatureCompatibilityVersion", "7.0")  # the same FCV: no-op

    with ShardedCluster(2, server_version={"router": "8.0", "config": "8.0", "shards": "8.0"}) as c2, \
            pymongo.MongoClient(c2.uri) as client:
        assert set(_fcvs(c2).values()) == {"8.0"}
        client.admin.command("setFeatureCompatibilityVersion", "7.0", confirm=True)
        assert set(_fcvs(c2).values()) == {"7.0"}


def test_confirm_is_unknown_on_60() -> None:
    with ShardedCluster(1, server_version="6.0") as cluster, \
            pymongo.MongoClient(cluster.uri) as client:
        with pytest.raises(pymongo.errors.OperationFailure) as exc:
            client.admin.command("setFeatureCompatibilityVersion", "5.0", confirm=True)
        assert exc.value.code == 40415
        assert exc.value.details["errmsg"] == \
            "BSON field 'setFeatureCompatibilityVersion.confirm' is an unknown field."


@pytest.mark.parametrize("old,new,field,on_old_only", [
    ("7.0", "8.0", "nsType", False),           # 8.0 shards add nsType to create events
    ("8.2.0", "8.2", "collectionUUID", True),  # only 8.2.0 shows it without showExpandedEvents
])
def test_router_merges_events_of_both_releases(old: str, new: str, field: str,
                                               on_old_only: bool) -> None:
    versions = {"router": new, "config": new, "shards": new, "shard0": old}
    expanded = field == "nsType"
    with ShardedCluster(2, server_version=versions) as cluster, \
            pymongo.MongoClient(cluster.uri) as client:
        a, b = "mx_a_" + uuid.uuid4().hex[:4], "mx_b_" + uuid.uuid4().hex[:4]
        client.admin.command("enableSharding", a, primaryShard="shard0")  # the old binary
        client.admin.command("enableSharding", b, primaryShard="shard1")  # the new one
        with client.watch(show_expanded_events=expanded or None, max_await_time_ms=300) as s:
            for i in range(3):
                client[a].c.insert_one({"_id": i})
                client[b].c.insert_one({"_id": i})
            want = 6 + (2 if expanded else 0)
            evs = _read(s, want)
        assert len(evs) == want
        tokens = [e["_id"]["_data"] for e in evs]
        assert tokens == sorted(tokens)  # one stream, in token order
        for e in evs:
            if expanded and e["operationType"] != "create":
                continue
            on_old = e["ns"]["db"] == a
            assert (field in e) is (on_old if on_old_only else not on_old), e


def test_60_router_over_70_shards_gets_v1_tokens() -> None:
    versions = {"router": "6.0", "config": "7.0", "shards": "7.0"}
    with ShardedCluster(2, server_version=versions) as cluster, \
            pymongo.MongoClient(cluster.uri) as client:
        assert set(_fcvs(cluster).values()) == {"6.0"}
        coll = client.db60.c
        with coll.watch(max_await_time_ms=300) as s:
            coll.insert_one({"_id": 1})
            ev = _read(s, 1)[0]
        data = rt.decode(ev["_id"])
        assert data.version == 1 and data.eventIdentifier == {"_id": 1}


def test_v2_reader_needs_fcv_90() -> None:
    versions = {"router": "9.0", "config": "9.0", "shards": "9.0", "shard2": "8.0"}
    with ShardedCluster(3, server_version=versions) as cluster, \
            pymongo.MongoClient(cluster.uri) as client:
        assert set(_fcvs(cluster).values()) == {"8.0"}
        client.admin.command("enableSharding", "fcvdb", primaryShard="shard1")
        coll = client.fcvdb.c
        # FCV 8.0: v1 (and the 8.0 shard is not sent the 8.2+ 'version' field)
        with coll.aggregate([{"$changeStream": {"version": "v2"}}], maxAwaitTimeMS=300) as s:
            coll.insert_one({"_id": 1})
            assert [e["documentKey"] for e in _read(s, 1)] == [{"_id": 1}]
            router = cluster.cluster.router.node
            stream = next(iter(router.promise_requests.streams))
            assert stream.topology_v2 is None
            assert sorted(r.name for r in stream.merger.remotes) == \
                ["config", "shard0", "shard1", "shard2"]


def test_fcv_downgrade_clears_the_placement_history() -> None:
    with ShardedCluster(3, server_version="9.0") as cluster, \
            pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("enableSharding", "hist", primaryShard="shard1")
        coll = client.hist.c
        coll.insert_one({"_id": 0})
        before = client.hist.command("ping")["operationTime"]
        client.admin.command("setFeatureCompatibilityVersion", "8.0", confirm=True)
        assert set(_fcvs(cluster).values()) == {"8.0"}
        client.admin.command("setFeatureCompatibilityVersion", "9.0", confirm=True)
        router = cluster.cluster.router.node

        def remotes(**spec: Any) -> list[str]:
            with coll.aggregate([{"$changeStream": {"version": "v2", **spec}}]) as s:
                stream = [st for st in router.promise_requests.streams if not st.closed][-1]
                names = sorted(r.name for r in stream.merger.remotes)
                s.close()
            return names

        # a start before the downgrade: no history for it any more -> the v1 reader
        assert remotes(startAtOperationTime=before) == ["config", "shard0", "shard1", "shard2"]
        assert remotes() == ["shard1"]  # now: the new history answers


def test_fcv_downgrade_ends_open_v2_streams_with_a_resumable_error() -> None:
    with ShardedCluster(2, server_version="9.0") as cluster, \
            pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("enableSharding", "dg", primaryShard="shard1")
        coll = client.dg.c
        coll.insert_one({"_id": 0})
        with coll.aggregate([{"$changeStream": {"version": "v2"}}], maxAwaitTimeMS=300) as s:
            client.admin.command("setFeatureCompatibilityVersion", "8.0", confirm=True)
            with pytest.raises(pymongo.errors.OperationFailure) as exc:
                for _ in range(40):
                    s.try_next()
            assert exc.value.code == 234
            assert "ResumableChangeStreamError" in exc.value.details.get("errorLabels", [])


def test_new_and_restarted_members_get_the_current_fcv() -> None:
    with ShardedCluster(2, server_version="8.0") as cluster, \
            pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("setFeatureCompatibilityVersion", "7.0", confirm=True)
        name = cluster.add_shard()
        cluster.restart_shard("shard0")
        fcvs = _fcvs(cluster)
        assert fcvs["shard0"] == fcvs[name] == "7.0"
