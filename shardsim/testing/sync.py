"""The in-process sharded cluster for synchronous code: :class:`ShardedCluster`.

An :class:`~shardsim.testing.cluster.AsyncShardedCluster` on an event loop of its own, run by
one background thread (``shardsim-testkit``); every method hands its coroutine to that loop and
waits for the result, so it can be called from any thread (a test, a pymongo callback).
:meth:`ShardedCluster.stop` stops the members, cancels whatever task is left, stops the loop,
joins the thread and closes the loop: nothing of the cluster survives it.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from typing import Any, Coroutine, TypeVar

from bson.timestamp import Timestamp

from shardsim.testing.cluster import AsyncShardedCluster, ClusterNotRunning

T = TypeVar("T")


class ShardedCluster:
    """A sharded cluster (config server, ``shards`` shards, router) inside this process.

    ::

        with ShardedCluster(shards=3, seed=7) as cluster:
            client = pymongo.MongoClient(cluster.uri)
            ...
            cluster.pause_shard("shard1")

    Same parameters, attributes and fault methods as :class:`AsyncShardedCluster` (see there),
    as blocking calls. ``timeout`` (s) bounds each call into the cluster's loop.
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

    # -- faults (see AsyncShardedCluster for what each does) ----------------------------------
    def pause_shard(self, name: str | None = None) -> str:
        """Stop answering on a shard (seeded random when None); returns its name."""
        return self._call(self.cluster.pause_shard(name))

    def resume_shard(self, name: str) -> None:
        """Answer again on a paused shard."""
        self._call(self.cluster.resume_shard(name))

    def kill_shard(self, name: str | None = None) -> str:
        """Kill a shard like ``kill -9``; returns its name."""
        return self._call(self.cluster.kill_shard(name))

    def restart_shard(self, name: str) -> None:
        """Start a shard again, same port and dbpath."""
        self._call(self.cluster.restart_shard(name))

    def add_shard(self) -> str:
        """Start and add a new shard; returns its name."""
        return self._call(self.cluster.add_shard())

    def remove_shard(self, name: str) -> None:
        """Drain (chunks, primaries), remove and stop a shard."""
        self._call(self.cluster.remove_shard(name))

    def set_noop_interval(self, ms: int, name: str | None = None) -> None:
        """The periodic no-op writer's interval in ms (one shard, or all and the config server)."""
        self._call(self.cluster.set_noop_interval(ms, name))

    def truncate_oplog(self, name: str, before: Timestamp | datetime.datetime) -> int:
        """Drop a shard's oplog entries older than ``before``; returns how many."""
        return self._call(self.cluster.truncate_oplog(name, before))

    def slow_promises(self, name: str, ms: float) -> None:
        """Delay a shard's change-stream promises by ``ms`` ms (``shardsimDelayPromise``)."""
        self._call(self.cluster.slow_promises(name, ms))

    def stall_promises(self, name: str) -> None:
        """Freeze a shard's change-stream promise (``shardsimStallPromise``)."""
        self._call(self.cluster.stall_promises(name))

    def clear_promise_faults(self, name: str) -> None:
        """Undo slow/stalled promises and a pending cluster-time pin on a shard."""
        self._call(self.cluster.clear_promise_faults(name))

    def same_cluster_time(self, shard_a: str, shard_b: str) -> Timestamp:
        """Pin the next write of two shards at one cluster time; returns it."""
        return self._call(self.cluster.same_cluster_time(shard_a, shard_b))

    def configure_fail_point(self, member: str, name: str, mode: Any,
                             data: dict[str, Any] | None = None) -> dict[str, Any]:
        """``configureFailPoint`` on a member."""
        return self._call(self.cluster.configure_fail_point(member, name, mode, data))


async def _cancel_all_tasks() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)
