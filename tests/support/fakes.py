"""Stand-ins for role objects in unit tests: the little of a node the code under test reads."""

from __future__ import annotations

import datetime
from typing import Any

from bson import Binary

from shardsim.core.clock import HybridLogicalClock
from shardsim.shard.change_stream.cursor import PromiseWaiters
from shardsim.shard.change_stream.promise_faults import NO_FAULTS
from shardsim.shard.oplog import Oplog, PreImages

#: The collection UUID every :meth:`FakeShardNode.write` entry carries by default.
U1 = Binary(bytes(range(16)), 4)


class FakeShardNode:
    """A :class:`shardsim.shard.change_stream.host.ChangeStreamHost`, the little of a
    ``ShardNode`` the shard's change-stream cursor and the no-op writer read:
    ``clock`` (a hybrid logical clock on a frozen wall clock, 1000 s), ``oplog`` (options as
    :class:`Oplog`'s, e.g. ``max_bytes``), ``pre_images``, ``options`` (``promise_mode``,
    ``noop_interval_ms`` 40), ``cs_promise_waiters`` and ``noop_writer_task`` (as ShardNode
    declares them), ``docs`` (``(ns, _id) -> document`` for post-image look-ups)."""

    def __init__(self, promise_mode: str = "clock", **oplog_kw: Any) -> None:
        self.clock = HybridLogicalClock(wall=lambda: 1000.0)
        self.oplog = Oplog(**oplog_kw)
        self.stream_oplog = self.oplog  # what change streams read (a single member: all of it)
        self.repl: Any = None
        self.pre_images = PreImages()
        self.options = {"promise_mode": promise_mode, "noop_interval_ms": 40}
        self.docs: dict[Any, Any] = {}
        self.cs_promise_waiters = PromiseWaiters()
        self.cs_promise_faults = NO_FAULTS
        self.sharding: Any = None  # no sharding runtime: a plain member
        self.profile: Any = None  # the default server version
        self.noop_writer_task: Any = None

    def write(self, op: str, ns: str, o: dict[str, Any], o2: dict[str, Any] | None = None,
              ui: Any = U1, **extra: Any) -> dict[str, Any]:
        """Append one oplog entry at the next cluster time; returns it."""
        e: dict[str, Any] = {"op": op, "ns": ns, "o": o, "ts": self.clock.tick(),
                             "wall": datetime.datetime(2026, 1, 1)}
        if ui is not None:
            e["ui"] = ui
        if o2 is not None:
            e["o2"] = o2
        e.update(extra)
        self.oplog.append(e)
        return e

    def write_noop(self, o: dict[str, Any], o2: dict[str, Any] | None = None, ns: str = "",
                   ui: Any = None) -> Any:
        """A no-op entry (``op: "n"``); returns its timestamp."""
        return self.write("n", ns, o, o2, ui=ui)["ts"]

    def find_document(self, ns: str, key: dict[str, Any]) -> Any:
        return self.docs.get((ns, key.get("_id")))

    def parameters(self) -> dict[str, Any]:
        return {}
