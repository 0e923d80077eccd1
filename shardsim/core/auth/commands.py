"""The authentication commands every role answers (``src/mongo/db/auth/sasl_commands.cpp``,
``authentication_commands.cpp``): ``saslStart``, ``saslContinue``, ``logout``,
``authenticate``, ``connectionStatus``; the ``hello`` fields ``saslSupportedMechs`` and
``speculativeAuthenticate`` (:func:`hello_fields`); and ``_shardsimSetClusterKeys`` (how the
config server hands its HMAC keys to a shard; shardsim's own, ``__system`` only).

Replies: ``saslStart`` -> ``{conversationId: 1, done: false, payload: BinData}``;
``saslContinue`` -> ``{conversationId: 1, done, payload}``. Errors: AuthenticationFailed (18)
"Authentication failed." for any failed conversation (unknown user, wrong password, bad
message), MechanismUnavailable (334) for a mechanism other than SCRAM-SHA-1/-256, ProtocolError
(17) "No SASL session state found" for a saslContinue without a saslStart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson import Binary

from shardsim.core.auth import roles as roles_mod
from shardsim.core.auth.scram import MECHANISMS, ScramFailed, ServerConversation
from shardsim.core.auth.session import SYSTEM_USER
from shardsim.core.auth.security import Security
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import shard as shrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.core.node import Node

commands = CommandFamily("auth")
CONVERSATION_ID = 1


def _auth_failed() -> MongoError:
    return MongoError(18, "Authentication failed.")


def _user_of(payload: bytes) -> str:
    """The ``n=`` user name of a SCRAM client-first message (``=2C``/``=3D`` unescaped)."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise _auth_failed() from None
    for part in text.split(",")[2:]:
        if part.startswith("n="):
            return part[2:].replace("=2C", ",").replace("=3D", "=")
    raise _auth_failed()


def _payload(value: Any) -> bytes:
    if isinstance(value, (bytes, Binary)):
        return bytes(value)
    if isinstance(value, str):  # the legacy shell sent base64 strings
        import base64
        return base64.b64decode(value)
    raise MongoError(14, "BSON field 'payload' is the wrong type, expected type 'binData'")


async def sasl_start_reply(node: "Node", body: dict[str, Any], db: str, conn: Any) -> dict[str, Any]:
    """Run a ``saslStart`` (also the ``speculativeAuthenticate`` of hello); the reply body."""
    mech = body.get("mechanism")
    if mech not in MECHANISMS:
        raise MongoError(334, f"Received authentication for mechanism {mech} which is unknown "
                              f"or not enabled")
    payload = _payload(body.get("payload", b""))
    user = _user_of(payload)
    security: Security = node.security
    creds = await security.credentials(db, user)
    sess = security.session(conn)
    conv = ServerConversation(mech, lambda _u: creds)
    try:
        out = conv.start(payload)
    except ScramFailed:
        sess.conversation = None
        raise _auth_failed() from None
    opts = body.get("options")
    conv.skip_empty = bool(opts.get("skipEmptyExchange")) if isinstance(opts, dict) else False
    sess.conversation, sess.conversation_db = conv, db
    return {"conversationId": CONVERSATION_ID, "done": False, "payload": Binary(out)}


@commands.handler("saslStart", secondary="always", privileges=priv.NO_AUTH)
async def sasl_start(node: "Node", req: Request) -> dict[str, Any]:
    """``{saslStart: 1, mechanism, payload, options: {skipEmptyExchange}}`` on the user's
    database."""
    return await sasl_start_reply(node, req.body, req.db, req.conn)


