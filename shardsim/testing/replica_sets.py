"""Replica-set shards in the test kit: members, and the faults that act on them.

With ``members=N`` (N > 1) every shard of :class:`shardsim.testing.AsyncShardedCluster` is a
replica set of N members, each a :class:`shard.node.ShardNode` on its own loopback port, with its
own oplog, documents and (when durable) dbpath; the shard is added to the router as
``name/host1,host2,...``, as mongos stores a replica-set shard. Election timeouts are the kit's
(``repl_options``: ``election_timeout_ms`` 1000, ``heartbeat_interval_ms`` 200,
``heartbeat_timeout_ms`` 2000 by default; ``stall_tolerant``: the members share one event loop,
so a stall of that loop counts as paused time) so that a test sees a new primary within about
1.5 s of a kill.

:class:`ReplicaSetMembers` is the part of the cluster that knows them: ``members_of``,
``primary_of`` and the faults ``step_down``, ``kill_primary``, ``restart_member``, ``isolate``
and ``heal`` (records in :mod:`shardsim.testing.faults`). :class:`AsyncReplicaSet` is a plain
replica set of such members, no router (``shardsim up --topology replicaset``'s in-process
counterpart), for users of replica sets.
"""

from __future__ import annotations

import asyncio
import os
import socket
import shutil
import tempfile
from typing import Any

from shardsim.core.node import Node
from shardsim.testing.members import Member, TaskTracker, run_as

KIT_REPL_OPTIONS = {"election_timeout_ms": 1000, "heartbeat_interval_ms": 200,
                    "heartbeat_timeout_ms": 2000, "stall_tolerant": True}


class NoPrimary(RuntimeError):
    """No member of the set became writable primary in time."""


def member_options(hosts: list[str], index: int, repl_options: dict[str, Any],
                   seed: int | None) -> dict[str, Any]:
    """The :class:`ShardNode` options that make it member ``index`` of ``hosts``."""
    opts = {**KIT_REPL_OPTIONS, **repl_options, "repl_hosts": list(hosts)}
    opts["seed"] = None if seed is None else seed * 100 + index
    return opts


