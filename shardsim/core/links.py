"""Network links a test cut: ``_shardsimCutLinks``, a test-only command of every role process.

The detached cluster's ``shardsim fault partition|isolate|heal`` (:mod:`shardsim.tools.fault_cli`)
cut the link between two processes of a cluster (replica-set members, the config server, a
router: every one is a host) by telling **both ends** to drop it, both ways:

* **outbound** — this process's connections to a cut host (every member pool, the router's
  shard pools and monitors, a shard's config-server pool: all are
  :class:`shardsim.core.client.Connection` s) are closed at once (a request in flight loses
  its reply: SocketException 9001), and no new one is opened (HostUnreachable 6
  "Couldn't connect to server ... :: caused by :: link cut (_shardsimCutLinks)"); a
  replica-set member's heartbeats, votes, position updates and oplog fetches to it are dropped
  (:meth:`shard.replication.coordinator.ReplicationCoordinator.link_down`);
* **inbound** — a replica-set member refuses the member commands (heartbeat, votes,
  ``replSetUpdatePosition``, the oplog fetch and the rollback's refetch: each carries the
  sender's member id ``fromId``, which the set's configuration maps to its host) of a cut
  member by closing the connection without a reply (:mod:`shard.replication.hook`). Other
  peers (routers, the config server, a shard calling the config server) are not identified on
  inbound connections: they only ever connect out, so the cut at their end (the same command
  sent to them) closes those connections.

What mongod does instead: nothing of the kind in the server itself. Its own tests cut links
with ``mongobridge`` (``src/mongo/tools/mongobridge_tool/``: a proxy per process whose
``rejectConnectionsFrom`` / ``acceptConnectionsFrom`` / ``discardMessagesFrom`` commands act
on a peer identified by the ``hostInfo`` its connection sends; ``ReplSetTest``/``ShardingTest``
with ``useBridge``, ``jstests/libs/mongobridge.js`` ``disconnect``/``reconnect``). Here the
cut lives inside each process, so no proxy is needed; a refusal is immediate where a dropped
link in a real network would time out (what the peers see is the same: no answer).

The set of cut hosts is **per process** (one :data:`LINKS`), so the command is for role
processes (``shardsim up``); the in-process kit, whose nodes share one process, cuts links
with its own methods (:meth:`shardsim.testing.replica_sets.ReplicaSetMembers.partition`).

``{_shardsimCutLinks: "cut", hosts: ["host:port", ...]}`` adds hosts; ``{_shardsimCutLinks:
"heal"}`` restores every link (``hosts`` given: only those). Reply ``{cut: [hosts]}``, the
hosts cut now, sorted. Errors: BadValue 2 for another verb, TypeMismatch 14 for ``hosts``
that is not an array of ``host:port`` strings. Like ``configureFailPoint``, the command exists
only with test commands on (``--enable-test-commands`` / ``--setParameter
enableTestCommands=1``; CommandNotFound 59 otherwise): :func:`install`.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

from shardsim.core.auth import privileges as priv
from shardsim.core.commands import CommandFamily
from shardsim.core.errors import MongoError
from shardsim.core.protocol.shard import CutLinks

COMMAND = CutLinks.NAME
CUT_REASON = f"link cut ({COMMAND})"


def normalize(address: str) -> str:
    """``host:port`` compared case-insensitively, ``localhost`` as ``127.0.0.1``."""
    host, _, port = address.strip().lower().rpartition(":")
    if host == "localhost":
        host = "127.0.0.1"
    return f"{host}:{port}"


class Links:
    """The hosts this process's links to are cut, and its open outbound connections (to close
    the ones to a host when it is cut)."""

    def __init__(self) -> None:
        self.cut: set[str] = set()
        self._conns: "weakref.WeakSet[Any]" = weakref.WeakSet()
        #: called after every change (a replica-set member's coordinator closes its pools to
        #: cut members and wakes its timers)
        self.listeners: list[Callable[[], None]] = []

    def is_cut(self, address: str) -> bool:
        """The link to ``address`` (``host:port``) is cut."""
        return bool(self.cut) and normalize(address) in self.cut

    def track(self, conn: Any) -> None:
        """Remember an outbound connection (an object with ``address`` and ``close()``)."""
        self._conns.add(conn)

    def cut_hosts(self, hosts: Iterable[str]) -> None:
        """Cut the links to ``hosts``; close the open connections to them."""
        new = {normalize(h) for h in hosts}
        self.cut |= new
        for conn in list(self._conns):
            if normalize(conn.address) in new:
                conn.close()

    def heal(self, hosts: Iterable[str] | None = None) -> None:
        """Restore the links to ``hosts`` (None: every link)."""
        if hosts is None:
            self.cut.clear()
        else:
            self.cut -= {normalize(h) for h in hosts}


#: This process's links.
LINKS = Links()

commands = CommandFamily("links")


@commands.handler(COMMAND, secondary="always", privileges=priv.NO_AUTH)
async def cut_links(node: Any, req: Any) -> dict[str, Any]:
    """``_shardsimCutLinks`` (module docstring); the listeners of :data:`LINKS` are told
    (a replica-set member's coordinator, so that its heartbeats see the change at once)."""
    verb = req.arg
    hosts = req.body.get("hosts")
    if hosts is not None and (not isinstance(hosts, list)
                              or not all(isinstance(h, str) and ":" in h for h in hosts)):
        raise MongoError(14, f"BSON field '{COMMAND}.hosts' must be an array of "
                             f"'host:port' strings")
    if verb == "cut":
        if not hosts:
            raise MongoError(2, f"{COMMAND}: 'cut' needs hosts")
        LINKS.cut_hosts(hosts)
    elif verb == "heal":
        LINKS.heal(hosts)
    else:
        raise MongoError(2, f"{COMMAND} must be 'cut' or 'heal', not {verb!r}")
    for listener in list(LINKS.listeners):
        listener()
    return {"cut": sorted(LINKS.cut)}


def install(node: Any) -> None:
    """Install ``_shardsimCutLinks`` on ``node`` when its test commands are on."""
    if node.test_commands:
        node.commands.install(node, commands)


__all__ = ["COMMAND", "CUT_REASON", "LINKS", "Links", "cut_links", "install", "normalize"]
