"""Stand-ins for role objects in unit tests: the little of a node the code under test reads."""

from __future__ import annotations

import datetime
from typing import Any

from bson import Binary
from bson.int64 import Int64

from shardsim.core.clock import HybridLogicalClock
from shardsim.shard.change_stream.cursor import PromiseWaiters
from shardsim.shard.change_stream.promise_faults import NO_FAULTS
from shardsim.shard.oplog import Oplog, PreImages

#: The collection UUID every :meth:`FakeShardNode.write` entry carries by default.
U1 = Binary(bytes(range(16)), 4)


class FakeShardNode:
    """A :class:`shardsim.shard.change_stream.host.ChangeStreamHost`, the little of a
    ``ShardNode`` the shard's change-stream cursor and the no-op writer read:
    ``clock`` (a hybrid logical clock on a frozen wall clock, 1000 s), ``oplog`` (options as
    :class:`Oplog`'s, e.g. ``max_bytes``), ``pre_images``, ``options`` (``promise_mode``,
    ``noop_interval_ms`` 40), ``cs_promise_waiters`` and ``noop_writer_task`` (as ShardNode
    declares them), ``docs`` (``(ns, _id) -> document`` for post-image look-ups)."""

    def __init__(self, promise_mode: str = "clock", **oplog_kw: Any) -> None:
        self.clock = HybridLogicalClock(wall=lambda: 1000.0)
        self.oplog = Oplog(**oplog_kw)
        self.stream_oplog = self.oplog  # what change streams read (a single member: all of it)
        self.repl: Any = None
        self.pre_images = PreImages()
        self.options = {"promise_mode": promise_mode, "noop_interval_ms": 40}
        self.docs: dict[Any, Any] = {}
        self.cs_promise_waiters = PromiseWaiters()
        self.cs_promise_faults = NO_FAULTS
        self.sharding: Any = None  # no sharding runtime: a plain member
        self.profile: Any = None  # the default server version
        self.noop_writer_task: Any = None

    def write(self, op: str, ns: str, o: dict[str, Any], o2: dict[str, Any] | None = None,
              ui: Any = U1, **extra: Any) -> dict[str, Any]:
        """Append one oplog entry at the next cluster time; returns it."""
        e: dict[str, Any] = {"op": op, "ns": ns, "o": o, "ts": self.clock.tick(),
                             "wall": datetime.datetime(2026, 1, 1)}
        if ui is not None:
            e["ui"] = ui
        if o2 is not None:
            e["o2"] = o2
        e.update(extra)
        self.oplog.append(e)
        return e

    def write_noop(self, o: dict[str, Any], o2: dict[str, Any] | None = None, ns: str = "",
                   ui: Any = None) -> Any:
        """A no-op entry (``op: "n"``); returns its timestamp."""
        return self.write("n", ns, o, o2, ui=ui)["ts"]

    def find_document(self, ns: str, key: dict[str, Any]) -> Any:
        return self.docs.get((ns, key.get("_id")))

    def parameters(self) -> dict[str, Any]:
        return {}


