"""Command dispatch: a table of handlers with mongod's names and aliases, and the request shape.

A handler is ``async def handler(req: Request) -> dict``; it returns the reply body without
``ok`` (added as ``1.0``) and raises :class:`~shardsim.core.errors.MongoError` to fail. Unknown
commands fail like mongod: ``CommandNotFound`` (59) "no such command: '<name>'".
"""

from __future__ import annotations

import contextvars
import datetime
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from bson import Binary, Code, DBRef, Decimal128, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS
from bson.int64 import Int64

from shardsim.core.errors import MongoError

Handler = Callable[["Request"], Awaitable[dict[str, Any]]]
# A module-level command handler: ``async def insert(node, req) -> dict`` (node: the role's Node).
NodeHandler = Callable[[Any, "Request"], Awaitable[dict[str, Any]]]

# The request a node is running on this task: set by ``Node.run_command`` for its command hooks
# and for checks deeper down that do not see the request (a getMore's cursor checks).
CURRENT_REQUEST: contextvars.ContextVar["Request | None"] = contextvars.ContextVar(
    "shardsim_current_request", default=None)

# Fields every command may carry (mongod's generic arguments); handlers must not reject them.
GENERIC_FIELDS = frozenset({
    "$db", "lsid", "txnNumber", "$clusterTime", "readConcern", "writeConcern", "comment",
    "maxTimeMS", "$readPreference", "apiVersion", "apiStrict", "apiDeprecationErrors",
    "autocommit", "startTransaction", "stmtId", "$audit", "$client", "$configServerState",
    "$configTime", "$topologyTime", "mayBypassWriteBlocking", "maxTimeMSOpOnly",
    "readOnly", "shardVersion", "databaseVersion", "$queryOptions", "clientOperationKey",
    "allowImplicitCollectionCreation", "versionContext", "rawData",
})


@dataclass(slots=True)
class ConnectionInfo:
    """Per-connection state: an id (``connectionId`` in hello), the peer address, the
    client metadata's ``application.name`` (used by failCommand's ``appName``) and the
    authentication state (``auth``: a :class:`shardsim.core.auth.session.AuthSession`, None until
    the connection authenticates)."""

    id: int
    peer: str = ""
    app_name: str | None = None
    closed: bool = False
    auth: Any = None
    compressors: list[str] = field(default_factory=list)  # negotiated in hello (OP_COMPRESSED)


@dataclass(slots=True)
class Request:
    """One command: ``name`` (as sent), ``db`` (``$db``), ``body`` (decoded, kind-1 sequences
    merged in as lists) and ``raw`` (the body's raw BSON bytes, for passthrough)."""

    name: str
    db: str
    body: dict[str, Any]
    conn: ConnectionInfo
    raw: bytes = b""
    sequences: dict[str, list[bytes]] = field(default_factory=dict)

    @property
    def arg(self) -> Any:
        """The command's first value (``{find: "coll"}`` -> ``"coll"``)."""
        return self.body[self.name]

    def get(self, key: str, default: Any = None) -> Any:
        return self.body.get(key, default)


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """What a command declares where it is defined (the server's ``Command`` virtuals), so that
    no central table has to list it:

    * ``versioned``: routed with a placement version (``shardVersion``): the router attaches
      the version it targeted with to the requests it sends for this command, and a shard
      checks it (StaleConfig 13388) -- ``CommandInvocation::supportsShardVersion``-like;
    * ``snapshot``: accepts ``readConcern: {level: "snapshot"}`` outside a transaction
      (``Command::supportsReadConcern``: find, aggregate, distinct), otherwise InvalidOptions 72;
    * ``reads``: a read that waits on a prepared transaction's documents (the shard's
      prepare conflicts, ``shard/prepare_conflicts.py``);
    * ``retryable_write``: with ``txnNumber`` outside a transaction it is a retryable write
      (``RetryableWriteError`` label on retryable errors; ``isRetryableWriteCommand``);
    * ``secondary``: may it run on a replica-set member that is not the writable primary
      (``Command::secondaryAllowed``): ``"always"`` (hello, ping, auth, replSet* ...),
      ``"optIn"`` (reads: with a ``$readPreference`` other than primary or ``secondaryOk``,
      otherwise NotPrimaryNoSecondaryOk 13435) or ``"never"`` (writes and DDL:
      NotWritablePrimary 10107); checked by the member's replication hook only
      (``shard/replication/hook.py``);
    * ``privileges``: what it needs to run, the server's ``checkAuthForOperation``: a rule of
      :mod:`shardsim.core.auth.privileges` (``NO_AUTH``, ``AUTH_ONLY``, ``on_coll("find")``,
      ``checked("updateUser")``, ...); a command that declares none needs the internal
      privilege only ``__system`` has.

    Which commands may run inside a transaction stays one central allowlist, as in the server
    (``shardsim/core/txn_rules.py``, ``txnCmdAllowlist``)."""

    versioned: bool = False
    snapshot: bool = False
    reads: bool = False
    retryable_write: bool = False
    secondary: str = "never"
    privileges: Any = None


