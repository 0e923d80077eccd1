"""The commands every role answers the same way (mongod and mongos alike): ``hello``, ``ping``,
``buildInfo``, parameters, ``serverStatus``, the session no-ops, ``getMore``, ``killCursors``...

:class:`shardsim.core.node.Node` installs :data:`commands` first; a role installs its own families
after it, and a later family overrides a name (the shard's ``endSessions`` aborts transactions,
say). Each handler is ``async def name(node, req) -> dict``: ``node`` is the role's
:class:`~shardsim.core.node.Node` (role hooks: ``hello``, ``parameters``, ``set_parameter``,
``server_status``, ``parsed_options``), ``req`` a :class:`~shardsim.core.commands.Request`; the reply
body is returned without ``ok``. Reply shapes follow the server's commands of the same name
(``hello_command.cpp``/``replication_info.cpp``, ``buildinfo.cpp``, ``parameters.cpp``,
``getmore_cmd.cpp``, ``killcursors_cmd.cpp``).
"""

from __future__ import annotations

import datetime
import os
import sys
import uuid
from typing import TYPE_CHECKING, Any

from bson import Binary

from shardsim.core import compression
from shardsim.core.commands import CommandFamily, Request, check_type
from shardsim.core.errors import MongoError
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.core.node import Node

SERVER_VERSION = "8.0.4"
VERSION_ARRAY = [8, 0, 4, 0]
MAX_WIRE_VERSION = 25  # MongoDB 8.0
MAX_BSON_OBJECT_SIZE = 16 * 1024 * 1024
MAX_MESSAGE_SIZE_BYTES = 48_000_000
MAX_WRITE_BATCH_SIZE = 100_000

commands = CommandFamily("common")


@commands.handler("hello", "isMaster", "ismaster", secondary="always", privileges=priv.NO_AUTH)
async def hello(node: Node, req: Request) -> dict[str, Any]:
    """``hello``/``isMaster``: the role's fields (:meth:`Node.hello`) plus the limits and wire
    versions of the node's server-version profile (8.0 by default). Remembers the client's ``application.name`` on the connection
    (failCommand's ``appName``). The legacy name answers ``ismaster`` instead of
    ``isWritablePrimary``."""
    client = req.body.get("client")
    if isinstance(client, dict):
        app = client.get("application")
        if isinstance(app, dict) and isinstance(app.get("name"), str):
            req.conn.app_name = app["name"]
    legacy = req.name.lower() == "ismaster"
    if node.topology_version is not None:  # a replica-set member: the awaitable hello
        await node.topology_version.wait(req.body)
    role = node.hello(req)
    reply: dict[str, Any] = {}
    if node.topology_version is not None:  # first, as appendReplicationInfo writes it
        reply["topologyVersion"] = node.topology_version.doc()
    if "isWritablePrimary" not in role:
        reply["ismaster" if legacy else "isWritablePrimary"] = True
    for key, value in role.items():  # a member places isWritablePrimary itself
        reply["ismaster" if legacy and key == "isWritablePrimary" else key] = value
    reply.update({
        "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
        "maxMessageSizeBytes": MAX_MESSAGE_SIZE_BYTES,
        "maxWriteBatchSize": MAX_WRITE_BATCH_SIZE,
        "localTime": datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None),
        "logicalSessionTimeoutMinutes": 30,
        "connectionId": req.conn.id,
        "minWireVersion": 0,
        "maxWireVersion": node.profile.max_wire_version,
        "readOnly": False,
    })
    if req.body.get("helloOk"):
        reply["helloOk"] = True
    # MessageCompressorManager::serverNegotiate (shardsim/core/compression.py)
    negotiated = compression.negotiate(req.body.get("compression"), req.conn.compressors)
    if "compression" in req.body:
        req.conn.compressors = negotiated or []
    if negotiated:
        reply["compression"] = negotiated
    if "speculativeAuthenticate" in req.body or "saslSupportedMechs" in req.body:
        from shardsim.core.auth.commands import hello_fields
        reply.update(await hello_fields(node, req))
    return reply


