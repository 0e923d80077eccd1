"""The shard's catalog (DDL) commands: create, drop, dropDatabase, renameCollection,
createIndexes, dropIndexes, collMod (views included: :mod:`shard.commands.views`).

Each change writes mongod's oplog command entry (``op: "c"``, ``ns: "<db>.$cmd"``; formats from
``oplog.cpp``/``op_observer_impl.cpp``). Every command accepts ``fromMigrate: true``, which
marks its entries. The listings are in :mod:`shard.commands.catalog`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson.int64 import Int64

from shardsim.core import query as q
from shardsim.core.commands import GENERIC_FIELDS, CommandFamily, Request, bson_type_name, check_type
from shardsim.core.errors import MongoError
from shardsim.shard.collection_kinds import apply_unique_options, normalize_create_options
from shardsim.shard import uncommitted_catalog, validation
from shardsim.shard.commands.helpers import ddl_context, ddl_name, existing_collection, ns_missing
from shardsim.shard.commands.views import create_view, drop_view, mod_view
from shardsim.core.errors import view_error
from shardsim.shard.storage import Collection, validate_collection_name, validate_db_name
from shardsim.shard.write_context import WriteContext
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode

commands = CommandFamily("ddl")

# create options mongod accepts (collection_options.idl); others fail with 40415.
CREATE_OPTIONS = frozenset({
    "capped", "size", "max", "autoIndexId", "validator", "validationLevel", "validationAction",
    "indexOptionDefaults", "viewOn", "pipeline", "collation", "storageEngine", "timeseries",
    "expireAfterSeconds", "clusteredIndex", "changeStreamPreAndPostImages", "encryptedFields",
    "idIndex", "recordPreImages", "flags", "temp",
})

COLLMOD_OPTIONS = frozenset({
    "validator", "validationLevel", "validationAction", "changeStreamPreAndPostImages",
    "expireAfterSeconds", "index", "viewOn", "pipeline", "timeseries", "cappedSize", "cappedMax",
    "recordPreImages", "dryRun",
})


# -- create / drop ------------------------------------------------------------------------
@commands.handler("create", privileges=priv.on_coll("createCollection"))
async def create(node: ShardNode, req: Request) -> dict[str, Any]:
    """``create: <coll>[, options]`` (``create_collection.cpp``): ``{}``; logs ``{create,
    <options>, idIndex}``. With ``viewOn``/``pipeline`` it creates a view
    (:func:`shard.commands.views.create_view`). An identical re-create is a no-op (7.0+).
    Errors: 40415 (unknown option), 48 (exists, or is a view), 40414, 73, 13297. Inside a
    transaction the collection is the transaction's until it commits
    (:mod:`shard.uncommitted_catalog`); there 72 (read concern not local) and 263 (a view, a
    time-series or a system collection) too."""
    txn = node.txn_of(req)
    if txn is not None:
        return await _in_transaction(node, req, txn, _create)
    return await _create(node, req, None)


async def _in_transaction(node: ShardNode, req: Request, txn: Any, run: Any) -> dict[str, Any]:
    """Run the catalog command ``run(node, req, txn)`` as a statement of ``txn``: only with the
    ``local`` read concern (72), and a failure aborts the transaction, as any failed statement
    does (:mod:`shard.uncommitted_catalog`)."""
    try:
        uncommitted_catalog.check_read_concern(txn, node.commands.canonical(req.name))
        return await run(node, req, txn)
    except MongoError:
        node.sessions.abort_on_error(req)
        raise


async def _create(node: ShardNode, req: Request, txn: Any) -> dict[str, Any]:
    """``create`` outside (``txn`` None) or inside a transaction: there a new collection exists
    for the transaction only until it commits; views and time-series collections are 263."""
    storage = node.storage
    name = ddl_name(req)
    options: dict[str, Any] = {}
    for k, v in req.body.items():
        if k == req.name or k in GENERIC_FIELDS or k == "fromMigrate":
            continue
        if k not in CREATE_OPTIONS:
            raise MongoError(40415, f"BSON field 'create.{k}' is an unknown field.")
        options[k] = v
    if "viewOn" in options or "pipeline" in options:
        if txn is not None:
            raise MongoError(263, "Cannot create a view in a multi-document transaction.")
        return create_view(node, req, name, options)
    if txn is not None and options.get("timeseries") is not None:
        raise MongoError(263, "Cannot create a time-series collection in a multi-document "
                              "transaction.")
    validation.check_options("create", options)
    if storage.view_def(req.db, name) is not None:
        raise MongoError(48, f"namespace '{req.db}.{name}' already exists, but is a view")
    cs = options.get("changeStreamPreAndPostImages")
    if cs is not None and (not isinstance(cs, dict) or not isinstance(cs.get("enabled"), bool)):
        raise MongoError(40414, "BSON field 'create.changeStreamPreAndPostImages.enabled' is "
                                "missing but a required field")
    options.pop("idIndex", None)
    options = normalize_create_options(options)
    existing = storage.get(req.db, name)
    if existing is not None:
        if existing.options == options and txn is None:
            return {}  # 7.0+: an identical create is a no-op, outside a transaction only
        # In a transaction NamespaceExists is surfaced whatever the options, and aborts it
        # (create_command.cpp CmdCreate: "NamespaceExists will cause multi-document
        # transactions to implicitly abort"; catalog::checkIfNamespaceExists's message).
        raise MongoError(48, f"Collection {req.db}.{name} already exists.")
    if txn is not None:
        uncommitted_catalog.create(node, txn, req.db, name, options)
        return {}
    coll = node.create_collection(req.db, name, options, ctx=ddl_context(req))
    ts = options.get("timeseries")
    if ts and "metaField" in ts:  # 6.3+: the default {meta: 1, time: 1} index
        meta, time_field = ts["metaField"], ts["timeField"]
        coll.add_index({"v": 2, "key": {meta: 1, time_field: 1},
                        "name": f"{meta}_1_{time_field}_1"})
        storage.note_catalog(coll)
    return {}


def drop_collection(node: ShardNode, coll: Collection, ctx: WriteContext) -> int:
    """Remove ``coll`` and log ``{drop}`` with ``o2: {numRecords}``; returns its index count."""
    storage = node.storage
    n = len(coll.indexes)
    records = len(coll.docs)
    storage.remove(coll)
    # o2.numRecords as op_observer_impl.cpp's makeObject2ForDropOrRename writes it.
    node.log_command(coll.db, {"drop": coll.name}, coll.ui, {"numRecords": Int64(records)},
                     ctx=ctx)
    return n


@commands.handler("drop", privileges=priv.on_coll("dropCollection"))
async def drop(node: ShardNode, req: Request) -> dict[str, Any]:
    """``drop: <coll>``: ``{nIndexesWas, ns}``; a view's definition is removed instead, and a
    missing namespace is not an error (7.0+, ``drop_collection.cpp``): ``{}``."""
    storage = node.storage
    name = ddl_name(req)
    coll = storage.get(req.db, name)
    if coll is None:
        # drop_collection.cpp _dropView: a view is removed from system.views; dropping a
        # missing namespace succeeds (7.0+)
        drop_view(node, req.db, name, ddl_context(req))
        return {}
    n = drop_collection(node, coll, ddl_context(req))
    return {"nIndexesWas": n, "ns": coll.ns}


@commands.handler("dropDatabase", privileges=priv.on_db("dropDatabase"))
async def drop_database(node: ShardNode, req: Request) -> dict[str, Any]:
    """``dropDatabase: 1``: one ``{drop}`` entry per collection, then ``{dropDatabase: 1}``;
    ``{dropped: <db>}`` (``{}`` when there is no such database). IllegalOperation (20) for
    local/admin/config."""
    storage = node.storage
    validate_db_name(req.db)
    if req.db in ("local", "admin", "config"):
        raise MongoError(20, f"Cannot drop '{req.db}' database while replication is active")
    ctx = ddl_context(req)
    colls = list(storage.collections(req.db))
    if not colls and req.db not in storage.dbs:
        return {}
    for coll in colls:
        drop_collection(node, coll, ctx)
    storage.dbs.pop(req.db, None)
    node.log_command(req.db, {"dropDatabase": 1}, ctx=ctx)
    return {"dropped": req.db}


@commands.handler("renameCollection", privileges=priv.rename_privileges)
async def rename_collection(node: ShardNode, req: Request) -> dict[str, Any]:
    """``renameCollection: "<db>.<coll>", to, dropTarget?`` on admin: ``{}``; logs
    ``{renameCollection, to[, dropTarget: <uuid>], stayTemp}`` with ``o2: {numRecords}``.
    Errors: 13 (not admin), 73, 166 (a view), 26 (no source), 48 (target exists), 20 (same)."""
    storage = node.storage
    if req.db != "admin":
        raise MongoError(13, "renameCollection may only be run against the admin database.")
    src = req.arg
    dst = check_type(req, "to", str, "string", required=True)
    if not isinstance(src, str) or "." not in src:
        raise MongoError(73, f"Invalid source namespace: {src}")
    if "." not in dst:
        raise MongoError(73, f"Invalid target namespace: {dst}")
    drop_target = req.body.get("dropTarget", False)
    sdb, _, sname = src.partition(".")
    ddb, _, dname = dst.partition(".")
    validate_db_name(ddb)
    validate_collection_name(ddb, dname)
    coll = storage.get(sdb, sname)
    if coll is None and storage.view_def(sdb, sname) is not None:
        raise MongoError(166, f"cannot rename view: {src}")
    if coll is None:
        raise MongoError(26, f"Source collection {src} does not exist")
    if storage.view_def(ddb, dname) is not None:
        raise MongoError(48, f"a view already exists with that name: {dst}")
    if src == dst:
        raise MongoError(20, "Can't rename a collection to itself")
    target = storage.get(ddb, dname)
    ctx = ddl_context(req)
    o: dict[str, Any] = {"renameCollection": src, "to": dst}
    if target is not None:
        if not drop_target:
            raise MongoError(48, "target namespace exists")
        storage.remove(target)
        o["dropTarget"] = target.ui
    o["stayTemp"] = False
    storage.rename(coll, ddb, dname)
    node.log_command(sdb, o, coll.ui, {"numRecords": Int64(len(coll.docs))}, ctx=ctx)
    return {}


# -- indexes ------------------------------------------------------------------------------
@commands.handler("createIndexes", privileges=priv.on_coll("createIndex"))
async def create_indexes(node: ShardNode, req: Request) -> dict[str, Any]:
    """``createIndexes: <coll>, indexes: [{key, name, ...}]``: ``{numIndexesBefore,
    numIndexesAfter, createdCollectionAutomatically[, note]}``; one ``{createIndexes, v, key,
    name, ...}`` entry per new index. Errors: 2, 9, 14, 67 (bad spec), 85/86 (conflicting
    index), 166 (a view). Inside a transaction only on a collection it creates
    (:func:`_create_indexes_in_txn`)."""
    txn = node.txn_of(req)
    if txn is not None:
        return await _in_transaction(node, req, txn, _create_indexes_in_txn)
    storage = node.storage
    name = ddl_name(req)
    specs = check_type(req, "indexes", list, "array", required=True)
    if not specs:
        raise MongoError(2, "Must specify at least one index to create")
    if storage.view_def(req.db, name) is not None:
        raise view_error(f"{req.db}.{name}")
    ctx = ddl_context(req)
    created_auto = storage.get(req.db, name) is None
    prepared = _index_specs(specs)
    coll = node.ensure_collection(req.db, name, ctx)
    before = len(coll.indexes)
    for full in _new_indexes(coll, prepared):
        coll.add_index(full)
        storage.note_catalog(coll)
        node.log_command(req.db, {"createIndexes": name, **full}, coll.ui, ctx=ctx)
    reply: dict[str, Any] = {"numIndexesBefore": before, "numIndexesAfter": len(coll.indexes),
                             "createdCollectionAutomatically": created_auto}
    if len(coll.indexes) == before:
        reply["note"] = "all indexes already exist"
    return reply


async def _create_indexes_in_txn(node: ShardNode, req: Request, txn: Any) -> dict[str, Any]:
    """``createIndexes`` as a transaction statement (``create_indexes_cmd.cpp``
    ``runCreateIndexesWithCoordinator``/``runCreateIndexesOnNewCollection``): indexes that all
    exist answer as outside; a missing collection is created in the transaction; new indexes
    only on an empty collection this transaction created, else OperationNotSupportedIn-
    Transaction (263); a system collection is 263 too."""
    storage = node.storage
    name = ddl_name(req)
    ns = f"{req.db}.{name}"
    if name.startswith("system."):
        raise MongoError(263, f"Cannot write to system collection {ns} within a transaction.")
    specs = check_type(req, "indexes", list, "array", required=True)
    if not specs:
        raise MongoError(2, "Must specify at least one index to create")
    if storage.view_def(req.db, name) is not None:
        raise view_error(ns)
    prepared = _index_specs(specs)
    coll = storage.get(req.db, name)  # the transaction's own new collections included
    if coll is not None:
        new = _new_indexes(coll, prepared)
        if not new:
            n = len(coll.indexes)
            return {"numIndexesBefore": n, "numIndexesAfter": n,
                    "createdCollectionAutomatically": False, "note": "all indexes already exist"}
        if txn.created.get((req.db, name)) is not coll:
            raise uncommitted_catalog.existing_collection_error(ns)
    else:
        coll = uncommitted_catalog.create(node, txn, req.db, name)
        new = _new_indexes(coll, prepared)
    before = len(coll.indexes)
    uncommitted_catalog.create_indexes(txn, coll, new, txn.view(coll))
    reply: dict[str, Any] = {"numIndexesBefore": before, "numIndexesAfter": len(coll.indexes),
                             "createdCollectionAutomatically": True}
    if len(coll.indexes) == before:
        reply["note"] = "all indexes already exist"
    return reply


def _index_specs(specs: list[Any]) -> list[dict[str, Any]]:
    """The full specs ``{v: 2, key, name, ...}`` of ``createIndexes.indexes``. Errors: 14 (not
    an object), 2 (no key), 67 (bad key or name), 9 (no name)."""
    prepared = []
    for spec in specs:
        if not isinstance(spec, dict):
            raise MongoError(14, "BSON field 'createIndexes.indexes' is the wrong type, expected type 'object'")
        key = spec.get("key")
        if not isinstance(key, dict) or not key:
            raise MongoError(2 if key is None else 67, "The 'key' field is a required property of an index "
                             "specification" if key is None else "Index keys cannot be empty.")
        for f, v in key.items():
            if not f:
                raise MongoError(67, "Index keys cannot be an empty field.")
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and v != 0
                                           or v in ("hashed", "text", "2d", "2dsphere")):
                raise MongoError(67, f"Values in the index key pattern can contain only "
                                     f"non-zero numbers or strings, got {f}: {v!r}")
        iname = spec.get("name")
        if iname is None:
            raise MongoError(9, "The 'name' field is a required property of an index specification")
        if not isinstance(iname, str) or not iname:
            raise MongoError(67, "The index name cannot be empty")
        if "partialFilterExpression" in spec:
            _check_partial_filter(spec["partialFilterExpression"])
        full = {"v": 2, "key": dict(key), "name": iname}
        for k, v in spec.items():
            if k not in ("key", "name", "v", "ns"):
                full[k] = v
        prepared.append(full)
    return prepared


def _check_partial_filter(pfe: Any) -> None:
    """A ``partialFilterExpression`` as ``index_key_validate.cpp`` checks it: a document
    (TypeMismatch 14 "The field 'partialFilterExpression' must be an object, but got <type>"),
    then a filter that parses (the matcher's errors, BadValue 2 for an unknown operator or
    ``$and: 5``)."""
    if not isinstance(pfe, dict):
        raise MongoError(14, f"The field 'partialFilterExpression' must be an object, but got "
                             f"{bson_type_name(pfe)}")
    for k in ("$and", "$or", "$nor"):
        if k in pfe and not isinstance(pfe[k], list):
            raise MongoError(2, f"{k} must be an array")
    q.matches(pfe, {})


def _new_indexes(coll: Collection, prepared: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The specs of ``prepared`` that ``coll`` does not have yet (``removeExistingIndexes``).
    Errors: 86 (same name, other key), 85 (same name other options, or same index under
    another name)."""
    new: list[dict[str, Any]] = []
    for full in prepared:
        existing = coll.indexes.get(full["name"])
        same_key = next((i for i in coll.indexes.values() if i.spec["key"] == full["key"]), None)
        if existing is not None:
            if existing.spec["key"] != full["key"]:
                raise MongoError(86, f"An existing index has the same name as the requested "
                                     f"index. When index names are not specified, they are "
                                     f"auto generated and can cause conflicts. Please refer to "
                                     f"our documentation. Requested index: {full}, existing "
                                     f"index: {existing.spec}")
            if {k: v for k, v in existing.spec.items() if k != "v"} != \
                    {k: v for k, v in full.items() if k != "v"}:
                raise MongoError(85, f"An existing index has the same name as the requested "
                                     f"index. Requested index: {full}, existing index: {existing.spec}")
            continue
        if same_key is not None and full["key"] == {"_id": 1}:
            continue
        if same_key is not None and {k: v for k, v in same_key.spec.items() if k not in ("v", "name")} == \
                {k: v for k, v in full.items() if k not in ("v", "name")}:
            raise MongoError(85, f"Index already exists with a different name: {same_key.name}")
        if any(n["name"] == full["name"] for n in new):
            continue
        new.append(full)
    return new