NO_SPEC = CommandSpec()


class CommandFamily:
    """One command family's handlers (one module, e.g. ``router/commands/crud.py``).

    A module declares ``commands = CommandFamily("crud")`` and decorates its module-level
    handlers ``@commands.handler("insert", privileges=priv.insert_privileges)`` /
    ``@commands.handler("findAndModify",
    "findandmodify")``; a node installs the family with :meth:`CommandTable.install`, which binds
    each handler to the node. Handlers stay plain functions, so a test can call
    ``await crud.insert(node, request)`` directly.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.entries: list[tuple[str, NodeHandler, tuple[str, ...], CommandSpec]] = []

    def handler(self, name: str, *aliases: str, **spec: Any) -> Callable[[NodeHandler], NodeHandler]:
        """Decorator: register ``fn`` under ``name`` (and ``aliases``) with the properties
        ``spec`` (:class:`CommandSpec` fields); returns ``fn`` unchanged."""
        def deco(fn: NodeHandler) -> NodeHandler:
            self.entries.append((name, fn, aliases, CommandSpec(**spec)))
            return fn
        return deco

    def add(self, name: str, fn: NodeHandler, *aliases: str, **spec: Any) -> None:
        """Register an existing handler under another command name (``commitTransaction`` and
        ``abortTransaction`` sharing one function, say)."""
        self.entries.append((name, fn, aliases, CommandSpec(**spec)))

    def names(self) -> list[str]:
        return [name for name, _, _, _ in self.entries]


class CommandTable:
    """Name -> handler, with aliases. Look-up is exact first, then case-insensitive (the
    server accepts ``ismaster``/``buildinfo`` aliases; drivers send them lower-case)."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._lower: dict[str, str] = {}
        self._canonical: dict[str, str] = {}
        self._specs: dict[str, CommandSpec] = {}

    def register(self, name: str, handler: Handler, *aliases: str,
                 spec: CommandSpec = NO_SPEC) -> None:
        for n in (name, *aliases):
            self._handlers[n] = handler
            self._lower[n.lower()] = n
            self._canonical[n] = name
        self._specs[name] = spec

    def install(self, node: Any, *families: CommandFamily) -> None:
        """Bind every handler of ``families`` to ``node`` and register it (a later family
        overrides an earlier one's command of the same name: role families after the common
        one)."""
        for family in families:
            for name, fn, aliases, spec in family.entries:
                self.register(name, _bind(fn, node), *aliases, spec=spec)

    def remove(self, *names: str) -> None:
        """Drop commands (canonical names) and their aliases: a server-version profile without
        them answers CommandNotFound (59) like that release (shardsim/core/server_version.py)."""
        for name in names:
            for alias in [a for a, c in self._canonical.items() if c == name]:
                self._handlers.pop(alias, None)
                self._lower.pop(alias.lower(), None)
                self._canonical.pop(alias, None)
            self._specs.pop(name, None)

    def command(self, name: str, *aliases: str) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register`."""
        def deco(fn: Handler) -> Handler:
            self.register(name, fn, *aliases)
            return fn
        return deco

    def lookup(self, name: str) -> Handler:
        """The handler for ``name``; raises CommandNotFound (59)."""
        handler = self._handlers.get(name)
        if handler is None:
            exact = self._lower.get(name.lower())
            if exact is not None and name.lower() in ("ismaster", "buildinfo"):
                handler = self._handlers[exact]
        if handler is None:
            raise MongoError(59, f"no such command: '{name}'")
        return handler

    def spec(self, name: str) -> CommandSpec:
        """The properties command ``name`` (any alias or case) declared; defaults for a
        command this table does not have."""
        return self._specs.get(self.canonical(name), NO_SPEC)

    def with_property(self, prop: str) -> frozenset[str]:
        """The canonical names of the commands that declare ``prop`` (a view, for docs and
        tests: ``table.with_property("versioned")``)."""
        return frozenset(n for n, s in self._specs.items() if getattr(s, prop))

    def has(self, name: str) -> bool:
        """This table has command ``name`` (any alias or case)."""
        return self.canonical(name) in self._specs

    def canonical(self, name: str) -> str:
        """The canonical command name (``ismaster`` -> ``isMaster``)."""
        exact = self._lower.get(name.lower(), name)
        return self._canonical.get(exact, name)

    def names(self) -> list[str]:
        return sorted(set(self._canonical.values()))


def _bind(fn: NodeHandler, node: Any) -> Handler:
    async def handler(req: Request) -> dict[str, Any]:
        return await fn(node, req)
    handler.__name__ = handler.__qualname__ = fn.__name__
    handler.__wrapped__ = fn  # type: ignore[attr-defined]
    return handler


def check_type(req: Request, field_name: str, types: type | tuple[type, ...], type_name: str,
               *, required: bool = False) -> Any:
    """Validate a command field's BSON type like the IDL parser does.

    Raises TypeMismatch (14) "BSON field '<cmd>.<field>' is the wrong type '<t>', expected
    type '<type_name>'" or IDLFailedToParse (40414) when a required field is missing.
    """
    if field_name not in req.body:
        if required:
            raise MongoError(40414, f"BSON field '{req.name}.{field_name}' is missing but a "
                                    f"required field")
        return None
    value = req.body[field_name]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise MongoError(14, f"BSON field '{req.name}.{field_name}' is the wrong type 'bool', "
                             f"expected type '{type_name}'")
    if not isinstance(value, types):
        raise MongoError(14, f"BSON field '{req.name}.{field_name}' is the wrong type "
                             f"'{bson_type_name(value)}', expected type '{type_name}'")
    return value


def bson_type_name(value: Any) -> str:
    """The server's ``$type`` alias of a decoded BSON value (``"int"``, ``"long"``, ``"object"``...).

    int64 values decode to :class:`bson.int64.Int64`; a plain Python ``int`` is reported as
    ``"int"`` when it fits in 32 bits, else ``"long"`` (how pymongo encodes it). Values pymongo
    decodes to other Python types map to their BSON type: ``uuid.UUID`` -> ``"binData"``,
    ``DBRef`` -> ``"object"``, ``re.Pattern`` -> ``"regex"``, ``DatetimeMS`` -> ``"date"``.
    Aliases per https://www.mongodb.com/docs/manual/reference/operator/query/type/.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Int64):
        return "long"
    if isinstance(value, int):
        return "int" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, Decimal128):
        return "decimal"
    if isinstance(value, Code):  # Code subclasses str: test it first
        return "javascriptWithScope" if value.scope is not None else "javascript"
    if isinstance(value, str):
        return "string"
    if isinstance(value, DBRef):
        return "object"  # a DBRef is a document on the wire ($ref/$id)
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (bytes, Binary, uuid.UUID)):
        return "binData"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, ObjectId):
        return "objectId"
    if isinstance(value, (datetime.datetime, DatetimeMS)):
        return "date"
    if isinstance(value, (Regex, re.Pattern)):
        return "regex"
    if isinstance(value, Timestamp):
        return "timestamp"
    if isinstance(value, MinKey):
        return "minKey"
    if isinstance(value, MaxKey):
        return "maxKey"
    return type(value).__name__
