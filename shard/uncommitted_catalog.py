"""Collections and indexes created inside a multi-document transaction (MongoDB 4.4+).

mongod keeps them in the operation's ``UncommittedCatalogUpdates``
(``src/mongo/db/catalog/uncommitted_catalog_updates.cpp``): the transaction's own statements
find them (``CollectionCatalog::lookupCollectionByNamespace`` consults that list first), nobody
else does, and they are published to the catalog only when the storage transaction commits; an
abort forgets them. shardsim does the same: :attr:`shard.sessions.Transaction.created` holds the
new :class:`shard.storage.Collection` objects, :meth:`shard.storage.Storage.get` returns them
only while a statement of that transaction runs (:data:`shard.storage.CURRENT_TXN`), and
:func:`publish` adds them to the catalog at ``commitTransaction``, before the documents are
applied.

The oplog: ``OpObserverImpl::onCreateCollection`` / ``onCreateIndex`` (``op_observer_impl.cpp``)
add, inside a transaction, an operation to the transaction instead of writing an entry, so the
commit's one ``applyOps`` carries them in statement order::

    {op: "c", ns: "<db>.$cmd", ui: <uuid>, o: {create: <coll>, <options>, idIndex: {v: 2,
     key: {_id: 1}, name: "_id_"}}}
    {op: "c", ns: "<db>.$cmd", ui: <uuid>, o: {createIndexes: <coll>, v: 2, key, name, ...}}

Rules (the server's, with its codes):

* ``create`` (``create_collection.cpp`` ``createCollection``): a view, a time-series collection
  or a ``system.*`` collection: OperationNotSupportedInTransaction (263);
* ``create``/``createIndexes`` need the transaction's read concern to be ``local`` (their
  ``supportsReadConcern`` is the default one of ``commands.h``): InvalidOptions (72) for
  ``snapshot``/``majority``, checked on every statement (``commands_in_txns_read_concern.js``);
* ``createIndexes`` (``create_indexes_cmd.cpp`` ``runCreateIndexesWithCoordinator`` /
  ``runCreateIndexesOnNewCollection``): all indexes already there: the usual "all indexes
  already exist" reply; a collection that exists and was not created by this transaction: 263
  "Cannot create new indexes on existing collection"; a missing one is created in the
  transaction; one created by this transaction but no longer empty: 263 "Cannot create new
  indexes on non-empty collection"; ``createdCollectionAutomatically`` is true on a
  collection created in the transaction, explicitly or not;
* commit: the namespace taken meanwhile (created outside the transaction, or by another
  transaction that committed first): WriteConflict (112, TransientTransactionError), the
  transaction aborted (``create_collection_parallel.js``);
* ``prepareTransaction`` of a transaction that created something: 263 "Cannot create new
  collections inside distributed transactions" (``txn_two_phase_commit_cmds.cpp``), so a
  cross-shard write transaction that created a collection cannot commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.errors import MongoError
from shardsim.shard.storage import (CURRENT_TXN, ID_INDEX, Collection, new_uuid, validate_collection_name,
                           validate_db_name)

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode
    from shardsim.shard.sessions import Transaction

TRANSIENT = ["TransientTransactionError"]


def check_read_concern(txn: "Transaction", command: str) -> None:
    """InvalidOptions (72) when ``command`` (``create``/``createIndexes``) runs in a transaction
    whose read concern is not ``local`` (``CommandInvocation::supportsReadConcern``'s default:
    "read concern not supported", wrapped by ``service_entry_point_common.cpp``)."""
    level = txn.read_level
    if level not in (None, "local"):
        raise MongoError(72, f"Command {command} does not support {{ readConcern: {{ level: "
                             f"\"{level}\" }} }} :: caused by :: read concern not supported")


def create(node: "ShardNode", txn: "Transaction", db: str, name: str,
           options: dict[str, Any] | None = None, *, implicit: bool = False) -> Collection:
    """Create ``db.name`` inside ``txn``: a new collection only the transaction sees, and its
    ``create`` operation buffered for the commit's applyOps. ``implicit``: by an insert or
    upsert (``write_ops_exec.cpp`` ``makeCollection``), where a non-local read concern is 263
    "Cannot create namespace ... in multi-document transaction." instead of 72. Raises 263 for
    a system collection, 72, 73, 13297."""
    validate_db_name(db)
    validate_collection_name(db, name)
    ns = f"{db}.{name}"
    if name.startswith("system."):
        raise MongoError(263, f"Cannot create system collection {ns} within a transaction.")
    if implicit and txn.read_level not in (None, "local"):
        raise MongoError(263, f"Cannot create namespace {ns} in multi-document transaction.")
    storage = node.storage
    if db not in storage.dbs:
        for other in storage.dbs:
            if other.lower() == db.lower():
                raise MongoError(13297, f"db already exists with different case already have: "
                                        f"[{other}] trying to create [{db}]")
    coll = Collection(db, name, new_uuid(), options)
    txn.created[(db, name)] = coll
    o: dict[str, Any] = {"create": name}
    o.update(coll.options)
    if "clusteredIndex" not in coll.options:
        o["idIndex"] = dict(ID_INDEX)
    txn.ops.append({"op": "c", "ns": f"{db}.$cmd", "ui": coll.ui, "o": o})
    return coll


def create_indexes(txn: "Transaction", coll: Collection, specs: list[dict[str, Any]],
                   view: Any) -> None:
    """Add ``specs`` (full specs, not yet on ``coll``) to ``coll``, a collection ``txn`` created,
    and buffer one ``createIndexes`` operation each. ``view``: the collection as the
    transaction sees it (its own inserts). Raises 263 when it is not empty."""
    if len(view.docs):
        raise MongoError(263, f"Cannot create new indexes on non-empty collection {coll.ns} in "
                              f"a multi-document transaction.")
    for spec in specs:
        coll.add_index(spec)
        txn.ops.append({"op": "c", "ns": f"{coll.db}.$cmd", "ui": coll.ui,
                        "o": {"createIndexes": coll.name, **spec}})


def existing_collection_error(ns: str) -> MongoError:
    """263 for new indexes on a collection the transaction did not create."""
    return MongoError(263, f"Cannot create new indexes on existing collection {ns} in a "
                           f"multi-document transaction.")


def refuse_prepare(txn: "Transaction") -> None:
    """263 when a transaction that created collections is prepared (two-phase commit)."""
    if txn.created:
        raise MongoError(263, "Cannot create new collections inside distributed transactions")


def publish(node: "ShardNode", txn: "Transaction") -> list[Collection]:
    """At commit: add the transaction's new collections to the catalog; returns them (for
    :func:`unpublish` if the commit then fails). WriteConflict (112, TransientTransaction-
    Error) when one of the namespaces was taken meanwhile (nothing is added then)."""
    storage = node.storage
    token = CURRENT_TXN.set(None)  # the committed catalog only
    try:
        for (db, name) in txn.created:
            if storage.get(db, name) is not None or storage.view_def(db, name) is not None:
                raise MongoError(112, "Write conflict during plan execution and yielding is "
                                      "disabled. :: Please retry your operation or "
                                      "multi-document transaction. (collection "
                                      f"{db}.{name} was created concurrently)", labels=TRANSIENT)
    finally:
        CURRENT_TXN.reset(token)
    added = []
    for coll in txn.created.values():
        storage.add(coll)
        added.append(coll)
    return added


def unpublish(node: "ShardNode", added: list[Collection]) -> None:
    """Undo :func:`publish` (the commit failed after it)."""
    for coll in added:
        node.storage.remove(coll)
