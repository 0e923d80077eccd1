"""The in-process sharded cluster, asyncio flavour: :class:`AsyncShardedCluster`.

The config server, the shards and the router are the role classes the processes run
(:class:`configsvr.node.ConfigServerNode`, :class:`shard.node.ShardNode`,
:class:`router.node.RouterNode`), each behind the same server loop
(:class:`shardsim.core.server.Server`) on a real loopback socket on a free port, all on ONE event
loop: the caller's (``async with AsyncShardedCluster() as c``) or, for
:class:`shardsim.testing.ShardedCluster`, a background thread's. Shards are added with the
router's own ``addShard`` command, as ``shardsim up`` does (:mod:`shardsim.tools.launcher`).

Faults on demand are methods, one per record of :mod:`shardsim.testing.faults` (the same
records ``shardsim fault`` offers), each running its record's steps: :meth:`pause_shard` /
:meth:`resume_shard`,
:meth:`kill_shard` / :meth:`restart_shard`, :meth:`add_shard` / :meth:`remove_shard`,
:meth:`set_noop_interval`, :meth:`truncate_oplog`, :meth:`slow_promises` /
:meth:`stall_promises` / :meth:`clear_promise_faults`, :meth:`same_cluster_time`,
:meth:`configure_fail_point`. Random choices
(a shard picked when none is named, the destination of chunks moved off a removed shard, the
fail points' ``activationProbability``) come from ``random.Random(seed)``. Every node runs
with the test-only commands on (``enableTestCommands=1``; off by default in the processes).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import random
import shutil
import tempfile
from typing import Any

from bson.timestamp import Timestamp

from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError
from shardsim.core.node import Node
from shardsim.testing import faults
from shardsim.testing.members import Member, TaskTracker, run_as
from shardsim.testing.replica_sets import (ReplicaSetMembers, connection_string, member_options,
                                           new_replica_set)

PROMISE_MODES = ("clock", "mongod")
#: How often the router's replica-set monitors poll a shard member without streaming (ms).
RSM_HEARTBEAT_MS = 100
_KIT_CONN = ConnectionInfo(id=-1, peer="shardsim.testing")


class ClusterNotRunning(RuntimeError):
    """A fault or query on a cluster that is not started, or on a member that is down."""


class AsyncShardedCluster(ReplicaSetMembers):
    """A sharded cluster inside this process, driven from asyncio.

    Parameters: ``shards`` (int, shards named ``shard0``...); ``promise_mode`` (``"clock"`` or
    ``"mongod"``: how a shard's empty change-stream batch advances its postBatchResumeToken,
    ``python -m shardsim.shard --promise-mode``); ``durable`` (bool: every member gets a dbpath under
    ``dbpath`` or a temporary directory removed by :meth:`stop`); ``seed`` (int or None: seeds
    every random choice of the kit); ``noop_interval_ms`` (int, ms: the periodic no-op writer
    of shards and config server, mongod's ``periodicNoopIntervalSecs``); ``host``; ``port``
    (the router's port, 0 = a free one); ``shard_options`` (extra :class:`ShardNode` options,
    e.g. ``{"oplog_size_mb": 1}``); ``routers`` (int: routers on the same config server, the
    first named ``"router"``, the others ``"router1"``, ...; ``uris`` lists them all);
    ``server_version`` (``"6.0"``, ``"7.0"``, ``"8.0"`` (default), ``"8.2.0"``, ``"8.2"``,
    ``"9.0"``: the release every member behaves as, :mod:`shardsim.core.server_version`; or, for
    a mixed-version cluster (a rolling upgrade), a dict with a release per role — keys
    ``"router"``, ``"config"``, ``"shards"`` (every shard) or a shard's name (``"shard1"``), 8.0
    for those not given. The cluster then starts at the lowest member's featureCompatibilityVersion
    (ValueError when some binary cannot run at it) and ``setFeatureCompatibilityVersion`` raises
    it, :mod:`shardsim.core.fcv`);
    ``members`` (int: every shard a replica set of that many members, added as
    ``shardN/h1,h2,...``; :mod:`shardsim.testing.replica_sets`, whose queries and faults
    ``members_of``, ``primary_of``, ``step_down``, ``kill_primary``, ``restart_member``,
    ``isolate``, ``partition``, ``heal`` this class has); ``repl_options`` (their timing in
    ms: ``election_timeout_ms`` 1000, ``heartbeat_interval_ms`` 200, ``heartbeat_timeout_ms``
    2000 by default); ``config_members`` (int, default ``members``: the config server a
    replica set (CSRS) of that many members, ``config``, ``config-1``, ..., set name
    ``config``; the routers get ``--configdb config/h1,h2,h3`` and the shards' ``shardIdentity``
    that string; ``primary_of("config")``, ``step_down("config")``, ``kill_primary("config")``
    and the other replica-set faults act on it; ``node("config")``/``command("config", ...)``
    reach its current primary). ``noop_interval_ms`` defaults to 1000, 200 with ``members`` or
    ``config_members`` > 1.

    ``uri`` is the router's ``mongodb://host:port/`` once started. Use ``async with`` or
    :meth:`start` / :meth:`stop` (stop always leaves no socket or task of the cluster behind).
    """

    def __init__(self, shards: int = 3, *, promise_mode: str = "clock", durable: bool = False,
                 dbpath: str | None = None, seed: int | None = None,
                 noop_interval_ms: int | None = None,
                 host: str = "127.0.0.1", port: int = 0,
                 shard_options: dict[str, Any] | None = None, routers: int = 1,
                 server_version: str | dict[str, str] = "8.0", members: int = 1,
                 repl_options: dict[str, Any] | None = None,
                 config_members: int | None = None) -> None:
        from shardsim.core import server_version as versions
        if isinstance(server_version, dict):
            self.server_versions = {k: versions.get(v).name for k, v in server_version.items()}
        else:
            name = versions.get(server_version).name  # ValueError when unknown
            self.server_versions = {"router": name, "config": name, "shards": name}
        # the router's release: what a client sees (buildInfo, hello)
        self.server_version = self.server_versions.get("router", "8.0")
        roles = ["router", "config"] + [f"shard{i}" for i in range(max(shards, 0))]
        self.fcv = versions.cluster_fcv([versions.get(self._version_of(m)) for m in roles])
        if promise_mode not in PROMISE_MODES:
            raise ValueError(f"promise_mode must be one of {PROMISE_MODES}, not {promise_mode!r}")
        if shards < 1:
            raise ValueError("a cluster needs at least one shard")
        if members < 1:
            raise ValueError("a shard needs at least one member")
        self.num_shards = shards
        self.num_members = int(members)
        self.num_config_members = int(members if config_members is None else config_members)
        if self.num_config_members < 1:
            raise ValueError("a config server needs at least one member")
        self.repl_options = dict(repl_options or {})
        self.promise_mode = promise_mode
        self.durable = durable or dbpath is not None
        self._dbpath_arg = dbpath
        self.base_dir: str | None = None
        self.seed = seed
        self.random = random.Random(seed)
        # replica-set shards release events at the commit point, idle ones as their no-ops
        # commit (the mongod promise mode): a shorter interval keeps the merged stream quick
        self.noop_interval_ms = int(noop_interval_ms if noop_interval_ms is not None
                                    else 1000 if max(members, self.num_config_members) == 1
                                    else 200)
        self.host = host
        self.port = port
        self.shard_options = dict(shard_options or {})
        self.config: Member | None = None  # the config server (its member 0 in a set)
        self.config_set: list[Member] = []  # every member of the config server, _id order
        self.router: Member | None = None
        self.num_routers = max(1, int(routers))
        self.extra_routers: list[Member] = []
        self.shards: dict[str, Member] = {}  # a shard's first member (legacy faults act on it)
        self.replsets: dict[str, list[Member]] = {}  # every member of each shard, _id order
        self._tracker = TaskTracker()
        self._shard_seq = 0

    # -- addresses --------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        """``mongodb://HOST:PORT/`` of the router (pymongo, any driver)."""
        if self.router is None or not self.router.port:
            raise ClusterNotRunning("the cluster is not started")
        return f"mongodb://{self.host}:{self.router.port}/"

    @property
    def uris(self) -> list[str]:
        """``mongodb://HOST:PORT/`` of every router (the first is :attr:`uri`)."""
        return [self.uri] + [f"mongodb://{self.host}:{m.port}/" for m in self.extra_routers]

    @property
    def shard_names(self) -> list[str]:
        """Names of the shards the kit started and did not remove, in order of creation."""
        return list(self.shards)

    def shard_address(self, name: str) -> str:
        """``host:port`` of shard ``name`` (connect with ``directConnection=true``)."""
        return self._shard(name).address

    def node(self, name: str) -> Node:
        """The live node object of member ``name`` (``"router"``, ``"config"``, a shard)."""
        member = self._member(name)
        if member.node is None or not member.running:
            raise ClusterNotRunning(f"{name} is not running")
        return member.node

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> "AsyncShardedCluster":
        """Start config server, shards and router; add the shards. On failure stop and raise."""
        loop = asyncio.get_running_loop()
        self._tracker.install(loop)
        try:
            if self.durable:
                self.base_dir = self._dbpath_arg or tempfile.mkdtemp(prefix="shardsim-testkit-")
            if self.num_config_members > 1:
                self.config_set = self._new_config_set()
                self.config = self.config_set[0]
                await asyncio.gather(*(run_as(m.name, m.start) for m in self.config_set))
                await self.settled("config")
            else:
                self.config = Member("config", "configsvr", self._make_config, self.host,
                                     self._data_dir("config"))
                self.config_set = [self.config]
                await run_as("config", self.config.start)
            for _ in range(self.num_shards):
                self._new_shard_member()
            await asyncio.gather(*(run_as(m.name, m.start) for ms in self.replsets.values()
                                   for m in ms))
            for name in self.replsets:
                await self.settled(name)
            self.router = Member("router", "router", self._make_router, self.host)
            self.router.port = self.port
            await run_as("router", self.router.start)
            for i in range(1, self.num_routers):
                extra = Member(f"router{i}", "router", self._make_router, self.host)
                self.extra_routers.append(extra)
                await run_as(extra.name, extra.start)
            for member in self.shards.values():
                await self._add_shard(member)
            for member in (*self.config_set, *self.shards.values(), self.router,
                           *self.extra_routers):
                self._seed_fail_points(member)
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        """Stop router, shards, config server (in that order) and remove temporary data.
        Safe to call twice."""
        for member in [*reversed(self.extra_routers), self.router,
                       *(m for ms in reversed(list(self.replsets.values())) for m in ms),
                       *(self.config_set or [self.config])]:
            if member is not None:
                try:
                    await member.stop(self._tracker)
                except Exception:  # pragma: no cover - keep stopping the others
                    await member.kill(self._tracker)
        for owner in list(self._tracker.tasks):
            await self._tracker.cancel(owner)
        self._tracker.uninstall()
        if self.base_dir and self._dbpath_arg is None:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    async def __aenter__(self) -> "AsyncShardedCluster":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # -- building members -------------------------------------------------------------------
    def _data_dir(self, name: str) -> str | None:
        if not self.durable:
            return None
        assert self.base_dir is not None
        path = os.path.join(self.base_dir, name)
        os.makedirs(path, exist_ok=True)
        return path

    def _current_fcv(self) -> str:
        """The FCV a (re)started member or a new shard gets: the config server's (what
        ``setFeatureCompatibilityVersion`` last set; the server persists it in
        ``admin.system.version`` and addShard hands it to a new shard), else the initial one."""
        node = self._config_member().node if self.config is not None else None
        return str(node.fcv) if node is not None else self.fcv

    def _version_of(self, member: str) -> str:
        """The release member ``member`` ("router", "config", "shard<N>") runs."""
        v = self.server_versions
        if member in ("router", "config"):
            return v.get(member, "8.0")
        return v.get(member, v.get("shards", "8.0"))

    def _make_config(self, port: int) -> Node:
        from shardsim.configsvr.node import ConfigServerNode
        assert self.config is not None
        return ConfigServerNode(host=self.host, port=port, test_commands=True, options={
            "dbpath": self.config.dbpath, "noop_interval_ms": self.noop_interval_ms,
            "server_version": self._version_of("config"), "fcv": self._current_fcv()})

    def _new_config_set(self) -> list[Member]:
        """The members of the config server replica set (not started): ``config``,
        ``config-1``, ... of set ``config``, the kit's election timing."""
        from shardsim.configsvr.node import ConfigServerNode

        def options(i: int, hosts: list[str]) -> dict[str, Any]:
            opts = {"noop_interval_ms": self.noop_interval_ms,
                    "server_version": self._version_of("config"), "fcv": self._current_fcv()}
            opts.update(member_options(hosts, i, self.repl_options,
                                       None if self.seed is None else self.seed + 7919))
            return opts

        def make(port: int, options: dict[str, Any]) -> Node:
            return ConfigServerNode(host=self.host, port=port, test_commands=True,
                                    options=options)
        return new_replica_set("config", self.num_config_members, self.host, options,
                               self._data_dir, make_node=make, role="configsvr")

    def _sets(self) -> dict[str, list[Member]]:
        """The shards' sets and the config server's (``"config"``)."""
        if not self.config_set:
            return self.replsets
        return {**self.replsets, "config": self.config_set}

    def _config_member(self) -> Member:
        """The config server's writable primary (a one-node config server: itself); member 0
        when none is writable now."""
        assert self.config is not None
        for m in self.config_set:
            node = m.node
            if m.running and node is not None and (node.repl is None or node.repl.writable):
                return m
        return self.config

    @property
    def configdb(self) -> str:
        """The routers' ``--configdb``: ``config/h1,h2,h3`` for a config server replica set,
        else ``host:port``."""
        assert self.config is not None
        return connection_string("config", self.config_set or [self.config])

    def _make_router(self, port: int) -> Node:
        from shardsim.router.node import RouterNode
        assert self.config is not None
        configdb = self.configdb
        return RouterNode(configdb=configdb, host=self.host, port=port, test_commands=True,
                          options={"configdb": configdb, "server_version": self._version_of("router"),
                                   "fcv": self._current_fcv(),
                                   # the router's replica-set monitors poll members often
                                   "rsm_heartbeat_ms": RSM_HEARTBEAT_MS})

    def _new_shard_member(self) -> Member:
        from shardsim.shard.node import ShardNode
        name = f"shard{self._shard_seq}"
        self._shard_seq += 1

        def options(i: int, hosts: list[str]) -> dict[str, Any]:
            opts = {"noop_interval_ms": self.noop_interval_ms, "promise_mode": self.promise_mode,
                    "server_version": self._version_of(name), "fcv": self._current_fcv(),
                    **self.shard_options}
            if self.num_members > 1:
                opts.update(member_options(hosts, i, self.repl_options, self.seed))
            return opts

        members = new_replica_set(name, self.num_members, self.host, options, self._data_dir)
        self.replsets[name] = members
        self.shards[name] = members[0]
        return members[0]

    def _seed_fail_points(self, member: Member) -> None:
        fps = getattr(member.node, "failpoints", None)
        if fps is not None:
            rng = random.Random(self.random.getrandbits(64))
            for fp in fps.points.values():
                fp.rng = rng

    # -- commands ---------------------------------------------------------------------------
    async def command(self, member: str, cmd: dict[str, Any], db: str = "admin") -> dict[str, Any]:
        """Run ``cmd`` on member ``member``'s command table as a client would (same handlers);
        returns the reply, raising :class:`MongoError` for ``ok: 0``."""
        node = self.node(member)
        body = {**cmd, "$db": db}
        reply = await node.run_command(Request(next(iter(cmd)), db, body, _KIT_CONN))
        if not reply.get("ok"):
            raise MongoError(int(reply.get("code", 1)), str(reply.get("errmsg", "")),
                             labels=list(reply.get("errorLabels", [])))
        return reply

    async def _add_shard(self, member: Member) -> None:
        """``addShard`` through the router: ``host:port``, or ``name/h1,h2,h3`` for a set."""
        await self.command("router", {"addShard": connection_string(member.name,
                                                                    self.replsets[member.name]),
                                      "name": member.name})

    # -- faults: the records of shardsim.testing.faults, run on members ---------------------
    def _member(self, name: str) -> Member:
        if name == "router" and self.router is not None:
            return self.router
        for extra in self.extra_routers:
            if extra.name == name:
                return extra
        if name in ("config", "configsvr") and self.config is not None:
            return self._config_member()
        for m in self.config_set:  # a config server member: config-1, ...
            if m.name == name:
                return m
        if name in self.shards:
            return self.shards[name]
        for members in self.replsets.values():  # a replica-set member: shard0-1, ...
            for m in members:
                if m.name == name:
                    return m
        raise KeyError(f"no member named {name!r} (shards: {self.shard_names})")

    def _shard(self, name: str | None) -> Member:
        if name is None:
            if not self.shards:
                raise ClusterNotRunning("the cluster has no shards")
            name = self.random.choice(sorted(self.shards))
        if name not in self.shards:
            raise KeyError(f"no shard named {name!r} (shards: {self.shard_names})")
        return self.shards[name]

    def _running(self, member: Member) -> Any:
        if member.server is None:
            raise ClusterNotRunning(f"{member.name} is not running")
        return member.server

    async def _apply(self, method: str, targets: list[str], args: dict[str, Any]) -> Any:
        """Run the apply steps of fault record ``method`` (:data:`faults.BY_METHOD`) on the
        members named ``targets``: a :class:`faults.Send` goes to the first target (to each
        with ``to="each"``) through its command table, as the member's own task; an
        :class:`faults.Action` calls ``_act_<name>(target)``. Returns the last step's result."""
        result: Any = None
        for step in faults.BY_METHOD[method].apply:
            if isinstance(step, faults.Send):
                cmd = faults.build(step, args)
                for member in (targets if step.to == "each" else targets[:1]):
                    result = await run_as(member, self.command, member, cmd)
            else:
                act = getattr(self, "_act_" + step.name.replace("-", "_"))
                result = await act(*targets[:1])
        return result

    async def _act_stop_answering(self, name: str) -> None:
        self._running(self._member(name)).gate.clear()

    async def _act_answer_again(self, name: str) -> None:
        self._running(self._member(name)).gate.set()

    async def _act_kill(self, name: str) -> None:
        member = self._member(name)
        self._running(member)
        await member.kill(self._tracker)

    async def _act_start(self, name: str) -> None:
        member = self._member(name)
        if member.running:
            await member.kill(self._tracker)
        await run_as(member.name, member.start)
        self._seed_fail_points(member)

    async def _act_add_shard(self) -> str:
        member = self._new_shard_member()
        members = self.replsets[member.name]
        try:
            await asyncio.gather(*(run_as(m.name, m.start) for m in members))
            await self.settled(member.name)
            await self._add_shard(member)
        except BaseException:
            for m in members:
                await m.stop(self._tracker)
            del self.shards[member.name]
            del self.replsets[member.name]
            raise
        for m in members:
            self._seed_fail_points(m)
        return member.name

    async def _act_drain_and_remove(self, name: str) -> None:
        member = self._shard(name)
        reply = await self.command("router", {"removeShard": name})
        others = sorted(n for n in self.shards if n != name)
        if reply.get("state") != "completed":
            for chunk in await self._find_all("chunks", {"shard": name}):
                coll = (await self._find_all("collections", {"uuid": chunk["uuid"]}))[0]
                await self.command("router", {"moveChunk": coll["_id"],
                                              "bounds": [chunk["min"], chunk["max"]],
                                              "to": self.random.choice(others)})
            for db in reply.get("dbsToMove", []):
                await self.command("router", {"movePrimary": db, "to": self.random.choice(others)})
            reply = await self.command("router", {"removeShard": name})
        if reply.get("state") != "completed":
            raise MongoError(20, f"removeShard {name} did not complete: {reply}")
        for m in self.replsets.pop(name):
            await m.stop(self._tracker)
        del self.shards[name]

    async def _find_all(self, coll: str, filt: dict[str, Any]) -> list[dict[str, Any]]:
        node = self.node("config")
        return await node.find_all(coll, filt)  # type: ignore[attr-defined]

    async def pause_shard(self, name: str | None = None) -> str:
        """Stop answering on shard ``name`` (a seeded random shard when None): commands on its
        connections, and replies already being computed (an awaitData getMore), wait until
        :meth:`resume_shard`. The router's getMore to it then waits too, so its promise does
        not advance and the merged stream holds back every event after it. (The router gives
        up on a remote getMore after maxAwaitTimeMS + 30 s with NetworkTimeout 89, a resumable
        error, as it does for any unresponsive shard.) Returns the shard's name."""
        member = self._shard(name)
        await self._apply("pause_shard", [member.name], {"name": member.name})
        return member.name

    async def resume_shard(self, name: str) -> None:
        """Answer again on shard ``name``: everything held by :meth:`pause_shard` proceeds."""
        await self._apply("resume_shard", [self._shard(name).name], {"name": name})

    async def kill_shard(self, name: str | None = None) -> str:
        """Kill shard ``name`` like ``kill -9``: its sockets close without replies, its tasks
        stop, nothing more is written (``node.crash()``). Clients see network errors
        (HostUnreachable 6 / ..., resumable for change streams). Returns the shard's name."""
        member = self._shard(name)
        await self._apply("kill_shard", [member.name], {"name": member.name})
        return member.name

    async def restart_shard(self, name: str) -> None:
        """Start shard ``name`` again on the same port (and the same dbpath when durable: it
        comes back with its documents and oplog; in memory it comes back empty). A running
        shard is killed first."""
        await self._apply("restart_shard", [self._shard(name).name], {"name": name})

    async def add_shard(self) -> str:
        """Start a new shard and ``addShard`` it through the router; returns its name."""
        return await self._apply("add_shard", [], {})

    async def remove_shard(self, name: str) -> None:
        """Drain and remove shard ``name`` through the router (``removeShard``), then stop it.

        Without a balancer the kit does the draining itself: every chunk the shard owns is
        moved (``moveChunk``) and every database it is primary of is moved (``movePrimary``)
        to another shard picked with the seeded random generator."""
        await self._apply("remove_shard", [self._shard(name).name], {"name": name})

    async def set_noop_interval(self, ms: int, name: str | None = None) -> None:
        """Set the periodic no-op writer's interval (ms) of shard ``name``, or of every shard
        and the config server when None (``setParameter: {periodicNoopIntervalSecs: ms /
        1000}``, which shardsim accepts at runtime with test commands on); the writer restarts
        with it. mongod's ``periodicNoopIntervalSecs`` is 10 s by default:
        ``set_noop_interval(10_000)`` reproduces the latency an idle shard adds to a merged
        stream (SERVER-80427). ValueError below 1 ms."""
        if int(ms) < 1:
            raise ValueError("the no-op interval is at least 1 ms")
        members = [self._shard(name)] if name is not None else \
            [*self.shards.values(), *(m for m in self.config_set if m.running)]
        for member in members:
            self.node(member.name)
            await self._apply("set_noop_interval", [member.name], {"ms": int(ms)})
        if name is None:
            self.noop_interval_ms = int(ms)

    async def truncate_oplog(self, name: str, before: Timestamp | datetime.datetime) -> int:
        """Remove every oplog entry (and pre-image) of shard ``name`` older than ``before`` (a
        BSON Timestamp, or a datetime taken as UTC when naive), as capped-oplog truncation
        does; the newest entry is always kept (test command ``_shardsimTruncateOplog``). A
        change stream resuming before the new oldest entry then fails with
        ChangeStreamHistoryLost (286), labelled NonResumableChangeStreamError. Returns the
        number of entries removed; TypeError for another ``before``."""
        member = self._shard(name)
        if isinstance(before, datetime.datetime):
            if before.tzinfo is None:
                before = before.replace(tzinfo=datetime.timezone.utc)
            before = Timestamp(int(before.timestamp()), 0)
        if not isinstance(before, Timestamp):
            raise TypeError("before must be a bson Timestamp or a datetime")
        self.node(member.name)
        reply = await self._apply("truncate_oplog", [member.name],
                                  {"name": member.name, "before": before})
        return int(reply["removed"])

    async def configure_fail_point(self, member: str, name: str, mode: Any,
                                   data: dict[str, Any] | None = None) -> dict[str, Any]:
        """``configureFailPoint`` on ``member`` (``"router"``, ``"config"`` or a shard name):
        ``failCommand`` / ``failGetMoreAfterCursorCheckout`` with mongod's modes and data."""
        return await self._apply("configure_fail_point", [member],
                                 {"member": member, "name": name, "mode": mode, "data": data})

    # -- promise faults (shard/change_stream/promise_faults.py) ------------------------------
    async def slow_promises(self, name: str, ms: float) -> None:
        """Delay shard ``name``'s change-stream promises by ``ms`` milliseconds (fail point
        ``shardsimDelayPromise``): its getMore replies without events, which carry its
        promise, leave ``ms`` after the promise was taken, so the merged stream releases
        another shard's event about ``ms`` later. The shard's own events are not delayed.
        Until :meth:`clear_promise_faults`. ValueError below 0 ms."""
        if ms < 0:
            raise ValueError("the promise delay is at least 0 ms")
        member = self._shard(name).name
        await self._apply("slow_promises", [member], {"name": member, "ms": ms})

    async def stall_promises(self, name: str) -> None:
        """Freeze shard ``name``'s change-stream promise at its current value (fail point
        ``shardsimStallPromise``): it keeps answering every command and returning its own
        events, but promises nothing newer, so the merged stream holds back every later event
        of the other shards (``$currentOp`` names it in ``waitingFor``). Until
        :meth:`clear_promise_faults`, which lets it promise at once."""
        member = self._shard(name).name
        await self._apply("stall_promises", [member], {"name": member})

    async def clear_promise_faults(self, name: str) -> None:
        """Undo :meth:`slow_promises`, :meth:`stall_promises` and a pending
        :meth:`same_cluster_time` pin on shard ``name``."""
        member = self._shard(name).name
        await self._apply("clear_promise_faults", [member], {"name": member})

    async def same_cluster_time(self, shard_a: str, shard_b: str) -> Timestamp:
        """Pin the next oplog entry of shards ``shard_a`` and ``shard_b`` at one cluster time T
        just past both shards' clocks and oplogs (``_shardsimSetClusterTime``): their next
        writes' events tie on ``clusterTime`` and the router orders them by the rest of the
        resume token, as for real shards whose clocks agree. Until a shard writes, its promise
        stays at or below T (events at or after T wait for it) and its periodic no-op writer
        skips. The next entry includes an implicit ``create``: write to existing collections.
        Returns T; ValueError for one shard twice; BadValue (2) if the clocks kept moving."""
        if shard_a == shard_b:
            raise ValueError("same_cluster_time needs two different shards")
        names = [self._shard(shard_a).name, self._shard(shard_b).name]
        for _ in range(3):  # gossip may move a clock between the look and the pin
            nodes = [self.node(n) for n in names]
            key = max(max(n.clock.now_key(), n.oplog.latest_key)  # type: ignore[attr-defined]
                      for n in nodes) + 1
            ts = Timestamp(key >> 32, key & 0xFFFFFFFF)
            try:
                await self._apply("same_cluster_time", names,
                                  {"shard_a": names[0], "shard_b": names[1], "ts": ts})
            except MongoError as exc:
                if exc.code != 2:
                    raise
                continue
            return ts
        raise MongoError(2, "the shards' clocks kept moving; could not pin a common time")


__all__ = ["AsyncShardedCluster", "ClusterNotRunning", "PROMISE_MODES"]
