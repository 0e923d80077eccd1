"""The router's view of each shard as a replica set (mongos' ``ShardRegistry`` with a
``ShardRemote`` + ``RemoteCommandTargeterRS`` per shard, ``src/mongo/s/client/``).

One :class:`shardsim.core.replica_set_monitor.ReplicaSetMonitor` per shard, built from the
shard's ``config.shards.host`` (``setName/host1,host2``) as the catalog cache last loaded it.
The config server is reached through :func:`config_pool`: one pool for a plain
``--configdb host:port``, a :class:`PrimaryPool` over a monitor for ``setName/host,...``.
The registry follows the catalog: a shard
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

from shardsim.core.client import Pool
from shardsim.core.errors import MongoError
from shardsim.core.replica_set_monitor import (
    DEFAULT_FIND_HOST_TIMEOUT_MS, DEFAULT_HEARTBEAT_S, NETWORK_CODES, NOT_PRIMARY_CODES, OTHER,
    PRIMARY, PRIMARY_ONLY, SECONDARY, SHUTDOWN_CODES, STANDALONE, UNKNOWN, ConnectionString,
    ReadPreference, ReplicaSetMonitor)

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

    def member_state(self, shard: str | None, host: str, config_pool: Any = None) -> str | None:
        """The router's view of member ``host`` of ``shard`` (None: the config server, through
        ``config_pool``), from its monitor's last ``hello``: ``PRIMARY``, ``SECONDARY``,
        ``OTHER`` (reachable, neither: ROLLBACK, RECOVERING, STARTUP2 look alike from
        ``hello``), ``UNKNOWN`` (its last check failed: down, or the link is cut; or the set's
        monitor does not list it) or ``STANDALONE``; None when no monitor watches it (a config
        server given to ``--configdb`` as a plain ``host:port`` is reached through a plain
        pool). Shown beside a remote cursor's ``host`` in ``$currentOp``
        (:mod:`router.change_stream.current_op`)."""
        if shard is None:
            mon = getattr(config_pool, "monitor", None)
        else:
            mon = self.monitors.get(shard)
        if mon is None:
            return None
        member = mon.members.get(host)
        if member is None:
            return "UNKNOWN"
        return _STATE_WORDS.get(member.kind, "UNKNOWN")

    def monitor(self, shard: str) -> ReplicaSetMonitor:
        """The monitor of ``shard``; ShardNotFound (70) when the catalog does not list it."""
        if self._generation != self.catalog.generation:
            self._sync()
        mon = self.monitors.get(shard)
        if mon is None:
            raise MongoError(70, f"Shard {shard} not found")
        return mon

    # -- targeting ----------------------------------------------------------------------------
    async def target(self, shard: str, read_preference: ReadPreference | None = None, *,
                     timeout_s: float | None = None) -> tuple[str, Any]:
        """``(host, pool)`` of the member a command to ``shard`` goes to: the cached primary
        for a primary read preference, else a selection that may wait ``timeout_s`` (default
        ``defaultFindReplicaSetHostTimeoutMS``), then FailedToSatisfyReadPreference (133)."""
        mon = self.monitor(shard)
        rp = read_preference or PRIMARY_ONLY
        if rp.mode == "primary":
            pool = mon.primary_pool()
            if pool is not None:
                return mon.primary, pool  # type: ignore[return-value]
        host = await mon.get_host(rp, timeout_s=timeout_s)
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


# SDAM server types -> the words of a member state (replSetGetStatus stateStr where one fits)
_STATE_WORDS = {PRIMARY: "PRIMARY", SECONDARY: "SECONDARY", OTHER: "OTHER",
                STANDALONE: "STANDALONE", UNKNOWN: "UNKNOWN"}


class PrimaryPool:
    """A :class:`shardsim.core.client.Pool` look-alike whose commands go to the primary of a
    replica set (the router's config server when ``--configdb`` is ``setName/h1,h2``, as
    mongos' ``ShardRegistry`` keeps a ``ShardRemote`` for the config shard): each command
    waits for a primary (133 after ``defaultFindReplicaSetHostTimeoutMS``) and tells the
    monitor what its failure says. :meth:`pin` gives the pool of the current primary itself,
    for a cursor whose getMores must reach the member that opened it."""

    def __init__(self, monitor: ReplicaSetMonitor) -> None:
        self.monitor = monitor

    @property
    def address(self) -> str:
        """The primary's ``host:port`` when known, else the first seed's."""
        return self.monitor.primary or self.monitor.seed_string.hosts[0]

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    async def pin(self) -> Any:
        """The pool of the primary now (waiting for one)."""
        return self.monitor.pool(await self.monitor.get_host())

    async def command(self, db: str, cmd: dict[str, Any], **kw: Any) -> Any:
        """Run one command on the primary (see the class docstring)."""
        mon = self.monitor
        pool = mon.primary_pool()
        host = mon.primary
        if pool is None or host is None:
            host = await mon.get_host()
            pool = mon.pool(host)
        try:
            reply = await pool.command(db, cmd, **kw)
        except MongoError as exc:
            if exc.code in _TELLING:
                mon.update_host_with_status(host, exc)
            raise
        if not reply.get("ok") and reply.get("code") in _TELLING:
            mon.update_host_with_status(host, MongoError(int(reply["code"]),
                                                         str(reply.get("errmsg", ""))))
        return reply

    def close(self) -> None:
        """Stop the monitor and close its pools."""
        self.monitor.close()


def config_pool(configdb: str, registry: "ShardRegistry") -> Any:
    """How the router reaches its config server: ``--configdb`` ``host:port`` -> one
    :class:`shardsim.core.client.Pool` (a command to a config server that is down fails at once
    with the network error); ``setName/host1:port1,...`` -> a :class:`PrimaryPool` over a
    monitor of that set (FailedToParse 9 / BadValue 2 for a bad string)."""
    conn = ConnectionString.parse(configdb)
    if conn.set_name is None:
        host, _, port = conn.hosts[0].rpartition(":")
        return Pool(host, int(port))
    return PrimaryPool(registry._make(conn))


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
