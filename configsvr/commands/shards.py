"""Shards in the catalog: ``_configsvrAddShard`` and ``_configsvrRemoveShard`` (the router's
``addShard``/``removeShard``; ``configsvr_add_shard_command.cpp``,
``configsvr_remove_shard_command.cpp``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from bson.int64 import Int64

from shardsim.core.gossip import gossip_command
from shardsim.core.client import Pool, parse_address
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.replica_set_monitor import ConnectionString
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr")

commands = CommandFamily("shards")


@commands.handler(csrq.AddShard.NAME, privileges=priv.INTERNAL)
async def add_shard(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """addShard (``configsvr_add_shard_command.cpp``/``ShardingCatalogManager::addShard`` and
    ``_validateHostAsShard``): ``{_configsvrAddShard: "setName/host1:port1,host2:port2" |
    "host:port", name?}`` -> ``{shardAdded: name}``.

    ``hello`` runs on the seeds in order until one answers, then on the primary it names; the
    entry inserted into ``config.shards`` (which change streams see) has ``host``
    ``setName/<every member hello lists>`` (``hosts``, ``passives``, ``arbiters``: the
    connection string the replica-set monitor knows, ``RemoteCommandTargeterRS::
    connectionString``) and ``_id`` the given name or else the set name. Errors:
    BadValue (2) for a bad connection string or the name ``config``, FailedToParse (9) for a
    bad host, the connection's error ("failed to run command { hello: 1 } ..."),
    IllegalOperation (20) for a mongos, NotWritablePrimary (10107) without a primary,
    OperationFailed (96) for a set name that does not match, a seed that is not a member, or
    a host or name already in use. A plain ``host:port`` of a replica-set member is accepted
    (mongos refuses it with "host is part of set ...; use replica set url format"): shardsim
    stores the set form all the same (docs/replication.md)."""
    conn = ConnectionString.parse(req.arg)
    target = str(req.arg)
    proposed = req.get("name")
    if proposed is not None and (not isinstance(proposed, str) or not proposed):
        raise MongoError(2, "shard name cannot be empty")
    async with node.ddl_lock:
        pool, hello = await _hello_of_primary(node, conn, target)
        try:
            name, entry_host = _validate_host_as_shard(conn, hello, proposed)
        except MongoError:
            pool.close()
            raise
        existing = await node.shards()
        members = set(ConnectionString.parse(entry_host).hosts)
        for e in existing:
            known = set(ConnectionString.parse(e["host"]).hosts)
            overlap = sorted(members & known)
            if overlap:
                if proposed in (None, e["_id"]) and name in (e["_id"], hello.get("setName")):
                    pool.close()
                    return {"shardAdded": e["_id"]}
                pool.close()
                raise MongoError(96, f"'{overlap[0]}' is already a member of the existing "
                                     f"shard '{e['host']}' ({e['_id']}).")
        if not name:
            n = len(existing)
            taken = {e["_id"] for e in existing}
            while f"shard{n:04d}" in taken:
                n += 1
            name = f"shard{n:04d}"
        if any(e["_id"] == name for e in existing):
            pool.close()
            raise MongoError(96, f"A shard already exists with the name: '{name}'")
        node.forget_shard(name)
        pool.close()  # the shard's monitor (ConfigServerNode.shard_monitor) makes its own
        entry = {"_id": name, "host": entry_host, "state": 1,
                 "topologyTime": node.clock.now()}
        await node.insert("shards", [entry])
        log.info("added shard %s at %s", name, entry_host)
        return {"shardAdded": name}


async def _hello_of_primary(node: ConfigServerNode, conn: ConnectionString,
                            target: str) -> tuple[Pool, dict[str, Any]]:
    """``(pool, hello reply)`` of the set's primary: the seeds in order until one answers;
    when it is not primary and names one, the named primary. The last connection error as
    "failed to run command { hello: 1 } when attempting to add shard <target> :: caused by ::
    ..." when no seed answers."""
    failure: MongoError | None = None
    last: tuple[Pool, dict[str, Any]] | None = None
    tried: list[str] = []
    queue = list(conn.hosts)
    while queue:
        host = queue.pop(0)
        if host in tried:
            continue
        tried.append(host)
        pool = Pool(*parse_address(host))
        try:
            hello = await gossip_command(node.clock, pool, "admin", {"hello": 1}, timeout=10)
        except MongoError as exc:
            pool.close()
            failure = exc
            continue
        primary = hello.get("primary")
        if (not hello.get("isWritablePrimary") and hello.get("msg") != "isdbgrid"
                and isinstance(primary, str) and primary not in tried):
            queue.insert(0, primary)
            if last is not None:
                last[0].close()
            last = (pool, hello)
            continue
        if last is not None:
            last[0].close()
        return pool, hello
    if last is not None:
        return last  # a member answered, none is primary: the validation says so
    assert failure is not None
    raise MongoError(failure.code, f"failed to run command {{ hello: 1 }} when attempting to "
                                   f"add shard {target} :: caused by :: {failure.errmsg}")


def _validate_host_as_shard(conn: ConnectionString, hello: dict[str, Any],
                            proposed: str | None) -> tuple[str | None, str]:
    """``ShardingCatalogManager::_validateHostAsShard``: ``(name or None, config.shards host)``
    from the primary's ``hello``; the errors of :func:`add_shard`."""
    if hello.get("msg") == "isdbgrid":
        raise MongoError(20, "cannot add a mongos as a shard")
    if not (hello.get("isWritablePrimary") or hello.get("ismaster")):
        raise MongoError(10107, f"{conn} does not have a master. If this is a replica set, "
                                "ensure that it has a healthy primary and that the set has "
                                "been properly initiated.")
    found = hello.get("setName")
    if conn.set_name and not found:
        raise MongoError(96, "host did not return a set name; is the replica set still "
                             f"initializing? {hello}")
    if conn.set_name and conn.set_name != found:
        raise MongoError(96, f"the provided connection string ({conn}) does not match the "
                             f"actual set name {found}")
    if hello.get("configsvr"):
        raise MongoError(96, f"Cannot add {conn} as a shard since it is a config server")
    members = [h for key in ("hosts", "passives", "arbiters")
               for h in (hello.get(key) or []) if isinstance(h, str)]
    if conn.set_name:
        for host in conn.hosts:
            if host not in members:
                raise MongoError(96, f"in seed list {conn}, host {host} does not belong to "
                                     f"replica set {found}; found {hello}")
    name = proposed or found
    if name == "config":
        raise MongoError(2, "use of shard replica set with name 'config' is not allowed")
    if found:
        return name, str(ConnectionString.for_replica_set(found, members or conn.hosts))
    return name, str(conn)


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
        node.forget_shard(name)
        return {"msg": "removeshard completed successfully", "state": "completed", "shard": name}
