"""The router's view of each shard as a replica set (mongos' ``ShardRegistry`` with a
``ShardRemote`` + ``RemoteCommandTargeterRS`` per shard, ``src/mongo/s/client/``).

One :class:`shardsim.core.replica_set_monitor.ReplicaSetMonitor` per shard, built from the
shard's ``config.shards.host`` (``setName/host1,host2``) as the catalog cache last loaded it.
(The config server is still reached through one pool to ``--configdb``: its monitor waits for
the lead's multi-member config server, see docs/replication.md.) The registry follows the catalog: a shard
removed from ``config.shards`` loses its monitor, a shard whose set name changed gets a new
one, new seed hosts of a known set are only added (the monitor discovers the rest itself).

:meth:`ShardRegistry.target` is the targeting step of every shard command: the cached primary
pool when the read preference is primary and a primary is known (no await, no round trip),
else :meth:`ReplicaSetMonitor.get_host` (waits up to ``defaultFindReplicaSetHostTimeoutMS``,
then FailedToSatisfyReadPreference 133). :meth:`ShardRegistry.report` tells a shard's
monitor what a command's failure says about the member (``ShardRemote::
updateReplSetMonitor``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.errors import MongoError
from shardsim.core.replica_set_monitor import (
    DEFAULT_FIND_HOST_TIMEOUT_MS, DEFAULT_HEARTBEAT_S, NETWORK_CODES, NOT_PRIMARY_CODES,
    PRIMARY_ONLY, SHUTDOWN_CODES, ConnectionString, ReadPreference, ReplicaSetMonitor)

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.catalog import CatalogCache

_TELLING = NOT_PRIMARY_CODES | NETWORK_CODES | SHUTDOWN_CODES | {202}


class ShardRegistry:
    """Monitors by shard name; ``catalog`` is the router's
    :class:`router.catalog.CatalogCache`. ``heartbeat_s`` is the monitors' polling interval;
    ``find_host_timeout_ms`` (``defaultFindReplicaSetHostTimeoutMS``, settable at run time
    with ``setParameter``) bounds every host selection."""

    def __init__(self, catalog: "CatalogCache", *,
                 heartbeat_s: float = DEFAULT_HEARTBEAT_S,
                 find_host_timeout_ms: int = DEFAULT_FIND_HOST_TIMEOUT_MS) -> None:
        self.catalog = catalog
        self.heartbeat_s = heartbeat_s
        self.find_host_timeout_ms = find_host_timeout_ms
        self.monitors: dict[str, ReplicaSetMonitor] = {}
        self._strings: dict[str, ConnectionString] = {}
        self._generation = -1
        self.closed = False

    def _make(self, conn: ConnectionString) -> ReplicaSetMonitor:
        return ReplicaSetMonitor(conn, heartbeat_s=self.heartbeat_s,
                                 find_host_timeout_ms=lambda: self.find_host_timeout_ms)

    # -- following the catalog ----------------------------------------------------------------
    def _sync(self) -> None:
        """Bring the monitors in line with the catalog's ``config.shards`` (once per catalog
        generation: an int compare on the hot path)."""
        self._generation = self.catalog.generation
        wanted: dict[str, ConnectionString] = {}
        for doc in self.catalog.shard_docs():
            try:
                wanted[doc["_id"]] = ConnectionString.parse(doc["host"])
            except MongoError:
                continue
        for name in [n for n in self.monitors if n not in wanted]:
            self.monitors.pop(name).close()
            self._strings.pop(name, None)
        for name, conn in wanted.items():
            if self._strings.get(name) == conn:
                continue
            mon = self.monitors.get(name)
            if mon is not None and mon.set_name == conn.set_name and conn.set_name:
                for h in conn.hosts:  # new seeds of the same set (ShardRegistry::updateReplSetHosts)
                    mon._add_member(h)
            else:
                if mon is not None:
                    mon.close()
                self.monitors[name] = self._make(conn)
                if self.closed:  # the router is stopping: a monitor that never checks
                    self.monitors[name].close()
            self._strings[name] = conn

    def monitor(self, shard: str) -> ReplicaSetMonitor:
        """The monitor of ``shard``; ShardNotFound (70) when the catalog does not list it."""
        if self._generation != self.catalog.generation:
            self._sync()
        mon = self.monitors.get(shard)
        if mon is None:
            raise MongoError(70, f"Shard {shard} not found")
        return mon

    # -- targeting ----------------------------------------------------------------------------
    async def target(self, shard: str,
                     read_preference: ReadPreference | None = None) -> tuple[str, Any]:
        """``(host, pool)`` of the member a command to ``shard`` goes to: the cached primary for a primary read preference, else a selection that may
        wait (133 after ``defaultFindReplicaSetHostTimeoutMS``)."""
        mon = self.monitor(shard)
        rp = read_preference or PRIMARY_ONLY
        if rp.mode == "primary":
            pool = mon.primary_pool()
            if pool is not None:
                return mon.primary, pool  # type: ignore[return-value]
        host = await mon.get_host(rp)
        return host, mon.pool(host)

    def primary_pool_or_seed(self, shard: str) -> Any:
        """Without waiting: the known primary's pool, else the first member's (a caller that
        cannot wait; its failure is reported and the next command targets anew)."""
        mon = self.monitor(shard)
        pool = mon.primary_pool()
        if pool is not None:
            return pool
        mon.start()
        mon.request_check()
        first = next(iter(mon.members), None) or mon.seed_string.hosts[0]
        return mon.pool(first)

    def report(self, shard: str, host: str, exc: BaseException) -> None:
        """Tell the monitor of ``shard`` about ``exc`` from ``host``
        (``ShardRemote::updateReplSetMonitor``)."""
        if getattr(exc, "code", None) not in _TELLING:
            return
        mon = self.monitors.get(shard)
        if mon is not None:
            mon.update_host_with_status(host, exc)

    def report_reply(self, shard: str, host: str, reply: Any) -> None:
        """As :meth:`report` for an ``ok: 0`` reply read without raising."""
        code = reply.get("code") if not reply.get("ok") else None
        if code in _TELLING:
            self.report(shard, host, MongoError(int(code), str(reply.get("errmsg", ""))))

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every monitor and close their pools."""
        self.closed = True
        for mon in self.monitors.values():
            mon.close()
        self.monitors.clear()
        self._strings.clear()

    def describe(self) -> dict[str, Any]:
        """``{setName: {hosts: [...]}}`` of every monitor (``connPoolStats.replicaSets``)."""
        return {mon.name: mon.describe() for mon in self.monitors.values()}


def read_preference_document(rp: ReadPreference) -> dict[str, Any]:
    """``$readPreference`` as a shard command carries it (``ReadPreferenceSetting::
    toContainingBSON``)."""
    doc: dict[str, Any] = {"mode": rp.mode}
    if rp.tags and rp.tags != ((),):
        doc["tags"] = rp.tag_sets()
    if rp.max_staleness_s is not None:
        doc["maxStalenessSeconds"] = rp.max_staleness_s
    return doc


def read_preference_of(req: Any) -> ReadPreference | None:
    """The client's ``$readPreference`` of ``req`` (None: primary), parsed
    (:meth:`shardsim.core.replica_set_monitor.ReadPreference.parse`; 9/2/14 on bad input)."""
    doc = req.body.get("$readPreference")
    if doc is None:
        return None
    rp = ReadPreference.parse(doc)
    return None if rp == PRIMARY_ONLY else rp