def new_replica_set(name: str, members: int, host: str, make_options: Any,
                    data_dir: Any, make_node: Any = None, role: str = "shard") -> list[Member]:
    """The :class:`Member` s of replica set ``name`` (not started): member 0 is named ``name``,
    the others ``name-1``, ``name-2``...; ports are chosen now (every member must know every
    address before it starts). ``make_options(index, hosts)`` gives a member's node options;
    ``data_dir(member name)`` its dbpath or None. Member 0 initiates the set at its first start
    (the "initiating set" no-op); a member restarted later never does. ``make_node(port,
    options)`` builds a member's node (default: a :class:`ShardNode` of shard ``name``; the
    kit's config server replica set passes a :class:`ConfigServerNode`'s), ``role`` names the
    members' role."""
    from shardsim.shard.node import ShardNode
    if make_node is None:
        def make_node(port: int, options: dict[str, Any]) -> Node:
            return ShardNode(shard_name=name, host=host, port=port, test_commands=True,
                             options=options)
    socks = [socket.socket() for _ in range(members)]  # held together: N distinct ports
    for sock in socks:
        sock.bind((host, 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    hosts = [f"{host}:{p}" for p in ports]
    out = []
    for i in range(members):
        mname = name if i == 0 else f"{name}-{i}"
        dbpath = data_dir(mname)
        first = [i == 0]

        def make(port: int, i: int = i, dbpath: Any = dbpath, first: list = first) -> Node:
            options = {"dbpath": dbpath, **make_options(i, hosts)}
            if members > 1:
                options["repl_initiate"] = first[0]
                first[0] = False
            return make_node(port, options)

        m = Member(mname, role, make, host, dbpath)
        m.port = ports[i]
        out.append(m)
    return out


def connection_string(name: str, members: list[Member]) -> str:
    """``name/host1,host2,...`` for a set of more than one member, else ``host:port``."""
    if len(members) == 1:
        return members[0].address
    return f"{name}/" + ",".join(m.address for m in members)


def _term(member: Member) -> int:
    """The member's current election term (-1: not running, or not a replica-set member)."""
    node = member.node
    if not member.running or node is None or node.repl is None:
        return -1
    return int(node.repl.core.term)


class ReplicaSetMembers:
    """Replica-set queries and faults of a cluster with ``replsets`` (``{set name: [Member]}``),
    a ``_tracker`` (:class:`TaskTracker`) and ``_seed_fail_points``."""

    replsets: dict[str, list[Member]]
    _tracker: TaskTracker

    def _sets(self) -> dict[str, list[Member]]:
        """Every set the faults may name: the shards' (:attr:`replsets`; a cluster adds its
        config server's as ``"config"``). Random choices stay among :attr:`replsets`."""
        return self.replsets

    def members_of(self, name: str) -> list[str]:
        """``host:port`` of every member of shard (set) ``name`` (``"config"``: the config
        server's), in ``_id`` order."""
        sets = self._sets()
        if name not in sets:
            raise KeyError(f"no replica set named {name!r} (sets: {sorted(sets)})")
        return [m.address for m in sets[name]]

    async def primary_of(self, name: str, timeout: float = 10.0) -> str:
        """``host:port`` of the writable primary of ``name`` as its ``hello`` says, waiting up
        to ``timeout`` s for one. Raises :class:`NoPrimary`."""
        members = self._sets()[name]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for m in members:
                node = m.node
                if m.running and node is not None and (node.repl is None or node.repl.writable):
                    return m.address
            if loop.time() > deadline:
                raise NoPrimary(f"no primary in {name} after {timeout} s")
            await asyncio.sleep(0.02)

    async def settled(self, name: str, timeout: float = 15.0) -> str:
        """Wait until set ``name`` has a writable primary that every running member knows
        and has caught up with (a steady state to start a test from); returns the primary."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            primary = await self.primary_of(name, timeout=max(0.1, deadline - loop.time()))
            pnode = self._member_at(primary).node
            nodes = [m.node for m in self._sets()[name] if m.running and m.node is not None]
            if pnode.repl is None or all(
                    n.repl.core.primary_id == pnode.repl.self_id
                    and n.repl.core.applied >= pnode.repl.core.first_op_of_term
                    for n in nodes if n is not pnode):
                return primary
            if loop.time() > deadline:
                raise NoPrimary(f"{name} did not settle in {timeout} s")
            await asyncio.sleep(0.02)

    def _member_at(self, host: str) -> Member:
        for members in self._sets().values():
            for m in members:
                if m.address == host:
                    return m
        raise KeyError(f"no replica-set member at {host!r}")

    def _primary_member(self, name: str | None) -> tuple[str, Member]:
        if name is None:
            name = self.random.choice(sorted(self.replsets))  # type: ignore[attr-defined]
        for m in self._sets()[name]:
            node = m.node
            if m.running and node is not None and (node.repl is None or node.repl.writable):
                return name, m
        raise NoPrimary(f"{name} has no primary now")

    async def step_down(self, name: str | None = None, secs: int = 10) -> str:
        """``replSetStepDown: secs`` with ``force`` on the primary of ``name`` (a seeded random
        set when None), as every rolling upgrade does: its writes get 11602, ``w`` waiters
        189, reads and cursors carry on; waits for a primary elected after it (another
        member, or the same one again once ``secs`` have passed: with no secondary caught up,
        mongod's stepped-down primary may win the next election). Returns the old primary's
        ``host:port``."""
        name, member = await self._wait_primary_member(name)
        term = _term(member)
        await run_as(member.name, self.command, member.name,  # type: ignore[attr-defined]
                     {"replSetStepDown": secs, "force": True})
        await self._wait_new_primary(name, member.address, term=term)
        return member.address

    async def kill_primary(self, name: str | None = None) -> str:
        """``kill -9`` the primary of ``name`` (a seeded random set when None); the others
        elect a new primary within the election timeout. Returns the killed member's
        ``host:port`` (start it again with :meth:`restart_member`)."""
        name, member = await self._wait_primary_member(name)
        await member.kill(self._tracker)
        return member.address

    async def restart_member(self, host: str) -> None:
        """Start the member at ``host`` again (same port and dbpath; killed first if it runs).
        It rejoins as a secondary and catches up (a member without a dbpath comes back empty
        and replays the whole oplog from its sync source)."""
        member = self._member_at(host)
        if member.running:
            await member.kill(self._tracker)
        await run_as(member.name, member.start)
        self._seed_fail_points(member)  # type: ignore[attr-defined]

    async def isolate(self, host: str) -> None:
        """Cut every link of the member at ``host``, both ways, until :meth:`heal`: its
        replication messages and every client command (routers' included) are dropped without
        a reply. A primary cut off steps down after the election timeout; the majority side
        elects another; its ``w: 1`` writes in between roll back when it rejoins."""
        node = self._member_at(host).node
        if node is not None and node.repl is not None:
            node.repl.isolate()

    async def partition(self, host_a: str, host_b: str) -> None:
        """Cut the link between members ``host_a`` and ``host_b`` both ways (their replication
        messages are dropped; clients still reach both), until :meth:`heal`. Cutting a primary
        from a majority makes it step down after the election timeout, while the others elect
        a new one; ``w: 1`` writes it took meanwhile roll back when it rejoins."""
        a, b = self._member_at(host_a), self._member_at(host_b)
        for x, y in ((a, b), (b, a)):
            if x.node is not None and x.node.repl is not None:
                x.node.repl.cut({x.node.repl.config.members[
                    [m.host for m in x.node.repl.config.members].index(y.address)].id})

    async def freeze(self, host: str, secs: int) -> None:
        """``replSetFreeze: secs`` on the member at ``host``: it does not stand for election
        for ``secs`` s (0 unfreezes). Raises MongoError NotSecondary 95 on a primary
        (``repl_set_commands.cpp`` ``CmdReplSetFreeze``)."""
        member = self._member_at(host)
        await run_as(member.name, self.command, member.name,  # type: ignore[attr-defined]
                     {"replSetFreeze": secs})

    async def lag(self, host: str, ms: float) -> None:
        """The secondary at ``host`` applies every fetched batch ``ms`` milliseconds late (0
        or :meth:`heal` ends it): its optimes, and with two lagging members the commit point,
        fall behind; a stream reading it (``readPreference: secondary``) runs late."""
        node = self._member_at(host).node
        if node is not None and node.repl is not None:
            node.repl.lag_ms = max(0.0, float(ms))

    async def hold_commit_point(self, name: str) -> None:
        """Hold shard ``name``'s majority commit point where it is: its secondaries stop
        fetching (until :meth:`heal`), so no new entry reaches a majority; ``w: "majority"``
        writes wait, and its change streams release nothing newer (the merged stream waits)."""
        primary = await self.primary_of(name)
        for m in self._sets()[name]:
            if m.address != primary and m.node is not None and m.node.repl is not None:
                m.node.repl.fetch_held = True

    async def heal(self) -> None:
        """Restore every link cut by :meth:`isolate` / :meth:`partition`; end :meth:`lag` and
        :meth:`hold_commit_point`."""
        for members in self._sets().values():
            for m in members:
                if m.node is not None and m.node.repl is not None:
                    m.node.repl.heal()

    async def _wait_primary_member(self, name: str | None) -> tuple[str, Member]:
        if name is None:
            name = self.random.choice(sorted(self.replsets))  # type: ignore[attr-defined]
        primary = await self.primary_of(name)
        return name, self._member_at(primary)

    async def _wait_new_primary(self, name: str, old: str, timeout: float = 15.0,
                                term: int | None = None) -> str:
        """A primary other than ``old``, or (``term`` given) one elected in a later term."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            primary = await self.primary_of(name, timeout=max(0.1, deadline - loop.time()))
            if primary != old or (term is not None and _term(self._member_at(primary)) > term):
                return primary
            if loop.time() > deadline:
                raise NoPrimary(f"{name}: no new primary after {timeout} s")
            await asyncio.sleep(0.02)


class AsyncReplicaSet(ReplicaSetMembers):
    """A plain replica set of ``members`` members inside this process (no router, no config
    server), for replica-set users: ``async with AsyncReplicaSet(members=3) as rs:``, then
    pymongo on :attr:`uri` (``replicaSet=<name>``: the driver discovers the set and follows
    failovers). ``name`` the set's name; ``durable``/``dbpath`` as the sharded cluster's;
    ``repl_options`` the timing options (ms); ``seed`` seeds the election jitter and the
    random choices of the faults."""

    def __init__(self, members: int = 3, *, name: str = "rs0", host: str = "127.0.0.1",
                 durable: bool = False, dbpath: str | None = None, seed: int | None = None,
                 noop_interval_ms: int = 200, repl_options: dict[str, Any] | None = None,
                 node_options: dict[str, Any] | None = None) -> None:
        import random
        if members < 1:
            raise ValueError("a replica set needs at least one member")
        self.name = name
        self.num_members = members
        self.host = host
        self.durable = durable or dbpath is not None
        self._dbpath_arg = dbpath
        self.base_dir: str | None = None
        self.seed = seed
        self.random = random.Random(seed)
        self.noop_interval_ms = noop_interval_ms
        self.repl_options = dict(repl_options or {})
        self.node_options = dict(node_options or {})
        self.replsets: dict[str, list[Member]] = {}
        self._tracker = TaskTracker()

    @property
    def uri(self) -> str:
        """``mongodb://h1,h2,h3/?replicaSet=<name>``."""
        hosts = ",".join(m.address for m in self.replsets[self.name])
        return f"mongodb://{hosts}/?replicaSet={self.name}"

    def node(self, host: str) -> Any:
        """The :class:`ShardNode` of the member at ``host``."""
        return self._member_at(host).node

    def _data_dir(self, mname: str) -> str | None:
        if not self.durable:
            return None
        assert self.base_dir is not None
        path = os.path.join(self.base_dir, mname)
        os.makedirs(path, exist_ok=True)
        return path

    def _seed_fail_points(self, member: Member) -> None:
        pass

    async def command(self, member: str, cmd: dict[str, Any], db: str = "admin") -> dict[str, Any]:
        """Run ``cmd`` on member ``member`` (its kit name, ``rs0``, ``rs0-1``...) directly."""
        from shardsim.core.commands import ConnectionInfo, Request
        from shardsim.core.errors import MongoError
        node = next(m.node for ms in self.replsets.values() for m in ms if m.name == member)
        reply = await node.run_command(Request(next(iter(cmd)), db, {**cmd, "$db": db},
                                               ConnectionInfo(id=-1, peer="shardsim.testing")))
        if not reply.get("ok"):
            raise MongoError(int(reply.get("code", 1)), str(reply.get("errmsg", "")))
        return reply

    async def start(self) -> "AsyncReplicaSet":
        """Start every member and wait for a primary."""
        self._tracker.install(asyncio.get_running_loop())
        try:
            if self.durable:
                self.base_dir = self._dbpath_arg or tempfile.mkdtemp(prefix="shardsim-rs-")

            def options(i: int, hosts: list[str]) -> dict[str, Any]:
                opts = {"noop_interval_ms": self.noop_interval_ms, **self.node_options}
                if self.num_members > 1:
                    opts.update(member_options(hosts, i, self.repl_options, self.seed))
                return opts
            members = new_replica_set(self.name, self.num_members, self.host, options,
                                      self._data_dir)
            self.replsets[self.name] = members
            await asyncio.gather(*(run_as(m.name, m.start) for m in members))
            await self.settled(self.name)
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        """Stop every member; remove temporary data. Safe to call twice."""
        for members in self.replsets.values():
            for m in members:
                try:
                    await m.stop(self._tracker)
                except Exception:  # pragma: no cover - keep stopping the others
                    await m.kill(self._tracker)
        for owner in list(self._tracker.tasks):
            await self._tracker.cancel(owner)
        self._tracker.uninstall()
        if self.base_dir and self._dbpath_arg is None:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    async def __aenter__(self) -> "AsyncReplicaSet":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
