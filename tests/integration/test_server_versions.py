"""Server-version profiles (issue 27, shardsim/core/server_version.py): what a client sees of
the release it talks to: buildInfo, hello's maxWireVersion, the FCV, the 8.0-only commands."""

from __future__ import annotations

import pymongo
import pytest

from shardsim.core import server_version
from shardsim.testing import ShardedCluster

EXPECTED = {  # name: (buildInfo.version, maxWireVersion, FCV, has moveCollection)
    "6.0": ("6.0.20", 17, "6.0", False),
    "7.0": ("7.0.16", 21, "7.0", False),
    "8.0": ("8.0.4", 25, "8.0", True),
    "8.2.0": ("8.2.0", 27, "8.2", True),
    "8.2": ("8.2.1", 27, "8.2", True),
    "9.0": ("9.0.1", 29, "9.0", True),
}


def test_profiles_listed_and_default_is_80() -> None:
    assert server_version.names() == list(EXPECTED)
    assert server_version.get(None).name == "8.0" and server_version.DEFAULT.is_default
    with pytest.raises(ValueError):
        server_version.get("5.0")
    with pytest.raises(ValueError):
        ShardedCluster(1, server_version="5.0")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_router_and_shard_follow_profile(name: str) -> None:
    version, wire, fcv, has_80 = EXPECTED[name]
    with ShardedCluster(1, server_version=name) as cluster:
        targets = [cluster.uri, "mongodb://" + cluster.cluster.shard_address("shard0") + "/"]
        for uri in targets:
            with pymongo.MongoClient(uri, directConnection=True) as client:
                info = client.admin.command("buildInfo")
                assert info["version"] == version
                assert info["versionArray"] == [int(x) for x in version.split(".")] + [0]
                assert client.config.command("buildinfo")["version"] == version
                assert client.admin.command("hello")["maxWireVersion"] == wire
                fcv_doc = client.admin.command("getParameter", 1, featureCompatibilityVersion=1)
                assert fcv_doc["featureCompatibilityVersion"] == {"version": fcv}
                explained = client.db.command("explain", {"find": "c"})
                assert explained["serverInfo"]["version"] == version
        with pymongo.MongoClient(cluster.uri) as client:
            client.db.c.insert_one({"_id": 1})
            for cmd in ("moveCollection", "unshardCollection"):
                if has_80:
                    continue
                with pytest.raises(pymongo.errors.OperationFailure) as exc:
                    client.admin.command(cmd, "db.c", toShard="shard0")
                assert exc.value.code == 59
                assert exc.value.details["codeName"] == "CommandNotFound"
                assert exc.value.details["errmsg"] == f"no such command: '{cmd}'"
            if has_80:
                client.admin.command("enableSharding", "db")
                client.admin.command("moveCollection", "db.c", toShard="shard0")


def _watch_two_inserts(name: str) -> tuple[list[dict], dict, dict]:
    """Events of two inserts on a sharded collection watched through the router of a cluster of
    profile ``name``, the stream's last postBatchResumeToken, and a resumed stream's event."""
    with ShardedCluster(2, server_version=name) as cluster:
        with pymongo.MongoClient(cluster.uri) as client:
            client.admin.command("enableSharding", "db")
            client.admin.command("shardCollection", "db.c", key={"_id": "hashed"})
            coll = client.db.c
            with coll.watch(max_await_time_ms=200) as stream:
                coll.insert_many([{"_id": 1}, {"_id": 2}])
                events = [stream.next(), stream.next()]
                assert stream.try_next() is None  # an empty batch: its PBRT is a high-water mark
                pbrt = stream.resume_token
            with coll.watch(resume_after=events[0]["_id"], max_await_time_ms=200) as again:
                resumed = again.next()
    return events, pbrt, resumed


def test_60_streams_make_v1_tokens() -> None:
    from shardsim.core import resume_token as rt
    events, pbrt, resumed = _watch_two_inserts("6.0")
    for ev in events:
        data = rt.decode(ev["_id"])
        assert data.version == 1 and data.eventIdentifier == ev["documentKey"]
        assert rt.event_token(ev["clusterTime"], data.uuid, "insert", ev["documentKey"],
                              version=1) == ev["_id"]
    assert rt.decode(pbrt).version == 1 and rt.is_high_water_mark(rt.decode(pbrt))
    assert resumed["_id"] == events[1]["_id"]


def test_80_streams_keep_v2_tokens() -> None:
    from shardsim.core import resume_token as rt
    events, pbrt, resumed = _watch_two_inserts("8.0")
    for ev in events:
        data = rt.decode(ev["_id"])
        assert data.version == 2
        assert data.eventIdentifier == {"operationType": "insert", "documentKey": ev["documentKey"]}
    assert rt.decode(pbrt).version == 2
    assert resumed["_id"] == events[1]["_id"]


def test_spec_cli_server_version_option() -> None:
    from click.testing import CliRunner

    from shardsim.tools.unified.cli import spec
    result = CliRunner().invoke(spec, ["--help"])
    assert "--server-version [6.0|7.0|8.0|8.2.0|8.2|9.0]" in result.output
    result = CliRunner().invoke(spec, ["--uri", "mongodb://127.0.0.1:1/", "--server-version", "6.0"])
    assert result.exit_code == 1 and "--server-version chooses what shardsim starts" in result.output
    result = CliRunner().invoke(spec, ["--server-version", "5.0"])
    assert result.exit_code == 2


def test_60_new_shard_cursor_keeps_v1_tokens() -> None:
    """A shard added while a 6.0 stream is open is opened from a v1 high-water mark, so its
    events carry v1 tokens too (a v2 start token would switch that shard to v2)."""
    from shardsim.core import resume_token as rt
    with ShardedCluster(1, server_version="6.0") as cluster:
        with pymongo.MongoClient(cluster.uri) as client:
            client.a.c.insert_one({"_id": 0})
            with client.watch(max_await_time_ms=200) as stream:
                new = cluster.add_shard()
                client.admin.command("enableSharding", "b", primaryShard=new)
                client.b.c.insert_one({"_id": 1})
                client.a.c.insert_one({"_id": 2})
                events = [stream.next(), stream.next()]
                assert stream.try_next() is None
                pbrt = stream.resume_token
    assert sorted(e["documentKey"]["_id"] for e in events) == [1, 2]
    for ev in events:
        assert rt.decode(ev["_id"]).version == 1
    assert rt.decode(pbrt).version == 1


def test_60_router_asks_remotes_for_v1_tokens() -> None:
    """What the 6.0 router sends: ``$_generateV2ResumeTokens: false`` to every remote."""
    from shardsim.router.change_stream.cursor import RouterChangeStream

    class _Router:
        def __init__(self, name: str) -> None:
            self.profile = server_version.get(name)
            self.promise_requests = None
    for name, expected in (("6.0", {"$_generateV2ResumeTokens": False}), ("8.0", {})):
        stream = RouterChangeStream(_Router(name), "db", "c", "db.c", {}, [],
                                    {"aggregate": "c", "pipeline": [{"$changeStream": {}}]})
        cmd = stream._shard_command({"startAtOperationTime": 1})
        assert cmd["pipeline"][0]["$changeStream"] == {"startAtOperationTime": 1, **expected}