@commands.handler("dropIndexes", "deleteIndexes", privileges=priv.on_coll("dropIndex"))
async def drop_indexes(node: ShardNode, req: Request) -> dict[str, Any]:
    """``dropIndexes: <coll>, index: "*"|name|[names]|key``: ``{nIndexesWas}``; one
    ``{dropIndexes, index}`` entry per index with its spec in ``o2``. Errors: 40414, 14,
    27 (no such index), 72 (the ``_id`` index), 26, 166."""
    storage = node.storage
    name = ddl_name(req)
    coll = existing_collection(node, req.db, name)
    which = req.body.get("index")
    if which is None:
        raise MongoError(40414, "BSON field 'dropIndexes.index' is missing but a required field")
    ctx = ddl_context(req)
    before = len(coll.indexes)
    if which == "*":
        names = [n for n in coll.indexes if n != "_id_"]
    elif isinstance(which, str):
        names = [which]
    elif isinstance(which, list):
        if not all(isinstance(n, str) for n in which):
            raise MongoError(14, "dropIndexes.index must be a string, an object or an array "
                                 "of strings")
        names = list(which)
    elif isinstance(which, dict):
        found = [i.name for i in coll.indexes.values() if i.spec["key"] == which]
        if not found:
            raise MongoError(27, f"can't find index with key: {which}")
        names = found[:1]
    else:
        raise MongoError(14, "BSON field 'dropIndexes.index' is the wrong type, expected "
                             "types '[string, object, array]'")
    for n in names:
        if n == "_id_":
            raise MongoError(72, "cannot drop _id index")
        if n not in coll.indexes:
            raise MongoError(27, f"index not found with name [{n}]")
    for n in names:
        idx = coll.indexes.pop(n)
        storage.note_catalog(coll)
        o = {"dropIndexes": name, "index": n}
        node.log_command(req.db, o, coll.ui, {"v": 2, "key": idx.spec["key"], "name": n}, ctx=ctx)
    return {"nIndexesWas": before}


