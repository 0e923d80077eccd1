"""The shard's catalog listings: listDatabases, listCollections, listIndexes, collStats and
dbStats. Read-only; the DDL that changes the catalog is in
:mod:`shard.commands.ddl`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson import Binary
from bson.int64 import Int64

from shardsim.core import authorized_listing
from shardsim.core.commands import CommandFamily, Request, check_type
from shardsim.core.cursors import ListCursor
from shardsim.core.errors import MongoError
from shardsim.core import query as q
from shardsim.shard.coll_stats import storage_stats
from shardsim.shard.commands.helpers import ddl_name, existing_collection
from shardsim.shard.storage import ID_INDEX, Collection, validate_db_name
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode

commands = CommandFamily("catalog")


@commands.handler("listDatabases", secondary="optIn", privileges=priv.AUTH_ONLY)
async def list_databases(node: ShardNode, req: Request) -> dict[str, Any]:
    """``listDatabases`` on admin: ``{databases: [{name, sizeOnDisk, empty}], totalSize,
    totalSizeMb}`` (sizes are estimates; ``nameOnly`` gives names only; only the databases the
    user may see, :mod:`shardsim.core.authorized_listing`). Unauthorized (13) elsewhere than
    admin."""
    storage = node.storage
    if req.db != "admin":
        raise MongoError(13, "listDatabases may only be run against the admin database.")
    filt = check_type(req, "filter", dict, "object") or {}
    name_only = bool(req.body.get("nameOnly", False))
    names = set(db for db, colls in storage.dbs.items() if colls) | {"admin", "config", "local"}
    names = set(await authorized_listing.filter_databases(node, req, sorted(names)))
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


def coll_info(coll: Collection) -> dict[str, Any]:
    """One ``listCollections`` entry of a collection (``info.uuid``, ``idIndex``; a time series
    is ``type: "timeseries"`` without uuid, a clustered collection has no ``idIndex``)."""
    if "timeseries" in coll.options:  # list_collections.cpp: a time series is listed as such
        return {"name": coll.name, "type": "timeseries", "options": dict(coll.options),
                "info": {"readOnly": False}}
    info = {"name": coll.name, "type": "collection", "options": dict(coll.options),
            "info": {"readOnly": False, "uuid": coll.ui}}
    if "clusteredIndex" not in coll.options:  # a clustered collection has no idIndex
        info["idIndex"] = dict(ID_INDEX)
    return info


@commands.handler("listCollections", secondary="optIn", privileges=priv.list_collections_privileges)
async def list_collections(node: ShardNode, req: Request) -> dict[str, Any]:
    """``listCollections`` (``list_collections.cpp``): a cursor over ``{name, type,
    options, info[, idIndex]}``, collections then views, plus ``oplog.rs`` in ``local``;
    ``filter`` and ``nameOnly`` apply (with ``authorizedCollections``, only what the user may
    see: :mod:`shardsim.core.authorized_listing`). 73 for a bad database name."""
    storage = node.storage
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
    infos = await authorized_listing.filter_collections(node, req, infos)
    if name_only:
        infos = [{"name": i["name"], "type": i["type"]} for i in infos]
    bs = cursor_opt.get("batchSize")
    reply = await node.cursors.run_first_batch(
        ListCursor(f"{req.db}.$cmd.listCollections", infos), int(bs) if bs else None)
    return {"cursor": reply}


@commands.handler("listIndexes", secondary="optIn", privileges=priv.on_coll("listIndexes"))
async def list_indexes(node: ShardNode, req: Request) -> dict[str, Any]:
    """``listIndexes: <coll>``: a cursor over the index specs. 26 when missing, 166 on a
    view."""
    name = ddl_name(req)
    coll = existing_collection(node, req.db, name)
    cursor_opt = check_type(req, "cursor", dict, "object") or {}
    bs = cursor_opt.get("batchSize")
    specs = [dict(i.spec) for i in coll.indexes.values()]
    reply = await node.cursors.run_first_batch(
        ListCursor(f"{req.db}.$cmd.listIndexes.{name}", specs), int(bs) if bs else None)
    return {"cursor": reply}


@commands.handler("collStats", secondary="optIn", privileges=priv.on_coll("collStats"))
async def coll_stats(node: ShardNode, req: Request) -> dict[str, Any]:
    """``collStats: <coll>[, scale]``: ``{ns, <storage stats>}`` (the ``storageStats`` of
    :func:`shard.coll_stats.storage_stats`: size, count, capped, nindexes, ...). 26, 166,
    BadValue (2) for a scale below 1."""
    name = ddl_name(req)
    coll = existing_collection(node, req.db, name)
    scale = req.body.get("scale", 1)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale < 1:
        raise MongoError(2, "scale has to be >= 1")
    return {"ns": coll.ns, **storage_stats(coll, int(scale))}


@commands.handler("dbStats", secondary="optIn", privileges=priv.on_db("dbStats"))
async def db_stats(node: ShardNode, req: Request) -> dict[str, Any]:
    """``dbStats [, scale]`` (``dbcommands_d.cpp`` ``CmdDbStats``, ``Database::getStats``):
    ``{db, collections, views, objects, avgObjSize, dataSize, storageSize, indexes, indexSize,
    totalSize, scaleFactor}`` — sizes are the BSON sizes of :func:`storage_stats`, divided by
    ``scale`` (``avgObjSize`` unscaled, a double). BadValue (2) for a scale below 1."""
    storage = node.storage
    scale = req.body.get("scale", 1)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale < 1:
        raise MongoError(2, "Scale factor must be greater than zero")
    colls = list(storage.collections(req.db))
    stats = [storage_stats(cl, 1) for cl in colls]
    objects = sum(len(cl.docs) for cl in colls)
    data = sum(int(st["size"]) for st in stats)
    index = sum(int(st["totalIndexSize"]) for st in stats)
    scale = int(scale)
    return {"db": req.db, "collections": len(colls), "views": len(storage.views(req.db)),
            "objects": Int64(objects), "avgObjSize": data / objects if objects else 0.0,
            "dataSize": Int64(data // scale), "storageSize": Int64(data // scale),
            "indexes": sum(len(cl.indexes) for cl in colls),
            "indexSize": Int64(index // scale), "totalSize": Int64((data + index) // scale),
            "scaleFactor": scale}
