"""The shard's op observer: what every write does once it is applied (mongod's
``OpObserverImpl``, ``src/mongo/db/op_observer/op_observer_impl.cpp``): tick the clock, make one
oplog entry in mongod's field order, append it (the oplog, the snapshot history, the durable
journal), store the pre-image, feed a running migration's transfer mods. One instance per shard,
``node.op_observer``; the node's ``log_op`` / ``log_command`` / ``write_noop`` name its methods.

``on_insert`` / ``on_update`` / ``on_delete`` return the entry's ``ts`` (a BSON Timestamp), or
None inside a transaction (the operation is buffered for the commit's ``applyOps``) and for the
unreplicated ``local`` database.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import TYPE_CHECKING, Any

from bson import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.core.errors import MongoError
from shardsim.shard.write_context import NO_CONTEXT, WriteContext

log = logging.getLogger("shardsim.shard.replication")

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode
    from shardsim.shard.storage import Collection

TERM = Int64(1)  # a one-member set's term (replication: shardsim/core/repl)
OPLOG_VERSION = Int64(2)

_EPOCH = datetime.datetime(1970, 1, 1)
_wall_cache: list[Any] = [0, _EPOCH]


def wall_now() -> datetime.datetime:
    """The oplog ``wall`` field: naive UTC datetime with millisecond precision."""
    ms = int(time.time() * 1000)
    if ms != _wall_cache[0]:
        _wall_cache[0] = ms
        _wall_cache[1] = _EPOCH + datetime.timedelta(milliseconds=ms)
    return _wall_cache[1]


class OpObserver:
    """The write path's last step on one shard (see the module docstring)."""

    def __init__(self, node: "ShardNode") -> None:
        self.node = node

    def make_entry(self, op: str, ns: str, ui: Binary | None, o: dict[str, Any],
                   o2: dict[str, Any] | None = None, *, ctx: WriteContext = NO_CONTEXT,
                   ts: Timestamp | None = None) -> dict[str, Any]:
        """An oplog entry in mongod's field order (``oplog_entry.idl``); ticks the clock (or
        takes the pinned time of the ``same_cluster_time`` test fault)."""
        entry: dict[str, Any] = {}
        if ctx.lsid is not None:
            entry["lsid"] = ctx.lsid
            entry["txnNumber"] = Int64(ctx.txn_number)
        entry["op"] = op
        entry["ns"] = ns
        if ui is not None:
            entry["ui"] = ui
        entry["o"] = o
        if o2 is not None:
            entry["o2"] = o2
        if ctx.lsid is not None and ctx.stmt_id is not None:
            entry["stmtId"] = ctx.stmt_id
        if ts is None:
            faults = self.node.cs_promise_faults
            ts = self.node.clock.tick() if not faults.pin else faults.take_pin()
        entry["ts"] = ts
        entry["t"] = self.node.oplog_term
        entry["v"] = OPLOG_VERSION
        entry["wall"] = wall_now()
        if ctx.from_migrate:
            entry["fromMigrate"] = True
        if ctx.lsid is not None:
            entry["prevOpTime"] = {"ts": Timestamp(0, 0), "t": Int64(-1)}
        return entry

    def append(self, entry: dict[str, Any], size: int | None = None) -> None:
        """Append to the oplog (and the durable journal, committed at once outside a command);
        the document changes made for it get its ``ts`` in the snapshot history
        (:mod:`shard.snapshot`). ``size``: the entry's BSON size in bytes when known."""
        node = self.node
        repl = node.repl
        if repl is not None and not repl.may_log():
            # a member that is not the primary of its term never writes an entry of its own
            # (oplog.cpp _logOpsInner: "logOp() but can't accept write to collection")
            log.error("%s: refused to log %s on %s while not primary", node.address,
                      entry.get("op"), entry.get("ns"))
            raise MongoError(10107, f"logOp() but can't accept write to collection "
                                    f"{entry.get('ns')}: not primary",
                             code_name_override="NotWritablePrimary")
        size = node.oplog.append(entry, size)
        node.storage.history.stamp(entry["ts"], size)
        if node.storage.journal is not None:
            node.storage.journal.append(("oplog", entry, size))
            if node.command_depth == 0:
                try:
                    node.flush()
                except MongoError:
                    pass  # rolled back and reported by flush (shard/durable_undo.py)

    def on_crud(self, op: str, coll: "Collection", o: dict[str, Any],
                o2: dict[str, Any] | None = None, *, ctx: WriteContext = NO_CONTEXT,
                pre_image: dict[str, Any] | None = None,
                size: int | None = None) -> Timestamp | None:
        """A CRUD operation on ``coll`` (``op`` ``i``/``u``/``d``): buffered in a
        transaction, else one entry; ``pre_image`` is stored when the collection has
        ``changeStreamPreAndPostImages`` enabled; a running migration of the namespace records
        the write (transfer mods). ``size``: the document's BSON size in bytes."""
        if coll.db == "local":
            return None  # the local database is not replicated: no oplog entries
        if ctx.txn is not None:
            ctx.txn.add_op(op, coll, o, o2, pre_image if coll.pre_post_images else None)
            return None
        node = self.node
        if not ctx.from_migrate and node.sharding.trackers:
            node.sharding.on_write(coll.ns, op, o, o2)  # a migration's transfer mods
        entry = self.make_entry(op, coll.ns, coll.ui, o, o2, ctx=ctx)
        self.append(entry, None if size is None else size + 160)
        if pre_image is not None and coll.pre_post_images:
            self.put_pre_image(coll.uuid, entry["ts"], 0, pre_image)
        return entry["ts"]

    def on_insert(self, coll: "Collection", doc: dict[str, Any], document_key: dict[str, Any],
                  **kw: Any) -> Timestamp | None:
        """An insert (``op: "i"``, ``o2`` the documentKey)."""
        return self.on_crud("i", coll, doc, document_key, **kw)

    def on_update(self, coll: "Collection", diff: dict[str, Any],
                  document_key: dict[str, Any], **kw: Any) -> Timestamp | None:
        """An update (``op: "u"``, ``o`` the ``$v: 2`` diff or the replacement)."""
        return self.on_crud("u", coll, diff, document_key, **kw)

    def on_delete(self, coll: "Collection", document_key: dict[str, Any],
                  **kw: Any) -> Timestamp | None:
        """A delete (``op: "d"``, ``o`` the documentKey)."""
        return self.on_crud("d", coll, document_key, None, **kw)

    def put_pre_image(self, uuid: bytes, ts: Timestamp, index: int, doc: dict[str, Any]) -> None:
        """Store a pre-image (``config.system.preimages``: collection UUID, the entry's ``ts``,
        its index in an ``applyOps``) and journal it."""
        node = self.node
        node.pre_images.put(uuid, ts, index, doc)
        if node.storage.journal is not None:
            node.storage.journal.append(("preimage", uuid, ts, index, doc))

    def on_command(self, db: str, o: dict[str, Any], ui: Binary | None = None,
                   o2: dict[str, Any] | None = None, *,
                   ctx: WriteContext = NO_CONTEXT) -> Timestamp:
        """A DDL entry ``{op: "c", ns: "<db>.$cmd", o}``; returns its ts (the cluster time
        without an entry for the unreplicated ``local`` database)."""
        if db == "local":
            return self.node.clock.now()
        entry = self.make_entry("c", f"{db}.$cmd", ui, o, o2,
                                ctx=WriteContext(from_migrate=ctx.from_migrate))
        self.append(entry)
        return entry["ts"]

    def on_noop(self, o: dict[str, Any], o2: dict[str, Any] | None = None, ns: str = "",
                ui: Binary | None = None) -> Timestamp:
        """An ``op: "n"`` entry (the periodic no-op writer, ``_shardsimNoop``); returns its ts."""
        entry = self.make_entry("n", ns, ui, o, o2)
        self.append(entry, 120)
        return entry["ts"]

    def on_oplog_truncated(self, key: int) -> None:
        """The oplog lost its entries up to time key ``key``: their pre-images go too."""
        node = self.node
        node.pre_images.truncate_before(key + 1)
        if node.storage.journal is not None:
            node.storage.journal.append(("truncate", key))
