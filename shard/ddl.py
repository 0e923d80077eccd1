"""Catalog (DDL) commands of the shard and the internal commands the router/config server use.

create, drop, renameCollection, dropDatabase, listDatabases, listCollections, createIndexes,
dropIndexes, listIndexes, collMod, dbStats/collStats (minimal), and ``_shardsimEnsureCollection``
/ ``_shardsimNoop`` (see the brief). Each DDL change writes mongod's oplog command entry
(``op: "c"``, ``ns: "<db>.$cmd"``; formats from ``oplog.cpp``/``op_observer_impl.cpp``).
"""

from __future__ import annotations

from typing import Any

from bson import Binary
from bson.int64 import Int64

from shardsim.commands import GENERIC_FIELDS as _GENERIC
from shardsim.commands import Request, bson_type_name, check_type
from shardsim.cursors import ListCursor
from shardsim.errors import MongoError, view_error
from shardsim import query as q
from shard.node import ID_INDEX_SPEC, ShardNode, WriteContext
from shard.storage import VIEWS_COLL, Collection, validate_collection_name, validate_db_name

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


def _ns_missing(ns: str) -> MongoError:
    return MongoError(26, f"ns does not exist: {ns}")


# Options a view accepts besides viewOn/pipeline (create_collection.cpp refuses the others).
_VIEW_OPTIONS = frozenset({"viewOn", "pipeline", "collation"})


