"""The node's logical session cache and the ``$listLocalSessions`` stage (mongod and mongos
alike).

Every command carrying an ``lsid`` makes its session known to the node that ran it
(``LogicalSessionCache::vivify``, called from ``initializeOperationSessionInfo``); the
``$listLocalSessions`` aggregation stage lists those sessions as ``LogicalSessionRecord``
documents: ``{_id: {id: UUID, uid: BinData(0, sha256)}, lastUse: Date}`` with
``user: {name: "user@db"}`` when the session belongs to an authenticated user
(``document_source_list_local_sessions.cpp``, ``logical_session_id_helpers.cpp``).

Stage options (``ListSessionsSpec``): ``{}`` lists the current user's sessions (the
no-auth uid, SHA-256 of the empty string, without authentication), ``{allUsers: true}``
every session, ``{users: [{user, db}, ...]}`` those users' sessions. Errors as mongod's:
InvalidNamespace (73) outside ``{aggregate: 1}`` (on any database, as mongod since 3.6's
``isCollectionlessAggregateNS`` check), FailedToParse (9) for a
non-object spec, 40414/40415/14 for the spec's fields, 50705 for ``allUsers`` with
``users``.
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

from bson import Binary

from shardsim.core.errors import MongoError

STAGE = "$listLocalSessions"
# kNoAuthDigest: the uid of sessions of unauthenticated clients.
NO_AUTH_UID = Binary(hashlib.sha256(b"").digest(), 0)


def user_uid(user: str, db: str) -> Binary:
    """The uid of ``user@db``'s sessions: SHA-256 of ``"user@db"`` (``getLogicalSessionUserDigestFor``)."""
    return Binary(hashlib.sha256(f"{user}@{db}".encode()).digest(), 0)


def _conn_users(conn: Any) -> list[tuple[str, str]]:
    """The connection's authenticated ``[(user, db)]`` (``[]`` without authentication)."""
    auth = getattr(conn, "auth", None)
    return list(getattr(auth, "users", None) or [])


# localLogicalSessionTimeoutMinutes' default: a session unused this long leaves the cache.
SESSION_TIMEOUT = datetime.timedelta(minutes=30)


class LocalSessionCache:
    """``{session id: record}`` of the sessions this node has seen, least recently used
    first. ``record``: ``{_id: {id, uid}, lastUse: datetime}`` (+ ``user``). Sessions unused
    for :data:`SESSION_TIMEOUT` are dropped as new ones arrive (the server's reaper)."""

    def __init__(self, timeout: datetime.timedelta = SESSION_TIMEOUT) -> None:
        # keyed by the whole LogicalSessionId (see vivify), least recently used first
        self.records: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.timeout = timeout

    def vivify(self, lsid: Any, conn: Any) -> None:
        """Note the session of a command's ``lsid`` (ignored unless ``{id: UUID, ...}``);
        ``lastUse`` becomes now, to the millisecond as BSON dates are. Runs for every command
        carrying an ``lsid``: no per-call work beyond the record itself."""
        if not isinstance(lsid, dict) or "id" not in lsid:
            return
        sid = lsid["id"]
        users = _conn_users(conn) if getattr(conn, "auth", None) is not None else None
        uid = lsid.get("uid")
        if not isinstance(uid, (bytes, Binary)):
            uid = user_uid(*users[0]) if users else NO_AUTH_UID
        uid_b = bytes(uid)
        # keyed by the whole LogicalSessionId: the same id of two users is two sessions
        if type(sid) is Binary:
            key: tuple[Any, ...] = (sid.subtype, bytes(sid), uid_b)
        elif hasattr(sid, "bytes"):  # uuid.UUID (a client's uuidRepresentation)
            key = (4, bytes(sid.bytes), uid_b)
        else:
            key = (None, repr(sid), uid_b)
        now = datetime.datetime.now(datetime.timezone.utc)
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)
        user = {"name": f"{users[0][0]}@{users[0][1]}"} \
            if users and uid_b == bytes(user_uid(*users[0])) else None
        records = self.records
        rec = records.pop(key, None)  # re-inserted last: the dict stays in lastUse order
        if rec is not None and type(rec["_id"]["id"]) is type(sid) and rec.get("user") == user:
            rec["lastUse"] = now  # a known session (the usual case): the same record, touched
        else:
            uid_doc = uid if type(uid) is Binary and uid.subtype == 0 else Binary(uid_b, 0)
            rec = {"_id": {"id": sid, "uid": uid_doc}, "lastUse": now}
            if user is not None:
                rec["user"] = user
        records[key] = rec
        while records:
            oldest = next(iter(records))
            if now - records[oldest]["lastUse"] < self.timeout:
                break
            del records[oldest]

    def list(self, spec: Any, conn: Any) -> list[dict[str, Any]]:
        """The records ``$listLocalSessions: spec`` returns (copies, in first-seen order)."""
        uids = parse_spec(spec, conn)
        out = []
        for rec in self.records.values():
            if uids is None or bytes(rec["_id"]["uid"]) in uids:
                out.append({**rec, "_id": dict(rec["_id"])})
        return out


