"""Change-event fields per server-version profile (issue 27, shardsim/core/server_version.py):
8.2.0 emits collectionUUID, updateDescription.disambiguatedPaths and commitTimestamp without
showExpandedEvents (SERVER-86688) and 8.2.1 does not (SERVER-109626); 6.0 and 7.0 have no
nsType on create (8.1+); 6.0 has no disambiguatedPaths (6.1+) and no refineCollectionShardKey
event without its feature flag; ``$changeStream.version`` exists from 8.2, ``ignoreRemovedShards``
from 9.0 (document_source_change_stream.idl / _test.cpp)."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest

from shardsim.testing import ShardedCluster


def _events(name: str, expanded: bool) -> dict[str, dict[str, Any]]:
    """The first event of each operationType for a create, an insert, an update, a
    transaction's insert and a refineCollectionShardKey, watched on the database."""
    out: dict[str, dict[str, Any]] = {}
    with ShardedCluster(1, server_version=name) as cluster:
        with pymongo.MongoClient(cluster.uri) as client:
            db = client.db
            client.admin.command("enableSharding", "db")
            kw = {"show_expanded_events": True} if expanded else {}
            with db.watch(max_await_time_ms=200, **kw) as stream:
                db.create_collection("c")
                db.c.insert_one({"_id": 1, "a": 1, "0": {"1": 0}})
                db.c.update_one({"_id": 1}, {"$set": {"0.1": 5}})
                with client.start_session() as s, s.start_transaction():
                    db.c.insert_one({"_id": 2, "a": 2}, session=s)
                db.c.create_index([("a", 1), ("b", 1)])
                client.admin.command("shardCollection", "db.c", key={"a": 1})
                client.admin.command("refineCollectionShardKey", "db.c", key={"a": 1, "b": 1})
                db.c.insert_one({"_id": 3, "a": 3})  # the last event: everything before is in
                while True:
                    ev = stream.next()
                    key = ev["operationType"]
                    if key == "insert" and ev.get("lsid") is not None:
                        key = "txnInsert"
                    out.setdefault(key, ev)
                    if ev.get("documentKey", {}).get("_id") == 3:
                        return out


def test_820_fields_without_show_expanded_events() -> None:
    ev = _events("8.2.0", expanded=False)
    assert "collectionUUID" in ev["insert"]
    assert ev["update"]["updateDescription"]["disambiguatedPaths"] == {"0.1": ["0", "1"]}
    assert "create" not in ev  # still an expanded event
    assert "commitTimestamp" not in ev["txnInsert"]  # one shard: not prepared, no commit time


@pytest.mark.parametrize("name", ["8.2", "8.0"])
def test_821_reverted(name: str) -> None:
    ev = _events(name, expanded=False)
    assert "collectionUUID" not in ev["insert"]
    assert "disambiguatedPaths" not in ev["update"]["updateDescription"]
    assert "commitTimestamp" not in ev["txnInsert"]


def _prepared_txn_events(name: str, **spec: Any) -> list[dict[str, Any]]:
    """The two events of a transaction writing to two shards (prepared, so its oplog has a
    commitTimestamp), watched with the ``$changeStream`` options ``spec``."""
    with ShardedCluster(2, server_version=name) as cluster:
        with pymongo.MongoClient(cluster.uri) as client:
            client.admin.command("enableSharding", "db", primaryShard="shard0")
            client.admin.command("shardCollection", "db.t", key={"_id": 1})
            client.admin.command("split", "db.t", middle={"_id": 10})
            client.admin.command("moveChunk", "db.t", find={"_id": 10}, to="shard1")
            with client.db.t.aggregate([{"$changeStream": spec}], maxAwaitTimeMS=200) as stream:
                with client.start_session() as s, s.start_transaction():
                    client.db.t.insert_many([{"_id": 1}, {"_id": 11}], session=s)
                return [stream.next(), stream.next()]