@commands.handler("collMod", privileges=priv.on_coll("collMod"))
async def coll_mod(node: ShardNode, req: Request) -> dict[str, Any]:
    """``collMod: <coll>, <changes>`` (``coll_mod.cpp``): ``{}`` or the index's
    ``<option>_old``/``<option>_new``; logs ``{collMod, ...}`` with ``o2:
    {collectionOptions_old[, indexOptions_old]}``. On a view it changes viewOn/pipeline.
    Errors: 26, 40415, 72, 40414, 14, 27."""
    storage = node.storage
    name = ddl_name(req)
    coll = storage.get(req.db, name)
    is_view = coll is None and storage.view_def(req.db, name) is not None
    if coll is None and not is_view:
        raise ns_missing(f"{req.db}.{name}")
    changes: dict[str, Any] = {}
    for k, v in req.body.items():
        if k == req.name or k in GENERIC_FIELDS or k == "fromMigrate":
            continue
        if k not in COLLMOD_OPTIONS:
            raise MongoError(40415, f"BSON field 'collMod.{k}' is an unknown field.")
        changes[k] = v
    if is_view:
        return mod_view(node, req, name, changes)
    validation.check_options("collMod", changes)
    assert coll is not None
    for k in ("viewOn", "pipeline"):
        if k in changes:
            raise MongoError(72, f"option only supported on a view: {k}")
    cs = changes.get("changeStreamPreAndPostImages")
    if cs is not None and (not isinstance(cs, dict) or not isinstance(cs.get("enabled"), bool)):
        raise MongoError(40414, "BSON field 'collMod.changeStreamPreAndPostImages.enabled' is "
                                "missing but a required field")
    reply, o2 = apply_coll_mod(coll, changes)
    storage.note_catalog(coll)
    node.log_command(req.db, {"collMod": name, **changes}, coll.ui, o2, ctx=ddl_context(req))
    return reply


