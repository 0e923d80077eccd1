"""The shard's refresh of its filtering metadata on a version mismatch
(shard/sharding_runtime.py, as mongod's ``onCollectionPlacementVersionMismatch`` and the
service entry point's ``_refreshIfNeeded``), on an in-process node whose config server is
replaced by a function: concurrent refreshes of one namespace are joined, the request is
checked again after the refresh, a router that is behind still gets StaleConfig, a newer
version installed meanwhile (a push) is not overwritten by an older read, and a new
primary forgets its metadata."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from bson import ObjectId
from bson.timestamp import Timestamp

from shardsim.core.errors import MongoError
from shardsim.core.protocol.versions import unsharded
from shardsim.shard.node import ShardNode

NS = "db.c"
EPOCH = ObjectId()
TS = Timestamp(100, 1)


def _meta(major_mine: int, major_other: int = 1, *, epoch: ObjectId = EPOCH,
          ts: Timestamp = TS) -> dict[str, Any]:
    """Metadata of NS in two chunks: ``[MinKey, 0)`` on shard0 at ``major_mine|0`` and
    ``[0, MaxKey)`` on shard1 at ``major_other|0``."""
    from bson import MaxKey, MinKey
    return {"epoch": epoch, "timestamp": ts, "key": {"x": 1},
            "chunks": [{"min": {"x": MinKey()}, "max": {"x": 0},
                        "lastmod": Timestamp(major_mine, 0), "shard": "shard0"},
                       {"min": {"x": 0}, "max": {"x": MaxKey()},
                        "lastmod": Timestamp(major_other, 0), "shard": "shard1"}]}


def _version(major: int, *, epoch: ObjectId = EPOCH, ts: Timestamp = TS) -> dict[str, Any]:
    return {"e": epoch, "t": ts, "v": Timestamp(major, 0)}


class FakeConfig:
    """The config server's side of a refresh: ``doc`` is what it answers; each fetch waits
    for ``gate`` (when set) so that a test can hold refreshes in flight."""

    def __init__(self, doc: dict[str, Any] | None) -> None:
        self.doc = doc
        self.fetches = 0
        self.gate: asyncio.Event | None = None

    async def fetch(self, conn: Any, ns: str) -> dict[str, Any] | None:
        self.fetches += 1
        if self.gate is not None:
            await self.gate.wait()
        return self.doc


def _node(config: FakeConfig) -> ShardNode:
    node = ShardNode(shard_name="shard0")
    node.sharding.config_connection_string = lambda: "127.0.0.1:1"  # type: ignore[method-assign]
    node.sharding._fetch = config.fetch  # type: ignore[method-assign]
    return node


def test_a_newer_version_makes_the_shard_refresh_then_accept() -> None:
    config = FakeConfig(_meta(2))
    node = _node(config)
    node.sharding.set_metadata(NS, _meta(1), pushed=False)

    async def main() -> None:
        # the router knows the shard's version 2 (a migration's commit): no StaleConfig
        assert await node.sharding.check(NS, "find", _version(2)) is False
        assert config.fetches == 1 and node.sharding.wanted(NS)["v"] == Timestamp(2, 0)
        assert node.sharding.stale_config_errors == 0
        # a write is counted in flight
        assert await node.sharding.check(NS, "insert", _version(2)) is True
        node.sharding.done(NS)
        assert config.fetches == 1  # compatible now: no other refresh

    asyncio.run(main())


def test_concurrent_refreshes_of_one_namespace_are_joined() -> None:
    config = FakeConfig(_meta(3))
    node = _node(config)
    node.sharding.set_metadata(NS, _meta(1), pushed=False)

    async def main() -> None:
        config.gate = asyncio.Event()
        checks = [asyncio.create_task(node.sharding.check(NS, "find", _version(3)))
                  for _ in range(5)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert config.fetches == 1  # one refresh in flight, four waiters joined it
        assert not any(t.done() for t in checks)  # every request waits for the refresh
        config.gate.set()
        assert await asyncio.gather(*checks) == [False] * 5
        assert config.fetches == 1 and node.sharding.refreshes == 1
        assert node.sharding.refreshes_joined == 4
        assert not node.sharding._refreshing

    asyncio.run(main())


def test_a_router_still_ahead_after_the_refresh_gets_stale_config() -> None:
    """The config server does not have the received version yet: the shard refreshes (twice:
    the second after the first one), then answers StaleConfig with its refreshed version."""
    config = FakeConfig(_meta(2))
    node = _node(config)
    node.sharding.set_metadata(NS, _meta(1), pushed=False)

    async def main() -> None:
        with pytest.raises(MongoError) as info:
            await node.sharding.check(NS, "insert", _version(5))
        err = info.value
        assert err.code == 13388
        assert err.extra["vReceived"]["v"] == Timestamp(5, 0)
        assert err.extra["vWanted"]["v"] == Timestamp(2, 0)
        assert err.extra["shardId"] == "shard0" and err.extra["ns"] == NS
        assert config.fetches == 2
        assert node.sharding.in_flight == {}  # a refused write is not counted

    asyncio.run(main())


def test_a_router_behind_gets_stale_config_without_a_refresh() -> None:
    config = FakeConfig(_meta(4))
    node = _node(config)
    node.sharding.set_metadata(NS, _meta(3), pushed=False)

    async def main() -> None:
        for received in (_version(2),  # same incarnation, older major
                         _version(9, epoch=ObjectId(), ts=Timestamp(50, 1))):  # older incarnation
            with pytest.raises(MongoError) as info:
                await node.sharding.check(NS, "find", received)
            assert info.value.code == 13388
            assert info.value.extra["vWanted"]["v"] == Timestamp(3, 0)
        assert config.fetches == 0

    asyncio.run(main())


def test_a_newer_incarnation_and_unknown_metadata_are_refreshed() -> None:
    """A version of a newer incarnation (resharding: new epoch and timestamp), or any sharded
    version on a shard that knows nothing of the namespace (cleared, restarted), is refreshed;
    an UNSHARDED version on a shard that knows nothing is accepted as it is."""
    new_epoch, new_ts = ObjectId(), Timestamp(200, 1)
    config = FakeConfig(_meta(1, epoch=new_epoch, ts=new_ts))
    node = _node(config)

    async def main() -> None:
        assert await node.sharding.check(NS, "find", unsharded()) is False
        assert config.fetches == 0 and NS not in node.sharding.metadata
        node.sharding.set_metadata(NS, _meta(3), pushed=False)
        assert await node.sharding.check(NS, "find", _version(1, epoch=new_epoch,
                                                              ts=new_ts)) is False
        assert config.fetches == 1 and node.sharding.wanted(NS)["e"] == new_epoch
        node.sharding.clear_metadata(NS)
        assert await node.sharding.check(NS, "find", _version(1, epoch=new_epoch,
                                                              ts=new_ts)) is False
        assert config.fetches == 2

    asyncio.run(main())


def test_a_push_during_a_refresh_is_not_overwritten_by_an_older_read() -> None:
    config = FakeConfig(_meta(2))
    node = _node(config)
    node.sharding.set_metadata(NS, _meta(1), pushed=False)

    async def main() -> None:
        config.gate = asyncio.Event()
        task = asyncio.create_task(node.sharding.check(NS, "find", _version(2)))
        for _ in range(3):
            await asyncio.sleep(0)
        node.sharding.set_metadata(NS, _meta(3))  # a push of a later migration's commit
        config.gate.set()
        with pytest.raises(MongoError) as info:  # the router is behind the push now
            await task
        assert info.value.code == 13388
        assert node.sharding.wanted(NS)["v"] == Timestamp(3, 0)

    asyncio.run(main())


def test_a_refresh_waits_for_the_critical_section() -> None:
    """A request with a newer version meeting a critical section (a read while it blocks only
    writes) refreshes after the section is released, as mongod's refresh joins it."""
    config = FakeConfig(_meta(2))
    node = _node(config)
    node.sharding.set_metadata(NS, _meta(1), pushed=False)

    async def main() -> None:
        await node.sharding.enter_critical_section(NS)
        task = asyncio.create_task(node.sharding.check(NS, "find", _version(2)))
        for _ in range(5):
            await asyncio.sleep(0)
        assert config.fetches == 0 and not task.done()
        node.sharding.exit_critical_section(NS)
        assert await task is False
        assert config.fetches == 1

    asyncio.run(main())


def test_no_config_server_known_keeps_the_old_answers() -> None:
    """Without a shard identity nothing can be refreshed: an unknown namespace accepts any
    version, a known one answers StaleConfig at once."""
    node = ShardNode(shard_name="shard0")

    async def main() -> None:
        assert await node.sharding.check(NS, "find", _version(2)) is False
        node.sharding.set_metadata(NS, _meta(1), pushed=False)
        with pytest.raises(MongoError):
            await node.sharding.check(NS, "find", _version(2))

    asyncio.run(main())


def test_a_new_primary_forgets_its_metadata() -> None:
    config = FakeConfig(_meta(2))
    node = _node(config)
    node.sharding.set_metadata(NS, _meta(1), pushed=False)
    node.on_became_writable_primary()
    assert node.sharding.metadata == {}

    async def main() -> None:
        assert await node.sharding.check(NS, "find", _version(2)) is False
        assert config.fetches == 1 and node.sharding.wanted(NS)["v"] == Timestamp(2, 0)

    asyncio.run(main())
