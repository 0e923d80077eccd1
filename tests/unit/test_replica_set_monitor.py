"""The replica-set monitor (shardsim/core/replica_set_monitor.py) against fake members
(tests/support/fakes.py FakeReplicaSet): discovery from hello, a primary change learned from the
awaitable hello or by polling, what errors mark, read-preference selection, 133 after the
deadline; connection strings and read preferences; the router's ShardRegistry following the
catalog."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from bson import ObjectId
from bson.int64 import Int64
from hypothesis import given, settings, strategies as st

from shardsim.core.errors import MongoError
from shardsim.core.replica_set_monitor import (PRIMARY, SECONDARY, UNKNOWN, ConnectionString,
                                               ReadPreference, ReplicaSetMonitor,
                                               is_stale_topology_version)
from shardsim.router.shard_registry import ShardRegistry, read_preference_document
from tests.support.fakes import FakeReplicaSet


def _monitor(rs: FakeReplicaSet, seeds: str | None = None, **kw: Any) -> ReplicaSetMonitor:
    kw.setdefault("heartbeat_s", 60.0)  # no polling unless a test asks for it
    kw.setdefault("seed", 1)
    return ReplicaSetMonitor(seeds or f"{rs.name}/{rs.hosts[0]}", pool_factory=rs.pool,
                             check_factory=rs.connection, **kw)


async def _until(pred: Any, timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- discovery ----------------------------------------------------------------------------------
def test_one_seed_discovers_every_member_and_the_primary() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 3)
        mon = _monitor(rs)
        assert mon.primary is None and list(mon.members) == ["h0:27017"]
        assert await mon.get_host() == "h0:27017"
        assert sorted(mon.members) == rs.hosts
        assert str(mon.connection_string()) == "rs0/h0:27017,h1:27017,h2:27017"
        assert mon.primary_pool() is rs.pools["h0:27017"]
        await _until(lambda: all(m.kind != UNKNOWN for m in mon.members.values()))
        assert [m.kind for m in mon.members.values()] == [PRIMARY, SECONDARY, SECONDARY]
        mon.close()
    run(main())


def test_a_seed_that_is_a_secondary_leads_to_the_primary() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 3)
        mon = _monitor(rs, "rs0/h2:27017")
        assert await mon.get_host() == "h0:27017"
        mon.close()
    run(main())


def test_the_primary_removes_members_it_does_not_list_and_other_sets_are_dropped() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 2)
        mon = _monitor(rs, "rs0/h0:27017,h1:27017,gone:27017")
        rs.counters["gone:27017"] = 0  # reachable, but the primary does not list it
        rs.process_ids["gone:27017"] = ObjectId()
        rs.set_name_of["gone:27017"] = "other"
        await mon.get_host()
        await _until(lambda: "gone:27017" not in mon.members)
        assert sorted(mon.members) == ["h0:27017", "h1:27017"]
        mon.close()
    run(main())


def test_a_plain_host_adopts_the_set_name_from_hello() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("shard0", 1)
        mon = _monitor(rs, "h0:27017")
        assert mon.set_name is None and mon.name == "h0:27017"
        assert await mon.get_host() == "h0:27017"
        assert mon.set_name == "shard0"
        assert str(mon.connection_string()) == "shard0/h0:27017"
        mon.close()
    run(main())


# -- primary changes ---------------------------------------------------------------------------
def test_the_awaitable_hello_reports_a_new_primary_without_polling() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 3)
        mon = _monitor(rs, heartbeat_s=60.0)
        await mon.get_host()
        await _until(lambda: all(m.topology_version for m in mon.members.values()))
        rs.elect("h1:27017")  # every member's topologyVersion moves: the waiting hellos answer
        await _until(lambda: mon.primary == "h1:27017")
        assert mon.members["h0:27017"].kind == SECONDARY
        assert mon.primary_pool() is rs.pools["h1:27017"]
        mon.close()
    run(main())


def test_members_without_topology_version_are_polled() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 2, topology_version=False)
        mon = _monitor(rs, heartbeat_s=0.02)
        await mon.get_host()
        before = dict(rs.hellos)
        await asyncio.sleep(0.15)
        assert all(rs.hellos[h] >= before.get(h, 0) + 2 for h in rs.hosts)  # polled
        rs.elect("h1:27017")
        await _until(lambda: mon.primary == "h1:27017")
        mon.close()
    run(main())


def test_a_stale_primary_is_not_believed() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 2)
        mon = _monitor(rs)
        rs.term = 5
        await mon.get_host()
        old = rs.hello("h0:27017")
        old["electionId"] = ObjectId(f"7fffffff{1:016x}")  # an earlier term
        old["topologyVersion"] = {"processId": ObjectId(), "counter": Int64(0)}
        mon.apply_hello("h1:27017", {**old, "me": "h1:27017"})
        assert mon.primary == "h0:27017" and mon.members["h1:27017"].kind == UNKNOWN
        mon.close()
    run(main())


# -- errors ------------------------------------------------------------------------------------
def test_not_primary_marks_at_once_and_the_next_selection_finds_the_new_primary() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 3, topology_version=False)
        mon = _monitor(rs, heartbeat_s=60.0)
        await mon.get_host()
        rs.elect("h2:27017")
        mon.update_host_with_status("h0:27017", MongoError(10107, "not primary"))
        assert mon.primary is None and mon.primary_pool() is None  # no round trip needed
        assert await mon.get_host(timeout_s=2) == "h2:27017"  # the immediate checks found it
        mon.close()
    run(main())


@pytest.mark.parametrize("code", [10107, 13435, 11602, 189])
def test_not_primary_codes(code: int) -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 1)
        mon = _monitor(rs)
        await mon.get_host()
        mon.update_host_with_status("h0:27017", MongoError(code, "x"))
        assert mon.primary is None and rs.pools["h0:27017"].closed == 0
        mon.close()
    run(main())


@pytest.mark.parametrize("code", [6, 89, 9001, 91, 11600])
def test_network_and_shutdown_errors_mark_unreachable_and_drop_the_pool(code: int) -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 1)
        mon = _monitor(rs)
        await mon.get_host()
        mon.update_host_with_status("h0:27017", MongoError(code, "x"))
        assert mon.primary is None and rs.pools["h0:27017"].closed == 1
        mon.close()
    run(main())


def test_other_errors_say_nothing() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 1)
        mon = _monitor(rs)
        await mon.get_host()
        for code in (2, 11000, 13388, 50):
            mon.update_host_with_status("h0:27017", MongoError(code, "x"))
        assert mon.primary == "h0:27017"
        mon.close()
    run(main())


def test_a_stale_not_primary_error_is_ignored() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 1)
        mon = _monitor(rs)
        await mon.get_host()
        known = mon.members["h0:27017"].topology_version
        old = {"processId": known["processId"], "counter": Int64(int(known["counter"]) - 1)}
        mon.mark_not_primary("h0:27017", old)
        assert mon.primary == "h0:27017"
        mon.mark_not_primary("h0:27017", known)  # not older: believed
        assert mon.primary is None
        mon.close()
    run(main())


def test_a_dead_member_is_replaced_once_another_is_elected() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 3)
        mon = _monitor(rs, heartbeat_s=0.02)
        await mon.get_host()
        rs.kill("h0:27017")
        mon.update_host_with_status("h0:27017", MongoError(6, "connection refused"))
        waiter = asyncio.ensure_future(mon.get_host(timeout_s=5))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # no primary yet: the selection waits
        rs.elect("h1:27017")
        assert await waiter == "h1:27017"
        mon.close()
    run(main())


# -- selection ---------------------------------------------------------------------------------
def test_read_preference_modes() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 3)
        mon = _monitor(rs)
        await mon.get_host()
        await _until(lambda: all(m.kind != UNKNOWN for m in mon.members.values()))
        secondaries = {"h1:27017", "h2:27017"}
        rp = ReadPreference.parse
        assert mon.select(rp({"mode": "primary"})) == "h0:27017"
        assert mon.select(rp({"mode": "primaryPreferred"})) == "h0:27017"
        picks = {mon.select(rp({"mode": "secondary"})) for _ in range(50)}
        assert picks == secondaries  # random among equally near members
        assert mon.select(rp({"mode": "secondaryPreferred"})) in secondaries
        assert {mon.select(rp({"mode": "nearest"})) for _ in range(80)} == set(rs.hosts)
        # excluded members are not chosen
        assert mon.select(rp({"mode": "secondary"}), exclude=["h1:27017"]) == "h2:27017"
        # without secondaries: secondaryPreferred falls back to the primary, secondary to none
        for h in secondaries:
            mon.members[h].kind = UNKNOWN
        assert mon.select(rp({"mode": "secondaryPreferred"})) == "h0:27017"
        assert mon.select(rp({"mode": "secondary"})) is None
        # without a primary: primaryPreferred takes a secondary
        mon.members["h1:27017"].kind = SECONDARY
        mon.mark_not_primary("h0:27017")
        assert mon.select(rp({"mode": "primaryPreferred"})) == "h1:27017"
        mon.close()
    run(main())


def test_tag_sets_are_tried_in_order() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 3)
        rs.tags = {"h1:27017": {"dc": "ny"}, "h2:27017": {"dc": "sf", "rack": "1"}}
        mon = _monitor(rs)
        await mon.get_host()
        await _until(lambda: all(m.kind != UNKNOWN for m in mon.members.values()))
        rp = ReadPreference.parse({"mode": "secondary",
                                   "tags": [{"dc": "la"}, {"dc": "sf"}, {}]})
        assert mon.select(rp) == "h2:27017"
        rp = ReadPreference.parse({"mode": "secondary", "tags": [{"dc": "la"}]})
        assert mon.select(rp) is None
        rp = ReadPreference.parse({"mode": "nearest", "tags": [{"dc": "ny"}]})
        assert mon.select(rp) == "h1:27017"
        mon.close()
    run(main())


def test_no_matching_member_fails_with_133_after_the_deadline() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("shard0", 1)
        mon = _monitor(rs, heartbeat_s=0.01, find_host_timeout_ms=lambda: 150)
        await mon.get_host()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(MongoError) as info:
            await mon.get_host(ReadPreference.parse({"mode": "secondary"}))
        assert 0.14 <= loop.time() - started < 1.0
        assert info.value.code == 133
        assert info.value.errmsg == ('Could not find host matching read preference '
                                     '{ mode: "secondary" } for set shard0')
        rs.kill("h0:27017")
        mon.mark_unreachable("h0:27017")
        with pytest.raises(MongoError) as info:
            await mon.get_host(timeout_s=0.05)
        assert info.value.errmsg == ('Could not find host matching read preference '
                                     '{ mode: "primary" } for set shard0')
        rs.revive("h0:27017")
        assert await mon.get_host(timeout_s=2) == "h0:27017"  # back: found by the next check
        mon.close()
    run(main())


def test_close_stops_the_checks_and_fails_waiters() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 2)
        mon = _monitor(rs)
        await mon.get_host()
        tasks = list(mon._tasks.values())
        rs.elect(None)
        await _until(lambda: mon.primary is None)
        waiter = asyncio.ensure_future(mon.get_host(timeout_s=5))
        await asyncio.sleep(0.02)
        mon.close()
        with pytest.raises(MongoError) as info:
            await waiter
        assert info.value.code == 133
        await asyncio.sleep(0)
        assert all(t.done() for t in tasks)
        assert all(p.closed for p in rs.pools.values())
    run(main())


# -- connection strings and read preferences ---------------------------------------------------
def test_connection_strings() -> None:
    cs = ConnectionString.parse("shard0/a:1,b:2,a:1")
    assert cs.set_name == "shard0" and cs.hosts == ("a:1", "b:2")
    assert str(cs) == "shard0/a:1,b:2"
    assert str(ConnectionString.parse("a")) == "a:27017"
    for bad, code in ((None, 2), ("", 2), ("rs/", 9), ("/a:1", 9), ("a:x", 9), ("a:70000", 9),
                      ("rs/a:1,,b:2", 9)):
        with pytest.raises(MongoError) as info:
            ConnectionString.parse(bad)
        assert info.value.code == code, bad


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9.-]{0,8}", fullmatch=True),
                          st.integers(1, 65535)), min_size=1, max_size=4),
       st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_-]{1,10}", fullmatch=True)))
def test_connection_strings_round_trip(hosts: list[tuple[str, int]], set_name: str | None) -> None:
    text = ",".join(f"{h}:{p}" for h, p in hosts)
    if set_name:
        text = f"{set_name}/{text}"
    cs = ConnectionString.parse(text)
    assert ConnectionString.parse(str(cs)) == cs
    assert list(cs.hosts) == list(dict.fromkeys(f"{h}:{p}" for h, p in hosts))


def test_read_preference_parsing_and_errors() -> None:
    rp = ReadPreference.parse({"mode": "secondary", "tags": [{"dc": "ny"}, {}],
                               "maxStalenessSeconds": 120})
    assert rp.describe() == '{ mode: "secondary", tags: [ { dc: "ny" }, {} ], maxStalenessSeconds: 120 }'
    assert read_preference_document(rp) == {"mode": "secondary", "tags": [{"dc": "ny"}, {}],
                                            "maxStalenessSeconds": 120}
    assert ReadPreference.parse(None).describe() == '{ mode: "primary" }'
    assert ReadPreference.parse({"mode": "primary", "tags": [{}]}).mode == "primary"
    cases = [({"mode": "secondaryy"}, 9), ({"mode": "primary", "tags": [{"a": 1}]}, 2),
             ({"mode": "primary", "maxStalenessSeconds": 90}, 2), ("primary", 14),
             ({"mode": "nearest", "tags": {"a": 1}}, 14)]
    for doc, code in cases:
        with pytest.raises(MongoError) as info:
            ReadPreference.parse(doc)
        assert info.value.code == code, doc
    with pytest.raises(MongoError) as info:
        ReadPreference.parse({"mode": "x"})
    assert info.value.errmsg == ("Could not parse $readPreference mode 'x'. Only the modes "
                                 "'primary', 'primaryPreferred', 'secondary', "
                                 "'secondaryPreferred', and 'nearest' are supported.")


def test_topology_version_staleness() -> None:
    pid = ObjectId()
    tv = {"processId": pid, "counter": Int64(3)}
    assert is_stale_topology_version(tv, {"processId": pid, "counter": Int64(2)})
    assert not is_stale_topology_version(tv, {"processId": pid, "counter": Int64(3)})
    assert not is_stale_topology_version(tv, {"processId": ObjectId(), "counter": Int64(0)})
    assert not is_stale_topology_version(None, tv)
    assert not is_stale_topology_version(tv, None)


# -- the router's registry ------------------------------------------------------------------------
class _Catalog:
    def __init__(self) -> None:
        self.generation = 0
        self.docs: list[dict[str, Any]] = []

    def shard_docs(self) -> list[dict[str, Any]]:
        return list(self.docs)

    def set(self, docs: list[dict[str, Any]]) -> None:
        self.docs = docs
        self.generation += 1


def test_the_registry_follows_config_shards() -> None:
    cat = _Catalog()
    reg = ShardRegistry(cat)  # type: ignore[arg-type]
    with pytest.raises(MongoError) as info:
        reg.monitor("shard0")
    assert info.value.code == 70 and info.value.errmsg == "Shard shard0 not found"
    cat.set([{"_id": "shard0", "host": "shard0/a:1"}, {"_id": "shard1", "host": "shard1/b:1"}])
    m0 = reg.monitor("shard0")
    assert list(m0.members) == ["a:1"] and reg.monitor("shard1").set_name == "shard1"
    cat.set([{"_id": "shard0", "host": "shard0/a:1,a:2"}])  # a new seed of the same set
    assert reg.monitor("shard0") is m0 and list(m0.members) == ["a:1", "a:2"]
    with pytest.raises(MongoError):
        reg.monitor("shard1")  # removed: its monitor is closed
    cat.set([{"_id": "shard0", "host": "other/c:1"}])  # another set under the name: a new one
    assert reg.monitor("shard0") is not m0 and m0.closed
    reg.close()


def test_a_closed_monitor_fails_selections_at_once() -> None:
    async def main() -> None:
        rs = FakeReplicaSet("rs0", 1)
        mon = _monitor(rs)
        mon.close()
        with pytest.raises(MongoError) as info:
            await mon.get_host(timeout_s=5)
        assert info.value.code == 133
        assert rs.hellos["h0:27017"] == 0
    run(main())