@pytest.mark.parametrize("name,present", [("8.2.0", True), ("8.2", False), ("8.0", False)])
def test_commit_timestamp_only_on_820(name: str, present: bool) -> None:
    events = _prepared_txn_events(name)
    assert [("commitTimestamp" in ev) for ev in events] == [present, present]
    if present:
        assert events[0]["commitTimestamp"] == events[1]["commitTimestamp"]


@pytest.mark.parametrize("name,present", [("8.2", True), ("9.0", True), ("8.0", False)])
def test_show_commit_timestamp(name: str, present: bool) -> None:
    events = _prepared_txn_events(name, showCommitTimestamp=True)
    assert [("commitTimestamp" in ev) for ev in events] == [present, present]


@pytest.mark.parametrize("name,ns_type,disambiguated,refine", [
    ("6.0", False, False, False), ("7.0", False, True, True), ("8.0", True, True, True),
    ("8.2", True, True, True)])
def test_expanded_events_per_release(name: str, ns_type: bool, disambiguated: bool,
                                     refine: bool) -> None:
    ev = _events(name, expanded=True)
    assert ("nsType" in ev["create"]) is ns_type
    assert "collectionUUID" in ev["insert"]
    assert ("disambiguatedPaths" in ev["update"]["updateDescription"]) is disambiguated
    assert ("refineCollectionShardKey" in ev) is refine
    assert "shardCollection" in ev


def _open(client: Any, spec: dict[str, Any]) -> None:
    client.db.command("aggregate", "c", pipeline=[{"$changeStream": spec}], cursor={})


def test_change_stream_version_and_ignore_removed_shards_fields() -> None:
    for name, version_ok, ignore_ok in (("8.0", False, False), ("8.2", True, False),
                                        ("9.0", True, True)):
        with ShardedCluster(1, server_version=name) as cluster:
            with pymongo.MongoClient(cluster.uri) as client:
                for field, value, ok in (("version", "v2", version_ok), ("version", "v1", version_ok),
                                         ("ignoreRemovedShards", True, ignore_ok)):
                    if ok:
                        _open(client, {field: value})
                        continue
                    with pytest.raises(pymongo.errors.OperationFailure) as exc:
                        _open(client, {field: value})
                    assert exc.value.code == 40415
                    assert exc.value.details["codeName"] == "IDLUnknownField"
                    assert exc.value.details["errmsg"] == (
                        f"BSON field '$changeStream.{field}' is an unknown field.")
                if version_ok:
                    for bad in ("v3", "V1", "", "2"):
                        with pytest.raises(pymongo.errors.OperationFailure) as exc:
                            _open(client, {"version": bad})
                        assert exc.value.code == 2 and exc.value.details["codeName"] == "BadValue"


@pytest.mark.parametrize("name,event,provenance", [
    ("6.0", False, False), ("7.0", True, False), ("8.0", True, True)])
def test_reshard_collection_event_per_release(name: str, event: bool, provenance: bool) -> None:
    """6.0 emits no reshardCollection event (flag-gated then); 7.0 emits it without
    ``operationDescription.provenance`` (8.0's moveCollection/unshardCollection added it)."""
    with ShardedCluster(2, server_version=name) as cluster:
        with pymongo.MongoClient(cluster.uri) as client:
            admin = client.admin
            admin.command("enableSharding", "rs")
            admin.command("shardCollection", "rs.c", key={"a": 1})
            client.rs.c.insert_one({"_id": 1, "a": 1, "b": 1})
            with client.rs.c.watch(show_expanded_events=True, max_await_time_ms=200) as stream:
                admin.command("reshardCollection", "rs.c", key={"b": 1})
                client.rs.c.insert_one({"_id": 2, "a": 2, "b": 2})
                got = []
                while not got or got[-1]["operationType"] != "insert":
                    got.append(stream.next())
    kinds = [e["operationType"] for e in got]
    assert ("reshardCollection" in kinds) is event
    if event:
        desc = got[kinds.index("reshardCollection")]["operationDescription"]
        assert ("provenance" in desc) is provenance
