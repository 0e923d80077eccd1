"""Who may manage users, roles and sessions (issue 28, findings S1, S2, S3, S5, L3): every
user- and role-management command and the session commands, run on a node with
authentication on, by five users (userAdmin, dbOwner and read on ``dbX``,
userAdminAnyDatabase and root), allowed or Unauthorized (13) as mongod decides
(``user_management_commands_common.cpp``, ``listSessionsRequiredPrivileges``,
``cluster_check_metadata_consistency_cmd.cpp``), plus what the commands themselves refuse
(InvalidRoleModification 49) and the binding of session ids to users
(``makeLogicalSessionId``)."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from typing import Any

import pytest
from bson import Binary

from shardsim.core.auth.session import AuthSession
from shardsim.core.auth.store import MemoryUserStore
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.node import Node
from shardsim.router.node import RouterNode
from shardsim.shard.node import ShardNode

USERS = {
    "ua": ("ua", "dbX", [("userAdmin", "dbX")]),
    "owner": ("owner", "dbX", [("dbOwner", "dbX")]),
    "reader": ("reader", "dbX", [("read", "dbX")]),
    "uaAny": ("uaAny", "admin", [("userAdminAnyDatabase", "admin")]),
    "root": ("root", "admin", [("root", "admin")]),
}
ORDER = ("ua", "owner", "reader", "uaAny", "root")


def _user_doc(name: str, db: str, roles: list[tuple[str, str]]) -> dict[str, Any]:
    return {"_id": f"{db}.{name}", "user": name, "db": db, "credentials": {"SCRAM-SHA-256": {}},
            "roles": [{"role": r, "db": d} for r, d in roles]}


def _node(router: bool = False) -> Node:
    """A node with authentication on, the user-management commands and a memory store holding
    the five users, a target user ``t@dbX`` and a custom role ``custom@dbX``."""
    # a shard (or a router, for the router's own commands): each command declares what it needs
    node = RouterNode(configdb="127.0.0.1:1", options={"auth": True}) if router \
        else ShardNode(options={"auth": True})
    store = node.security.store = MemoryUserStore()

    async def fill() -> None:
        for name, db, roles in USERS.values():
            await store.put_user(_user_doc(name, db, roles))
        await store.put_user(_user_doc("t", "dbX", [("read", "dbX")]))
        await store.put_role({"_id": "dbX.custom", "role": "custom", "db": "dbX",
                              "privileges": [], "roles": []})
    asyncio.run(fill())
    return node


def _conn(who: str) -> ConnectionInfo:
    name, db, _ = USERS[who]
    return ConnectionInfo(id=1, peer="10.0.0.9:5000", auth=AuthSession(users=[(name, db)]))


def _run(node: Node, who: str, body: dict[str, Any], db: str = "dbX") -> dict[str, Any]:
    req = Request(next(iter(body)), db, dict(body), _conn(who))
    return asyncio.run(node.run_command(req))


def _authorize(node: Node, who: str, body: dict[str, Any], db: str = "admin") -> int | None:
    """The authorization alone (what the command then does is not asked): None or the code."""
    req = Request(next(iter(body)), db, dict(body), _conn(who))
    try:
        asyncio.run(node.security.authorize(req))
    except Exception as exc:  # MongoError
        return getattr(exc, "code", -1)
    return None


PRIV_DBX = [{"resource": {"db": "dbX", "collection": ""}, "actions": ["find"]}]
PRIV_ANY = [{"resource": {"anyResource": True}, "actions": ["anyAction"]}]
PRIV_CLUSTER = [{"resource": {"cluster": True}, "actions": ["shutdown"]}]
ROOT_ROLES = [{"role": "root", "db": "admin"}, {"role": "__system", "db": "admin"}]
A, D = True, False  # allowed, denied (13)

# (case id, command, database, allowed for ua / owner / reader / uaAny / root)
UMC_TABLE = [
    ("createUser", {"createUser": "n1", "pwd": "pw", "roles": ["read"]}, "dbX", (A, A, D, A, A)),
    ("createUser-root-role", {"createUser": "n2", "pwd": "pw", "roles": ROOT_ROLES}, "dbX",
     (D, D, D, A, A)),
    ("updateUser-pwd", {"updateUser": "t", "pwd": "new"}, "dbX", (A, A, D, A, A)),
    ("updateUser-roles-root", {"updateUser": "t", "roles": ROOT_ROLES}, "dbX", (D, D, D, A, A)),
    ("updateUser-roles-same-db", {"updateUser": "t", "roles": ["readWrite"]}, "dbX",
     (D, D, D, A, A)),
    ("dropUser", {"dropUser": "t"}, "dbX", (A, A, D, A, A)),
    ("dropAllUsersFromDatabase", {"dropAllUsersFromDatabase": 1}, "dbY", (D, D, D, A, A)),
    ("grantRolesToUser", {"grantRolesToUser": "t", "roles": ["readWrite"]}, "dbX",
     (A, A, D, A, A)),
    ("grantRolesToUser-admin", {"grantRolesToUser": "t",
                                "roles": [{"role": "readWriteAnyDatabase", "db": "admin"}]},
     "dbX", (D, D, D, A, A)),
    ("revokeRolesFromUser", {"revokeRolesFromUser": "t", "roles": ["read"]}, "dbX",
     (A, A, D, A, A)),
    ("createRole", {"createRole": "r1", "privileges": PRIV_DBX, "roles": []}, "dbX",
     (A, A, D, A, A)),
    ("createRole-anyResource", {"createRole": "r2", "privileges": PRIV_ANY, "roles": []}, "dbX",
     (D, D, D, A, A)),
    ("createRole-root-role", {"createRole": "r3", "privileges": [],
                              "roles": [{"role": "root", "db": "admin"}]}, "dbX",
     (D, D, D, A, A)),
    ("updateRole", {"updateRole": "custom", "privileges": PRIV_DBX}, "dbX", (D, D, D, A, A)),
    ("dropRole", {"dropRole": "custom"}, "dbX", (A, A, D, A, A)),
    ("dropAllRolesFromDatabase", {"dropAllRolesFromDatabase": 1}, "dbX", (A, A, D, A, A)),
    ("grantRolesToRole", {"grantRolesToRole": "custom", "roles": ["read"]}, "dbX",
     (A, A, D, A, A)),
    ("grantRolesToRole-root", {"grantRolesToRole": "custom",
                               "roles": [{"role": "root", "db": "admin"}]}, "dbX",
     (D, D, D, A, A)),
    ("revokeRolesFromRole", {"revokeRolesFromRole": "custom", "roles": ["read"]}, "dbX",
     (A, A, D, A, A)),
    ("grantPrivilegesToRole", {"grantPrivilegesToRole": "custom", "privileges": PRIV_DBX},
     "dbX", (A, A, D, A, A)),
    ("grantPrivilegesToRole-cluster", {"grantPrivilegesToRole": "custom",
                                       "privileges": PRIV_CLUSTER}, "dbX", (D, D, D, A, A)),
    ("revokePrivilegesFromRole", {"revokePrivilegesFromRole": "custom", "privileges": PRIV_DBX},
     "dbX", (A, A, D, A, A)),
    ("usersInfo-db", {"usersInfo": 1}, "dbX", (A, A, D, A, A)),
    ("usersInfo-root-credentials", {"usersInfo": {"user": "root", "db": "admin"},
                                    "showCredentials": True}, "dbX", (D, D, D, A, A)),
    ("usersInfo-forAllDBs", {"usersInfo": {"forAllDBs": True}}, "dbX", (D, D, D, A, A)),
    ("rolesInfo-db", {"rolesInfo": 1}, "dbX", (A, A, D, A, A)),
    ("rolesInfo-root", {"rolesInfo": {"role": "root", "db": "admin"}}, "dbX", (D, D, D, A, A)),
    ("rolesInfo-own-role", {"rolesInfo": "read"}, "dbX", (A, A, A, A, A)),
]


@pytest.mark.parametrize("case,body,db,expected", UMC_TABLE, ids=[c[0] for c in UMC_TABLE])
@pytest.mark.parametrize("who", ORDER)
def test_user_and_role_management_authorization(case: str, body: dict, db: str,
                                                expected: tuple, who: str) -> None:
    reply = _run(_node(), who, body, db)
    allowed = expected[ORDER.index(who)]
    if allowed:
        assert reply.get("code") != 13, reply
    else:
        assert reply["ok"] == 0.0 and reply["code"] == 13, reply
        assert reply["codeName"] == "Unauthorized"


SESSION_TABLE = [
    ("listLocalSessions-own", {"aggregate": 1, "pipeline": [{"$listLocalSessions": {}}],
                               "cursor": {}}, (A, A, A, A, A)),
    ("listLocalSessions-allUsers", {"aggregate": 1, "pipeline": [
        {"$listLocalSessions": {"allUsers": True}}], "cursor": {}}, (D, D, D, D, A)),
    ("listLocalSessions-root", {"aggregate": 1, "pipeline": [
        {"$listLocalSessions": {"users": [{"user": "root", "db": "admin"}]}}], "cursor": {}},
     (D, D, D, D, A)),
    ("listSessions-allUsers", {"aggregate": "system.sessions", "pipeline": [
        {"$listSessions": {"allUsers": True}}], "cursor": {}}, (D, D, D, D, A)),
    ("endSessions", {"endSessions": [{"id": Binary(uuid.uuid4().bytes, 4)}]}, (A, A, A, A, A)),
    ("killSessions", {"killSessions": [{"id": Binary(uuid.uuid4().bytes, 4)}]},
     (A, A, A, A, A)),
    ("killAllSessions", {"killAllSessions": []}, (D, D, D, D, A)),
    ("checkMetadataConsistency-db", {"checkMetadataConsistency": 1}, (D, D, D, D, A)),
]


@pytest.mark.parametrize("case,body,expected", SESSION_TABLE, ids=[c[0] for c in SESSION_TABLE])
@pytest.mark.parametrize("who", ORDER)
def test_session_commands_authorization(case: str, body: dict, expected: tuple,
                                        who: str) -> None:
    db = "dbX" if case.startswith("checkMetadata") else "admin"
    code = _authorize(_node(router=case.startswith("checkMetadata")), who, body, db)
    assert code == (None if expected[ORDER.index(who)] else 13)


def test_refusals_carry_the_servers_messages() -> None:
    node = _node()
    reply = _run(node, "ua", {"updateUser": "ua", "roles": ROOT_ROLES})
    assert reply["errmsg"] == ("In order to use updateUser to set roles array, must be "
                               "authorized to revoke any role in the system")
    reply = _run(node, "ua", {"createUser": "x", "pwd": "p", "roles": ROOT_ROLES})
    assert reply["errmsg"] == "Not authorized to grant role: root@admin"
    reply = _run(node, "ua", {"createRole": "x", "privileges": PRIV_ANY, "roles": []})
    assert reply["errmsg"] == ("To grant privileges affecting multiple databases or the "
                               "cluster, must be authorized to grant roles from the admin "
                               "database")
    reply = _run(node, "ua", {"usersInfo": {"user": "root", "db": "admin"},
                              "showCredentials": True})
    assert reply["errmsg"] == "Not authorized to view users from the dbX database"
    assert "users" not in reply
    reply = _run(node, "reader", {"usersInfo": "reader"})  # one's own user needs nothing
    assert reply["ok"] == 1.0 and [u["user"] for u in reply["users"]] == ["reader"]


def test_role_outside_admin_may_not_name_other_databases() -> None:
    """checkOkayToGrantPrivilegesToRole / checkOkayToGrantRolesToRole: even root gets
    InvalidRoleModification (49) for a dbX role with a cluster-wide privilege or an admin
    role; the same role in admin is fine."""
    node = _node()
    for body in ({"createRole": "x", "privileges": PRIV_ANY, "roles": []},
                 {"createRole": "x", "privileges": [{"resource": {"db": "dbY", "collection": ""},
                                                     "actions": ["find"]}], "roles": []},
                 {"grantPrivilegesToRole": "custom", "privileges": PRIV_CLUSTER}):
        reply = _run(node, "root", body)
        assert reply["code"] == 49 and reply["codeName"] == "InvalidRoleModification"
        assert reply["errmsg"] == ("Roles on the 'dbX' database cannot be granted privileges "
                                   "that target other databases or the cluster")
    reply = _run(node, "root", {"grantRolesToRole": "custom",
                                "roles": [{"role": "root", "db": "admin"}]})
    assert reply["code"] == 49
    assert reply["errmsg"] == ("Roles on the 'dbX' database cannot be granted roles from other "
                               "databases")
    reply = _run(node, "root", {"grantRolesToRole": "custom", "roles": ["custom"]})
    assert reply["errmsg"] == "Cannot grant role custom@dbX to itself."
    assert _run(node, "root", {"createRole": "x", "privileges": PRIV_ANY,
                               "roles": []}, "admin")["ok"] == 1.0


def test_role_commands_change_the_role() -> None:
    node = _node()
    assert _run(node, "owner", {"grantPrivilegesToRole": "custom",
                                "privileges": PRIV_DBX})["ok"] == 1.0
    assert _run(node, "owner", {"grantRolesToRole": "custom", "roles": ["read"]})["ok"] == 1.0
    info = _run(node, "owner", {"rolesInfo": "custom", "showPrivileges": True})["roles"][0]
    assert info["privileges"] == PRIV_DBX and info["roles"] == [{"role": "read", "db": "dbX"}]
    assert _run(node, "root", {"updateRole": "custom", "privileges": [], "roles": []})["ok"] == 1
    info = _run(node, "owner", {"rolesInfo": "custom", "showPrivileges": True})["roles"][0]
    assert info["privileges"] == [] and info["roles"] == []
    reply = _run(node, "owner", {"dropAllRolesFromDatabase": 1})
    assert (reply["ok"], reply["n"]) == (1.0, 1)


def _uid(user: str, db: str) -> bytes:
    return hashlib.sha256(f"{user}@{db}".encode()).digest()


def test_session_ids_are_qualified_by_the_users_digest() -> None:
    """makeLogicalSessionId: an lsid without uid gets SHA-256("user@db"); another user's uid
    is refused (13); the internal user may pass any uid."""
    node = _node()
    sid = Binary(uuid.uuid4().bytes, 4)

    def qualify(conn: ConnectionInfo, lsid: dict) -> Any:
        req = Request("find", "dbX", {"find": "c", "lsid": lsid}, conn)
        try:
            asyncio.run(node.security.qualify_sessions(req, "find"))
        except Exception as exc:
            return (exc.code, str(exc))
        return req.body["lsid"]

    assert bytes(qualify(_conn("reader"), {"id": sid})["uid"]) == _uid("reader", "dbX")
    assert bytes(qualify(_conn("root"), {"id": sid})["uid"]) == _uid("root", "admin")
    root_uid = Binary(_uid("root", "admin"), 0)
    assert qualify(_conn("reader"), {"id": sid, "uid": root_uid}) == (
        13, "Unauthorized to set user digest in LogicalSessionId")
    assert qualify(_conn("root"), {"id": sid, "uid": root_uid})["uid"] == root_uid
    system = ConnectionInfo(id=2, peer="x", auth=AuthSession(users=[("__system", "local")]))
    assert qualify(system, {"id": sid, "uid": root_uid})["uid"] == root_uid


def test_local_session_cache_keeps_two_users_sessions_apart() -> None:
    """The same session id sent by two users is two $listLocalSessions records (the cache is
    keyed by {id, uid}, LogicalSessionCache)."""
    node = _node()
    sid = Binary(uuid.uuid4().bytes, 4)
    for who in ("reader", "root"):
        reply = _run(node, who, {"usersInfo": USERS[who][0], "lsid": {"id": sid}},
                     USERS[who][1])
        assert reply["ok"] == 1.0, reply
    recs = node.local_sessions.list({"allUsers": True}, None)
    assert sorted(bytes(r["_id"]["uid"]) for r in recs) == sorted(
        [_uid("reader", "dbX"), _uid("root", "admin")])
    assert sorted(r["user"]["name"] for r in recs) == ["reader@dbX", "root@admin"]
