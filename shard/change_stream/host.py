"""What the change-stream machinery uses of the node it runs on: the :class:`ChangeStreamHost`
protocol. A ``ShardNode`` (and a config server, itself a shard node) is one; so is the single
test fake ``tests/support/fakes.py`` ``FakeShardNode`` and the simulation's node
(``tests/sim/real_shard.py``). The stages, the cursor and the no-op writer read nothing else
of a node, and read it directly: a host has every attribute, ``None`` where it has no such
part (no sharding runtime: a plain replica set's member in a test)."""

from __future__ import annotations

from typing import Any, Protocol

from bson.timestamp import Timestamp


class ChangeStreamHost(Protocol):
    """A node the shard half of change streams runs on."""

    oplog: Any  # shard.oplog.Oplog (or DiskOplog): the entries and their listeners
    pre_images: Any  # shard.oplog.PreImages: config.system.preimages
    clock: Any  # shardsim.core.clock.HybridLogicalClock (BSON Timestamps)
    options: dict[str, Any]  # promise_mode (clock | mongod), noop_interval_ms, ...
    cs_promise_waiters: Any  # cursor.PromiseWaiters: the router's promise requests
    cs_promise_faults: Any  # promise_faults.PromiseFaults (NO_FAULTS when none)
    sharding: Any  # shard.sharding_runtime.ShardingRuntime, or None without sharding
    profile: Any  # shardsim.core.server_version.ServerProfile, or None for the default
    noop_writer_task: Any  # the periodic no-op writer's task, None until started

    def find_document(self, ns: str, document_key: dict[str, Any]) -> dict[str, Any] | None:
        """The current document of ``ns`` with that documentKey (updateLookup)."""

    def write_noop(self, o: dict[str, Any], o2: dict[str, Any] | None = None, ns: str = "",
                   ui: Any = None) -> Timestamp:
        """Append an ``op: "n"`` entry; returns its ts."""

    def parameters(self) -> dict[str, Any]:
        """getParameter's values (``periodicNoopIntervalSecs`` ...)."""
