"""The balancer's commands on the config server (``configsvr_balancer_control_command.cpp``,
``configsvr_balancer_collection_status_command.cpp``); the router's ``balancerStart``,
``balancerStop``, ``balancerStatus`` and ``balancerCollectionStatus`` forward here. The
balancer itself is :mod:`configsvr.balancer`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from shardsim.configsvr.catalog import split_ns
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

commands = CommandFamily("balancer")


@commands.handler(csrq.BalancerStart.NAME, privileges=priv.INTERNAL)
async def balancer_start(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{}``: balancer mode ``full`` in ``config.settings``; the next round starts now."""
    await node.balancer.set_mode("full")
    return {}


@commands.handler(csrq.BalancerStop.NAME, privileges=priv.INTERNAL)
async def balancer_stop(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{}``: balancer mode ``off``; waits for a round in progress to end, as the server
    does (``Balancer::joinCurrentRound``)."""
    await node.balancer.set_mode("off")
    while node.balancer.in_round:
        await asyncio.sleep(0.02)
    return {}


@commands.handler(csrq.BalancerStatus.NAME, privileges=priv.INTERNAL)
async def balancer_status(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{mode: "full" | "off", inBalancerRound, numBalancerRounds: Long, term: Long}``."""
    settings = await node.balancer.settings()
    return node.balancer.status(settings["mode"])


@commands.handler(csrq.BalancerCollectionStatus.NAME, privileges=priv.INTERNAL)
async def balancer_collection_status(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{balancerCompliant: bool, firstComplianceViolation?: "draining" |
    "chunksImbalance"}`` for one sharded collection (``Balancer::getBalancerStatusForNs``).
    Errors: InvalidNamespace (73), NamespaceNotSharded (118)."""
    ns = req.arg
    split_ns(ns, "balancerCollectionStatus")
    found = await node.find_all("collections", {"_id": ns})
    if not found or found[0].get("unsplittable"):
        raise MongoError(118, f"Collection {ns} is not sharded.")
    settings = await node.balancer.settings()
    _, info = await node.balancer.candidates(settings["chunk_size"], only=ns)
    if info["violation"] is None:
        return {"balancerCompliant": True}
    return {"balancerCompliant": False, "firstComplianceViolation": info["violation"]}
