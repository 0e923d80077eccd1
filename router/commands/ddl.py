"""DDL and catalog listing through the router: ``create``, ``drop``, ``renameCollection``,
``dropDatabase``, ``createIndexes``, ``dropIndexes``, ``collMod``, ``listDatabases``,
``listCollections``, ``listIndexes`` (mongos' ``cluster_create_cmd.cpp``,
``cluster_drop_collection_cmd.cpp``, ``cluster_rename_collection_cmd.cpp``, ...,
``cluster_list_databases_cmd.cpp``).

DDL runs on the namespace's primary shard first, then on every other shard owning it with
``fromMigrate: true`` (:func:`broadcast_ddl`), so a change stream sees each event once. Dropping
or renaming a sharded collection, or dropping a database, also updates the config server's
catalog and refreshes the router's cache.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from shardsim.core import authorized_listing
from shardsim.router.commands.admin import CONFIG_DATABASES, config_read
from shardsim.router.forwarding import BIG_BATCH, forwardable, namespace, reply_body, session_fields
from shardsim.core.client import remote_error
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("ddl")


async def broadcast_ddl(node: "RouterNode", db: str, body: dict[str, Any],
                        shards: list[str]) -> dict[str, Any]:
    """Run the DDL command ``body`` on ``shards[0]`` (the primary: its oplog entry is the one
    change streams see), then concurrently on the other ``shards`` with ``fromMigrate: true``.
    Returns the primary's reply body. Raises ShardNotFound (70) for no shards, the primary's
    error, or another shard's error other than NamespaceNotFound (26) / IndexNotFound (27)."""
    if not shards:
        raise MongoError(70, "No shards found")
    reply = await node.shard_command(shards[0], db, body)
    if len(shards) > 1:
        quiet = dict(body)
        quiet["fromMigrate"] = True
        results = await asyncio.gather(*(node.shard_command(s, db, quiet, check=False)
                                         for s in shards[1:]))
        for res in results:
            if not res.get("ok") and res.get("code") not in (26, 27):
                raise remote_error(res)
    return reply_body(reply)


# -- DDL ----------------------------------------------------------------------------------------
@commands.handler("create", privileges=priv.on_coll("createCollection"))
async def create(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{create, ...options}`` on the database's primary shard (creating the database entry
    first if needed; InvalidNamespace 73 for admin/config/local or a bad name)."""
    db, _ = namespace(req)
    primary = await node.ensure_database(db)
    return await broadcast_ddl(node, db, forwardable(req.body), [primary])


@commands.handler("createIndexes", privileges=priv.on_coll("createIndex"))
@commands.handler("dropIndexes", "deleteIndexes", privileges=priv.on_coll("dropIndex"))
@commands.handler("collMod", privileges=priv.on_coll("collMod"))
async def on_owners(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``createIndexes``/``dropIndexes``/``collMod`` on every shard owning the collection (the
    primary shard for an unsharded one); NamespaceNotFound (26) when there is no shard."""
    db, coll = namespace(req)
    ns = f"{db}.{coll}"
    if node.commands.canonical(req.name) == "createIndexes":
        await node.ensure_database(db)
    shards = node.catalog.shards_for_ns(ns) or [node.read_primary(db)]
    if shards[0] is None:
        raise MongoError(26, f"ns does not exist: {ns}")
    return await broadcast_ddl(node, db, forwardable(req.body), shards)