def apply_coll_mod(coll: Collection, changes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Apply ``collMod``'s ``changes`` to ``coll`` (its options and an ``index`` change), as the
    command does and as a secondary applying the ``{collMod}`` entry does
    (``coll_mod.cpp`` ``_collModInternal``; :mod:`shard.replication.apply_commands`). Returns
    ``(reply, o2)``: the command's reply fields (``<option>_old``/``_new`` of an index change)
    and the entry's ``o2`` (``{collectionOptions_old[, indexOptions_old]}``). Errors: 14, 27
    (no such index), 72/359 (``unique``)."""
    reply: dict[str, Any] = {}
    # o2 of the oplog entry: the options before the change (op_observer_impl.cpp onCollMod),
    # which change streams show as stateBeforeChange.
    o2: dict[str, Any] = {"collectionOptions_old": {"uuid": coll.ui, **coll.options}}
    if "index" in changes:
        spec = changes["index"]
        if not isinstance(spec, dict):
            raise MongoError(14, "BSON field 'collMod.index' is the wrong type, expected type 'object'")
        idx = None
        if "name" in spec:
            idx = coll.indexes.get(spec["name"])
        elif "keyPattern" in spec:
            idx = next((i for i in coll.indexes.values() if i.spec["key"] == spec["keyPattern"]), None)
        if idx is None:
            raise MongoError(27, f"cannot find index {spec.get('name', spec.get('keyPattern'))} "
                                 f"for ns {coll.ns}")
        old_index = {k: idx.spec[k] for k in ("hidden", "expireAfterSeconds", "unique",
                                               "prepareUnique") if k in spec and k in idx.spec}
        if old_index:
            o2["indexOptions_old"] = old_index
        apply_unique_options(coll, idx, spec)
        for k in ("hidden", "expireAfterSeconds", "unique", "prepareUnique"):
            if k in spec:
                old = idx.spec.get(k)
                idx.spec[k] = spec[k]
                reply[f"{k}_old"] = old
                reply[f"{k}_new"] = spec[k]
    for k, v in changes.items():
        if k in ("index", "dryRun"):
            continue
        if k == "cappedSize":
            coll.options["size"] = v
        elif k == "cappedMax":
            coll.options["max"] = v
        else:
            coll.options[k] = v
    cs_opt = coll.options.get("changeStreamPreAndPostImages")
    if isinstance(cs_opt, dict) and cs_opt.get("enabled") is False:
        coll.options.pop("changeStreamPreAndPostImages")
    return reply, o2
