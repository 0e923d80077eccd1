"""Databases in the catalog: ``_configsvrCreateDatabase`` (``enableSharding``, implicit
creation), ``_configsvrMovePrimary`` and ``_configsvrDropDatabase`` (the catalog side of a
``dropDatabase`` the router runs on the shards).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from shardsim.configsvr import placement_history
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import shard as shrq
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr")

commands = CommandFamily("databases")


@commands.handler(csrq.CreateDatabase.NAME, privileges=priv.INTERNAL)
async def create_database(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{_configsvrCreateDatabase: db, primaryShard?}`` -> ``{databaseVersion, primary}``: the
    database's catalog entry, created if missing (:meth:`ConfigServerNode.ensure_database`).
    Errors: InvalidNamespace (73) for a bad or reserved name, ShardNotFound (70)."""
    db = req.arg
    if not isinstance(db, str) or not db or "." in db:
        raise MongoError(73, f"invalid database name '{db}'")
    if db in ("admin", "local"):
        raise MongoError(73, f"Cannot create database '{db}'")
    async with node.ddl_lock:
        entry = await node.ensure_database(db, req.get("primaryShard"))
    return {"databaseVersion": entry["version"], "primary": entry["primary"]}


@commands.handler(csrq.MovePrimary.NAME, privileges=priv.INTERNAL)
async def move_primary(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """movePrimary (``move_primary_coordinator.cpp``): clone every unsharded collection of
    the database (same UUID, options, indexes, documents, all ``fromMigrate``) and its views
    to the new primary, give it the sharded collections' catalog entries too, switch
    ``config.databases.primary``, then drop the clones' sources on the old primary with
    ``fromMigrate`` (change streams see nothing). ``{_configsvrMovePrimary: db, to}`` ->
    ``{primary}``. Errors: InvalidNamespace (73), missing ``to`` (40414), NamespaceNotFound
    (26) for an unknown database, ShardNotFound (70)."""
    db, to = req.arg, req.get("to")
    if not isinstance(db, str) or not db:
        raise MongoError(73, f"invalid database name '{db}'")
    if not isinstance(to, str):
        raise MongoError(40414, "BSON field 'movePrimary.to' is missing but a required field")
    async with node.ddl_lock:
        found = await node.find_all("databases", {"_id": db})
        if not found:
            raise MongoError(26, f"Database {db} not found")
        entry = found[0]
        old = entry["primary"]
        if to not in {s["_id"] for s in await node.shards()}:
            raise MongoError(70, f"Shard {to} not found")
        if to == old:
            return {"primary": old}
        sharded = {c["_id"]: c for c in await node.find_all("collections")}
        listed = await node.on_shard(old, db, {"listCollections": 1, "cursor": {"batchSize": 1 << 30}})
        moved: list[str] = []
        views = [i for i in listed["cursor"]["firstBatch"] if i.get("type") == "view"]
        for info in listed["cursor"]["firstBatch"]:
            name = info["name"]
            if info.get("type", "collection") != "collection" or name.startswith("system."):
                continue
            ns = f"{db}.{name}"
            meta = sharded.get(ns)
            ensure = shrq.EnsureCollection(name, uuid=info.get("info", {}).get("uuid"),
                                           shardKey=meta["key"] if meta is not None else None,
                                           options=info.get("options", {}), primary=False)
            await node.on_shard(to, db, ensure.to_command())
            if meta is not None:
                continue  # its documents belong to chunks and stay where they are
            idx = await node.on_shard(old, db, {"listIndexes": name, "cursor": {"batchSize": 1 << 30}})
            specs = [i for i in idx["cursor"]["firstBatch"] if i.get("name") != "_id_"]
            if specs:
                await node.on_shard(to, db, {"createIndexes": name, "indexes": specs,
                                             "fromMigrate": True})
            docs = await node.shard_find_all(old, db, name)
            for i in range(0, len(docs), 1000):
                await node.on_shard(to, db, {"insert": name, "documents": docs[i:i + 1000],
                                             "ordered": False, "fromMigrate": True})
            moved.append(name)
        version = dict(entry.get("version") or {})
        version["lastMod"] = int(version.get("lastMod", 1)) + 1
        version["timestamp"] = node.clock.now()
        await node.update("databases", {"_id": db}, {"$set": {"primary": to, "version": version}})
        committed = await placement_history.record(node, db, [to])
        await placement_history.notify(node, db, {old, to}, committed)
        for name in moved:
            await node.on_shard(old, db, {"drop": name, "fromMigrate": True})
        await _move_views(node, db, views, old, to)
        log.info("moved primary of %s from %s to %s (%d collections)", db, old, to, len(moved))
        return {"primary": to}


async def _move_views(node: ConfigServerNode, db: str, views: list[dict[str, Any]], old: str,
                      to: str) -> None:
    """movePrimary of the view definitions (``system.views``): created on the new primary and
    dropped on the old one, both ``fromMigrate`` (``MovePrimaryCoordinator`` clones
    ``system.views`` with the other collections)."""
    for info in views:
        opts = dict(info.get("options", {}))
        cmd: dict[str, Any] = {"create": info["name"], "viewOn": opts.pop("viewOn"),
                               "pipeline": opts.pop("pipeline", []), "fromMigrate": True}
        if "collation" in opts:
            cmd["collation"] = opts["collation"]
        await node.on_shard(to, db, cmd)
    for info in views:
        await node.on_shard(old, db, {"drop": info["name"], "fromMigrate": True})


@commands.handler(csrq.DropDatabase.NAME, privileges=priv.INTERNAL)
async def drop_database_meta(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{_configsvrDropDatabase: db}`` -> ``{}``: remove the database, its sharded
    collections and their chunks from the catalog (the router drops the data on the shards)."""
    db = req.arg
    async with node.ddl_lock:
        for entry in await node.find_all("collections", {"_id": {"$regex": f"^{re.escape(db)}\\."}}):
            await node.delete("chunks", {"uuid": entry["uuid"]})
            await node.delete("collections", {"_id": entry["_id"]})
            await placement_history.record(node, entry["_id"], [])
        await node.delete("databases", {"_id": db})
        await placement_history.record(node, db, [])
    return {}
