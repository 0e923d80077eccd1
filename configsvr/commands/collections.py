"""Collections in the catalog: ``_configsvrShardCollection``, and the catalog side of the
``drop``/``renameCollection`` the router runs on the shards (``_configsvrDropCollection``,
``_configsvrRenameCollection``).
"""

from __future__ import annotations

import logging
import uuid as uuid_mod
from typing import TYPE_CHECKING, Any

from bson import Binary, ObjectId
from bson.timestamp import Timestamp

from shardsim.configsvr import catalog
from shardsim.configsvr import migration, placement_history
from shardsim.configsvr.catalog import chunk_doc, initial_chunks, split_ns
from shardsim.core.shard_key import KeyPattern
from shardsim.core.errors import view_error
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import shard as shrq
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr")
_UNSHARDABLE_DBS = ("admin", "local", "config")

commands = CommandFamily("collections")


@commands.handler(csrq.ShardCollection.NAME, privileges=priv.INTERNAL)
async def shard_collection(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """shardCollection (``create_collection_coordinator.cpp``): catalog entries, the
    collection with one UUID on every shard that gets chunks, and the ``shardCollection``
    no-op on the primary shard (``notifyChangeStreamsOnShardCollection``).
    ``{_configsvrShardCollection: ns, key, unique?, numInitialChunks?, presplitHashedZones?}``
    -> ``{collectionsharded: ns}``. Errors: InvalidNamespace (73), IllegalOperation (20) for
    admin/local/config, system and capped collections, BadValue (2) for a unique hashed key,
    AlreadyInitialized (23) when sharded with other options, the view error of a view."""
    ns = req.arg
    db, coll = split_ns(ns)
    pattern = KeyPattern.parse(req.get("key"))
    unique = bool(req.get("unique", False))
    if db in _UNSHARDABLE_DBS:
        raise MongoError(20, f"can't shard {db} database" if db != "config"
                         else "can't shard config database")
    if coll.startswith("system."):
        raise MongoError(20, f"can't shard system namespaces {ns}")
    if unique and pattern.is_hashed:
        raise MongoError(2, "hashed shard keys cannot be declared unique. It's possible to "
                            "ensure uniqueness on the hashed field by declaring an additional "
                            "(non-hashed) unique index on the field.")
    async with node.ddl_lock:
        existing = await node.find_all("collections", {"_id": ns})
        if existing:
            if existing[0]["key"] == pattern.pattern and bool(existing[0].get("unique")) == unique:
                return {"collectionsharded": ns}
            raise MongoError(23, f"sharding already enabled for collection {ns} with options "
                                 f"{{ key: {existing[0]['key']}, unique: "
                                 f"{str(bool(existing[0].get('unique'))).lower()} }}")
        dbe = await node.ensure_database(db)
        primary = dbe["primary"]
        listed = await node.on_shard(primary, db, {"listCollections": 1, "filter": {"name": coll}})
        infos = listed["cursor"]["firstBatch"]
        if infos and infos[0].get("type") == "view":
            raise view_error(ns)
        if infos:
            uuid = infos[0].get("info", {}).get("uuid") or Binary(uuid_mod.uuid4().bytes, 4)
            options = infos[0].get("options", {})
            count = (await node.on_shard(primary, db, {"count": coll}))["n"]
        else:
            uuid, options, count = Binary(uuid_mod.uuid4().bytes, 4), {}, 0
        if options.get("capped"):
            raise MongoError(20, "can't shard a capped collection")
        shards = [s["_id"] for s in await node.shards() if not s.get("draining")]
        chunks = initial_chunks(pattern, primary, shards, count,
                                      req.get("numInitialChunks"))
        owners = [primary] + sorted({c.shard for c in chunks} - {primary})
        for shard in owners:
            await node.on_shard(shard, db, shrq.EnsureCollection(
                coll, uuid=uuid, shardKey=pattern.pattern, options=options,
                primary=shard == primary).to_command())
            if pattern.pattern != {"_id": 1}:
                name = "_".join(f"{f}_{v}" for f, v in pattern.pattern.items())
                spec: dict[str, Any] = {"key": pattern.pattern, "name": name}
                if unique:
                    spec["unique"] = True
                cmd: dict[str, Any] = {"createIndexes": coll, "indexes": [spec]}
                if shard != primary:
                    cmd["fromMigrate"] = True
                try:
                    await node.on_shard(shard, db, cmd)
                except MongoError as exc:  # an index that exists with other options
                    if exc.code not in (85, 86, 68):
                        raise
        now = node.clock.now()
        epoch = ObjectId()
        await node.insert("collections", [{
            "_id": ns, "lastmodEpoch": epoch,
            "lastmod": catalog.date_now(),
            "timestamp": now, "uuid": uuid, "key": pattern.pattern, "unique": unique,
            "noBalance": False}])
        await node.insert("chunks", [
            chunk_doc(uuid, pattern, c, Timestamp(1, i), now)
            for i, c in enumerate(chunks)])
        o2 = {"shardCollection": ns, "shardKey": pattern.pattern, "unique": unique,
              "presplitHashedZones": bool(req.get("presplitHashedZones", False))}
        if options.get("capped"):
            o2["capped"] = True
        await node.on_shard(primary, db, shrq.Noop({"msg": {"shardCollection": ns}}, o2=o2, ns=ns,
                                                   ui=uuid).to_command())
        await migration.push_metadata(node, ns)  # every shard learns the collection's version
        committed = await placement_history.record(node, ns, {c.shard for c in chunks})
        await placement_history.notify(node, ns, set(owners), committed, ui=uuid)
        log.info("sharded %s on %s: %d chunks over %s", ns, pattern.pattern, len(chunks), owners)
        return {"collectionsharded": ns}


@commands.handler(csrq.DropCollection.NAME, privileges=priv.INTERNAL)
async def drop_collection_meta(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{_configsvrDropCollection: ns}`` -> ``{}``: remove the collection and its chunks from
    the catalog (the router drops the data on the shards)."""
    ns = req.arg
    async with node.ddl_lock:
        found = await node.find_all("collections", {"_id": ns})
        if found:
            await node.delete("chunks", {"uuid": found[0]["uuid"]})
            await node.delete("collections", {"_id": ns})
            await placement_history.record(node, ns, [])
    return {}


@commands.handler(csrq.RenameCollection.NAME, privileges=priv.INTERNAL)
async def rename_collection_meta(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{_configsvrRenameCollection: ns, to}`` -> ``{}``: the catalog entry of ``ns`` under
    ``to`` (a sharded target's entry and chunks are dropped first)."""
    src, dst = req.arg, req.get("to")
    async with node.ddl_lock:
        target = await node.find_all("collections", {"_id": dst})
        if target:
            await node.delete("chunks", {"uuid": target[0]["uuid"]})
            await node.delete("collections", {"_id": dst})
        found = await node.find_all("collections", {"_id": src})
        if found:
            entry = dict(found[0])
            entry["_id"] = dst
            await node.delete("collections", {"_id": src})
            await node.insert("collections", [entry])
        if target or found:
            await placement_history.record(node, dst, await placement_history.collection_owners(node, dst))
            if found:
                await placement_history.record(node, src, [])
    return {}
