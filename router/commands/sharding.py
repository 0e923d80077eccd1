"""Sharding administration through the router (``admin`` database): ``addShard``,
``listShards``, ``removeShard``, ``enableSharding``, ``shardCollection``, ``split``,
``moveChunk``, ``movePrimary``, ``flushRouterConfig`` and the ``balancer*`` commands (mongos'
``cluster_add_shard_cmd.cpp``, ``cluster_shard_collection_cmd.cpp``,
``cluster_move_chunk_cmd.cpp``, ...).

Each one runs on the config server under its internal name (``_configsvrAddShard``, ...; see
:mod:`configsvr.node`), then the router refreshes its catalog cache. The ``balancer*`` commands are answered by
the config server's balancer (:mod:`configsvr.balancer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.router import writes
from shardsim.router.forwarding import reply_body
from shardsim.core.commands import CommandFamily, Request, check_type
from shardsim.core.errors import MongoError
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("sharding")


def admin_only(req: Request) -> None:
    """Unauthorized (13) unless ``req`` runs on the ``admin`` database."""
    if req.db != "admin":
        raise MongoError(13, f"{req.name} may only be run against the admin database.")


async def run_on_config(node: "RouterNode", cmd: dict[str, Any],
                        hold_writes_to: str | None = None) -> dict[str, Any]:
    """Run ``cmd`` on the config server, refresh the routing cache, and return the reply
    without ok/$clusterTime/operationTime (raises the config server's MongoError). With
    ``hold_writes_to`` (a namespace or a database), this router's writes there are held until
    it is done (:class:`router.writes.NamespaceGate`): ``movePrimary`` has no catch-up phase, so
    no write may land on the old primary after its documents were copied."""
    if hold_writes_to is not None:
        gate = writes.gate_for(node, hold_writes_to)
        await gate.block()
        try:
            return await run_on_config(node, cmd)
        finally:
            await gate.unblock()
    reply = await node.config_command(cmd)
    await node.catalog.refresh()
    return reply_body(reply)


@commands.handler("addShard", "addshard", privileges=priv.on_cluster("addShard"))
async def add_shard(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{addShard: "host:port", name}`` -> ``{shardAdded}``."""
    admin_only(req)
    return await run_on_config(node, csrq.AddShard.forward(req.arg, req.body).to_command())


@commands.handler("listShards", "listshards", privileges=priv.on_cluster("listShards"))
async def list_shards(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{shards: [config.shards documents]}``, after refreshing the catalog cache."""
    admin_only(req)
    await node.catalog.refresh()
    return {"shards": node.catalog.shard_docs()}


@commands.handler("removeShard", "removeshard", privileges=priv.on_cluster("removeShard"))
async def remove_shard(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{removeShard: name}`` -> ``{state: "started"|"ongoing"|"completed", ...}``."""
    admin_only(req)
    return await run_on_config(node, csrq.RemoveShard(req.arg).to_command())


@commands.handler("enableSharding", "enablesharding", privileges=priv.on_full_ns("enableSharding"))
async def enable_sharding(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{enableSharding: db, primaryShard}``: create the database entry; ``{}``."""
    admin_only(req)
    await node.config_command(csrq.CreateDatabase.forward(req.arg, req.body).to_command())
    await node.catalog.refresh()
    return {}


@commands.handler("shardCollection", "shardcollection", privileges=priv.on_full_ns("enableSharding"))
async def shard_collection(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{shardCollection: ns, key, unique, numInitialChunks, ...}`` -> ``{collectionsharded}``;
    TypeMismatch (14) / IDLFailedToParse (40414) for a bad or missing ``key``."""
    admin_only(req)
    check_type(req, "key", dict, "object", required=True)
    return await run_on_config(node, csrq.ShardCollection.forward(req.arg, req.body).to_command())


@commands.handler("split", privileges=priv.on_full_ns("splitChunk"))
async def split(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{split: ns, middle|find|bounds}``: split one chunk."""
    admin_only(req)
    return await run_on_config(node, csrq.SplitChunk.forward(req.arg, req.body).to_command())


@commands.handler("moveChunk", "movechunk", privileges=priv.on_full_ns("moveChunk"))
async def move_chunk(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{moveChunk: ns, find|bounds, to}``: migrate one chunk. Writes through this router go
    on meanwhile: the migration's catch-up and the donor's critical section keep them
    (``configsvr/migration.py``), as on mongos."""
    admin_only(req)
    return await run_on_config(node, csrq.MoveChunk.forward(req.arg, req.body).to_command())


@commands.handler("movePrimary", "moveprimary", privileges=priv.on_full_ns("moveChunk"))
async def move_primary(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{movePrimary: db, to}``: move the database's unsharded collections."""
    admin_only(req)
    # This router's writes to the database are held while its collections are copied.
    return await run_on_config(node, csrq.MovePrimary.forward(req.arg, req.body).to_command(),
                               hold_writes_to=str(req.arg))


@commands.handler("flushRouterConfig", "flushrouterconfig", privileges=priv.on_cluster("flushRouterConfig"))
async def flush_router_config(node: "RouterNode", req: Request) -> dict[str, Any]:
    """Reload the catalog cache now; ``{flushed: true}``."""
    await node.catalog.refresh()
    return {"flushed": True}


@commands.handler("balancerStatus", privileges=priv.on_config_settings("find"))
async def balancer_status(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{mode: "full" | "off", inBalancerRound, numBalancerRounds, term}`` from the config
    server's balancer (``cluster_balancer_control_cmd.cpp`` -> ``_configsvrBalancerStatus``)."""
    admin_only(req)
    return reply_body(await node.config_command(csrq.BalancerStatus(1).to_command()))


@commands.handler("balancerStart", privileges=priv.on_config_settings("update"))
async def balancer_start(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{}``: turn the balancer on (``_configsvrBalancerStart``); a round starts at once."""
    admin_only(req)
    return reply_body(await node.config_command(csrq.BalancerStart(1).to_command()))


@commands.handler("balancerStop", privileges=priv.on_config_settings("update"))
async def balancer_stop(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{}``: turn the balancer off (``_configsvrBalancerStop``; waits for the current round)."""
    admin_only(req)
    return reply_body(await node.config_command(csrq.BalancerStop(1).to_command()))


@commands.handler("balancerCollectionStatus", privileges=priv.on_full_ns("enableSharding"))
async def balancer_collection_status(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{balancerCollectionStatus: ns}`` -> ``{balancerCompliant, firstComplianceViolation?}``
    (``cluster_balancer_collection_status_cmd.cpp``). 73 for a bad namespace, 118 when not
    sharded."""
    admin_only(req)
    return reply_body(await node.config_command(csrq.BalancerCollectionStatus(req.arg).to_command()))
