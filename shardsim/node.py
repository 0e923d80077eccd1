"""What every role (shard, configsvr, router) shares: clock, cursors, the command table, and the
commands every mongod/mongos answers the same way (ping, buildInfo, getMore, killCursors, ...).

A role subclasses :class:`Node`, overrides :meth:`hello` and registers its own commands on
``self.commands``. Replies get ``ok``, ``$clusterTime`` and ``operationTime`` here
(``appendRequiredFieldsToResponse`` in the server's service entry points).
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import time
from typing import Any

import bson
from bson import Binary
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.clock import HybridLogicalClock
from shardsim.cluster_time import parse_gossip
from shardsim.commands import CommandTable, ConnectionInfo, Request, check_type
from shardsim.cursors import CursorManager
from shardsim.errors import MongoError, change_stream_labels

log = logging.getLogger("shardsim")

SERVER_VERSION = "8.0.4"
VERSION_ARRAY = [8, 0, 4, 0]
MAX_WIRE_VERSION = 25  # MongoDB 8.0
MAX_BSON_OBJECT_SIZE = 16 * 1024 * 1024
MAX_MESSAGE_SIZE_BYTES = 48_000_000
MAX_WRITE_BATCH_SIZE = 100_000

# How every role decodes command bodies: plain ordered dicts, UUIDs left as Binary subtype 4,
# dates outside datetime's range kept as DatetimeMS (fidelity: types round-trip unchanged).
CODEC = CodecOptions(document_class=dict, tz_aware=False,
                     datetime_conversion=DatetimeConversion.DATETIME_AUTO)
DUMMY_SIGNATURE = {"hash": Binary(b"\x00" * 20, 0), "keyId": Int64(0)}


def decode(raw: bytes) -> dict[str, Any]:
    """Decode a BSON document with the project's codec; InvalidBSON (22) on bad bytes."""
    try:
        return bson.decode(raw, CODEC)
    except RecursionError:  # nesting the wire check lets through cannot get here; be safe
        raise MongoError(15, "BSONObj exceeded maximum nested object depth: 200") from None
    except Exception as exc:  # bson.errors.InvalidBSON and friends
        raise MongoError(22, f"invalid BSON: {exc}") from None


def encode(doc: Any) -> bytes:
    """Encode a reply document; RawBSONDocument values are copied as raw bytes."""
    return bson.encode(doc, codec_options=CODEC)


