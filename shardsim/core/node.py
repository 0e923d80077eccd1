"""What every role (shard, configsvr, router) shares: clock, cursors, the command table, and the
commands every mongod/mongos answers the same way (ping, buildInfo, getMore, killCursors, ...).

The common commands are module-level handlers in :mod:`shardsim.core.node_commands`, installed
first; a role subclasses :class:`Node`, overrides :meth:`hello` (and the parameter/status hooks)
and installs its own command families on ``self.commands`` after them. Replies get ``ok``,
``$clusterTime`` and ``operationTime`` here (``appendRequiredFieldsToResponse`` in the server's
service entry points).
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import socket
import time
from typing import Any, Protocol

import bson
from bson import Binary
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.int64 import Int64

from shardsim.core import collation, expressions, server_version, max_time, node_commands, request_checks, search_indexes
from shardsim.core import fcv
from shardsim.core.auth import commands as auth_commands
from shardsim.core.auth.security import Security
from shardsim.core.clock import HybridLogicalClock
from shardsim.core.cluster_time import parse_gossip
from shardsim.core.commands import CURRENT_REQUEST, CommandTable, Request
from shardsim.core import cursors as cursors_mod
from shardsim.core.cursors import COMMAND_TIME_LIMIT, CursorManager
from shardsim.core.local_sessions import LocalSessionCache
from shardsim.core.server_stats import ServerStats
from shardsim.core.errors import MongoError, change_stream_labels

log = logging.getLogger("shardsim")

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


@functools.lru_cache(maxsize=1)
def _hostname() -> str:
    return socket.gethostname()


class CommandHook(Protocol):
    """A hook point around every command a node runs (:meth:`Node.run_command`); the fail
    points' ``failCommand`` is one (``shardsim/core/failpoints.py``)."""

    async def before_command(self, req: Request) -> dict[str, Any] | None:
        """A complete reply that replaces the command (an injected error), or None to run it.
        May raise ConnectionError: the server loop then drops the connection unanswered."""

    def after_command(self, req: Request, reply: dict[str, Any]) -> None:
        """Amend the command's reply in place (an injected writeConcernError, labels)."""