@commands.handler("ping", secondary="always", privileges=priv.NO_AUTH)
async def ping(node: Node, req: Request) -> dict[str, Any]:
    """``ping``: ``{}``."""
    return {}


@commands.handler("buildInfo", "buildinfo", secondary="always", privileges=priv.NO_AUTH)
async def build_info(node: Node, req: Request) -> dict[str, Any]:
    """``buildInfo``: the profile's ``version``/``versionArray`` (``8.0.4`` by default,
    :mod:`shardsim.core.server_version`) and the fields drivers and the spec runner read."""
    return {
        "version": node.profile.version, "gitVersion": "shardsim", "allocator": "system",
        "javascriptEngine": "none", "sysInfo": "deprecated", "versionArray": list(node.profile.version_array),
        "openssl": {"running": "disabled", "compiled": "disabled"},
        "buildEnvironment": {"distmod": "shardsim", "target_os": sys.platform},
        "bits": 64, "debug": False, "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
        "storageEngines": ["inMemory", "wiredTiger"], "modules": [],
    }


@commands.handler("getParameter", secondary="always", privileges=priv.on_cluster("getParameter"))
async def get_parameter(node: Node, req: Request) -> dict[str, Any]:
    """``getParameter: "*"`` (or ``{allParameters: true}``) gives every parameter, otherwise the
    ones named as fields. InvalidOptions (72) "no option found to get" when none is known."""
    params = node.parameters()
    arg = req.arg
    if arg == "*" or (isinstance(arg, dict) and arg.get("allParameters")):
        return dict(params)
    out = {k: v for k, v in params.items() if k in req.body and k != "getParameter"}
    if not out:
        raise MongoError(72, "no option found to get")
    return out


@commands.handler("setParameter", secondary="always", privileges=priv.on_cluster("setParameter"))
async def set_parameter(node: Node, req: Request) -> dict[str, Any]:
    """``setParameter: 1, <name>: <value>``: ``{was: <old value>}``. InvalidOptions (72) for a
    parameter the role does not have."""
    settable = node.parameters()
    out: dict[str, Any] = {}
    for k, v in req.body.items():
        if k in ("setParameter", "$db") or k.startswith("$") or k in ("lsid", "comment"):
            continue
        if k not in settable:
            raise MongoError(72, f"attempted to set unrecognized parameter [{k}], use "
                                 f"help:true to see options ")
        out["was"] = settable[k]
        node.set_parameter(k, v)
    return out


@commands.handler("serverStatus", secondary="always", privileges=priv.on_cluster("serverStatus"))
async def server_status(node: Node, req: Request) -> dict[str, Any]:
    """``serverStatus``: :meth:`Node.server_status` (roles add their sections)."""
    return node.server_status()


@commands.handler("getCmdLineOpts", secondary="always", privileges=priv.on_cluster("getCmdLineOpts"))
async def cmd_line_opts(node: Node, req: Request) -> dict[str, Any]:
    """``getCmdLineOpts``: ``{argv, parsed: {net: {bindIp, port}, <role options>}}``."""
    argv = list(sys.argv)
    parsed = {"net": {"bindIp": node.host, "port": node.port}}
    parsed.update(node.parsed_options())
    return {"argv": argv, "parsed": parsed}


@commands.handler("endSessions", secondary="always", privileges=priv.AUTH_ONLY)
async def end_sessions(node: Node, req: Request) -> dict[str, Any]:
    """``endSessions``/``killAllSessions``/``refreshSessions``: nothing to do on a role without
    session state (the shard overrides the first two)."""
    return {}


commands.add("killAllSessions", end_sessions, privileges=priv.on_cluster("killAnySession"))
commands.add("refreshSessions", end_sessions, privileges=priv.AUTH_ONLY)


@commands.handler("startSession", secondary="always", privileges=priv.AUTH_ONLY)
async def start_session(node: Node, req: Request) -> dict[str, Any]:
    """``startSession``: a fresh ``{id: {id: UUID}}`` and ``timeoutMinutes: 30``."""
    return {"id": {"id": Binary(uuid.uuid4().bytes, 4)}, "timeoutMinutes": 30}