@commands.handler("drop", privileges=priv.on_coll("dropCollection"))
async def drop(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{drop}`` on every owner; a sharded collection is also dropped from the catalog
    (``_configsvrDropCollection``) even when a shard fails. NamespaceNotFound (26) without
    shards."""
    db, coll = namespace(req)
    ns = f"{db}.{coll}"
    sharded = node.catalog.collection(ns) is not None
    shards = node.catalog.shards_for_ns(ns) or [node.read_primary(db)]
    if shards[0] is None:
        raise MongoError(26, "ns not found")
    try:
        return await broadcast_ddl(node, db, forwardable(req.body), shards)
    finally:
        if sharded:
            await node.config_command(csrq.DropCollection(ns).to_command())
            await node.catalog.refresh()


@commands.handler("renameCollection", privileges=priv.rename_privileges)
async def rename_collection(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{renameCollection: "db.a", to: "db.b", dropTarget}`` (on ``admin``) on every shard
    owning either namespace; the catalog follows for sharded ones. InvalidNamespace (73) for
    a bad name, IllegalOperation (20) across primary shards, NamespaceNotFound (26)."""
    src, dst = req.arg, req.get("to")
    if not isinstance(src, str) or "." not in src:
        raise MongoError(73, f"Invalid source namespace: {src}")
    if not isinstance(dst, str) or "." not in dst:
        raise MongoError(73, f"Invalid target namespace: {dst}")
    sdb, ddb = src.split(".", 1)[0], dst.split(".", 1)[0]
    catalog = node.catalog
    if sdb != ddb and catalog.primary_shard(sdb) != catalog.primary_shard(ddb):
        raise MongoError(20, "Source and destination collections must be on the same "
                             "database primary shard")
    sharded = catalog.collection(src) is not None or catalog.collection(dst) is not None
    shards = catalog.shards_for_ns(src) or [node.read_primary(sdb)]
    for s in catalog.shards_for_ns(dst):
        if s not in shards:
            shards.append(s)
    if shards[0] is None:
        raise MongoError(26, "Source collection does not exist")
    try:
        return await broadcast_ddl(node, "admin", forwardable(req.body), shards)
    finally:
        if sharded:
            await node.config_command(csrq.RenameCollection(src, dst).to_command())
            await catalog.refresh()


@commands.handler("dropDatabase", privileges=priv.on_db("dropDatabase"))
async def drop_database(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{dropDatabase: 1}`` on every shard (primary first) and in the catalog; ``{}`` when
    there is no shard. IllegalOperation (20) for admin/config/local."""
    db = req.db
    if db in ("admin", "config", "local"):
        raise MongoError(20, f"Cannot drop '{db}' database through the router")
    primary = node.read_primary(db)
    if primary is None:
        return {}
    shards = [primary] + [s for s, _, _ in node.catalog.shards() if s != primary]
    known = node.catalog.primary_shard(db) is not None
    try:
        reply = await broadcast_ddl(node, db, forwardable(req.body), shards)
    finally:
        if known:
            await node.config_command(csrq.DropDatabase(db).to_command())
            await node.catalog.refresh()
    return reply


# -- catalog listing ----------------------------------------------------------------------------
@commands.handler("listDatabases", privileges=priv.AUTH_ONLY)
async def list_databases(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{databases: [{name, sizeOnDisk, empty}], totalSize, totalSizeMb}`` summed over every
    shard, with ``config`` and ``admin`` always listed; ``nameOnly`` -> ``[{name}]``. Only the
    databases the user may see (:mod:`shardsim.core.authorized_listing`)."""
    body = forwardable(req.body)
    targets = [s for s, _, _ in node.catalog.shards()]
    replies = await asyncio.gather(*(node.shard_command(s, "admin", body) for s in targets))
    sizes: dict[str, int] = {}
    for rep in replies:
        for d in rep.get("databases", []):
            if d["name"] in ("admin", "config", "local"):
                continue
            sizes[d["name"]] = sizes.get(d["name"], 0) + int(d.get("sizeOnDisk", 0) or 0)
    sizes.setdefault("config", 4096)
    sizes.setdefault("admin", 4096)
    shown = set(await authorized_listing.filter_databases(node, req, sorted(sizes)))
    sizes = {n: s for n, s in sizes.items() if n in shown}
    if req.get("nameOnly"):
        return {"databases": [{"name": n} for n in sorted(sizes)]}
    total = sum(sizes.values())
    return {"databases": [{"name": n, "sizeOnDisk": s, "empty": s == 0}
                          for n, s in sorted(sizes.items())],
            "totalSize": total, "totalSizeMb": total // (1024 * 1024)}


@commands.handler("listCollections", privileges=priv.list_collections_privileges)
async def list_collections(node: "RouterNode", req: Request) -> dict[str, Any]:
    """A cursor over the primary shard's ``listCollections`` (the config server's for
    ``config``/``admin``; empty without shards); ``authorizedCollections`` + ``nameOnly``
    lists only what the user may see (:mod:`shardsim.core.authorized_listing`)."""
    db = req.db
    ns = f"{db}.$cmd.listCollections"
    batch_size = (req.get("cursor") or {}).get("batchSize")
    if db in CONFIG_DATABASES:
        return await config_read(node, req, "listCollections")
    shard = node.read_primary(db)
    if shard is None:
        return await node.cursor_reply(ns, [], req, batch_size)
    body = forwardable(req.body)
    body["cursor"] = {"batchSize": BIG_BATCH}
    _, docs = await node.drain(shard, db, body, session=session_fields(req))
    docs = await authorized_listing.filter_collections(node, req, docs)
    return await node.cursor_reply(ns, docs, req, batch_size)


@commands.handler("listIndexes", privileges=priv.on_coll("listIndexes"))
async def list_indexes(node: "RouterNode", req: Request) -> dict[str, Any]:
    """A cursor over the ``listIndexes`` of the first shard owning the collection;
    InvalidNamespace (73), NamespaceNotFound (26) without shards."""
    db, coll = namespace(req)
    if db in CONFIG_DATABASES:
        return await config_read(node, req, "listIndexes")
    ns = f"{db}.{coll}"
    batch_size = (req.get("cursor") or {}).get("batchSize")
    shards = node.catalog.shards_for_ns(ns) or [node.read_primary(db)]
    if shards[0] is None:
        raise MongoError(26, f"ns does not exist: {ns}")
    body = forwardable(req.body)
    body["cursor"] = {"batchSize": BIG_BATCH}
    _, docs = await node.drain(shards[0], db, body)
    return await node.cursor_reply(ns, docs, req, batch_size)
