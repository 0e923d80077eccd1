"""A secondary applies the oplog entries it fetched from its sync source.

:func:`apply_entries` takes decoded oplog documents exactly as the primary's oplog holds them,
in ``ts`` order, and leaves the member as the primary was once it had written them (the
server's ``OplogApplierImpl::_applyOplogBatch`` -> ``applyOplogEntryOrGroupedInserts`` ->
``applyOperation_inlock`` / ``applyCommand_inlock``, ``src/mongo/db/repl/oplog.cpp`` and
``oplog_applier_impl.cpp``):

* every entry is appended to ``node.oplog`` unchanged (the same dict: fields, order, ``ts``,
  ``t``), so resume tokens computed on this member are byte-identical to the primary's, and the
  cluster clock moves to its ``ts`` (``clock.restore``: never a tick of its own);
* CRUD entries (``i``/``u``/``d``) change the collection named by ``ui`` (its UUID): an insert
  stores ``o``; an update applies the ``{$v: 2, diff}`` (``doc_diff_applier.cpp`` semantics,
  :func:`shard.change_stream.add_post_image.apply_diff`) or stores the replacement; a delete
  removes the document of ``o``. Nothing is created implicitly: an entry on a missing
  collection is NamespaceNotFound (26), an update/delete of a missing document is
  UpdateOperationFailed (218) / NoMatchingDocument (47) (steady-state application, not the
  server's idempotent initial-sync mode);
* pre-images (``config.system.preimages``) of updates and deletes on collections with
  ``changeStreamPreAndPostImages``, keyed by the entry's ``ts`` as the primary keys them;
* the snapshot history (:mod:`shard.snapshot`): every document change is stamped with its
  entry's ``ts`` by the same :meth:`shard.op_observer.OpObserver.append` the primary uses;
* command entries (:mod:`shard.replication.apply_commands`), transactions and session records
  (:mod:`shard.replication.apply_txn`), no-ops (``n``: appended only);
* durable members (``--dbpath``): the batch's documents, catalog changes, entries, pre-images
  and session records are committed in one SQLite transaction at the end of the call
  (:meth:`shard.node.ShardNode.flush`), as a command's writes are on the primary.

An entry whose ``ts`` is not newer than the member's newest oplog entry is refused with
OplogOutOfOrder (152) before anything of the batch is applied: entries are applied once, in
order (the server's idempotent re-application of initial sync is not needed and not built).
A failing entry (a MongoError) stops the batch: the entries before it stay applied (and are
committed on a durable member), the failing one is not appended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from shardsim.core.clock import ts_key
from shardsim.core.errors import MongoError
from shardsim.shard.replication import apply_commands, apply_txn
from shardsim.shard.replication.documents import (IDEMPOTENT, apply_crud, collection_of,
                                                  document_key_of, settle_unique_indexes,
                                                  short)

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

__all__ = ["apply_entries", "undo_entries", "RollbackResult"]


def apply_entries(node: "ShardNode", entries: list[dict[str, Any]], *,
                  idempotent: bool = False) -> None:
    """Apply ``entries`` (decoded oplog documents in ``ts`` order) to ``node`` as a secondary
    (see the module docstring). ``idempotent``: the catch-up after a rollback, up to
    :attr:`~shard.replication.rollback.RollbackResult.min_valid` (the refetched documents
    already show some of these entries): an insert of a present document replaces it, an
    update or delete of a missing one does nothing (a replacement inserts), a ``create`` of a
    present collection, a ``drop`` of a missing one, an existing index and the like are no-ops
    (the server's ``OplogApplication::Mode::kRecovering`` after ``rs_rollback.cpp`` set
    ``minValid``). Raises OplogOutOfOrder (152) when an entry's ``ts`` is not
    newer than the previous one (the node's newest oplog entry for the first), BadValue (2)
    for an entry without a Timestamp ``ts``; NamespaceNotFound (26), UpdateOperationFailed
    (218), NoMatchingDocument (47), DuplicateKey (11000), error 14825 (unknown ``op``) or
    BadValue (2, unknown command) from the entry that could not be applied."""
    if not entries:
        return
    _check_order(node, entries)
    node.command_depth += 1  # the op observer journals without committing per entry
    token = IDEMPOTENT.set(idempotent)
    try:
        for entry in entries:
            node.clock.restore(entry["ts"])
            _apply_one(node, entry)
    except BaseException:
        node.storage.history.pending.clear()  # changes of the failed entry get no stamp
        raise
    finally:
        IDEMPOTENT.reset(token)
        settle_unique_indexes(node)
        node.command_depth -= 1
        if node.durable is not None and node.command_depth == 0:
            node.flush()


def _check_order(node: "ShardNode", entries: list[dict[str, Any]]) -> None:
    last = node.oplog.last_ts()
    prev = ts_key(last) if last is not None else 0
    for entry in entries:
        ts = entry.get("ts") if isinstance(entry, dict) else None
        if not isinstance(ts, Timestamp):
            raise MongoError(2, f"oplog entry to apply has no Timestamp 'ts': {short(entry)}")
        key = ts_key(ts)
        if key <= prev:
            raise MongoError(152, f"refusing to apply oplog entry {ts}: it is not newer than "
                                  f"the last applied entry {_ts_of(prev)} (entries are applied "
                                  f"once, in order)")
        prev = key


def _ts_of(key: int) -> Timestamp:
    return Timestamp(key >> 32, key & 0xFFFFFFFF)


def _apply_one(node: "ShardNode", entry: dict[str, Any]) -> None:
    op = entry.get("op")
    if op in ("i", "u", "d"):
        coll = collection_of(node, entry)
        if coll is None:  # the unreplicated local database never has entries
            node.op_observer.append(entry)
            return
        old = apply_crud(node, coll, op, entry["o"], entry.get("o2"), entry)
        node.op_observer.append(entry)
        if old is not None and coll.pre_post_images:
            node.put_pre_image(coll.uuid, entry["ts"], 0, old)
        if "lsid" in entry and "txnNumber" in entry:
            post = None
            if op != "d":
                post = entry["o"] if op == "i" else coll.docs.get(
                    document_key_of(coll, entry.get("o2") or {}))
            apply_txn.note_retryable_write(node, entry, old, post)
    elif op == "n":
        node.op_observer.append(entry)
    elif op == "c":
        apply_commands.apply_command(node, entry)
    else:
        raise MongoError(14825, f"error in applyOperation : unknown opType {op!r}")



from shardsim.shard.replication.rollback import RollbackResult, undo_entries  # noqa: E402
