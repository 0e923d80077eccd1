"""The in-process sharded cluster for synchronous code: :class:`ShardedCluster`.

An :class:`~shardsim.testing.cluster.AsyncShardedCluster` on an event loop of its own, run by
one background thread (``shardsim-testkit``); every method hands its coroutine to that loop and
waits for the result, so it can be called from any thread (a test, a pymongo callback).
:meth:`ShardedCluster.stop` stops the members, cancels whatever task is left, stops the loop,
joins the thread and closes the loop: nothing of the cluster survives it.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, Callable, Coroutine, TypeVar

from shardsim.testing.cluster import AsyncShardedCluster, ClusterNotRunning
from shardsim.testing.faults import FAULTS, Fault

T = TypeVar("T")


class ShardedCluster:
    """A sharded cluster (config server, ``shards`` shards, router) inside this process.

    ::

        with ShardedCluster(shards=3, seed=7) as cluster:
            client = pymongo.MongoClient(cluster.uri)
            ...
            cluster.pause_shard("shard1")

    Same parameters, attributes and fault methods as :class:`AsyncShardedCluster` (see there),
    as blocking calls; the fault methods are generated from the records of
    :mod:`shardsim.testing.faults`, one per record. ``timeout`` (s) bounds each call into the
    cluster's loop.
    """

    def __init__(self, shards: int = 3, *, timeout: float = 60.0, **options: Any) -> None:
        self.cluster = AsyncShardedCluster(shards, **options)
        self.timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._clients: list[Any] = []

    # -- the loop thread --------------------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._loop is None:
            coro.close()
            raise ClusterNotRunning("the cluster is not started")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(self.timeout if timeout is None else timeout)

    def start(self) -> "ShardedCluster":
        """Start the loop thread and the cluster; returns self. Raises what start-up raised
        (after stopping everything)."""
        if self._loop is not None:
            return self
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="shardsim-testkit",
                                        daemon=True)
        self._thread.start()
        try:
            self._call(self.cluster.start())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the cluster, its tasks, loop and thread; close clients from :meth:`client`.
        Safe to call twice."""
        for client in self._clients:
            client.close()
        self._clients.clear()
        loop, thread = self._loop, self._thread
        if loop is None:
            return
        try:
            self._call(self.cluster.stop())
            self._call(_cancel_all_tasks())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(10)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._loop = None
            self._thread = None

    def __enter__(self) -> "ShardedCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- addresses --------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        """``mongodb://HOST:PORT/`` of the router."""
        return self.cluster.uri

    @property
    def uris(self) -> list[str]:
        """Every router's ``mongodb://HOST:PORT/`` (``routers=N``; the first is :attr:`uri`)."""
        return self.cluster.uris

    @property
    def shard_names(self) -> list[str]:
        """The shards' names, in order of creation."""
        return self.cluster.shard_names

    @property
    def seed(self) -> int | None:
        return self.cluster.seed

    def shard_address(self, name: str) -> str:
        """``host:port`` of shard ``name``."""
        return self.cluster.shard_address(name)

    def client(self, **kwargs: Any) -> Any:
        """A ``pymongo.MongoClient`` to the router (closed by :meth:`stop`)."""
        import pymongo
        kwargs.setdefault("serverSelectionTimeoutMS", 10000)
        client: Any = pymongo.MongoClient(self.uri, **kwargs)
        self._clients.append(client)
        return client

    def command(self, member: str, cmd: dict[str, Any], db: str = "admin") -> dict[str, Any]:
        """Run ``cmd`` on a member's command table (see :meth:`AsyncShardedCluster.command`)."""
        return self._call(self.cluster.command(member, cmd, db))

    # -- replica-set shards (members=N; shardsim.testing.replica_sets) ----------------------
    def members_of(self, name: str) -> list[str]:
        """``host:port`` of every member of shard ``name``."""
        return self.cluster.members_of(name)

    def primary_of(self, name: str, timeout: float = 10.0) -> str:
        """The primary's ``host:port`` of shard ``name`` (waits up to ``timeout`` s)."""
        return self._call(self.cluster.primary_of(name, timeout))

    def step_down(self, name: str | None = None, secs: int = 10) -> str:
        """See :meth:`AsyncShardedCluster.step_down`."""
        return self._call(self.cluster.step_down(name, secs))

    def kill_primary(self, name: str | None = None) -> str:
        """See :meth:`AsyncShardedCluster.kill_primary`."""
        return self._call(self.cluster.kill_primary(name))

    def restart_member(self, host: str) -> None:
        """See :meth:`AsyncShardedCluster.restart_member`."""
        self._call(self.cluster.restart_member(host))

    def isolate(self, host: str) -> None:
        """See :meth:`AsyncShardedCluster.isolate`."""
        self._call(self.cluster.isolate(host))

    def partition(self, host_a: str, host_b: str) -> None:
        """See :meth:`AsyncShardedCluster.partition`."""
        self._call(self.cluster.partition(host_a, host_b))

    def heal(self) -> None:
        """See :meth:`AsyncShardedCluster.heal`."""
        self._call(self.cluster.heal())

    def freeze(self, host: str, secs: int) -> None:
        """See :meth:`AsyncShardedCluster.freeze`."""
        self._call(self.cluster.freeze(host, secs))

    def lag(self, host: str, ms: float) -> None:
        """See :meth:`AsyncShardedCluster.lag`."""
        self._call(self.cluster.lag(host, ms))

    def hold_commit_point(self, name: str) -> None:
        """See :meth:`AsyncShardedCluster.hold_commit_point`."""
        self._call(self.cluster.hold_commit_point(name))

    def member_node(self, host: str) -> Any:
        """The node of the shard member at ``host`` (to check its own data after a fault)."""
        return self.cluster._member_at(host).node


