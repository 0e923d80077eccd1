"""The counters behind ``serverStatus``'s ``connections``, ``network``, ``opcounters`` and
``asserts`` sections, in mongod/mongos 8.0's shapes.

One :class:`ServerStats` per process (``node.stats``, declared by :class:`shardsim.core.node.Node`).
The server loop (:mod:`shardsim.core.server`) counts connections, bytes and requests; the node's
``run_command`` counts operations and failed commands. Each section follows the server:

- ``connections``: ``SessionManagerCommon::appendStats``
  (``src/mongo/transport/session_manager_common.cpp``): ``current``, ``available``,
  ``totalCreated``, ``rejected``, ``active``, ``threaded`` (int32) and the exhaust/awaitable
  counts (Int64);
- ``network``: ``NetworkCounter::append`` (``src/mongo/db/stats/counters.cpp``): ``bytesIn``,
  ``bytesOut``, ``physicalBytesIn``, ``physicalBytesOut`` (no wire compression here, so equal),
  ``numSlowDNSOperations``, ``numSlowSSLOperations``, ``numRequests`` (Int64);
- ``opcounters``: ``OpCounters::append`` (same file), Int64: ``insert``/``update``/``delete``
  count documents or statements (``gotInserts(n)``, one per update/delete statement), ``query``
  a ``find``, ``getmore`` a ``getMore``, ``command`` every other command (commands whose
  ``shouldAffectCommandCounter()`` is false, the CRUD ones, are counted only per operation);
- ``asserts``: ``AssertionCount`` (``src/mongo/util/assert_util.cpp``): ``user`` counts
  ``uassert`` failures (every command that fails with a MongoDB error), ``regular`` internal
  failures (a Python exception turned into InternalError), ``warning``/``msg``/``tripwire``
  stay 0; ``rollovers`` 0.
"""

from __future__ import annotations

from typing import Any

from bson.int64 import Int64

MAX_CONNECTIONS = 838_860  # mongod's default maxIncomingConnections on Linux (ulimit-bound)
_CRUD = ("insert", "update", "delete")


class ServerStats:
    """Counters of one process (see the module docstring); plain ints, read by
    :meth:`sections`."""

    __slots__ = ("current", "total_created", "active", "bytes_in", "bytes_out", "requests",
                 "ops", "user_asserts", "regular_asserts")

    def __init__(self) -> None:
        self.current = 0
        self.total_created = 0
        self.active = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.requests = 0
        self.ops = {"insert": 0, "query": 0, "update": 0, "delete": 0, "getmore": 0, "command": 0}
        self.user_asserts = 0
        self.regular_asserts = 0

    # -- the server loop ------------------------------------------------------------------
    def connection_opened(self) -> None:
        """A client connection was accepted."""
        self.current += 1
        self.total_created += 1

    def connection_closed(self) -> None:
        """A client connection ended."""
        self.current -= 1

    def message(self, n_in: int, n_out: int) -> None:
        """One request of ``n_in`` bytes answered with ``n_out`` bytes (0: no reply)."""
        self.requests += 1
        self.bytes_in += n_in
        self.bytes_out += n_out

    # -- commands -------------------------------------------------------------------------
    def command(self, name: str, body: dict[str, Any]) -> None:
        """Count a command (canonical ``name``) as ``opcounters`` does, before it runs."""
        ops = self.ops
        if name in _CRUD:
            docs = body.get("documents" if name == "insert" else name + "s")
            ops[name] += len(docs) if isinstance(docs, list) else 1
        elif name == "find":
            ops["query"] += 1
        elif name == "getMore":
            ops["getmore"] += 1
        else:
            ops["command"] += 1

    def failed(self, internal: bool = False) -> None:
        """A command failed: a user assertion, or (``internal``) a regular one."""
        if internal:
            self.regular_asserts += 1
        else:
            self.user_asserts += 1

    # -- serverStatus ---------------------------------------------------------------------
    def sections(self) -> dict[str, Any]:
        """``{connections, network, opcounters, asserts}`` for ``serverStatus``."""
        return {
            "connections": {
                "current": self.current, "available": MAX_CONNECTIONS - self.current,
                "totalCreated": self.total_created, "rejected": 0, "active": self.active,
                "threaded": self.current, "exhaustIsMaster": Int64(0), "exhaustHello": Int64(0),
                "awaitingTopologyChanges": Int64(0), "loadBalanced": Int64(0),
            },
            "network": {
                "bytesIn": Int64(self.bytes_in), "bytesOut": Int64(self.bytes_out),
                "physicalBytesIn": Int64(self.bytes_in),
                "physicalBytesOut": Int64(self.bytes_out),
                "numSlowDNSOperations": Int64(0), "numSlowSSLOperations": Int64(0),
                "numRequests": Int64(self.requests),
            },
            "opcounters": {k: Int64(v) for k, v in self.ops.items()},
            "asserts": {"regular": self.regular_asserts, "warning": 0, "msg": 0,
                        "user": self.user_asserts, "tripwire": 0, "rollovers": 0},
        }
