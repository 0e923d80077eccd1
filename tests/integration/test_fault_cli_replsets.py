"""``shardsim fault partition|lag|hold-commit-point|heal`` on a detached sharded cluster of
3-member shards (``shardsim up --detach --members 3 --enable-test-commands``), and the member
(and its state) a router's remote cursor is on in ``$currentOp`` and ``shardsim top``.

One cluster (a config server, a router, one shard of three member processes) for every check,
to keep the wall time small; always stopped, nothing left running (tests/integration/
detached_kit.py)."""

from __future__ import annotations

import time
from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure, WriteConcernError
from pymongo.write_concern import WriteConcern

from detached_kit import FAST, detached_cluster, direct, member_state
from shardsim.testing.helpers import change_stream_ops, read_events, wait_until

pytestmark = pytest.mark.timeout(300)


def _address(p: dict[str, Any]) -> str:
    return f"{p['host']}:{p['port']}"


def _status(address: str) -> dict[str, Any]:
    with direct(address) as client:
        return client.admin.command("replSetGetStatus")


def _health(viewer: str, of: str) -> float:
    """``health`` of member ``of`` in ``viewer``'s ``replSetGetStatus``."""
    return next(m["health"] for m in _status(viewer)["members"] if m["name"] == of)


def _applied(address: str) -> Any:
    """The member's own ``optimes.appliedOpTime.ts``."""
    return _status(address)["optimes"]["appliedOpTime"]["ts"]


def _docs_on(address: str) -> int:
    with direct(address, readPreference="secondaryPreferred") as client:
        return client.test.c.count_documents({})


def _remote(client: Any, name: str) -> dict[str, Any]:
    """The ``changeStream.remotes`` entry ``name`` of the router's one change-stream cursor."""
    [op] = change_stream_ops(client, "test.c")
    return next(r for r in op["changeStream"]["remotes"] if r["name"] == name)


def _ids(events: list[dict[str, Any]]) -> list[Any]:
    return [e["documentKey"]["_id"] for e in events]


def test_partition_lag_hold_commit_point_and_remote_cursor_members(tmp_path: Any) -> None:
    with detached_cluster(tmp_path, "--shards", "1", "--members", "3",
                          "--enable-test-commands", *FAST) as run:
        state = run.state()
        members = [_address(p) for p in state["processes"] if p.get("set") == "shard0"]
        router = next(p for p in state["processes"] if p["module"] == "router")
        client: Any = pymongo.MongoClient(state["router_uri"], serverSelectionTimeoutMS=20000)
        try:
            majority = client.test.get_collection(
                "c", write_concern=WriteConcern("majority", wtimeout=15000))
            w1 = client.test.get_collection("c", write_concern=WriteConcern(1))
            majority.insert_one({"_id": 0})
            primary = next(m for m in members if member_state(m) == "PRIMARY")
            s1, s2 = [m for m in members if m != primary]
            with majority.watch(max_await_time_ms=100) as stream:
                # -- the remote cursors: on the primary (readPreference primary), PRIMARY
                remote = _remote(client, "shard0")
                assert remote["host"] == primary and remote["state"] == "PRIMARY"
                top = run.cli("top", "--once").stdout
                row = next(ln for ln in top.splitlines() if " shard0 " in ln)
                assert primary in row and "PRIMARY" in row, top

                # -- partition primary <-> s1 (s1 frozen: it may not stand on its side)
                run.cli("fault", "freeze", s1, "120")
                out = run.cli("fault", "partition", primary, s1).stdout
                assert f"{primary} <-/-> {s1}: link cut" in out
                # cut both ways: each side's heartbeats time out (2 s), not at the same moment
                wait_until(lambda: _health(primary, s1) == 0.0, 15, 0.2)
                wait_until(lambda: _health(s1, primary) == 0.0, 15, 0.2)
                assert _health(primary, s2) == 1.0
                majority.insert_one({"_id": 1})             # w: majority through s2
                assert member_state(primary) == "PRIMARY"
                assert _ids(read_events(stream, 1, 15)) == [1]
                wait_until(lambda: _docs_on(s1) == 2, 15, 0.2)  # s1 syncs from s2 meanwhile
                assert "healed: nothing was isolated" in run.cli("fault", "heal").stdout
                wait_until(lambda: _health(primary, s1) == 1.0, 15, 0.2)
                run.cli("fault", "freeze", s1, "0")

                # -- lag: s1 applies 4 s late; its gap behind the primary grows with writes
                assert f"{s1}: applies 4000 ms late" in \
                    run.cli("fault", "lag", s1, "4000").stdout
                w1.insert_one({"_id": 2})
                time.sleep(0.3)  # s1 has fetched _id 2 and sleeps on it
                gaps = []
                for i in range(3, 13):
                    w1.insert_one({"_id": i})
                    if i in (4, 12):
                        gaps.append(_docs_on(primary) - _docs_on(s1))
                assert 1 <= gaps[0] < gaps[1], gaps            # writes behind, growing
                assert _applied(s1) < _applied(primary)
                wait_until(lambda: _docs_on(s2) == 13, 10, 0.2)    # the other secondary keeps up
                run.cli("fault", "heal")
                wait_until(lambda: _docs_on(s1) == 13, 15, 0.2)
                assert _ids(read_events(stream, 11, 15)) == list(range(2, 13))

                # -- hold the commit point: w: majority times out (64), the stream gets
                # nothing, until heal, then everything in order
                out = run.cli("fault", "hold-commit-point", "shard0").stdout
                assert "shard0: commit point held" in out and s1 in out and s2 in out
                held = client.test.get_collection(
                    "c", write_concern=WriteConcern("majority", wtimeout=1000))
                with pytest.raises(WriteConcernError) as info:
                    held.insert_one({"_id": 100})
                assert info.value.code == 64
                assert info.value.details["errInfo"]["wtimeout"] is True
                w1.insert_one({"_id": 101})
                assert read_events(stream, 1, 2.0) == []
                run.cli("fault", "heal")
                assert _ids(read_events(stream, 2, 15)) == [100, 101]

                # -- a router is a host too: cut from the primary, it sees it UNKNOWN and
                # cannot reach the shard's primary (133 after the find-host timeout)
                client.admin.command("setParameter", 1, defaultFindReplicaSetHostTimeoutMS=1500)
                run.cli("fault", "partition", router["name"], primary)
                wait_until(lambda: _remote(client, "shard0")["state"] == "UNKNOWN", 15, 0.2)
                top = run.cli("top", "--once").stdout
                row = next(ln for ln in top.splitlines() if " shard0 " in ln)
                assert primary in row and "UNKNOWN" in row, top
                with pytest.raises(OperationFailure) as failed:
                    client.test.c.find_one({"_id": 0})
                assert failed.value.code == 133
                run.cli("fault", "heal")
                wait_until(lambda: _remote(client, "shard0")["state"] == "PRIMARY", 15, 0.2)
                assert client.test.c.find_one({"_id": 0}) == {"_id": 0}
        finally:
            client.close()
