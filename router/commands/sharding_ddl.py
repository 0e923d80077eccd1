"""The 8.0 sharding DDL through the router (``admin`` database unless noted):
``reshardCollection``, ``moveCollection``, ``unshardCollection``, ``refineCollectionShardKey``,
``mergeChunks``, ``setAllowMigrations`` and ``checkMetadataConsistency`` (any database;
mongos' ``cluster_reshard_collection_cmd.cpp``, ``cluster_move_collection_cmd.cpp``,
``cluster_unshard_collection_cmd.cpp``, ``cluster_refine_collection_shard_key_cmd.cpp``,
``cluster_merge_chunks_cmd.cpp``, ``cluster_set_allow_migrations_cmd.cpp``,
``cluster_check_metadata_consistency_cmd.cpp``).

Each runs on the config server (:mod:`configsvr.commands.resharding`,
:mod:`configsvr.commands.metadata`), then the router refreshes its catalog cache. A resharding
runs in two steps: the clone (with the catch-up of the writes made meanwhile), then the commit
inside the donors' critical section, which holds the writes of every router (they get
StaleConfig afterwards and go by the new routing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.router.commands.sharding import admin_only, run_on_config
from shardsim.router.forwarding import reply_body
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("sharding_ddl")


async def _reshard(node: "RouterNode", req: Request, provenance: str,
                   fields: tuple[str, ...]) -> dict[str, Any]:
    """Clone, then commit (abort on error). Writes through this router go on meanwhile, as
    through any other: the donors' critical section during the commit holds them and they are
    retried by the new routing table (:mod:`configsvr.resharding`)."""
    admin_only(req)
    ns = req.arg
    request = csrq.ReshardCollection.forward(ns, req.body, only=fields, provenance=provenance)
    cmd = request.to_command()
    first = reply_body(await node.config_command({**cmd, "phase": "clone"}))
    if first.get("noop"):
        return {}
    try:
        await node.config_command({**cmd, "phase": "commit"})
    except MongoError:
        try:
            await node.config_command({**cmd, "phase": "abort"})
        except MongoError:
            pass
        raise
    finally:
        await node.catalog.refresh()
    return {}


@commands.handler("reshardCollection", privileges=priv.on_full_ns("reshardCollection"))
async def reshard_collection(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{reshardCollection: ns, key, unique?, numInitialChunks?, forceRedistribution?}`` ->
    ``{}`` (same key without ``forceRedistribution``: nothing to do). Errors: 73, 40414, 118."""
    return await _reshard(node, req, "reshardCollection",
                          ("key", "unique", "numInitialChunks", "forceRedistribution",
                           "collation"))


@commands.handler("moveCollection", privileges=priv.on_full_ns("moveCollection"))
async def move_collection(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{moveCollection: ns, toShard}`` -> ``{}``: an unsharded collection to another shard.
    Errors: 40414 without ``toShard``, NamespaceNotFound (26) for a missing or sharded
    collection, ShardNotFound (70)."""
    return await _reshard(node, req, "moveCollection", ("toShard",))


@commands.handler("unshardCollection", privileges=priv.on_full_ns("unshardCollection"))
async def unshard_collection(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{unshardCollection: ns, toShard?}`` -> ``{}``: all of a sharded collection onto one
    shard (default: the one with the least data). NamespaceNotSharded (118), 70."""
    return await _reshard(node, req, "unshardCollection", ("toShard",))


@commands.handler("refineCollectionShardKey", privileges=priv.on_full_ns("refineCollectionShardKey"))
async def refine_collection_shard_key(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{refineCollectionShardKey: ns, key}`` -> ``{}``. Errors: 73, 40414, 118, 72."""
    admin_only(req)
    return await run_on_config(
        node, csrq.RefineCollectionShardKey.forward(req.arg, req.body).to_command())


@commands.handler("mergeChunks", privileges=priv.on_full_ns("splitChunk"))
async def merge_chunks(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{mergeChunks: ns, bounds: [min, max]}`` -> ``{}``. Errors: 73, 40414, 118, 2, 20."""
    admin_only(req)
    return await run_on_config(node, csrq.CommitChunksMerge.forward(req.arg, req.body).to_command())


@commands.handler("setAllowMigrations", privileges=priv.on_full_ns("setAllowMigrations"))
async def set_allow_migrations(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{setAllowMigrations: ns, allowMigrations: bool}`` -> ``{}``. 73, 40414, 14, 118."""
    admin_only(req)
    return await run_on_config(node,
                               csrq.SetAllowMigrations.forward(req.arg, req.body).to_command())


@commands.handler("checkMetadataConsistency", privileges=priv.checked("checkMetadataConsistency"))
async def check_metadata_consistency(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{checkMetadataConsistency: 1 | "<coll>", cursor?: {batchSize}}`` on ``admin`` (the
    cluster), a database or one collection -> ``{cursor: {id, ns:
    "<db>.$cmd.checkMetadataConsistency", firstBatch}}`` of ``{type, description, details}``
    documents, empty when the catalog and the shards agree. Errors: InvalidNamespace (73) for
    ``config``/``local`` or a collection level on ``admin``, NamespaceNotFound (26) for a
    database the catalog does not know, TypeMismatch (14) for another argument type."""
    db, arg = req.db, req.arg
    if db in ("config", "local"):
        raise MongoError(73, f"Invalid db name: {db}")
    if isinstance(arg, str):
        if db == "admin":
            raise MongoError(73, "Cannot run collection-level checkMetadataConsistency on the "
                                 "admin database")
    elif isinstance(arg, bool) or not isinstance(arg, (int, float)) or arg != 1:
        raise MongoError(14, "checkMetadataConsistency argument must be 1 or a collection name")
    if db != "admin":
        await node.refresh_on_database_miss(db)
        if node.catalog.primary_shard(db) is None:
            raise MongoError(26, f"Database {db} not found")
    reply = reply_body(await node.config_command(
        csrq.CheckMetadataConsistency(arg if isinstance(arg, str) else 1, db=db).to_command()))
    batch_size = (req.get("cursor") or {}).get("batchSize")
    return await node.cursor_reply(f"{db}.$cmd.checkMetadataConsistency",
                                   list(reply["inconsistencies"]), req, batch_size)