def _blocking(fault: Fault) -> Callable[..., Any]:
    """The blocking method of fault record ``fault``: the async method's coroutine run on the
    cluster's loop (same signature and docstring; ``.fault`` is the record)."""
    async_method = getattr(AsyncShardedCluster, fault.method)

    def method(self: ShardedCluster, *args: Any, **kwargs: Any) -> Any:
        return self._call(getattr(self.cluster, fault.method)(*args, **kwargs))

    method.__name__ = fault.method
    method.__qualname__ = f"ShardedCluster.{fault.method}"
    method.__doc__ = async_method.__doc__
    method.__signature__ = inspect.signature(async_method)  # type: ignore[attr-defined]
    method.fault = fault  # type: ignore[attr-defined]
    return method


# The fault methods (pause_shard, kill_shard, slow_promises, ...): one per record.
for _fault in FAULTS:
    setattr(ShardedCluster, _fault.method, _blocking(_fault))
del _fault


async def _cancel_all_tasks() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)


class ReplicaSet:
    """A plain replica set inside this process, blocking API (see
    :class:`shardsim.testing.replica_sets.AsyncReplicaSet` for the parameters)::

        with ReplicaSet(members=3, seed=7) as rs:
            client = pymongo.MongoClient(rs.uri)      # replicaSet=rs0
            rs.step_down()                             # a new primary within a second
    """

    def __init__(self, members: int = 3, *, timeout: float = 60.0, **options: Any) -> None:
        from shardsim.testing.replica_sets import AsyncReplicaSet
        self.rs = self.cluster = AsyncReplicaSet(members, **options)
        self.timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._clients: list[Any] = []

    # the loop thread and its life: the same as the sharded cluster's, on ``self.cluster``
    _call = ShardedCluster._call
    start = ShardedCluster.start
    stop = ShardedCluster.stop
    __enter__ = ShardedCluster.__enter__
    __exit__ = ShardedCluster.__exit__

    @property
    def uri(self) -> str:
        """``mongodb://h1,h2,h3/?replicaSet=<name>``."""
        return self.rs.uri

    def client(self, host: str | None = None, **kwargs: Any) -> Any:
        """A ``pymongo.MongoClient`` on :attr:`uri`, or on ``host`` (one member:
        ``direct=True`` connects to it alone), closed by :meth:`stop`."""
        import pymongo
        kwargs.setdefault("serverSelectionTimeoutMS", 10000)
        if host is not None and kwargs.pop("direct", False):
            kwargs["directConnection"] = True
        client: Any = pymongo.MongoClient(host or self.uri, **kwargs)
        self._clients.append(client)
        return client

    def members_of(self, name: str | None = None) -> list[str]:
        return self.rs.members_of(name or self.rs.name)

    def primary_of(self, name: str | None = None, timeout: float = 10.0) -> str:
        return self._call(self.rs.primary_of(name or self.rs.name, timeout))

    def step_down(self, secs: int = 10) -> str:
        return self._call(self.rs.step_down(self.rs.name, secs))

    def kill_primary(self) -> str:
        return self._call(self.rs.kill_primary(self.rs.name))

    def restart_member(self, host: str) -> None:
        self._call(self.rs.restart_member(host))

    def isolate(self, host: str) -> None:
        self._call(self.rs.isolate(host))

    def partition(self, host_a: str, host_b: str) -> None:
        self._call(self.rs.partition(host_a, host_b))

    def heal(self) -> None:
        self._call(self.rs.heal())

    def freeze(self, host: str, secs: int) -> None:
        """``replSetFreeze: secs`` on the member at ``host`` (0 unfreezes)."""
        self._call(self.rs.freeze(host, secs))

    def lag(self, host: str, ms: float) -> None:
        """The secondary at ``host`` applies ``ms`` late (see ``AsyncReplicaSet.lag``)."""
        self._call(self.rs.lag(host, ms))

    def hold_commit_point(self) -> None:
        """Hold the set's commit point until :meth:`heal` (``hold_commit_point``)."""
        self._call(self.rs.hold_commit_point(self.rs.name))

    def node(self, host: str) -> Any:
        """The member's node (read its storage and oplog directly after a fault)."""
        return self.rs.node(host)

    def command(self, member: str, cmd: dict[str, Any], db: str = "admin") -> dict[str, Any]:
        return self._call(self.rs.command(member, cmd, db))
