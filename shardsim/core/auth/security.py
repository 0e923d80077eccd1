"""A process's security settings and checks: :class:`Security`, one per node (``node.security``).

* ``enabled`` is mongod's ``--auth`` (also implied by ``--keyFile``, as in mongod): every
  command is authorized (:meth:`Security.authorize`) before it runs, and ``$clusterTime`` is
  signed and checked (:mod:`shardsim.core.auth.cluster_time`). Off by default; then nothing is
  checked and only the SCRAM commands exist (a client may still authenticate, as on mongod).
* ``store`` is where users and roles are read (:mod:`shardsim.core.auth.store`).
* the key file (``--keyFile``) gives the ``__system@local`` credentials members use to
  authenticate to each other (``src/mongo/db/auth/security_key.cpp``: the file's base64
  characters with whitespace removed are the password).

Errors, as ``src/mongo/db/commands.cpp`` / ``service_entry_point_common.cpp`` word them:
Unauthorized (13) "Command <name> requires authentication" for an unauthenticated client,
"not authorized on <db> to execute command { ... }" for a missing privilege.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import TYPE_CHECKING, Any

from bson import Binary, ObjectId, Timestamp

from shardsim.core.auth import privileges as privs_mod
from shardsim.core import local_sessions
from shardsim.core.auth import roles as roles_mod
from shardsim.core.auth import checks
from shardsim.core.auth.cluster_time import KeyRing
from shardsim.core.auth.scram import make_credentials
from shardsim.core.auth.session import SYSTEM_USER, AuthSession
from shardsim.core.auth.store import UserStore
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.core.node import Node

_KEY_CHARS = re.compile(r"^[A-Za-z0-9+/=]+$")


def read_key_file(path: str) -> str:
    """The key of a ``--keyFile``: its content without whitespace; 6 to 1024 base64
    characters, in a file no group or other user may read, write or run
    (``readSecurityFile``, ``src/mongo/db/auth/security_file.cpp``: "permissions on <path> are
    too open"). Raises ``ValueError`` with mongod's reason (``OSError`` for a missing file)."""
    if os.name == "posix" and os.stat(path).st_mode & 0o077:
        raise ValueError(f"permissions on {path} are too open")
    with open(path) as f:
        key = "".join(f.read().split())
    if len(key) < 6:
        raise ValueError(f"security key in {path} has length {len(key)}, must be at least 6")
    if len(key) > 1024:
        raise ValueError(f"security key in {path} has length {len(key)}, must be at most 1024")
    if not _KEY_CHARS.match(key):
        raise ValueError(f"invalid char in key file {path}: only base64 characters allowed")
    return key


def is_localhost(peer: str) -> bool:
    """True when the connection comes from a loopback address (the localhost exception)."""
    host = peer.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def format_bson(value: Any) -> str:
    """A value as the server's ``BSONObj::toString`` prints it (in error messages)."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k}: {format_bson(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[ " + ", ".join(format_bson(v) for v in value) + " ]" if value else "[]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    if isinstance(value, Binary) and value.subtype == 4 and len(value) == 16:
        h = bytes(value).hex()
        return f'UUID("{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")'
    if isinstance(value, (bytes, Binary)):
        sub = value.subtype if isinstance(value, Binary) else 0
        return f"BinData({sub}, {bytes(value).hex().upper()})"
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    if isinstance(value, ObjectId):
        return f"ObjectId('{value}')"
    if value is None:
        return "null"
    return str(value)


def _snip(body: dict[str, Any]) -> dict[str, Any]:
    """The command as logged: passwords and SCRAM payloads replaced (``snipForLogging``)."""
    return {k: ("xxx" if k in ("pwd", "payload") else v) for k, v in body.items()}


class Security:
    """The security of one process (see the module docstring). ``key``: the key file's key."""

    def __init__(self, node: "Node", *, enabled: bool = False, key: str | None = None) -> None:
        self.node = node
        self.enabled = bool(enabled or key)
        self.key = key
        self.store: UserStore = UserStore()
        self.keyring = KeyRing()
        self._system_creds = make_credentials(*SYSTEM_USER[:1], key) if key else None

    # -- sessions ------------------------------------------------------------------------
    @staticmethod
    def session(conn: ConnectionInfo) -> AuthSession:
        """The connection's :class:`AuthSession` (made on first use)."""
        sess = conn.auth
        if sess is None:
            sess = conn.auth = AuthSession()
        return sess

    async def credentials(self, db: str, user: str) -> dict[str, Any] | None:
        """The stored SCRAM credentials of ``user@db`` (``__system@local`` from the key file)."""
        if (user, db) == SYSTEM_USER:
            return self._system_creds
        doc = await self.store.get_user(db, user)
        return doc.get("credentials") if doc else None

    # -- authorization -------------------------------------------------------------------
    async def authorize(self, req: Request) -> None:
        """Raise Unauthorized (13) unless the connection may run ``req``."""
        name = self.node.commands.canonical(req.name)
        needed = privs_mod.required(self.node.commands.spec, name, req)
        if needed == privs_mod.NO_AUTH:
            return
        sess = req.conn.auth
        if sess is None or not sess.users:
            if name in ("createUser", "createRole") and req.db == "admin" \
                    and is_localhost(req.conn.peer) and not await self.store.has_users():
                return  # the localhost exception: the first user or role, in admin
            raise MongoError(13, f"Command {name} requires authentication")
        if sess.is_system:
            return
        if isinstance(needed, privs_mod.Checked):  # beyond a privilege list (checks.py)
            checks.check(needed.name, req, await sess.resolve(self.store), sess)
            return
        if needed == privs_mod.AUTH_ONLY:
            return
        privileges = await sess.resolve(self.store)
        for target, actions in needed:
            if not roles_mod.authorized(privileges, target, actions):
                raise MongoError(13, f"not authorized on {req.db} to execute command "
                                     f"{format_bson(_snip(req.body))}")

    # -- logical sessions ------------------------------------------------------------------
    async def qualify_sessions(self, req: Request, name: str) -> None:
        """Bind the request's sessions to the caller (``makeLogicalSessionId``,
        ``src/mongo/db/logical_session_id_helpers.cpp``): an ``lsid`` without ``uid`` gets
        the digest of the authenticated user (SHA-256 of ``"user@db"``; the no-auth digest
        without one), so two users' sessions with the same id are distinct sessions on this
        node and on the shards a router forwards them to (the router sends ``lsid.uid``, as
        mongos does). A ``uid`` given by the client must be its own unless the caller may
        ``impersonate`` (the cluster's internal user) or, for ``killSessions``, has
        ``killAnySession``: Unauthorized (13) "Unauthorized to set user digest in
        LogicalSessionId" otherwise. ``endSessions``/``killSessions`` lists are qualified
        the same way."""
        body = req.body
        lsid = body.get("lsid")
        if isinstance(lsid, dict) and "id" in lsid:
            body["lsid"] = await self._make_lsid(req, lsid, ())
        if name in ("endSessions", "killSessions") and isinstance(body.get(req.name), list):
            spoof = ("killAnySession",) if name == "killSessions" else ()
            body[req.name] = [await self._make_lsid(req, x, spoof)
                              if isinstance(x, dict) and "id" in x else x
                              for x in body[req.name]]

    async def _make_lsid(self, req: Request, lsid: dict[str, Any],
                         spoof: tuple[str, ...]) -> dict[str, Any]:
        sess = req.conn.auth
        users = sess.users if sess is not None else []
        mine = local_sessions.user_uid(*users[0]) if users else local_sessions.NO_AUTH_UID
        if "uid" not in lsid:
            return {"id": lsid["id"], "uid": mine,
                    **{k: v for k, v in lsid.items() if k != "id"}}
        uid = lsid["uid"]
        if isinstance(uid, (bytes, Binary)) and bytes(uid) == bytes(mine):
            return lsid
        if sess is not None and sess.is_system:
            return lsid
        if sess is not None and users:
            privs = await sess.resolve(self.store)
            if any(roles_mod.authorized(privs, ("cluster",), [a])
                   for a in ("impersonate",) + spoof):
                return lsid
        raise MongoError(13, "Unauthorized to set user digest in LogicalSessionId")

    # -- cluster time ----------------------------------------------------------------------
    def sign(self, ts: Timestamp, dummy: dict[str, Any]) -> dict[str, Any]:
        """The signature of an outgoing ``$clusterTime``."""
        return self.keyring.sign(ts, dummy)

    def check_cluster_time(self, req: Request, ct: dict[str, Any]) -> None:
        """Validate an incoming ``$clusterTime`` unless the sender may advance the clock
        (``advanceClusterTime``: ``__system``). Raises 204/211 (module
        :mod:`shardsim.core.auth.cluster_time`)."""
        sess = req.conn.auth
        if sess is not None and sess.is_system:
            return
        self.keyring.validate(ct)