class Node:
    """Base of every role. ``options`` are the process's command-line settings (dict)."""

    role = "node"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, test_commands: bool = True,
                 options: dict[str, Any] | None = None) -> None:
        self.host = host
        self.port = port
        self.test_commands = test_commands
        self.options = dict(options or {})
        # --server-version (shardsim/core/server_version.py); 8.0 when not given
        self.profile = server_version.get(self.options.get("server_version"))
        # featureCompatibilityVersion (shardsim/core/fcv.py): the test kit gives a mixed cluster
        # its lowest binary's; setFeatureCompatibilityVersion changes it
        self.fcv = str(self.options.get("fcv") or self.profile.fcv)
        self.clock = HybridLogicalClock()
        self.cursors = CursorManager()
        self.commands = CommandTable()
        self.command_hooks: list[CommandHook] = []  # see run_command
        # A replica-set member's topologyVersion and awaitable hello (shardsim/core/topology_version.py)
        self.topology_version: Any = None
        self.local_sessions = LocalSessionCache()  # $listLocalSessions (shardsim/local_sessions.py)
        self.stats = ServerStats()  # serverStatus connections/network/opcounters/asserts
        self.started = time.time()
        self.started_mono = time.monotonic()
        self.commands.install(self, node_commands.commands, auth_commands.commands,
                              search_indexes.commands, fcv.commands)
        # roles install theirs after; --auth / --keyFile (key: the key file's content)
        self.security = Security(self, enabled=bool(self.options.get("auth")),
                                 key=self.options.get("key"))

    # -- identity -------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """``host:port`` as hello and serverStatus report it, and as other roles reach this
        one. Bound to every interface (``0.0.0.0``, ``::``), the host is the machine's name,
        as mongod's ``getHostNameCached()`` (in a container: its hostname, which the compose
        network resolves); ``0.0.0.0`` would name the reader's own machine."""
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = _hostname()
        return f"{host}:{self.port}"

    def hello(self, req: Request) -> dict[str, Any]:
        """The role-specific part of ``hello``; the common fields are added by the handler. A
        replica-set member includes ``isWritablePrimary`` where mongod places it."""
        return {}

    # -- reply decoration -----------------------------------------------------------------
    def cluster_time_fields(self, req: Request | None, reply: dict[str, Any]) -> None:
        """Append ``$clusterTime`` and ``operationTime`` (gossip out)."""
        now = self.clock.now()
        if now.time == 0 and now.inc == 0:
            now = self.clock.advance_to_wall()
        security = self.security
        sig = security.sign(now, DUMMY_SIGNATURE) if security.enabled else DUMMY_SIGNATURE
        reply["$clusterTime"] = {"clusterTime": now, "signature": sig}
        op_time = reply.pop("__operationTime", None)
        reply["operationTime"] = op_time if op_time is not None else now

    def error_labels(self, req: Request | None, exc: MongoError) -> list[str]:
        """errorLabels for a failed command (error_labels.cpp): change-stream labels by default."""
        if exc.labels:
            return exc.labels
        if req is None:
            return []
        return change_stream_labels(exc.code, is_change_stream=self.is_change_stream_request(req),
                                    command=self.commands.canonical(req.name),
                                    profile=self.profile)

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
        (:func:`shardsim.core.cluster_time.parse_gossip`: 14, 40414, 140), with authentication on its
        signature checked (:meth:`shardsim.core.auth.security.Security.check_cluster_time`: 204/211,
        ``LogicalTimeValidator::validate``), then rate-limited
        (:meth:`shardsim.core.clock.HybridLogicalClock.check`: 205, 40484); a refused time moves
        nothing and fails the command."""
        ts = parse_gossip(req.body)
        if ts is not None:
            if self.security.enabled:
                self.security.check_cluster_time(req, req.body["$clusterTime"])
            self.clock.advance(ts)

    async def run_command(self, req: Request) -> dict[str, Any]:
        """Run one command and return the complete reply (never raises MongoError).

        The explicit hook points of every command: each of :attr:`command_hooks` (a
        :class:`CommandHook`) may answer instead of the command before it runs, and may amend
        its reply after; :data:`shardsim.core.commands.CURRENT_REQUEST` names the request
        meanwhile. Roles extend :meth:`execute`, never this."""
        token = CURRENT_REQUEST.set(req)
        self.stats.active += 1
        # the command's maxTimeMS, for the cursor it may open (shardsim/core/cursors.py)
        max_ms = req.body.get("maxTimeMS")
        limited = isinstance(max_ms, (int, float)) and not isinstance(max_ms, bool) \
            and max_ms > 0 and req.name != "getMore"
        limit_token = COMMAND_TIME_LIMIT.set((cursors_mod.clock(), max_ms / 1000.0)
                                             if limited else None)
        try:
            for hook in self.command_hooks:
                early = await hook.before_command(req)
                if early is not None:
                    return early
            reply = await self.execute(req)
            for hook in self.command_hooks:
                hook.after_command(req, reply)
            return reply
        finally:
            self.stats.active -= 1
            COMMAND_TIME_LIMIT.reset(limit_token)
            CURRENT_REQUEST.reset(token)

    async def execute(self, req: Request) -> dict[str, Any]:
        """The command itself: gossip, look-up, authorization, request checks, the handler,
        errors to replies (roles extend: sessions on the shard, StaleConfig retries on the
        router)."""
        stats = self.stats
        body = req.body
        try:
            self.gossip_in(req)
            handler = self.commands.lookup(req.name)
            canonical = self.commands.canonical(req.name)  # once per command
            stats.command(canonical, body)
            if self.security.enabled:
                await self.security.authorize(req)
                await self.security.qualify_sessions(req, canonical)
            if "lsid" in body:
                self.local_sessions.vivify(body["lsid"], req.conn)
            # maxTimeMS, writeConcern and write batch shapes (shardsim/request_checks.py)
            request_checks.check_request(canonical, body)
            timed = "maxTimeMS" in body and canonical in max_time.TIMED_COMMANDS \
                and not self.is_change_stream_request(req)
            if timed or (("let" in body or "collation" in body) and req.name != "bulkWrite"):
                reply = await self._invoke_scoped(handler, req, timed)
            else:  # the usual command: no deadline, let or collation scope to enter
                reply = await self.invoke(handler, req)
            if "ok" not in reply:
                reply["ok"] = 1.0
        except MongoError as exc:
            exc.labels = self.error_labels(req, exc)
            renamed = self.profile.code_names.get(exc.code)
            if renamed is not None:  # a code the release names differently (6.0: 63)
                exc.code_name = renamed
            reply = exc.to_reply()
            stats.failed()
        except RecursionError:  # input nested deeper than a handler can walk: mongod's Overflow
            reply = MongoError(15, "BSONObj exceeded maximum nested object depth: 200").to_reply()
            stats.failed()
        except Exception as exc:  # a bug must not take the process down
            log.exception("command %s failed", req.name)
            reply = MongoError(1, f"{type(exc).__name__}: {exc}").to_reply()
            stats.failed(internal=True)
        self.cluster_time_fields(req, reply)
        return reply

    async def _invoke_scoped(self, handler: Any, req: Request, timed: bool) -> dict[str, Any]:
        """:meth:`invoke` under the command's maxTimeMS deadline (when ``timed``) and its
        ``let`` / ``collation`` scopes (not for ``bulkWrite``, whose operations carry their
        own)."""
        body = req.body
        with max_time.deadline_scope(body["maxTimeMS"] if timed else None):
            if ("let" in body or "collation" in body) and req.name != "bulkWrite":
                with expressions.let_scope(body.get("let")), \
                        collation.collation_scope(body.get("collation")):
                    return await self.invoke(handler, req)
            return await self.invoke(handler, req)

    async def invoke(self, handler: Any, req: Request) -> dict[str, Any]:
        """Run the command's handler (roles wrap it: readConcern on the router and shards)."""
        return await handler(req)

    # -- parameters and status ------------------------------------------------------------
    def parameters(self) -> dict[str, Any]:
        """getParameter's values; roles extend."""
        return {
            "enableTestCommands": self.test_commands,
            "featureCompatibilityVersion": {"version": self.fcv},
            "cursorTimeoutMillis": Int64(self.cursors.timeout_ms),
            "maxBSONDepth": 200,
        }

    async def on_fcv_change(self, old: str, new: str) -> None:
        """After ``setFeatureCompatibilityVersion`` changed ``self.fcv`` (shardsim/core/fcv.py);
        roles extend (the config server clears the placement history on a downgrade)."""

    def set_parameter(self, name: str, value: Any) -> None:
        """Apply one setParameter value (``cursorTimeoutMillis`` here); roles extend."""
        if name == "cursorTimeoutMillis":
            self.cursors.timeout_ms = int(value)

    def parsed_options(self) -> dict[str, Any]:
        """The role's part of getCmdLineOpts ``parsed``; roles extend."""
        return {}

    def server_status(self) -> dict[str, Any]:
        """serverStatus: the common sections; roles extend."""
        return {
            "host": self.address, "version": self.profile.version, "process": self.process_name(),
            "pid": Int64(os.getpid()), "uptime": float(int(time.time() - self.started)),
            "uptimeMillis": Int64(int((time.monotonic() - self.started_mono) * 1000)),
            "localTime": datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None),
            **self.stats.sections(),
            "metrics": {"cursor": {"open": {"total": Int64(len(self.cursors))}}},
        }

    def process_name(self) -> str:
        """serverStatus ``process`` (``mongos`` for the router)."""
        return "mongod"

    # -- lifecycle ------------------------------------------------------------------------
    async def startup(self) -> None:
        """Called by the server loop once it listens (``self.port`` is known)."""
        self.cursors.start_reaper()

    async def shutdown(self) -> None:
        """Stop the idle-cursor reaper, kill every open cursor."""
        self.cursors.stop_reaper()
        await self.cursors.kill_all()

    def crash(self) -> None:
        """Die like ``kill -9`` (the test kit's ``kill_shard``; the server loop drops the
        connections, :meth:`shardsim.core.server.Server.abort`): stop every periodic task of
        the node and release what the operating system would release for a dead process
        (sockets to other members, file locks), writing nothing (no checkpoint, no flush).
        Synchronous; the node is not used again (a restart builds a new one). Roles extend it."""
        self.cursors.stop_reaper()
