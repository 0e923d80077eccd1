"""Writes through the router: ``insert``, ``update``, ``delete``, ``findAndModify`` (mongos'
``cluster_write_cmd.cpp`` and ``cluster_find_and_modify_cmd.cpp``).

The handlers only choose the path: the ``config``/``admin`` databases belong to the config
server (:func:`router.commands.admin.config_write`); everything else is targeted by shard key
and executed by :mod:`router.writes`, which forwards a retryable write's ``lsid``/``txnNumber``/
``stmtIds`` so the shards' session records keep it exactly-once (:mod:`router.retryable_writes`)
and registers transaction participants (:mod:`router.transactions`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.router import writes
from shardsim.router.commands.admin import CONFIG_DATABASES, config_write
from shardsim.router.forwarding import namespace
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("crud")


@commands.handler("insert", versioned=True, retryable_write=True, privileges=priv.insert_privileges)
async def insert(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{insert, documents}`` -> ``{n, [writeErrors]}``; see :func:`router.writes.run_write`."""
    if req.db in CONFIG_DATABASES:
        return await config_write(node, req)
    return await writes.run_write(node, req, "insert")


@commands.handler("update", versioned=True, retryable_write=True, privileges=priv.update_privileges)
async def update(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{update, updates}`` -> ``{n, nModified, [upserted], [writeErrors]}``; see
    :func:`router.writes.run_write`."""
    if req.db in CONFIG_DATABASES:
        return await config_write(node, req)
    return await writes.run_write(node, req, "update")


@commands.handler("delete", versioned=True, retryable_write=True, privileges=priv.on_coll("remove"))
async def delete(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{delete, deletes}`` -> ``{n, [writeErrors]}``; see :func:`router.writes.run_write`."""
    if req.db in CONFIG_DATABASES:
        return await config_write(node, req)
    return await writes.run_write(node, req, "delete")


@commands.handler("findAndModify", "findandmodify", versioned=True, retryable_write=True, privileges=priv.find_and_modify_privileges)
async def find_and_modify(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{findAndModify, query, update|remove, ...}`` -> ``{lastErrorObject, value}``;
    InvalidNamespace (73) for a bad collection name; see :func:`router.writes.find_and_modify`."""
    namespace(req)
    return await writes.find_and_modify(node, req)
