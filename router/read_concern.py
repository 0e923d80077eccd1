"""The router's side of ``readConcern`` (mongos ``strategy.cpp``/``cluster_find.cpp``): a
``snapshot`` read outside a transaction without ``atClusterTime`` gets the router's current
cluster time as its snapshot time, which is sent to every targeted shard (so all shards read the
same point in time) and returned to the client as ``atClusterTime`` (``cursor.atClusterTime``
for find/aggregate, top level for distinct). Validation (levels, snapshot only for
find/aggregate/distinct: InvalidOptions 72) is :func:`shardsim.core.read_concern.parse`; waiting for
``afterClusterTime`` is the shards' (:mod:`shard.read_concern`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable

from shardsim.core.commands import Request
from shardsim.core.read_concern import CURSOR_COMMANDS, attach_cluster_time, parse

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode


async def run_with_read_concern(node: "RouterNode", handler: Callable[[Request], Awaitable[dict]],
                                req: Request) -> dict[str, Any]:
    """Run ``handler(req)``; for a snapshot read, pin ``atClusterTime`` first and report it."""
    name = node.commands.canonical(req.name)
    if name in CURSOR_COMMANDS:  # any readConcern, checked for its shape and ignored
        parse(req.body, name, node.clock.now(), snapshot_ok=True)
        return await handler(req)
    rc = parse(req.body, name, node.clock.now(),
               snapshot_ok=node.commands.spec(req.name).snapshot)
    if rc is None or not rc.snapshot or req.body.get("autocommit") is False:
        return await handler(req)
    at = rc.at or node.clock.now()
    req.body["readConcern"] = {**req.body["readConcern"], "atClusterTime": at}
    reply = await handler(req)
    attach_cluster_time(reply, at)
    return reply