@commands.handler("whatsmyuri", secondary="always", privileges=priv.AUTH_ONLY)
async def whatsmyuri(node: Node, req: Request) -> dict[str, Any]:
    """``whatsmyuri``: the peer address of the connection."""
    return {"you": req.conn.peer}


@commands.handler("hostInfo", secondary="always", privileges=priv.on_cluster("hostInfo"))
async def host_info(node: Node, req: Request) -> dict[str, Any]:
    """``hostInfo``: host name (the node's address), core count and OS."""
    return {"system": {"hostname": node.address, "numCores": os.cpu_count()},
            "os": {"type": sys.platform}, "extra": {}}


@commands.handler("listCommands", secondary="always", privileges=priv.AUTH_ONLY)
async def list_commands(node: Node, req: Request) -> dict[str, Any]:
    """``listCommands``: every canonical command name the node answers."""
    return {"commands": {n: {"help": ""} for n in node.commands.names()}}


@commands.handler("getLog", secondary="always", privileges=priv.on_cluster("getLog"))
async def get_log(node: Node, req: Request) -> dict[str, Any]:
    """``getLog``: the log names for ``"*"``, an empty log otherwise."""
    if req.arg == "*":
        return {"names": ["global", "startupWarnings"]}
    return {"totalLinesWritten": 0, "log": []}


@commands.handler("getMore", secondary="always", privileges=priv.AUTH_ONLY)
async def get_more(node: Node, req: Request) -> dict[str, Any]:
    """``getMore: <cursor id>, collection, batchSize?, maxTimeMS?``: ``{cursor: {nextBatch, id,
    ns, ...}}`` from :meth:`CursorManager.get_more`. TypeMismatch (14) for a non-long id,
    51024 for a negative batchSize, BadValue (2) for maxTimeMS on a non-awaitData cursor,
    CursorNotFound (43) and Unauthorized (13, wrong collection) from the cursor manager."""
    cid = req.arg
    if isinstance(cid, bool) or not isinstance(cid, int):
        raise MongoError(14, "BSON field 'getMore.getMore' is the wrong type "
                             f"'{type(cid).__name__}', expected type 'long'")
    coll = check_type(req, "collection", str, "string", required=True)
    batch_size = check_type(req, "batchSize", (int, float), "long")
    if batch_size is not None and batch_size < 0:
        raise MongoError(51024, f"BatchSize value must be non-negative, but received: {batch_size}")
    max_time = req.body.get("maxTimeMS")
    cursor = node.cursors.get(cid)
    if max_time is not None and not cursor.await_data:
        # maxTimeMS of a getMore is the awaitData wait; elsewhere the cursor runs within what
        # its command's maxTimeMS left (shardsim/cursors.py). mongod: getmore_cmd.cpp
        # validateMaxTimeMS; mongos: cluster_find.cpp setUpOperationContextStateForGetMore.
        if node.process_name() == "mongos":
            raise MongoError(2, "maxTimeMS can only be used with getMore for tailable, "
                                "awaitData cursors")
        raise MongoError(2, "cannot set maxTimeMS on getMore command for a non-awaitData cursor")
    reply = await node.cursors.get_more(cid, coll, int(batch_size) if batch_size else None,
                                        int(max_time) if max_time is not None else None)
    return {"cursor": reply}


@commands.handler("killCursors", secondary="always", privileges=priv.AUTH_ONLY)
async def kill_cursors(node: Node, req: Request) -> dict[str, Any]:
    """``killCursors: <collection>, cursors: [ids]``: ``{cursorsKilled, cursorsNotFound,
    cursorsAlive, cursorsUnknown}`` from :meth:`CursorManager.kill`."""
    check_type(req, "killCursors", str, "string", required=True)
    ids = check_type(req, "cursors", list, "array", required=True)
    return await node.cursors.kill([int(i) for i in ids])