def _view_spec(cmd: str, options: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """Validate ``viewOn``/``pipeline`` of a create or collMod (IDL types, then
    ``CollectionOptions::parse``/``view_catalog_helpers`` rules); returns them."""
    view_on = options.get("viewOn")
    if "viewOn" not in options:
        raise MongoError(2, "'pipeline' requires 'viewOn' to also be specified")
    if not isinstance(view_on, str):
        raise MongoError(14, f"BSON field '{cmd}.viewOn' is the wrong type "
                             f"'{bson_type_name(view_on)}', expected type 'string'")
    if not view_on:
        raise MongoError(2, "'viewOn' cannot be empty")
    pipeline = options.get("pipeline", [])
    if not isinstance(pipeline, list):
        raise MongoError(14, f"BSON field '{cmd}.pipeline' is the wrong type "
                             f"'{bson_type_name(pipeline)}', expected type 'array'")
    for stage in pipeline:
        if not isinstance(stage, dict):
            raise MongoError(14, f"BSON field '{cmd}.pipeline' is the wrong type, expected type "
                                 f"'array' of objects")
        name = next(iter(stage), "")
        if name in ("$out", "$merge", "$changeStream"):  # OptionNotSupportedOnView
            raise MongoError(167, f"{name} cannot be used in a view definition")
    return view_on, pipeline


def register(node: ShardNode) -> None:
    """Register the catalog commands on ``node.commands``."""
    storage = node.storage
    c = node.commands

    def ctx_of(req: Request) -> WriteContext:
        return WriteContext(from_migrate=req.body.get("fromMigrate") is True)

    def name_of(req: Request) -> str:
        name = req.arg
        if not isinstance(name, str):
            raise MongoError(2, f"collection name has invalid type {bson_type_name(name)}")
        validate_db_name(req.db)
        validate_collection_name(req.db, name)
        return name

    def existing_collection(db: str, name: str) -> Collection:
        """The collection ``db.name``: CommandNotSupportedOnView (166) when it is a view,
        NamespaceNotFound (26) "ns does not exist" when there is neither."""
        coll = storage.get(db, name)
        if coll is None and storage.view_def(db, name) is not None:
            raise view_error(f"{db}.{name}")
        if coll is None:
            raise _ns_missing(f"{db}.{name}")
        return coll

    # -- create / drop ------------------------------------------------------------------------
    async def create(req: Request) -> dict[str, Any]:
        name = name_of(req)
        options: dict[str, Any] = {}
        for k, v in req.body.items():
            if k == req.name or k in _GENERIC or k == "fromMigrate":
                continue
            if k not in CREATE_OPTIONS:
                raise MongoError(40415, f"BSON field 'create.{k}' is an unknown field.")
            options[k] = v
        if "viewOn" in options or "pipeline" in options:
            return create_view(req, name, options)
        if storage.view_def(req.db, name) is not None:
            raise MongoError(48, f"namespace '{req.db}.{name}' already exists, but is a view")
        cs = options.get("changeStreamPreAndPostImages")
        if cs is not None and (not isinstance(cs, dict) or not isinstance(cs.get("enabled"), bool)):
            raise MongoError(40414, "BSON field 'create.changeStreamPreAndPostImages.enabled' is "
                                    "missing but a required field")
        options.pop("idIndex", None)
        existing = storage.get(req.db, name)
        if existing is not None:
            if existing.options == options:
                return {}  # 7.0+: an identical create is a no-op
            raise MongoError(48, f"Collection {req.db}.{name} already exists.")
        node.create_collection(req.db, name, options, ctx=ctx_of(req))
        return {}

    c.register("create", create)

    # -- views: documents of <db>.system.views (create_collection.cpp _createView,
    # views_for_database.cpp _upsertIntoCatalog/remove). The oplog sees only the CRUD entries on
    # system.views (plus its own creation); change streams turn those into create/modify/drop.
    def views_collection(db: str, ctx: WriteContext) -> Collection:
        views = storage.get(db, VIEWS_COLL)
        if views is None:  # Database::createSystemDotViewsIfNecessary
            views = node.create_collection(db, VIEWS_COLL, ctx=ctx)
        return views

    def check_no_cycle(db: str, name: str, view_on: str) -> None:
        chain = [f"{db}.{name}"]
        cur: str | None = view_on
        while cur is not None:
            chain.append(f"{db}.{cur}")
            if cur == name:
                raise MongoError(93, "View cycle detected: [ " + ", ".join(chain) + " ]")
            doc = storage.view_def(db, cur)
            cur = doc["viewOn"] if doc is not None else None
            if len(chain) > 21:
                raise MongoError(
                    14, "View depth too deep or view cycle detected. Maximum depth is 20")

    def create_view(req: Request, name: str, options: dict[str, Any]) -> dict[str, Any]:
        ns = f"{req.db}.{name}"
        view_on, pipeline = _view_spec("create", options)
        for k in options:
            if k not in _VIEW_OPTIONS:
                cs = options[k]
                if k == "changeStreamPreAndPostImages" and not (isinstance(cs, dict)
                                                                and cs.get("enabled")):
                    continue
                raise MongoError(72, f"option not supported on a view: {k}")
        if name.startswith("system."):
            raise MongoError(73, "View name cannot start with 'system.', which is reserved for "
                                 "system namespaces")
        collation = options.get("collation")
        if collation is not None and not isinstance(collation, dict):
            raise MongoError(14, f"BSON field 'create.collation' is the wrong type "
                                 f"'{bson_type_name(collation)}', expected type 'object'")
        if collation is not None and collation.get("locale") == "simple":
            collation = None  # the simple collation is stored as no collation
        if storage.get(req.db, name) is not None:
            raise MongoError(48, f"namespace '{ns}' already exists, but is a collection rather "
                                 f"than a view")
        existing = storage.view_def(req.db, name)
        if existing is not None:  # checkExistingViewIsCompatible: identical = no-op
            if existing["viewOn"] != view_on:
                raise MongoError(48, f"namespace '{ns}' already exists, but is a view on "
                                     f"'{req.db}.{existing['viewOn']}' rather than "
                                     f"'{req.db}.{view_on}'")
            if existing.get("pipeline") != pipeline:
                raise MongoError(48, f"namespace '{ns}' already exists, but with pipeline "
                                     f"{existing.get('pipeline')} rather than {pipeline}")
            if existing.get("collation") != collation:
                raise MongoError(48, f"namespace '{ns}' already exists, but with collation: "
                                     f"{existing.get('collation') or {}} rather than "
                                     f"{collation or {}}")
            return {}
        check_no_cycle(req.db, name, view_on)
        validate_collection_name(req.db, view_on)
        if req.db not in storage.dbs:
            for other in storage.dbs:
                if other.lower() == req.db.lower():
                    raise MongoError(13297, f"db already exists with different case already "
                                            f"have: [{other}] trying to create [{req.db}]")
        ctx = ctx_of(req)
        views = views_collection(req.db, ctx)
        doc: dict[str, Any] = {"_id": ns, "viewOn": view_on, "pipeline": pipeline}
        if collation:
            doc["collation"] = collation
        k = views.insert(doc)
        storage.note_doc(views, k, doc)
        node.log_op("i", views, doc, {"_id": ns}, ctx=ctx)
        return {}

    def drop_view(db: str, name: str, ctx: WriteContext) -> None:
        views = storage.get(db, VIEWS_COLL)
        ns = f"{db}.{name}"
        if views is None or ns not in views.docs:
            return
        views.delete(ns)
        storage.note_doc(views, ns, None)
        node.log_op("d", views, {"_id": ns}, ctx=ctx)

    def mod_view(req: Request, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        """collMod of a view: viewOn and/or pipeline, nothing else (coll_mod.cpp); logged as
        a replacement of the system.views document (the change stream's ``modify``)."""
        for k in changes:
            if k not in ("viewOn", "pipeline"):
                raise MongoError(72, f"option not supported on a view: {k}")
        views = storage.get(req.db, VIEWS_COLL)
        assert views is not None
        ns = f"{req.db}.{name}"
        old = views.docs[ns]
        # Without auth either field may be omitted and keeps its current value.
        view_on, pipeline = _view_spec("collMod", {"viewOn": old["viewOn"],
                                                   "pipeline": old.get("pipeline", []), **changes})
        check_no_cycle(req.db, name, view_on)
        doc: dict[str, Any] = {"_id": ns, "viewOn": view_on, "pipeline": pipeline}
        if old.get("collation"):
            doc["collation"] = old["collation"]
        views.replace(ns, doc)
        storage.note_doc(views, ns, doc)
        node.log_op("u", views, doc, {"_id": ns}, ctx=ctx_of(req), pre_image=old)
        return {}

    def drop_collection(coll: Collection, ctx: WriteContext) -> int:
        n = len(coll.indexes)
        records = len(coll.docs)
        storage.remove(coll)
        # o2.numRecords as op_observer_impl.cpp's makeObject2ForDropOrRename writes it.
        node.log_command(coll.db, {"drop": coll.name}, coll.ui, {"numRecords": Int64(records)},
                         ctx=ctx)
        return n

    async def drop(req: Request) -> dict[str, Any]:
        name = name_of(req)
        coll = storage.get(req.db, name)
        if coll is None:
            # drop_collection.cpp _dropView: a view is removed from system.views; dropping a
            # missing namespace succeeds (7.0+)
            drop_view(req.db, name, ctx_of(req))
            return {}
        n = drop_collection(coll, ctx_of(req))
        return {"nIndexesWas": n, "ns": coll.ns}

    c.register("drop", drop)

    async def drop_database(req: Request) -> dict[str, Any]:
        validate_db_name(req.db)
        if req.db in ("local", "admin", "config"):
            raise MongoError(20, f"Cannot drop '{req.db}' database while replication is active")
        ctx = ctx_of(req)
        colls = list(storage.collections(req.db))
        if not colls and req.db not in storage.dbs:
            return {}
        for coll in colls:
            drop_collection(coll, ctx)
        storage.dbs.pop(req.db, None)
        node.log_command(req.db, {"dropDatabase": 1}, ctx=ctx)
        return {"dropped": req.db}

    c.register("dropDatabase", drop_database)

    async def rename_collection(req: Request) -> dict[str, Any]:
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
        ctx = ctx_of(req)
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

    c.register("renameCollection", rename_collection)

    # -- listings -----------------------------------------------------------------------------
    async def list_databases(req: Request) -> dict[str, Any]:
        if req.db != "admin":
            raise MongoError(13, "listDatabases may only be run against the admin database.")
        filt = check_type(req, "filter", dict, "object") or {}
        name_only = bool(req.body.get("nameOnly", False))
        names = set(db for db, colls in storage.dbs.items() if colls) | {"admin", "config", "local"}
        out = []
        total = 0
        for name in sorted(names):
            colls = storage.dbs.get(name, {})
            size = sum(len(cl.docs) for cl in colls.values()) * 64 + 8192
            if name == "local":
                size += node.oplog.size_bytes
            entry: dict[str, Any] = {"name": name} if name_only else \
                {"name": name, "sizeOnDisk": Int64(size), "empty": False}
            if filt and not q.matches(filt, entry):
                continue
            total += size
            out.append(entry)
        reply: dict[str, Any] = {"databases": out}
        if not name_only:
            reply["totalSize"] = Int64(total)
            reply["totalSizeMb"] = Int64(total // (1024 * 1024))
        return reply

    c.register("listDatabases", list_databases)

    def coll_info(coll: Collection) -> dict[str, Any]:
        return {"name": coll.name, "type": "collection", "options": dict(coll.options),
                "info": {"readOnly": False, "uuid": coll.ui}, "idIndex": dict(ID_INDEX_SPEC)}

    async def list_collections(req: Request) -> dict[str, Any]:
        validate_db_name(req.db)
        filt = check_type(req, "filter", dict, "object") or {}
        name_only = bool(req.body.get("nameOnly", False))
        cursor_opt = check_type(req, "cursor", dict, "object") or {}
        infos = [coll_info(cl) for cl in storage.collections(req.db)]
        for vdoc in storage.views(req.db):  # list_collections.cpp: views after collections
            opts = {k: v for k, v in vdoc.items() if k != "_id"}
            infos.append({"name": vdoc["_id"].split(".", 1)[1], "type": "view",
                          "options": opts, "info": {"readOnly": True}})
        if req.db == "local":
            infos.append({"name": "oplog.rs", "type": "collection",
                          "options": {"capped": True, "size": Int64(node.oplog.max_bytes),
                                      "autoIndexId": False},
                          "info": {"readOnly": False, "uuid": Binary(b"\x00" * 15 + b"\x01", 4)}})
        infos = [i for i in infos if q.matches(filt, i)]
        if name_only:
            infos = [{"name": i["name"], "type": i["type"]} for i in infos]
        bs = cursor_opt.get("batchSize")
        reply = await node.cursors.run_first_batch(
            ListCursor(f"{req.db}.$cmd.listCollections", infos), int(bs) if bs else None)
        return {"cursor": reply}

    c.register("listCollections", list_collections)

    async def list_indexes(req: Request) -> dict[str, Any]:
        name = name_of(req)
        coll = existing_collection(req.db, name)
        cursor_opt = check_type(req, "cursor", dict, "object") or {}
        bs = cursor_opt.get("batchSize")
        specs = [dict(i.spec) for i in coll.indexes.values()]
        reply = await node.cursors.run_first_batch(
            ListCursor(f"{req.db}.$cmd.listIndexes.{name}", specs), int(bs) if bs else None)
        return {"cursor": reply}

    c.register("listIndexes", list_indexes)

    # -- indexes ------------------------------------------------------------------------------
    async def create_indexes(req: Request) -> dict[str, Any]:
        name = name_of(req)
        specs = check_type(req, "indexes", list, "array", required=True)
        if not specs:
            raise MongoError(2, "Must specify at least one index to create")
        if storage.view_def(req.db, name) is not None:
            raise view_error(f"{req.db}.{name}")
        ctx = ctx_of(req)
        created_auto = storage.get(req.db, name) is None
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
            full = {"v": 2, "key": dict(key), "name": iname}
            for k, v in spec.items():
                if k not in ("key", "name", "v", "ns"):
                    full[k] = v
            prepared.append(full)
        coll = node.ensure_collection(req.db, name, ctx)
        before = len(coll.indexes)
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
            coll.add_index(full)
            storage.note_catalog(coll)
            node.log_command(req.db, {"createIndexes": name, **full}, coll.ui, ctx=ctx)
        reply: dict[str, Any] = {"numIndexesBefore": before, "numIndexesAfter": len(coll.indexes),
                                 "createdCollectionAutomatically": created_auto}
        if len(coll.indexes) == before:
            reply["note"] = "all indexes already exist"
        return reply

    c.register("createIndexes", create_indexes)

    async def drop_indexes(req: Request) -> dict[str, Any]:
        name = name_of(req)
        coll = existing_collection(req.db, name)
        which = req.body.get("index")
        if which is None:
            raise MongoError(40414, "BSON field 'dropIndexes.index' is missing but a required field")
        ctx = ctx_of(req)
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

    c.register("dropIndexes", drop_indexes, "deleteIndexes")

    async def coll_mod(req: Request) -> dict[str, Any]:
        name = name_of(req)
        coll = storage.get(req.db, name)
        is_view = coll is None and storage.view_def(req.db, name) is not None
        if coll is None and not is_view:
            raise _ns_missing(f"{req.db}.{name}")
        changes: dict[str, Any] = {}
        for k, v in req.body.items():
            if k == req.name or k in _GENERIC or k == "fromMigrate":
                continue
            if k not in COLLMOD_OPTIONS:
                raise MongoError(40415, f"BSON field 'collMod.{k}' is an unknown field.")
            changes[k] = v
        if is_view:
            return mod_view(req, name, changes)
        assert coll is not None
        for k in ("viewOn", "pipeline"):
            if k in changes:
                raise MongoError(72, f"option only supported on a view: {k}")
        cs = changes.get("changeStreamPreAndPostImages")
        if cs is not None and (not isinstance(cs, dict) or not isinstance(cs.get("enabled"), bool)):
            raise MongoError(40414, "BSON field 'collMod.changeStreamPreAndPostImages.enabled' is "
                                    "missing but a required field")
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
        storage.note_catalog(coll)
        node.log_command(req.db, {"collMod": name, **changes}, coll.ui, o2, ctx=ctx_of(req))
        return reply

    c.register("collMod", coll_mod)

    async def coll_stats(req: Request) -> dict[str, Any]:
        name = name_of(req)
        coll = existing_collection(req.db, name)
        return {"ns": coll.ns, "count": len(coll.docs), "nindexes": len(coll.indexes),
                "capped": False}

    c.register("collStats", coll_stats)

    async def db_stats(req: Request) -> dict[str, Any]:
        colls = list(storage.collections(req.db))
        return {"db": req.db, "collections": len(colls), "views": len(storage.views(req.db)),
                "objects": sum(len(cl.docs) for cl in colls),
                "indexes": sum(len(cl.indexes) for cl in colls)}

    c.register("dbStats", db_stats)

    # -- internal commands --------------------------------------------------------------------
    async def ensure_collection(req: Request) -> dict[str, Any]:
        name = name_of(req)
        uuid = req.body.get("uuid")
        if uuid is not None and not (isinstance(uuid, Binary) and uuid.subtype == 4 and len(uuid) == 16):
            raise MongoError(14, "BSON field '_shardsimEnsureCollection.uuid' is the wrong type, "
                                 "expected type 'uuid'")
        shard_key = req.body.get("shardKey")
        if shard_key is not None and not isinstance(shard_key, dict):
            raise MongoError(14, "BSON field '_shardsimEnsureCollection.shardKey' is the wrong "
                                 "type, expected type 'object'")
        options = check_type(req, "options", dict, "object") or {}
        primary = req.body.get("primary") is True
        coll = storage.get(req.db, name)
        if coll is not None:
            if uuid is not None and bytes(uuid) != coll.uuid:
                raise MongoError(361, f"Collection UUID does not match that specified",
                                 db=req.db, collectionUUID=uuid, expectedCollection=name,
                                 actualCollection=name)
            if shard_key is not None:
                coll.shard_key = dict(shard_key)
                storage.note_catalog(coll)
            return {"uuid": coll.ui, "created": False}
        ctx = WriteContext(from_migrate=not primary)
        coll = node.create_collection(req.db, name, dict(options),
                                      uuid=bytes(uuid) if uuid is not None else None,
                                      shard_key=dict(shard_key) if shard_key else None, ctx=ctx)
        return {"uuid": coll.ui, "created": True}

    c.register("_shardsimEnsureCollection", ensure_collection)

    async def noop(req: Request) -> dict[str, Any]:
        o = req.arg
        if not isinstance(o, dict):
            raise MongoError(14, "BSON field '_shardsimNoop' is the wrong type, expected type 'object'")
        o2 = check_type(req, "o2", dict, "object")
        ns = check_type(req, "ns", str, "string") or ""
        ui = req.body.get("ui")
        ts = node.write_noop(o, o2, ns, ui)
        return {"ts": ts, "__operationTime": ts}

    c.register("_shardsimNoop", noop)

