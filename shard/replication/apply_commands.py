"""Command entries (``op: "c"``) on a secondary, as ``applyCommand_inlock``
(``src/mongo/db/repl/oplog.cpp``, its ``kOpsMap``) applies them: the catalog change, then the
entry appended unchanged. The kinds are every one a shard writes (``shard/commands/ddl.py``,
``shard/uncommitted_catalog.py``, ``shard/commands/transactions.py``; views and users are
CRUD entries on ``<db>.system.views`` / ``admin.system.*``):

========================  ======================================================================
``create``                a collection with the entry's ``ui`` and options (everything in ``o``
                          but ``create`` and ``idIndex``: capped, validator,
                          changeStreamPreAndPostImages, clusteredIndex, timeseries -- with the
                          default ``{meta: 1, time: 1}`` index the primary adds unlogged)
``drop``                  the collection ``ui``
``dropDatabase``          the database's name (its collections were dropped by earlier entries)
``renameCollection``      ``ui`` renamed to ``to``; ``dropTarget`` (a UUID) dropped first
``createIndexes``         the index spec (``o`` without ``createIndexes``) on ``ui``
``dropIndexes``           the index ``o.index`` of ``ui``
``collMod``               :func:`shard.commands.ddl.apply_coll_mod`, as the command does
``applyOps``,             transactions: :mod:`shard.replication.apply_txn`
``commitTransaction``,
``abortTransaction``
========================  ======================================================================

Anything else is BadValue (2), as the server refuses an unknown command in an oplog entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from shardsim.core.errors import MongoError
from shardsim.shard.commands.ddl import apply_coll_mod
from shardsim.shard.replication import apply_txn
from shardsim.shard.replication.documents import IDEMPOTENT, short
from shardsim.shard.storage import Collection

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode


def apply_command(node: "ShardNode", entry: dict[str, Any]) -> None:
    """Apply one command entry and append it (see the module docstring)."""
    o = entry.get("o")
    name = next(iter(o), None) if isinstance(o, dict) else None
    if name in apply_txn.TXN_COMMANDS:
        apply_txn.apply_txn_command(node, entry, name)
        return
    apply_catalog_op(node, entry)
    node.op_observer.append(entry)


def apply_catalog_op(node: "ShardNode", op: dict[str, Any]) -> None:
    """The catalog change of one command entry or ``applyOps`` operation (``create``,
    ``createIndexes`` inside a transaction), without appending anything."""
    o = op.get("o")
    name = next(iter(o), None) if isinstance(o, dict) else None
    handler = _HANDLERS.get(name)  # type: ignore[arg-type]
    if handler is None:
        raise MongoError(2, f"Invalid key '{name}' found in field 'o' of a command oplog "
                            f"entry: {short(op)}")
    db = (op.get("ns") or "").partition(".")[0]
    try:
        handler(node, db, o, op)
    except _AlreadyDone:
        pass  # idempotent application: the effect is there already


class _AlreadyDone(Exception):
    """Idempotent application met an operation whose effect is already there."""


def _coll(node: "ShardNode", op: dict[str, Any]) -> Collection:
    ui = op.get("ui")
    coll = node.storage.by_uuid.get(bytes(ui)) if ui is not None else None
    if coll is None:
        if IDEMPOTENT.get():
            raise _AlreadyDone
        raise MongoError(26, f"Failed to apply operation due to missing collection "
                             f"({ui.hex() if ui is not None else '?'}): {short(op)}")
    return coll


def _create(node: "ShardNode", db: str, o: dict[str, Any], op: dict[str, Any]) -> None:
    storage = node.storage
    name = o["create"]
    if IDEMPOTENT.get() and op.get("ui") is not None and bytes(op["ui"]) in storage.by_uuid:
        raise _AlreadyDone
    if storage.get(db, name) is not None:
        raise MongoError(48, f"Collection {db}.{name} already exists.")
    ui = op.get("ui")
    if ui is None:
        raise MongoError(2, f"create entry without 'ui': {short(op)}")
    options = {k: v for k, v in o.items() if k not in ("create", "idIndex")}
    coll = storage.add(Collection(db, name, bytes(ui), options))
    ts = options.get("timeseries")
    if isinstance(ts, dict) and "metaField" in ts:  # as ddl._create adds it, unlogged
        meta, time_field = ts["metaField"], ts["timeField"]
        coll.add_index({"v": 2, "key": {meta: 1, time_field: 1},
                        "name": f"{meta}_1_{time_field}_1"})
        storage.note_catalog(coll)


def _drop(node: "ShardNode", db: str, o: dict[str, Any], op: dict[str, Any]) -> None:
    node.storage.remove(_coll(node, op))


def _drop_database(node: "ShardNode", db: str, o: dict[str, Any], op: dict[str, Any]) -> None:
    storage = node.storage
    for coll in list(storage.collections(db)):  # the primary logged a drop for each first
        storage.remove(coll)
    storage.dbs.pop(db, None)


def _rename(node: "ShardNode", db: str, o: dict[str, Any], op: dict[str, Any]) -> None:
    storage = node.storage
    if not IDEMPOTENT.get():
        _coll(node, op)  # 26 before anything changes
    ddb, _, dname = str(o.get("to") or "").partition(".")
    target_ui = o.get("dropTarget")
    if target_ui is not None and not isinstance(target_ui, bool):
        target = storage.by_uuid.get(bytes(target_ui))
        if target is not None:  # (also when the source is gone: idempotent application)
            storage.remove(target)
    coll = _coll(node, op)
    if (coll.db, coll.name) == (ddb, dname) and IDEMPOTENT.get():
        raise _AlreadyDone
    if storage.get(ddb, dname) is not None:
        raise MongoError(48, f"target namespace exists: {ddb}.{dname}")
    storage.rename(coll, ddb, dname)


def _create_indexes(node: "ShardNode", db: str, o: dict[str, Any], op: dict[str, Any]) -> None:
    coll = _coll(node, op)
    if IDEMPOTENT.get() and o.get("name") in coll.indexes:
        raise _AlreadyDone
    coll.add_index({k: v for k, v in o.items() if k != "createIndexes"})
    node.storage.note_catalog(coll)


def _drop_indexes(node: "ShardNode", db: str, o: dict[str, Any], op: dict[str, Any]) -> None:
    coll = _coll(node, op)
    if coll.indexes.pop(o.get("index"), None) is None:
        if IDEMPOTENT.get():
            raise _AlreadyDone
        raise MongoError(27, f"index not found with name [{o.get('index')}]")
    node.storage.note_catalog(coll)


def _coll_mod(node: "ShardNode", db: str, o: dict[str, Any], op: dict[str, Any]) -> None:
    coll = _coll(node, op)
    try:
        apply_coll_mod(coll, {k: v for k, v in o.items() if k != "collMod"})
    except MongoError:
        if not IDEMPOTENT.get():
            raise
    node.storage.note_catalog(coll)


_HANDLERS: dict[str, Callable[["ShardNode", str, dict[str, Any], dict[str, Any]], None]] = {
    "create": _create,
    "drop": _drop,
    "dropDatabase": _drop_database,
    "renameCollection": _rename,
    "createIndexes": _create_indexes,
    "dropIndexes": _drop_indexes,
    "collMod": _coll_mod,
}