def parse_spec(spec: Any, conn: Any) -> set[bytes] | None:
    """The uids ``spec`` selects, or None for ``allUsers: true``
    (``ListSessionsSpec`` of ``list_sessions.idl`` and ``listSessionsUsersToDigests``)."""
    if not isinstance(spec, dict):
        raise MongoError(9, f"{STAGE} options must be specified in an object, but found: "
                            f"{type(spec).__name__}")
    for k in spec:
        if k not in ("allUsers", "users", "$_internalPredicate"):
            raise MongoError(40415, f"BSON field 'ListSessionsSpec.{k}' is an unknown field.")
    all_users = spec.get("allUsers", False)
    if not isinstance(all_users, bool):
        raise MongoError(14, "BSON field 'ListSessionsSpec.allUsers' is the wrong type "
                             "'{}', expected type 'bool'".format(type(all_users).__name__))
    users = spec.get("users")
    if all_users and users is not None:
        raise MongoError(50705, "Cannot specify both 'allUsers' and 'users'")  # mongod's code
    if all_users:
        return None
    if users is None:
        mine = _conn_users(conn)
        return {bytes(user_uid(*mine[0]) if mine else NO_AUTH_UID)}
    if not isinstance(users, list):
        raise MongoError(14, "BSON field 'ListSessionsSpec.users' is the wrong type, "
                             "expected type 'array'")
    out = set()
    for u in users:
        if not isinstance(u, dict) or not isinstance(u.get("user"), str) \
                or not isinstance(u.get("db"), str):
            raise MongoError(40414, "BSON field 'ListSessionsUser.user' is missing but a "
                                    "required field")
        out.add(bytes(user_uid(u["user"], u["db"])))
    return out


def is_list_local_sessions(pipeline: Any) -> bool:
    """True when ``pipeline``'s first stage is ``$listLocalSessions``."""
    return bool(pipeline) and isinstance(pipeline[0], dict) and STAGE in pipeline[0]


def local_sessions_docs(cache: LocalSessionCache, db: str, target: Any, pipeline: list[Any],
                        conn: Any) -> list[dict[str, Any]]:
    """The documents of a pipeline's leading ``$listLocalSessions`` stage; InvalidNamespace
    (73) unless it is ``{aggregate: 1}`` (on any database ``db``:
    ``document_source_list_local_sessions.cpp`` checks ``isCollectionlessAggregateNS`` only)."""
    if target != 1 or isinstance(target, bool):
        raise MongoError(73, f"{STAGE} must be run against the database with {{aggregate: 1}}, "
                             f"not a collection")
    return cache.list(pipeline[0][STAGE], conn)
