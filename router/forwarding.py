"""How the router passes a client command on to a shard or the config server, and its reply
back: the request fields it replaces, the reply fields it drops, and the small request-shape
helpers every command family uses. No node state here, so command modules and
:mod:`router.node` can both import it (no import cycle).
"""

from __future__ import annotations

from typing import Any

from shardsim.core.commands import Request
from shardsim.core.errors import MongoError

# Fields of a client command the router does not forward as such (the router adds its own
# $clusterTime; $readPreference and the other $-fields are for the router only).
_STRIP = frozenset({"$db", "$clusterTime", "$readPreference", "$audit", "$client",
                    "$configServerState", "$configTime", "$topologyTime"})
# Fields of a shard's reply the router replaces with its own (Node.cluster_time_fields).
_REPLY_STRIP = ("ok", "$clusterTime", "operationTime")
# batchSize of the router's own cursors on shards: read every cursor in one batch.
BIG_BATCH = 1 << 30


def forwardable(body: dict[str, Any]) -> dict[str, Any]:
    """A client command body without the fields the router replaces (``$db``, gossip)."""
    return {k: v for k, v in body.items() if k not in _STRIP}


def reply_body(reply: dict[str, Any]) -> dict[str, Any]:
    """A shard's (or the config server's) reply without ``ok``/``$clusterTime``/
    ``operationTime``: the router's own reply adds those for itself."""
    return {k: v for k, v in reply.items() if k not in _REPLY_STRIP}


def namespace(req: Request) -> tuple[str, str]:
    """``(db, collection)`` of a command whose first value names a collection
    (``{find: "c", $db: "d"}`` -> ``("d", "c")``); InvalidNamespace (73) when that value is not
    a non-empty string."""
    coll = req.arg
    if not isinstance(coll, str) or not coll:
        raise MongoError(73, f"Invalid namespace specified '{req.db}.{coll}'")
    return req.db, coll


def session_fields(req: Request) -> dict[str, Any]:
    """The fields a getMore on a shard must repeat for a read inside a transaction
    (``lsid``/``txnNumber``/``autocommit``); ``{}`` outside one."""
    if req.get("autocommit") is False:
        return {k: req.body[k] for k in ("lsid", "txnNumber", "autocommit") if k in req.body}
    return {}
