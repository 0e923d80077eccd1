"""The router's side of replica-set shards on the in-process kit: ``listShards`` and
``config.shards`` give ``setName/host,...`` as mongos does; addShard takes a seed list and
checks it against the set's ``hello`` (``ShardingCatalogManager::_validateHostAsShard``); the
router's monitor of each shard finds the primary again after an error says it moved; read
preferences select members, FailedToSatisfyReadPreference (133) when none fits within
``defaultFindReplicaSetHostTimeoutMS``; a shard whose only member is down is waited for."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure
from pymongo.read_preferences import Nearest, PrimaryPreferred, Secondary, SecondaryPreferred

from shardsim.core.errors import MongoError
from shardsim.testing import AsyncShardedCluster, ShardedCluster

pytestmark = pytest.mark.timeout(120)


def _router(c: Any) -> Any:
    return c.cluster.node("router") if hasattr(c, "cluster") else c.node("router")


def test_list_shards_and_config_shards_give_the_replica_set_form() -> None:
    with ShardedCluster(shards=2) as c:
        client = c.client()
        shards = client.admin.command("listShards")["shards"]
        # a one-member replica-set shard, as mongos lists it: setName/<hello's hosts>
        assert [(s["_id"], s["host"]) for s in shards] == [
            (n, f"{n}/{c.shard_address(n)}") for n in c.shard_names]
        assert [d["host"] for d in client.config.shards.find().sort("_id", 1)] == \
            [s["host"] for s in shards]
        for n in c.shard_names:
            with pymongo.MongoClient(c.shard_address(n), directConnection=True) as d:
                hello = d.admin.command("hello")
            assert f"{hello['setName']}/{','.join(hello['hosts'])}" == \
                next(s["host"] for s in shards if s["_id"] == n)
        # everything still works through the monitors
        client.admin.command("shardCollection", "rs.c", key={"_id": "hashed"})
        client.rs.c.insert_many([{"_id": i} for i in range(50)])
        assert client.rs.c.count_documents({}) == 50
        assert sorted(d["_id"] for d in client.rs.c.find()) == list(range(50))
        assert client.rs.c.distinct("_id", {"_id": {"$lt": 3}}) == [0, 1, 2]
        assert len(list(client.rs.c.aggregate([{"$match": {"_id": {"$gte": 45}}}]))) == 5


def test_add_shard_with_a_seed_list_checks_it_against_hello(shard_process) -> None:
    extra = shard_process("extra")
    with ShardedCluster(shards=1) as c:
        client = c.client()
        with pytest.raises(OperationFailure) as info:
            client.admin.command("addShard", f"other/{extra.address}")
        assert info.value.code == 96
        assert info.value.details["errmsg"] == (
            f"the provided connection string (other/{extra.address}) does not match the "
            "actual set name extra")
        with pytest.raises(OperationFailure) as info:
            client.admin.command("addShard", f"extra/{extra.address},127.0.0.1:1")
        assert info.value.code == 96
        assert info.value.details["errmsg"].startswith(
            f"in seed list extra/{extra.address},127.0.0.1:1, host 127.0.0.1:1 does not "
            "belong to replica set extra; found ")
        with pytest.raises(OperationFailure) as info:
            client.admin.command("addShard", "extra/")
        assert info.value.code == 9
        with pytest.raises(OperationFailure) as info:
            client.admin.command("addShard", f"config/{extra.address}")
        assert info.value.code == 96  # the set is named extra
        reply = client.admin.command("addShard", f"extra/{extra.address}")
        assert reply["shardAdded"] == "extra"  # the set's name when none is given
        # again: the same shard (a retried addShard is a no-op)
        assert client.admin.command("addShard", f"extra/{extra.address}")["shardAdded"] == "extra"
        entry = next(s for s in client.admin.command("listShards")["shards"]
                     if s["_id"] == "extra")
        assert entry["host"] == f"extra/{extra.address}"
        client.admin.command("enableSharding", "onextra", primaryShard="extra")
        client.onextra.c.insert_one({"_id": 1})
        assert client.onextra.c.find_one() == {"_id": 1}
        with pymongo.MongoClient(extra.address, directConnection=True) as d:
            assert d.onextra.c.find_one() == {"_id": 1}


def test_the_monitor_finds_the_primary_again_after_errors() -> None:
    async def main() -> None:
        async with AsyncShardedCluster(shards=2, seed=3) as c:
            client: Any = pymongo.AsyncMongoClient(c.uri)
            try:
                await client.admin.command("shardCollection", "mon.c", key={"_id": "hashed"})
                await client.mon.c.insert_many([{"_id": i} for i in range(20)])
                router = _router(c)
                mon = router.shards.monitor("shard0")
                addr = c.shard_address("shard0")
                assert mon.primary == addr
                assert router.catalog.shard_address("shard0") == tuple(
                    [addr.rsplit(":", 1)[0], int(addr.rsplit(":", 1)[1])])
                mon.update_host_with_status(addr, MongoError(10107, "not primary"))
                assert mon.primary is None and router.catalog.shard_address("shard0") is not None
                # the next command waits for the check the mark asked for, then goes on
                await client.mon.c.insert_many([{"_id": i} for i in range(20, 40)])
                assert mon.primary == addr
                mon.update_host_with_status(addr, MongoError(9001, "network error"))
                assert await client.mon.c.count_documents({}) == 40
                assert mon.primary == addr
                # a generation of the catalog that does not change config.shards keeps it
                await router.catalog.refresh()
                assert router.shards.monitor("shard0") is mon
            finally:
                await client.close()
    asyncio.run(main())


def test_read_preferences_and_133_on_one_member_shards() -> None:
    with ShardedCluster(shards=2) as c:
        client = c.client()
        client.admin.command("shardCollection", "rp.c", key={"_id": "hashed"})
        client.rp.c.insert_many([{"_id": i} for i in range(10)])
        for pref in (PrimaryPreferred(), SecondaryPreferred(), Nearest()):
            coll = client.rp.get_collection("c", read_preference=pref)
            assert coll.count_documents({}) == 10
            assert len(list(coll.find())) == 10
        assert client.admin.command("getParameter", 1, defaultFindReplicaSetHostTimeoutMS=1)[
            "defaultFindReplicaSetHostTimeoutMS"] == 15000
        client.admin.command("setParameter", 1, defaultFindReplicaSetHostTimeoutMS=300)
        coll = client.rp.get_collection("c", read_preference=Secondary())
        started = time.monotonic()
        with pytest.raises(OperationFailure) as info:
            list(coll.find())
        assert 0.3 <= time.monotonic() - started < 5
        assert info.value.code == 133
        assert 'Could not find host matching read preference { mode: "secondary" } for set ' \
               'shard' in info.value.details["errmsg"]
        with pytest.raises(OperationFailure) as info:
            client.admin.command("setParameter", 1, defaultFindReplicaSetHostTimeoutMS=-1)
        assert info.value.code == 2
        with pytest.raises(OperationFailure) as info:
            client.rp.command("find", "c", **{"$readPreference": {"mode": "bogus"}})
        assert info.value.code == 9


def test_a_change_stream_with_a_read_preference_and_a_killed_shard_waited_for() -> None:
    with ShardedCluster(shards=2) as c:
        client = c.client()
        client.admin.command("shardCollection", "cs.c", key={"_id": "hashed"})
        coll = client.cs.get_collection("c", read_preference=SecondaryPreferred())
        with coll.watch() as stream:
            client.cs.c.insert_many([{"_id": i} for i in range(4)])
            got = [stream.next()["documentKey"]["_id"] for _ in range(4)]
        assert sorted(got) == [0, 1, 2, 3]
        # a shard whose only member is down: commands wait for a primary (up to
        # defaultFindReplicaSetHostTimeoutMS) and go on once it is back
        name = c.kill_shard("shard1")
        time.sleep(0.3)  # the monitor has seen it go (heartbeat 100 ms in the kit)
        import threading
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(client.cs.c.count_documents({})))
        t.start()
        time.sleep(0.3)
        assert t.is_alive()  # waiting for shard1's primary
        c.restart_shard(name)
        t.join(20)
        assert result and isinstance(result[0], int)


# -- a three-member set over the wire ------------------------------------------------------------
class _SetState:
    """What three stand-in members of set ``rsA`` say in ``hello``: the primary, each member's
    ``topologyVersion`` (bumped on every change), which of them are down."""

    def __init__(self) -> None:
        from bson import ObjectId
        self.hosts: list[str] = []
        self.primary: str | None = None
        self.pids: dict[str, Any] = {}
        self.counters: dict[str, int] = {}
        self.refused: list[tuple[str, str]] = []  # (member, command) answered "not primary"
        self.reads: list[tuple[str, str, Any]] = []  # (member, command, $readPreference)
        self._oid = ObjectId

    def step(self, primary: str | None) -> None:
        self.primary = primary
        for h in self.hosts:
            self.counters[h] = self.counters.get(h, 0) + 1


_WRITES = ("insert", "update", "delete", "findAndModify")
_READS = ("find", "aggregate", "count", "distinct")


def _member_class() -> Any:
    from bson.int64 import Int64
    from shardsim.shard.node import ShardNode

    class RsMember(ShardNode):
        """A shard node that reports itself as one member of ``rsA`` (the members do not
        replicate: each test write is checked on the member that took it) and refuses what a
        non-primary mongod refuses: writes with NotWritablePrimary (10107), reads without a
        read preference with NotPrimaryNoSecondaryOk (13435)."""

        def __init__(self, state: _SetState, **kw: Any) -> None:
            super().__init__(shard_name="rsA", **kw)
            self.rs = state
            self.command_hooks.append(self)

        def hello(self, req: Any) -> dict[str, Any]:
            reply = super().hello(req)
            me, st = self.address, self.rs
            reply.update({"isWritablePrimary": me == st.primary, "secondary": me != st.primary,
                          "hosts": list(st.hosts), "me": me,
                          "topologyVersion": {"processId": st.pids[me],
                                              "counter": Int64(st.counters[me])}})
            if st.primary is None:
                reply.pop("primary", None)
            else:
                reply["primary"] = st.primary
            return reply

        async def before_command(self, req: Any) -> dict[str, Any] | None:
            me, st = self.address, self.rs
            if req.name in _READS:
                st.reads.append((me, req.name, req.body.get("$readPreference")))
            if me == st.primary:
                return None
            if req.name in _WRITES:
                st.refused.append((me, req.name))
                return {"ok": 0.0, "errmsg": "not primary", "code": 10107,
                        "codeName": "NotWritablePrimary"}
            if req.name in _READS and req.body.get("$readPreference") is None:
                st.refused.append((me, req.name))
                return {"ok": 0.0, "errmsg": "not primary and secondaryOk=false",
                        "code": 13435, "codeName": "NotPrimaryNoSecondaryOk"}
            return None

        def after_command(self, req: Any, reply: dict[str, Any]) -> None:
            return None

    return RsMember


def test_a_three_member_set_primary_changes_and_read_preferences_over_the_wire() -> None:
    from shardsim.core.server import Server

    async def main() -> None:
        state = _SetState()
        member_cls = _member_class()
        servers = []
        for _ in range(3):
            server = Server(member_cls(state, host="127.0.0.1", port=0, test_commands=True))
            await server.start()
            servers.append(server)
        state.hosts = [s.node.address for s in servers]
        for h in state.hosts:
            state.pids[h] = state._oid()
            state.counters[h] = 0
        h1, h2, h3 = state.hosts
        state.step(h1)

        def on(host: str) -> Any:
            return pymongo.AsyncMongoClient(host, directConnection=True)

        try:
            async with AsyncShardedCluster(shards=1, seed=5) as c:
                client: Any = pymongo.AsyncMongoClient(c.uri)
                try:
                    # seeded with a secondary: the config server goes to the primary it names
                    reply = await client.admin.command("addShard", f"rsA/{h2}")
                    assert reply["shardAdded"] == "rsA"
                    entry = next(s for s in (await client.admin.command("listShards"))["shards"]
                                 if s["_id"] == "rsA")
                    assert entry["host"] == f"rsA/{h1},{h2},{h3}"
                    await client.admin.command("enableSharding", "onrs", primaryShard="rsA")
                    await client.onrs.c.insert_one({"_id": 1})
                    async with on(h1) as d:
                        assert await d.onrs.c.find_one() == {"_id": 1}  # the primary took it
                    router = _router(c)
                    mon = router.shards.monitor("rsA")
                    assert mon.primary == h1

                    # a secondary read: on h2 or h3, carrying the read preference
                    coll = client.onrs.get_collection("c", read_preference=Secondary())
                    state.reads.clear()
                    assert await coll.find().to_list() == []  # the secondaries have nothing
                    assert [(m in (h2, h3), pref) for m, name, pref in state.reads
                            if name == "find"] == [(True, {"mode": "secondary"})]

                    # step-down: h2 is elected. The monitor polls these members (their hello
                    # does not wait); with polling off, only h1's NotWritablePrimary can tell
                    # the router: the retryable write is re-sent and lands on h2
                    mon.heartbeat_s = 60.0
                    await asyncio.sleep(0.3)  # the polls in progress end
                    state.step(h2)
                    state.refused.clear()
                    await client.onrs.c.insert_one({"_id": 2})
                    assert state.refused == [(h1, "insert")]
                    async with on(h2) as d:
                        assert await d.onrs.c.find_one({"_id": 2}) == {"_id": 2}
                    assert mon.primary == h2

                    # h1 is elected again, unseen: opening a change stream's cursor on h2 gets
                    # NotPrimaryNoSecondaryOk, and the establishment is retried on h1
                    state.step(h1)
                    state.refused.clear()
                    async with await client.onrs.c.watch() as stream:
                        await client.onrs.c.insert_one({"_id": 4})
                        assert (await stream.next())["documentKey"] == {"_id": 4}
                    assert state.refused[0] == (h2, "aggregate")
                    assert mon.primary == h1
                    mon.heartbeat_s = 0.1

                    # the primary dies, h3 is elected: the write that finds out is retried there
                    servers[1].abort()
                    state.step(h3)
                    await client.onrs.c.insert_one({"_id": 3})
                    async with on(h3) as d:
                        assert await d.onrs.c.find_one({"_id": 3}) == {"_id": 3}
                    assert mon.primary == h3
                    assert mon.connection_string().hosts == (h1, h2, h3)

                    # no primary at all: 133 after defaultFindReplicaSetHostTimeoutMS
                    await client.admin.command("setParameter", 1,
                                               defaultFindReplicaSetHostTimeoutMS=300)
                    state.step(None)
                    await _wait(lambda: mon.primary is None)
                    with pytest.raises(OperationFailure) as info:
                        await client.onrs.c.find_one()
                    assert info.value.code == 133
                    assert ('Could not find host matching read preference { mode: "primary" } '
                            'for set rsA') in info.value.details["errmsg"]
                finally:
                    await client.close()
        finally:
            for server in servers:
                server.abort()
                try:
                    await server.close()
                except Exception:
                    pass

    asyncio.run(main())


async def _wait(pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_a_router_given_the_config_server_as_a_replica_set() -> None:
    from shardsim.core.server import Server
    from shardsim.router.node import RouterNode
    from shardsim.router.shard_registry import PrimaryPool

    async def main() -> None:
        async with AsyncShardedCluster(shards=2, seed=7) as c:
            config_addr = c.node("config").address
            node = RouterNode(configdb=f"config/{config_addr}", host="127.0.0.1", port=0,
                              test_commands=True, options={"rsm_heartbeat_ms": 100})
            assert isinstance(node.config_pool, PrimaryPool)
            server = Server(node)
            await server.start()
            client: Any = pymongo.AsyncMongoClient(node.address, directConnection=True)
            try:
                shards = (await client.admin.command("listShards"))["shards"]
                assert [s["_id"] for s in shards] == c.shard_names
                assert node.config_pool.monitor.primary == config_addr
                await client.admin.command("shardCollection", "cfg.c", key={"_id": "hashed"})
                async with await client.cfg.c.watch() as stream:
                    await client.cfg.c.insert_many([{"_id": i} for i in range(4)])
                    got = [(await stream.next())["documentKey"]["_id"] for _ in range(4)]
                assert sorted(got) == [0, 1, 2, 3]
                status = await client.admin.command("serverStatus")
                assert status["sharding"]["configsvrConnectionString"] == f"config/{config_addr}"
                # an error that says the primary moved: the next command finds it again
                node.config_pool.monitor.update_host_with_status(
                    config_addr, MongoError(10107, "not primary"))
                assert node.config_pool.monitor.primary is None
                assert [s["_id"] for s in (await client.admin.command("listShards"))["shards"]] \
                    == c.shard_names
            finally:
                await client.close()
                await server.close()
    asyncio.run(main())
