"""The router's administrative commands, and the passthrough of the ``config``/``admin``
databases to the config server.

* ``isdbgrid``: answers only on a router (``cluster_is_db_grid_cmd.cpp``).
* ``replSetGetStatus``: a router is no replica set (``cluster_repl_set_get_status_cmd.cpp``).
* ``validate``: sent to the shards owning the collection, their replies under ``raw``
  (``dbStats``/``collStats``/``dataSize`` are aggregated across the shards:
  :mod:`router.commands.stats`).
* :func:`config_read` / :func:`config_write`: reads and writes of the ``config`` and ``admin``
  databases are the config server's (as on mongos); the read, write and listing families
  call them for those databases.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from shardsim.router.forwarding import BIG_BATCH, forwardable, reply_body
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("admin")

# Databases whose reads and writes the config server answers.
CONFIG_DATABASES = ("config", "admin")


@commands.handler("replSetGetStatus", privileges=priv.NO_AUTH)
async def repl_set_get_status(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``replSetGetStatus`` on mongos (``src/mongo/s/commands/cluster_repl_set_get_status_cmd.cpp``
    ``CmdReplSetGetStatus``): admin only (Unauthorized 13 elsewhere, as every ``adminOnly``
    command), no authentication needed, and always the reply ``{info: "mongos", ok: 0, errmsg:
    "replSetGetStatus is not supported through mongos"}``, with no ``code`` (the command sets
    ``errmsg`` and returns false; it does not throw)."""
    from shardsim.router.commands.sharding import admin_only
    admin_only(req)
    return {"info": "mongos", "ok": 0.0,
            "errmsg": "replSetGetStatus is not supported through mongos"}


async def config_read(node: "RouterNode", req: Request, cursor_field: str | None) -> dict[str, Any]:
    """Run the read ``req`` on the config server and return its reply body.

    ``cursor_field`` is None for a command without a cursor (``count``, ``distinct``); else
    ``"find"`` (batch size in ``batchSize``) or the name of a command with a ``cursor`` option
    (``aggregate``, ``listCollections``, ``listIndexes``): the config server's cursor is read to
    the end and served from a router cursor with the client's batch size. Raises what the config
    server raises (MongoError)."""
    body = forwardable(req.body)
    if cursor_field is None:
        return reply_body(await node.config_command(body, db=req.db))
    if cursor_field == "find":
        batch_size = body.get("batchSize")
        body["batchSize"] = BIG_BATCH
    else:
        batch_size = (body.get("cursor") or {}).get("batchSize")
        body["cursor"] = {"batchSize": BIG_BATCH}
    reply = await node.config_command(body, db=req.db)
    cur = reply["cursor"]
    docs = list(cur["firstBatch"])
    coll = cur["ns"].split(".", 1)[1]
    while cur["id"]:
        reply = await node.config_command({"getMore": cur["id"], "collection": coll,
                                           "batchSize": BIG_BATCH}, db=req.db)
        cur = reply["cursor"]
        docs.extend(cur["nextBatch"])
    return await node.cursor_reply(cur["ns"], docs, req, batch_size, bool(req.get("singleBatch")))


async def config_write(node: "RouterNode", req: Request) -> dict[str, Any]:
    """Run the write ``req`` (insert/update/delete on ``config``/``admin``) on the config
    server; returns its reply body, raises what it raises."""
    return reply_body(await node.config_command(forwardable(req.body), db=req.db))


@commands.handler("isdbgrid", privileges=priv.AUTH_ONLY)
async def isdbgrid(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{isdbgrid: 1, hostname: "host:port"}``: how a client tells a mongos."""
    return {"isdbgrid": 1, "hostname": node.address}


_GOSSIP = ("$clusterTime", "operationTime", "$configTime", "$topologyTime", "lastCommittedOpTime")


@commands.handler("validate", privileges=priv.on_coll("validate"))
async def validate(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``validate`` through the router, as ``ValidateCmd`` in
    ``src/mongo/s/commands/cluster_validate_cmd.cpp``: sent to every shard owning chunks of a
    sharded collection (the primary shard of an unsharded one); ``raw`` holds each shard's reply
    under its shard id (``{error: "<Code>: <errmsg>"}`` for one that failed). An unsharded
    collection's reply is its shard's reply, passthrough fields, with ``raw`` after; a sharded
    one's is ``valid`` (false if any shard says so) and ``raw``. The first shard error is then
    the command's error (26 for a missing collection). ShardNotFound (70) without shards."""
    coll = req.arg
    if not isinstance(coll, str) or not coll:
        raise MongoError(73, f"Invalid namespace specified '{req.db}.{coll}'")
    ns = f"{req.db}.{coll}"
    info = node.catalog.collection(ns)
    if info is None:
        await node.refresh_on_database_miss(req.db)
        info = node.catalog.collection(ns)
    if info is None:
        primary = node.read_primary(req.db)
        if primary is None:
            raise MongoError(70, "No shards found")
        targets = [primary]
    else:
        targets = list(info.chunks.shards())
    body = forwardable(req.body)
    replies = await asyncio.gather(*(node.shard_command(s, req.db, body, check=False)
                                     for s in targets), return_exceptions=True)
    raw: dict[str, Any] = {}
    first_error: MongoError | None = None
    valid = True
    for shard, reply in zip(targets, replies):
        if isinstance(reply, BaseException):
            err = reply if isinstance(reply, MongoError) else MongoError(6, str(reply))
            raw[shard] = {"error": f"{err.code_name}: {err.errmsg}"}
            first_error = first_error or err
            continue
        data = {k: v for k, v in reply.items() if k not in _GOSSIP}
        if not data.get("ok"):
            err = MongoError(int(data.get("code", 8)), str(data.get("errmsg", "")))
            raw[shard] = {"error": f"{err.code_name}: {err.errmsg}"}
            first_error = first_error or err
            continue
        raw[shard] = data
        if not data.get("valid"):
            valid = False
    if first_error is not None:
        raise first_error
    if info is None:
        out = {k: v for k, v in raw[targets[0]].items() if k != "ok"}
    else:
        out = {"valid": valid}
    out["raw"] = raw
    return out


@commands.handler("fsync", privileges=priv.on_cluster("fsync"))
async def fsync(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``fsync`` through the router (mongos' ``FsyncCommand``,
    ``src/mongo/s/commands/cluster_fsync_cmd.cpp``): sent to every shard; ``{numFiles: <sum>,
    all: {<shard>: <reply>}}``, ``ok: 0`` with ``cause`` (the failing shard's reply) when one
    fails. Unauthorized (13) on another database than ``admin``; ``lock: true`` is not built
    (238, the shards' answer)."""
    if req.db != "admin":
        raise MongoError(13, "fsync may only be run against the admin database.")
    shards = [s[0] for s in node.catalog.shards()]
    body = forwardable(req.body)
    replies = await asyncio.gather(*(node.shard_command(s, "admin", body, check=False)
                                     for s in shards), return_exceptions=True)
    out: dict[str, Any] = {}
    all_: dict[str, Any] = {}
    num_files = 0
    ok = True
    for shard, reply in zip(shards, replies):
        if isinstance(reply, BaseException):
            err = reply if isinstance(reply, MongoError) else MongoError(6, str(reply))
            reply = err.to_reply()
        data = {k: v for k, v in reply.items() if k not in _GOSSIP}
        all_[shard] = data
        if not data.get("ok"):
            if ok:
                out["cause"] = data
            ok = False
        num_files += int(data.get("numFiles", 0) or 0)
    out["numFiles"] = num_files
    out["all"] = all_
    if not ok:
        out["ok"] = 0.0
    return out
