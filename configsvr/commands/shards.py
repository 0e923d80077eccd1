"""Shards in the catalog: ``_configsvrAddShard`` and ``_configsvrRemoveShard`` (the router's
``addShard``/``removeShard``; ``configsvr_add_shard_command.cpp``,
``configsvr_remove_shard_command.cpp``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from bson.int64 import Int64

from shardsim.configsvr.catalog import shard_host
from shardsim.core.gossip import gossip_command
from shardsim.core.client import Pool, parse_address
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr")

commands = CommandFamily("shards")


@commands.handler(csrq.AddShard.NAME, privileges=priv.INTERNAL)
async def add_shard(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """addShard (``configsvr_add_shard_command.cpp``/``ShardingCatalogManager::addShard``):
    ``{_configsvrAddShard: "<name>/host:port" | "host:port", name?}`` -> ``{shardAdded: name}``
    (the entry inserted into config.shards, which change streams see). Errors: BadValue (2)
    for a bad connection string, the connection's error, IllegalOperation (96) for a mongos,
    an address or name already in use."""
    target = req.arg
    if not isinstance(target, str) or not target:
        raise MongoError(2, "Invalid connection string")
    conn_str = target.split("/", 1)[-1]
    host, port = parse_address(conn_str.split(",")[0])
    async with node.ddl_lock:
        pool = Pool(host, port)
        try:
            hello = await gossip_command(node.clock, pool, "admin", {"hello": 1}, timeout=10)
        except MongoError as exc:
            pool.close()
            raise MongoError(exc.code, f"failed to run command {{ hello: 1 }} when attempting "
                                       f"to add shard {target} :: caused by :: {exc.errmsg}")
        if hello.get("msg") == "isdbgrid":
            pool.close()
            raise MongoError(96, "can't add a mongos process as a shard")
        existing = await node.shards()
        address = f"{host}:{port}"
        name = req.get("name") or hello.get("setName")
        for e in existing:
            if "%s:%s" % shard_host(e) == address:
                if name in (None, e["_id"]):
                    pool.close()
                    return {"shardAdded": e["_id"]}
                raise MongoError(96, f"'{address}' is already a member of the existing "
                                     f"shard '{e['host']}' ({e['_id']}).")
        if not name:
            n = len(existing)
            taken = {e["_id"] for e in existing}
            while f"shard{n:04d}" in taken:
                n += 1
            name = f"shard{n:04d}"
        if any(e["_id"] == name for e in existing):
            raise MongoError(96, f"A shard already exists with the name: '{name}'")
        node.shard_pools[name] = pool
        entry = {"_id": name, "host": f"{name}/{address}", "state": 1,
                 "topologyTime": node.clock.now()}
        await node.insert("shards", [entry])
        log.info("added shard %s at %s", name, address)
        return {"shardAdded": name}


@commands.handler(csrq.RemoveShard.NAME, privileges=priv.INTERNAL)
async def remove_shard(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """removeShard (``ShardingCatalogManager::removeShard``): ``started``/``ongoing`` while
    the shard still owns chunks or is a database primary; the balancer moves its chunks off
    (:mod:`configsvr.balancer`), the user moves the databases it is primary for with
    ``movePrimary`` (``dbsToMove``), as in 8.0; ``completed`` once empty.
    Errors: ShardNotFound (70), IllegalOperation (20) for the last shard."""
    name = req.arg
    async with node.ddl_lock:
        shards = await node.shards()
        entry = next((s for s in shards if s["_id"] == name), None)
        if entry is None:
            raise MongoError(70, f"Shard {name} not found")
        if len(shards) == 1:
            raise MongoError(20, "Operation not allowed because it would remove the last shard")
        chunks = await node.find_all("chunks", {"shard": name})
        dbs = [d["_id"] for d in await node.find_all("databases", {"primary": name})]
        if chunks or dbs:
            note = ("you need to call moveCollection for collectionsToMove and afterwards "
                    "movePrimary for the dbsToMove")
            if not entry.get("draining"):
                await node.update("shards", {"_id": name}, {"$set": {"draining": True}})
                node.balancer.wake()  # the balancer moves its chunks off
                return {"msg": "draining started successfully", "state": "started",
                        "shard": name, "note": note, "dbsToMove": dbs, "collectionsToMove": []}
            return {"msg": "draining ongoing", "state": "ongoing",
                    "remaining": {"chunks": Int64(len(chunks)), "dbs": Int64(len(dbs)),
                                  "jumboChunks": Int64(0)},
                    "note": note, "dbsToMove": dbs, "collectionsToMove": []}
        await node.delete("shards", {"_id": name})
        pool = node.shard_pools.pop(name, None)
        if pool:
            pool.close()
        return {"msg": "removeshard completed successfully", "state": "completed", "shard": name}