@commands.handler("saslContinue", secondary="always", privileges=priv.NO_AUTH)
async def sasl_continue(node: "Node", req: Request) -> dict[str, Any]:
    """``{saslContinue: 1, conversationId, payload}``: the proof, then (without
    skipEmptyExchange) one empty round. Success authenticates the connection as the user."""
    sess = node.security.session(req.conn)
    conv = sess.conversation
    if conv is None or sess.conversation_db != req.db:
        raise MongoError(17, "No SASL session state found")
    if req.body.get("conversationId", CONVERSATION_ID) != CONVERSATION_ID:
        raise MongoError(17, "No SASL session state found")
    payload = _payload(req.body.get("payload", b""))
    if conv.done:  # the empty round
        sess.conversation = None
        return {"conversationId": CONVERSATION_ID, "done": True, "payload": Binary(b"")}
    try:
        out = conv.finish(payload)
    except ScramFailed:
        sess.conversation = None
        raise _auth_failed() from None
    sess.add_user(conv.user, req.db)
    done = conv.skip_empty
    if done:
        sess.conversation = None
    return {"conversationId": CONVERSATION_ID, "done": done, "payload": Binary(out)}


@commands.handler("authenticate", secondary="always", privileges=priv.NO_AUTH)
async def authenticate(node: "Node", req: Request) -> dict[str, Any]:
    """``authenticate`` (MONGODB-X509): not offered; MechanismUnavailable (334)."""
    mech = req.body.get("mechanism")
    raise MongoError(334, f"Received authentication for mechanism {mech} which is unknown or "
                          f"not enabled")


@commands.handler("logout", secondary="always", privileges=priv.NO_AUTH)
async def logout(node: "Node", req: Request) -> dict[str, Any]:
    """``logout``: forget the user authenticated on this database (deprecated in mongod)."""
    if req.conn.auth is not None:
        req.conn.auth.logout(req.db)
    return {}


@commands.handler("connectionStatus", secondary="always", privileges=priv.NO_AUTH)
async def connection_status(node: "Node", req: Request) -> dict[str, Any]:
    """``connectionStatus [showPrivileges]``: ``{authInfo: {authenticatedUsers: [{user, db}],
    authenticatedUserRoles: [{role, db}], authenticatedUserPrivileges?}}``
    (``connection_status.cpp``)."""
    sess = req.conn.auth
    users = sess.users if sess is not None else []
    info: dict[str, Any] = {"authenticatedUsers": [{"user": u, "db": d} for u, d in users],
                            "authenticatedUserRoles": []}
    privs: dict = {}
    if sess is not None and users:
        privs = await sess.resolve(node.security.store)
        info["authenticatedUserRoles"] = [{"role": r, "db": d} for r, d in sess.roles]
    if req.body.get("showPrivileges"):
        info["authenticatedUserPrivileges"] = roles_mod.privilege_docs(privs)
    return {"authInfo": info}


async def hello_fields(node: "Node", req: Request) -> dict[str, Any]:
    """``saslSupportedMechs: "<db>.<user>"`` -> the user's mechanisms;
    ``speculativeAuthenticate: {saslStart..., db}`` -> the saslStart reply (left out when it
    fails: the driver then authenticates normally and sees the error)."""
    out: dict[str, Any] = {}
    who = req.body.get("saslSupportedMechs")
    if isinstance(who, str) and "." in who:
        db, user = who.split(".", 1)
        creds = await node.security.credentials(db, user)
        if creds:
            out["saslSupportedMechs"] = [m for m in MECHANISMS if m in creds]
    spec = req.body.get("speculativeAuthenticate")
    if isinstance(spec, dict) and "saslStart" in spec:
        try:
            out["speculativeAuthenticate"] = await sasl_start_reply(
                node, spec, spec.get("db", "admin"), req.conn)
        except MongoError:
            pass
    return out


@commands.handler(shrq.SetClusterKeys.NAME, privileges=priv.INTERNAL)
async def set_cluster_keys(node: "Node", req: Request) -> dict[str, Any]:
    """``{_shardsimSetClusterKeys: [admin.system.keys documents]}`` (shardsim's own; the
    config server sends it to shards): take the HMAC keys. ``__system`` only."""
    docs = shrq.SetClusterKeys.parse(req.body).keys
    node.security.keyring.load([d for d in docs if isinstance(d, dict)])
    return {}


__all__ = ["commands", "hello_fields", "SYSTEM_USER"]
