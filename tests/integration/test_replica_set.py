"""Replica sets of shard members in process (issue 24): elections, replication, the commit
point, stepdown, a dead primary, rollback, and what drivers see, checked with pymongo against
:class:`shardsim.testing.ReplicaSet` and on every member's own data after each fault."""

from __future__ import annotations

import threading
import time
from typing import Any

import pymongo
import pytest
from pymongo import monitoring
from pymongo.errors import NotPrimaryError, OperationFailure, PyMongoError

from shardsim.core.errors import MongoError
from shardsim.testing import ReplicaSet

MAJORITY = pymongo.WriteConcern("majority", wtimeout=10000)


@pytest.fixture
def rs():
    with ReplicaSet(members=3, seed=24) as rs:
        yield rs


def docs_of(rs: ReplicaSet, host: str, db: str = "test", coll: str = "c") -> list[Any]:
    """The documents of ``db.coll`` on member ``host``'s own storage, sorted by _id."""
    c = rs.node(host).storage.get(db, coll)
    return [] if c is None else sorted(c.docs.values(), key=lambda d: repr(d["_id"]))


def wait_for(cond: Any, timeout: float = 10.0, what: str = "") -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        time.sleep(0.02)


def test_hello_of_every_member_describes_the_set(rs: ReplicaSet) -> None:
    primary = rs.primary_of()
    for host in rs.members_of():
        hello = rs.client(f"mongodb://{host}/", direct=True).admin.command("hello")
        assert list(hello)[:4] == ["topologyVersion", "hosts", "setName", "setVersion"]
        assert set(hello["topologyVersion"]) == {"processId", "counter"}
        assert hello["hosts"] == rs.members_of() and hello["setName"] == "rs0"
        assert hello["me"] == host and hello["primary"] == primary
        assert hello["isWritablePrimary"] is (host == primary)
        assert hello["secondary"] is (host != primary)
        assert ("electionId" in hello) is (host == primary)
        assert hello["lastWrite"]["opTime"]["t"] >= 1
        legacy = rs.client(f"mongodb://{host}/", direct=True).admin.command("isMaster")
        assert legacy["ismaster"] is (host == primary) and "isWritablePrimary" not in legacy