class FakeReplicaSet:
    """Members of a replica set as :class:`shardsim.core.replica_set_monitor.ReplicaSetMonitor`
    sees them, without sockets: :meth:`connection` and :meth:`pool` are its ``check_factory``
    and ``pool_factory``. Members ``h0:27017``... answer ``hello`` as mongod 8.0 does
    (``isWritablePrimary``, ``secondary``, ``setName``, ``setVersion``, ``hosts``, ``primary``,
    ``me``, ``electionId``, ``topologyVersion`` unless ``topology_version=False``), an awaitable
    ``hello`` waits for the member's next change or ``maxAwaitTimeMS``; a member :meth:`kill`
    ed fails every command with HostUnreachable (6). ``hellos`` counts the checks per member."""

    def __init__(self, name: str = "rs0", n: int = 3, *, topology_version: bool = True) -> None:
        import asyncio as _asyncio
        from bson import ObjectId
        self._asyncio = _asyncio
        self._oid = ObjectId
        self.name = name
        self.hosts = [f"h{i}:27017" for i in range(n)]
        self.topology_version = topology_version
        self.primary: str | None = self.hosts[0]
        self.term = 1
        self.down: set[str] = set()
        self.tags: dict[str, dict[str, Any]] = {}
        self.set_name_of: dict[str, str] = {}
        self.counters = {h: 0 for h in self.hosts}
        self.process_ids = {h: ObjectId() for h in self.hosts}
        self.changed: dict[str, Any] = {}
        self.hellos: dict[str, int] = {h: 0 for h in self.hosts}
        self.pools: dict[str, FakeRsPool] = {}

    def election_id(self) -> Any:
        return self._oid(f"7fffffff{self.term:016x}")

    def hello(self, host: str) -> dict[str, Any]:
        """The member's ``hello`` reply now."""
        reply: dict[str, Any] = {
            "isWritablePrimary": host == self.primary,
            "secondary": host != self.primary,
            "setName": self.set_name_of.get(host, self.name), "setVersion": 1,
            "hosts": list(self.hosts), "me": host}
        if self.primary is not None:
            reply["primary"] = self.primary
        if host == self.primary:
            reply["electionId"] = self.election_id()
        if host in self.tags:
            reply["tags"] = dict(self.tags[host])
        if self.topology_version:
            reply["topologyVersion"] = {"processId": self.process_ids[host],
                                        "counter": Int64(self.counters[host])}
        reply["ok"] = 1.0
        return reply

    def _bump(self, *hosts: str) -> None:
        for h in hosts or self.hosts:
            self.counters[h] = self.counters.get(h, 0) + 1
            ev = self.changed.pop(h, None)
            if ev is not None:
                ev.set()

    def elect(self, host: str | None) -> None:
        """``host`` becomes primary in a new term (None: no primary); every member changes."""
        self.primary = host
        self.term += 1
        self._bump()

    def kill(self, host: str) -> None:
        self.down.add(host)
        self._bump(host)

    def revive(self, host: str) -> None:
        self.down.discard(host)
        self.process_ids[host] = self._oid()  # a restarted process: a new processId
        self.counters[host] = 0

    def connection(self, host: str, port: int) -> "FakeRsConnection":
        return FakeRsConnection(self, f"{host}:{port}")

    def pool(self, host: str, port: int) -> "FakeRsPool":
        pool = self.pools[f"{host}:{port}"] = FakeRsPool(f"{host}:{port}")
        return pool


class FakeRsConnection:
    """A member's check connection of :class:`FakeReplicaSet`."""

    def __init__(self, rs: FakeReplicaSet, host: str) -> None:
        self.rs = rs
        self.host = host
        self.broken = False

    async def command(self, db: str, cmd: dict[str, Any], *, timeout: float | None = None,
                      **_: Any) -> dict[str, Any]:
        from shardsim.core.errors import MongoError
        rs = self.rs
        if self.host in rs.down or self.host not in rs.counters:
            self.broken = True
            raise MongoError(6, f"Couldn't connect to server {self.host}")
        rs.hellos[self.host] = rs.hellos.get(self.host, 0) + 1
        tv = cmd.get("topologyVersion")
        if tv is not None and tv.get("processId") == rs.process_ids[self.host] \
                and int(tv.get("counter", 0)) == rs.counters[self.host]:
            ev = rs.changed.setdefault(self.host, rs._asyncio.Event())
            try:
                await rs._asyncio.wait_for(ev.wait(), int(cmd.get("maxAwaitTimeMS", 0)) / 1000)
            except rs._asyncio.TimeoutError:
                pass
            if self.host in rs.down:
                self.broken = True
                raise MongoError(9001, f"network error while contacting {self.host}")
        return rs.hello(self.host)

    def close(self) -> None:
        self.broken = True


class FakeRsPool:
    """A member's command pool of :class:`FakeReplicaSet`: only ``address`` and ``close``
    (``closed`` counts the drops)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.closed = 0

    def close(self) -> None:
        self.closed += 1