class Node:
    """Base of every role. ``options`` are the process's command-line settings (dict)."""

    role = "node"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, test_commands: bool = True,
                 options: dict[str, Any] | None = None) -> None:
        self.host = host
        self.port = port
        self.test_commands = test_commands
        self.options = dict(options or {})
        self.clock = HybridLogicalClock()
        self.cursors = CursorManager()
        self.commands = CommandTable()
        self.started = time.time()
        self.started_mono = time.monotonic()
        self._register_common()

    # -- identity -------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def hello(self, req: Request) -> dict[str, Any]:
        """The role-specific part of ``hello``; the common fields are added by the handler."""
        return {}

    # -- reply decoration -----------------------------------------------------------------
    def cluster_time_fields(self, req: Request | None, reply: dict[str, Any]) -> None:
        """Append ``$clusterTime`` and ``operationTime`` (gossip out)."""
        now = self.clock.now()
        if now.time == 0 and now.inc == 0:
            now = self.clock.advance_to_wall()
        reply["$clusterTime"] = {"clusterTime": now, "signature": DUMMY_SIGNATURE}
        op_time = reply.pop("__operationTime", None)
        reply["operationTime"] = op_time if op_time is not None else now

    def error_labels(self, req: Request | None, exc: MongoError) -> list[str]:
        """errorLabels for a failed command (error_labels.cpp): change-stream labels by default."""
        if exc.labels:
            return exc.labels
        if req is None:
            return []
        return change_stream_labels(exc.code, is_change_stream=self.is_change_stream_request(req),
                                    command=self.commands.canonical(req.name))

    def is_change_stream_request(self, req: Request) -> bool:
        """True for an aggregate whose pipeline starts with $changeStream, or a getMore on one."""
        name = req.name
        if name == "aggregate":
            pipeline = req.body.get("pipeline")
            return bool(pipeline) and isinstance(pipeline, list) and isinstance(pipeline[0], dict) \
                and "$changeStream" in pipeline[0]
        if name == "getMore":
            try:
                cursor = self.cursors.get(int(req.body.get("getMore", 0)))
            except (MongoError, TypeError, ValueError):
                return False
            return bool(getattr(cursor, "is_change_stream", False))
        return False

    # -- dispatch -------------------------------------------------------------------------
    def gossip_in(self, req: Request) -> None:
        """Take in a request's ``$clusterTime`` as ``VectorClock::gossipIn`` does: shape-checked
        (:func:`shardsim.cluster_time.parse_gossip`: 14, 40414, 140) and rate-limited
        (:meth:`shardsim.clock.HybridLogicalClock.check`: 205, 40484); a refused time moves
        nothing and fails the command."""
        ts = parse_gossip(req.body)
        if ts is not None:
            self.clock.advance(ts)

    async def run_command(self, req: Request) -> dict[str, Any]:
        """Run one command and return the complete reply (never raises MongoError)."""
        try:
            self.gossip_in(req)
            handler = self.commands.lookup(req.name)
            mt = req.body.get("maxTimeMS")
            if mt is not None and (isinstance(mt, bool) or not isinstance(mt, (int, float)) or mt < 0):
                raise MongoError(2, f"{mt} value for maxTimeMS is out of range [0, 2147483647]")
            reply = await handler(req)
            if "ok" not in reply:
                reply["ok"] = 1.0
        except MongoError as exc:
            exc.labels = self.error_labels(req, exc)
            reply = exc.to_reply()
        except RecursionError:  # input nested deeper than a handler can walk: mongod's Overflow
            reply = MongoError(15, "BSONObj exceeded maximum nested object depth: 200").to_reply()
        except Exception as exc:  # a bug must not take the process down
            log.exception("command %s failed", req.name)
            reply = MongoError(1, f"{type(exc).__name__}: {exc}").to_reply()
        self.cluster_time_fields(req, reply)
        return reply

    # -- common commands ------------------------------------------------------------------
    def _register_common(self) -> None:
        c = self.commands

        async def hello(req: Request) -> dict[str, Any]:
            client = req.body.get("client")
            if isinstance(client, dict):
                app = client.get("application")
                if isinstance(app, dict) and isinstance(app.get("name"), str):
                    req.conn.app_name = app["name"]
            legacy = req.name.lower() == "ismaster"
            reply: dict[str, Any] = {}
            if legacy:
                reply["ismaster"] = True
            else:
                reply["isWritablePrimary"] = True
            reply.update(self.hello(req))
            reply.update({
                "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
                "maxMessageSizeBytes": MAX_MESSAGE_SIZE_BYTES,
                "maxWriteBatchSize": MAX_WRITE_BATCH_SIZE,
                "localTime": datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None),
                "logicalSessionTimeoutMinutes": 30,
                "connectionId": req.conn.id,
                "minWireVersion": 0,
                "maxWireVersion": MAX_WIRE_VERSION,
                "readOnly": False,
            })
            if req.body.get("helloOk"):
                reply["helloOk"] = True
            return reply

        c.register("hello", hello, "isMaster", "ismaster")

        async def ping(req: Request) -> dict[str, Any]:
            return {}

        c.register("ping", ping)

        async def build_info(req: Request) -> dict[str, Any]:
            return {
                "version": SERVER_VERSION, "gitVersion": "shardsim", "allocator": "system",
                "javascriptEngine": "none", "sysInfo": "deprecated", "versionArray": VERSION_ARRAY,
                "openssl": {"running": "disabled", "compiled": "disabled"},
                "buildEnvironment": {"distmod": "shardsim", "target_os": sys.platform},
                "bits": 64, "debug": False, "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
                "storageEngines": ["inMemory", "wiredTiger"], "modules": [],
            }

        c.register("buildInfo", build_info, "buildinfo")

        async def get_parameter(req: Request) -> dict[str, Any]:
            params = self.parameters()
            arg = req.arg
            if arg == "*" or (isinstance(arg, dict) and arg.get("allParameters")):
                return dict(params)
            out = {k: v for k, v in params.items() if k in req.body and k != "getParameter"}
            if not out:
                raise MongoError(72, "no option found to get")
            return out

        c.register("getParameter", get_parameter)

        async def set_parameter(req: Request) -> dict[str, Any]:
            settable = self.parameters()
            out: dict[str, Any] = {}
            for k, v in req.body.items():
                if k in ("setParameter", "$db") or k.startswith("$") or k in ("lsid", "comment"):
                    continue
                if k not in settable:
                    raise MongoError(72, f"attempted to set unrecognized parameter [{k}], use "
                                         f"help:true to see options ")
                out["was"] = settable[k]
                self.set_parameter(k, v)
            return out

        c.register("setParameter", set_parameter)

        async def server_status(req: Request) -> dict[str, Any]:
            return self.server_status()

        c.register("serverStatus", server_status)

        async def cmd_line_opts(req: Request) -> dict[str, Any]:
            argv = list(sys.argv)
            parsed = {"net": {"bindIp": self.host, "port": self.port}}
            parsed.update(self.parsed_options())
            return {"argv": argv, "parsed": parsed}

        c.register("getCmdLineOpts", cmd_line_opts)

        async def end_sessions(req: Request) -> dict[str, Any]:
            return {}

        c.register("endSessions", end_sessions)
        c.register("killAllSessions", end_sessions)
        c.register("refreshSessions", end_sessions)

        async def start_session(req: Request) -> dict[str, Any]:
            import uuid
            return {"id": {"id": Binary(uuid.uuid4().bytes, 4)}, "timeoutMinutes": 30}

        c.register("startSession", start_session)

        async def whatsmyuri(req: Request) -> dict[str, Any]:
            return {"you": req.conn.peer}

        c.register("whatsmyuri", whatsmyuri)

        async def connection_status(req: Request) -> dict[str, Any]:
            return {"authInfo": {"authenticatedUsers": [], "authenticatedUserRoles": []}}

        c.register("connectionStatus", connection_status)

        async def host_info(req: Request) -> dict[str, Any]:
            return {"system": {"hostname": self.address, "numCores": os.cpu_count()},
                    "os": {"type": sys.platform}, "extra": {}}

        c.register("hostInfo", host_info)

        async def list_commands(req: Request) -> dict[str, Any]:
            return {"commands": {n: {"help": ""} for n in self.commands.names()}}

        c.register("listCommands", list_commands)

        async def get_log(req: Request) -> dict[str, Any]:
            if req.arg == "*":
                return {"names": ["global", "startupWarnings"]}
            return {"totalLinesWritten": 0, "log": []}

        c.register("getLog", get_log)

        async def get_more(req: Request) -> dict[str, Any]:
            cid = req.arg
            if isinstance(cid, bool) or not isinstance(cid, int):
                raise MongoError(14, "BSON field 'getMore.getMore' is the wrong type "
                                     f"'{type(cid).__name__}', expected type 'long'")
            coll = check_type(req, "collection", str, "string", required=True)
            batch_size = check_type(req, "batchSize", (int, float), "long")
            if batch_size is not None and batch_size < 0:
                raise MongoError(51024, f"BatchSize value must be non-negative, but received: {batch_size}")
            max_time = req.body.get("maxTimeMS")
            cursor = self.cursors.get(cid)
            if max_time is not None and not cursor.await_data:
                raise MongoError(2, "cannot set maxTimeMS on getMore command for a non-awaitData cursor")
            reply = await self.cursors.get_more(cid, coll, int(batch_size) if batch_size else None,
                                                int(max_time) if max_time is not None else None)
            return {"cursor": reply}

        c.register("getMore", get_more)

        async def kill_cursors(req: Request) -> dict[str, Any]:
            check_type(req, "killCursors", str, "string", required=True)
            ids = check_type(req, "cursors", list, "array", required=True)
            return await self.cursors.kill([int(i) for i in ids])

        c.register("killCursors", kill_cursors)

    # -- parameters and status ------------------------------------------------------------
    def parameters(self) -> dict[str, Any]:
        """getParameter's values; roles extend."""
        return {
            "enableTestCommands": self.test_commands,
            "featureCompatibilityVersion": {"version": "8.0"},
            "cursorTimeoutMillis": Int64(self.cursors.timeout_ms),
            "maxBSONDepth": 200,
        }

    def set_parameter(self, name: str, value: Any) -> None:
        if name == "cursorTimeoutMillis":
            self.cursors.timeout_ms = int(value)

    def parsed_options(self) -> dict[str, Any]:
        return {}

    def server_status(self) -> dict[str, Any]:
        """serverStatus: the common sections; roles extend."""
        return {
            "host": self.address, "version": SERVER_VERSION, "process": self.process_name(),
            "pid": Int64(os.getpid()), "uptime": float(int(time.time() - self.started)),
            "uptimeMillis": Int64(int((time.monotonic() - self.started_mono) * 1000)),
            "localTime": datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None),
            "metrics": {"cursor": {"open": {"total": Int64(len(self.cursors))}}},
        }

    def process_name(self) -> str:
        return "mongod"

    # -- lifecycle ------------------------------------------------------------------------
    async def startup(self) -> None:
        """Called by the server loop once it listens (``self.port`` is known)."""
        self.cursors.start_reaper()

    async def shutdown(self) -> None:
        await self.cursors.kill_all()