def test_awaitable_hello_waits_and_answers_at_once_on_a_state_change(rs: ReplicaSet) -> None:
    primary = rs.primary_of()
    c = rs.client(f"mongodb://{primary}/", direct=True)
    tv = c.admin.command("hello")["topologyVersion"]
    t0 = time.time()
    same = c.admin.command({"hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 300})
    assert time.time() - t0 >= 0.25 and same["topologyVersion"] == tv
    out: dict[str, Any] = {}

    def wait() -> None:
        out["reply"] = c.admin.command({"hello": 1, "topologyVersion": tv,
                                        "maxAwaitTimeMS": 20000})
        out["at"] = time.time()

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    t1 = time.time()
    rs.step_down()
    waiter.join(15)
    assert out["at"] - t1 < 5
    assert out["reply"]["topologyVersion"]["counter"] > tv["counter"]
    assert out["reply"]["isWritablePrimary"] is False
    with pytest.raises(OperationFailure) as e:
        c.admin.command({"hello": 1, "topologyVersion": tv})
    assert e.value.code == 31368
    assert "must include 'maxAwaitTimeMS'" in e.value.details["errmsg"]


def test_secondaries_refuse_writes_and_reads_without_secondary_ok(rs: ReplicaSet) -> None:
    rs.client().get_database("test", write_concern=MAJORITY).c.insert_one({"_id": 1})
    secondary = next(h for h in rs.members_of() if h != rs.primary_of())
    direct = rs.client(f"mongodb://{secondary}/", direct=True)
    with pytest.raises(NotPrimaryError) as e:
        direct.test.command({"insert": "c", "documents": [{"_id": 2}]})
    reply = e.value.errors
    assert (reply["code"], reply["codeName"], reply["errmsg"]) == \
        (10107, "NotWritablePrimary", "not primary")
    assert "topologyVersion" in reply
    # a driver connected to one member always asks for secondaryOk (server selection spec,
    # topology Single); a command without $readPreference is refused
    name = next(m.name for m in rs.rs.replsets["rs0"] if m.address == secondary)
    with pytest.raises(MongoError) as err:
        rs.command(name, {"find": "c"}, db="test")
    assert (err.value.code, err.value.errmsg) == (13435, "not primary and secondaryOk=false")
    rows = direct.get_database("test", read_preference=pymongo.ReadPreference.SECONDARY).c.find()
    assert list(rows) == [{"_id": 1}]  # answered from the secondary's own data
    assert direct.admin.command("ping")["ok"] == 1
    with pytest.raises(NotPrimaryError) as e:
        direct.admin.command("replSetStepDown", 10)
    assert (e.value.errors["code"], e.value.errors["errmsg"]) == \
        (10107, "not primary so can't step down")


def test_majority_writes_are_on_a_majority_and_every_member_converges(rs: ReplicaSet) -> None:
    coll = rs.client().get_database("test", write_concern=MAJORITY).c
    coll.insert_many([{"_id": i, "v": [i, {"x": i}]} for i in range(50)])
    coll.update_many({"_id": {"$lt": 25}}, {"$set": {"v.1.x": "y", "w": 1}})
    coll.update_many({"_id": {"$lt": 10}}, {"$push": {"v": 0}, "$unset": {"w": 1}})
    coll.delete_many({"_id": {"$gte": 40}})
    expected = sorted(coll.find(), key=lambda d: repr(d["_id"]))
    on_majority = sum(1 for h in rs.members_of() if docs_of(rs, h) == expected)
    assert on_majority >= 2
    wait_for(lambda: all(docs_of(rs, h) == expected for h in rs.members_of()),
             what="every member has the primary's documents")
    wait_for(lambda: len({len(list(rs.node(h).oplog.entries_from(0)))
                          for h in rs.members_of()}) == 1, what="equal oplogs")
    oplogs = [[(e["ts"], e["t"], e["op"]) for e in rs.node(h).oplog.entries_from(0)]
              for h in rs.members_of()]
    assert oplogs[0] == oplogs[1] == oplogs[2]


def test_write_concern_numbers_and_timeouts(rs: ReplicaSet) -> None:
    db = rs.client().test
    reply = db.command({"insert": "c", "documents": [{"_id": 1}], "writeConcern": {"w": 3}})
    assert reply["n"] == 1 and "writeConcernError" not in reply
    reply = db.command({"insert": "c", "documents": [{"_id": 2}], "writeConcern": {"w": 5}})
    assert reply["writeConcernError"]["code"] == 100
    assert reply["writeConcernError"]["codeName"] == "UnsatisfiableWriteConcern"
    secondary = next(h for h in rs.members_of() if h != rs.primary_of())
    rs.partition(rs.primary_of(), secondary)
    reply = db.command({"insert": "c", "documents": [{"_id": 3}],
                        "writeConcern": {"w": 3, "wtimeout": 200}})
    wce = reply["writeConcernError"]
    assert (wce["code"], wce["codeName"]) == (64, "WriteConcernFailed")
    assert wce["errInfo"]["wtimeout"] is True and reply["n"] == 1
    rs.heal()


def test_stepdown_during_a_stream_loses_and_repeats_nothing(rs: ReplicaSet) -> None:
    listener = PoolEvents()
    client = rs.client(event_listeners=[listener])
    coll = client.get_database("test", write_concern=MAJORITY).c
    seen: list[Any] = []
    with coll.watch() as stream:
        for i in range(20):
            coll.insert_one({"_id": i})
            if i == 9:  # the SDAM spec's "rediscover quickly after step-down"
                for host in rs.members_of():
                    if host != rs.primary_of():
                        rs.client(f"mongodb://{host}/", direct=True).admin.command(
                            "replSetFreeze", 0)
                t0 = time.time()
                rs.step_down()
                assert time.time() - t0 < 15
        while len(seen) < 20:
            ev = stream.next()
            seen.append(ev["documentKey"]["_id"])
    assert seen == list(range(20))
    assert listener.cleared == 0  # a stepdown is no network error: no pool is cleared


def test_a_killed_primary_is_replaced_and_the_stream_resumes_with_identical_tokens(
        rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.get_database("test", write_concern=MAJORITY).c
    with coll.watch() as stream:
        coll.insert_many([{"_id": i} for i in range(5)])
        first = [stream.next() for _ in range(5)]
        killed = rs.kill_primary()
        t0 = time.time()
        new = rs.primary_of()
        assert new != killed and time.time() - t0 < 5
        coll.insert_many([{"_id": i} for i in range(5, 10)])
        rest = [stream.next() for _ in range(5)]
    assert [e["documentKey"]["_id"] for e in first + rest] == list(range(10))
    # the same events read on every live member carry the same resume tokens
    tokens = {}
    for host in rs.members_of():
        if host == killed:
            continue
        direct = rs.client(f"mongodb://{host}/", direct=True,
                           read_preference=pymongo.ReadPreference.SECONDARY_PREFERRED)
        with direct.test.c.watch(start_after=first[0]["_id"]) as s:
            tokens[host] = [s.next()["_id"] for _ in range(9)]
    assert len({tuple(map(repr, t)) for t in tokens.values()}) == 1
    assert list(tokens.values())[0] == [e["_id"] for e in first[1:] + rest]
    rs.restart_member(killed)
    expected = docs_of(rs, new)
    wait_for(lambda: docs_of(rs, killed) == expected, what="the restarted member caught up")


def test_a_partitioned_primary_rolls_back_its_w1_writes_and_no_event_shows_them(
        rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.get_database("test", write_concern=MAJORITY).c
    coll.insert_many([{"_id": i} for i in range(5)])
    old = rs.primary_of()
    direct = rs.client(f"mongodb://{old}/", direct=True)
    with coll.watch() as stream:
        for host in rs.members_of():
            if host != old:
                rs.partition(old, host)
        doomed = 0
        while doomed < 200:
            try:
                direct.test.c.insert_one({"_id": 1000 + doomed, "doomed": True})
            except PyMongoError:
                break
            doomed += 1
        assert doomed > 0
        wait_for(lambda: rs.primary_of() != old, what="a new primary")
        coll.insert_one({"_id": 99})
        rs.heal()
        wait_for(lambda: rs.node(old).repl.rollbacks == 1, what="the rollback")
        coll.insert_one({"_id": 100})
        got = []
        while len(got) < 2:
            got.append(stream.next()["documentKey"]["_id"])
        assert got == [99, 100]
        assert stream.try_next() is None
    expected = [{"_id": i} for i in range(5)] + [{"_id": 99}, {"_id": 100}]
    wait_for(lambda: all(docs_of(rs, h) == sorted(expected, key=lambda d: repr(d["_id"]))
                         for h in rs.members_of()), what="every member without the doomed")
    assert rs.node(old).repl.core.durable.rbid == 2
    status = rs.client(f"mongodb://{old}/", direct=True).admin.command("replSetGetStatus")
    assert status["myState"] == 2


def test_repl_set_get_status_and_freeze(rs: ReplicaSet) -> None:
    primary = rs.primary_of()
    st = rs.client(f"mongodb://{primary}/", direct=True).admin.command("replSetGetStatus")
    assert st["set"] == "rs0" and st["myState"] == 1 and st["term"] >= 1
    assert [m["stateStr"] for m in st["members"]].count("PRIMARY") == 1
    assert [m["name"] for m in st["members"]] == rs.members_of()
    assert st["optimes"]["lastCommittedOpTime"]["t"] == st["term"]
    with pytest.raises(OperationFailure) as e:
        rs.client(f"mongodb://{primary}/", direct=True).admin.command("replSetFreeze", 10)
    assert e.value.code == 95 and "state: Primary" in e.value.details["errmsg"]
    secondary = next(h for h in rs.members_of() if h != primary)
    d = rs.client(f"mongodb://{secondary}/", direct=True)
    assert d.admin.command("replSetFreeze", 0)["info"] == "unfreezing"
    assert d.admin.command("replSetFreeze", 1)["warning"].startswith("you really want")
    cfg = d.admin.command("replSetGetConfig")["config"]
    assert cfg["_id"] == "rs0" and [m["host"] for m in cfg["members"]] == rs.members_of()


class PoolEvents(monitoring.ConnectionPoolListener):
    """Counts pool-cleared events (the SDAM "rediscover quickly after step-down" check)."""

    def __init__(self) -> None:
        self.cleared = 0

    def pool_cleared(self, event: Any) -> None:
        self.cleared += 1

    def __getattr__(self, name: str) -> Any:
        return lambda event: None
