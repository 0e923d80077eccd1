"""Reaching another shard's primary from a shard or the config server, as the server's
``ShardRegistry`` / ``ShardRemote`` do (``src/mongo/s/client/shard_remote.cpp``): one
:class:`~shardsim.core.replica_set_monitor.ReplicaSetMonitor` per shard connection string
(``setName/h1,h2,h3`` or ``host:port``), the primary found through it, and every error told to
it (``updateReplSetMonitor``) so that the next command goes to the new primary after a
failover. A "not primary" refusal (the command ran nothing) is retried at once on the primary
the monitor finds next, up to :data:`ATTEMPTS` times; other errors are raised.
"""

from __future__ import annotations

from typing import Any

from shardsim.core.errors import MongoError
from shardsim.core.gossip import gossip_command
from shardsim.core.replica_set_monitor import ReadPreference, ReplicaSetMonitor

ATTEMPTS = 3
NOT_PRIMARY_REFUSALS = frozenset({10107, 13435, 13436})  # refused before running anything


class ShardTargets:
    """Monitors by connection string; :meth:`command` runs a command on a shard's primary (or
    the member a read preference selects). Close with :meth:`close`."""

    def __init__(self) -> None:
        self._monitors: dict[str, ReplicaSetMonitor] = {}

    def monitor(self, conn: str) -> ReplicaSetMonitor:
        """The monitor of connection string ``conn`` (made on first use)."""
        m = self._monitors.get(conn)
        if m is None:
            m = self._monitors[conn] = ReplicaSetMonitor(conn)
        return m

    async def command(self, clock: Any, conn: str, db: str, cmd: dict[str, Any], *,
                      read_preference: ReadPreference | None = None,
                      timeout: float | None = None) -> Any:
        """Run ``cmd`` on the member of ``conn`` that ``read_preference`` selects (the primary
        by default) with ``$clusterTime`` gossip; MongoError on failure (133 when no member
        fits within ``defaultFindReplicaSetHostTimeoutMS``)."""
        monitor = self.monitor(conn)
        body = cmd
        if read_preference is not None and read_preference.mode != "primary":
            body = {**cmd, "$readPreference": {"mode": read_preference.mode}}
        for attempt in range(ATTEMPTS):
            host = await (monitor.get_host(read_preference) if read_preference is not None
                          else monitor.get_host())
            try:
                return await gossip_command(clock, monitor.pool(host), db, body, timeout=timeout)
            except MongoError as exc:
                monitor.update_host_with_status(host, exc)
                if exc.code not in NOT_PRIMARY_REFUSALS or attempt == ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close every monitor and its pools."""
        for m in self._monitors.values():
            m.close()
        self._monitors.clear()
