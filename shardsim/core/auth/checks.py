"""Authorization of the commands whose rule is more than a list of privileges (the table of
:mod:`shardsim.core.auth.privileges`), with the server's own Unauthorized (13) messages.

``checkMetadataConsistency`` (``cluster_check_metadata_consistency_cmd.cpp``,
``doCheckAuthorization``): the ``checkMetadataConsistency`` action on the cluster (on
``admin``), on the cluster or the database (``{checkMetadataConsistency: 1}`` on a database),
on the cluster or the namespace (on a collection).

The user- and role-management commands, as mongod checks them before it runs one (``src/mongo/db/commands/user_management_commands_common.cpp``, the
``checkAuthForTypedCommand`` overloads and their helpers ``checkAuthorizedToGrantRoles``,
``checkAuthorizedToRevokeRoles``, ``checkAuthorizedToGrantPrivilege(s)``,
``checkAuthorizedToRevokePrivilege(s)``).

The rules, per command (``db`` is the command's database):

* createUser: ``createUser`` on db, then ``grantRole`` on the database of every role given.
* updateUser: ``pwd`` needs ``changePassword`` on db, ``customData`` ``changeCustomData``;
  ``roles`` needs ``revokeRole`` on any normal resource (the caller may be revoking anything)
  and ``grantRole`` on every new role's database.
* grantRolesToUser / grantRolesToRole: ``grantRole`` on each role's database;
  revokeRolesFromUser / revokeRolesFromRole: ``revokeRole`` on each.
* createRole: ``createRole`` on db, ``grantRole`` per role, and per privilege ``grantRole`` on
  its database (a ``{db, collection}`` resource naming one) or on ``admin`` (any other
  resource: the cluster, any database, any resource); grantPrivilegesToRole likewise;
  revokePrivilegesFromRole with ``revokeRole``.
* updateRole: ``revokeRole`` on any normal resource, then the createRole checks for whatever
  roles and privileges it sets.
* dropUser / dropAllUsersFromDatabase: ``dropUser`` on db; dropRole /
  dropAllRolesFromDatabase: ``dropRole``.
* usersInfo: ``1`` -> ``viewUser`` on db; ``{forAllDBs: true}`` -> on the cluster; named users
  -> ``viewUser`` on each user's database, except the caller's own users.
* rolesInfo: ``1`` -> ``viewRole`` on db; named roles -> on each role's database, except roles
  the caller's users hold directly (``isAuthenticatedAsUserWithRole``).

Every refusal is Unauthorized (13) with the server's message (below); :func:`check` raises it.
"""

from __future__ import annotations

from typing import Any, Callable

from shardsim.core.auth import roles as roles_mod
from shardsim.core.auth.roles import Privileges
from shardsim.core.auth.session import AuthSession, role_refs
from shardsim.core.commands import Request
from shardsim.core.errors import MongoError

Check = Callable[[Request, Privileges, AuthSession], None]


def _has(privs: Privileges, target: tuple, action: str) -> bool:
    return roles_mod.authorized(privs, target, [action])


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise MongoError(13, message)


def _roles(req: Request, field: str = "roles") -> list[tuple[str, str]]:
    """The roles the command names (bare strings are roles of the command's database)."""
    value = req.body.get(field)
    return role_refs(value if isinstance(value, list) else [], req.db)


def grant_roles(privs: Privileges, refs: list[tuple[str, str]]) -> None:
    """``checkAuthorizedToGrantRoles``: grantRole on each role's database."""
    for role, db in refs:
        _require(_has(privs, ("db", db), "grantRole"), f"Not authorized to grant role: {role}@{db}")


def revoke_roles(privs: Privileges, refs: list[tuple[str, str]]) -> None:
    """``checkAuthorizedToRevokeRoles``: revokeRole on each role's database."""
    for role, db in refs:
        _require(_has(privs, ("db", db), "revokeRole"),
                 f"Not authorized to revoke role: {role}@{db}")


def _privilege_db(p: Any) -> str | None:
    """The database a privilege document targets (``{db: "x", collection: ...}``), or None
    for a resource spanning databases or the cluster (malformed ones are left to the command,
    which refuses them with BadValue)."""
    res = p.get("resource") if isinstance(p, dict) else None
    if isinstance(res, dict) and isinstance(res.get("db"), str) and res["db"] \
            and isinstance(res.get("collection"), str):
        return res["db"]
    return None


def grant_privileges(privs: Privileges, privileges: Any, action: str = "grantRole") -> None:
    """``checkAuthorizedToGrantPrivilege(s)`` (``revokeRole``: ``...RevokePrivilege(s)``)."""
    verb = "grant" if action == "grantRole" else "revoke"
    for p in privileges if isinstance(privileges, list) else []:
        if not isinstance(p, dict) or not isinstance(p.get("resource"), dict):
            continue
        db = _privilege_db(p)
        if db is not None:
            _require(_has(privs, ("db", db), action),
                     f"Not authorized to {verb} privileges on the {db}database")
        else:
            _require(_has(privs, ("db", "admin"), action),
                     f"To {verb} privileges affecting multiple databases or the cluster, must "
                     f"be authorized to {verb} roles from the admin database")


def _create_user(req: Request, privs: Privileges, sess: AuthSession) -> None:
    _require(_has(privs, ("db", req.db), "createUser"),
             f"Not authorized to create users on db: {req.db}")
    grant_roles(privs, _roles(req))


def _update_user(req: Request, privs: Privileges, sess: AuthSession) -> None:
    who = f"{req.arg}@{req.db}"
    _require("pwd" not in req.body or _has(privs, ("db", req.db), "changePassword"),
             f"Not authorized to change password of user: {who}")
    _require("customData" not in req.body or _has(privs, ("db", req.db), "changeCustomData"),
             f"Not authorized to change customData of user: {who}")
    if "roles" in req.body:
        _require(_has(privs, ("anyNormal",), "revokeRole"),
                 "In order to use updateUser to set roles array, must be authorized to revoke "
                 "any role in the system")
        grant_roles(privs, _roles(req))


def _create_role(req: Request, privs: Privileges, sess: AuthSession) -> None:
    _require(_has(privs, ("db", req.db), "createRole"),
             f"Not authorized to create roles on db: {req.db}")
    grant_roles(privs, _roles(req))
    grant_privileges(privs, req.body.get("privileges"))


def _update_role(req: Request, privs: Privileges, sess: AuthSession) -> None:
    _require(_has(privs, ("anyNormal",), "revokeRole"),
             "updateRole command required the ability to revoke any role in the system")
    if "roles" in req.body:
        grant_roles(privs, _roles(req))
    if "privileges" in req.body:
        grant_privileges(privs, req.body.get("privileges"))


def _on_db(action: str, message: str) -> Check:
    def check(req: Request, privs: Privileges, sess: AuthSession) -> None:
        _require(_has(privs, ("db", req.db), action), message.format(db=req.db))
    return check


def _info_targets(req: Request, key: str) -> list[tuple[str, str]] | str:
    """usersInfo/rolesInfo's argument: "db" (every one of the database), "all"
    (``{forAllDBs: true}``) or the named ``[(name, db)]``."""
    arg = req.arg
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return "db"
    if isinstance(arg, dict) and arg.get("forAllDBs") is True:
        return "all"
    out = []
    for item in arg if isinstance(arg, list) else [arg]:
        if isinstance(item, str):
            out.append((item, req.db))
        elif isinstance(item, dict) and isinstance(item.get(key), str):
            db = item.get("db", req.db)
            out.append((item[key], db if isinstance(db, str) else req.db))
    return out


def _users_info(req: Request, privs: Privileges, sess: AuthSession) -> None:
    targets = _info_targets(req, "user")
    if targets == "all":
        _require(_has(privs, ("cluster",), "viewUser"),
                 "Not authorized to view users from all databases")
        return
    if targets == "db":
        targets = [("", req.db)]
    for user, db in targets:
        if (user, db) in sess.users:
            continue  # "Can always view users you are logged in as."
        _require(_has(privs, ("db", db), "viewUser"),
                 f"Not authorized to view users from the {req.db} database")


def _roles_info(req: Request, privs: Privileges, sess: AuthSession) -> None:
    targets = _info_targets(req, "role")
    if not isinstance(targets, list):
        _require(_has(privs, ("db", req.db), "viewRole"),
                 f"Not authorized to view roles from the {req.db} database")
        return
    for role, db in targets:
        if (role, db) in sess.roles:
            continue  # "Can always see roles that you are a member of"
        _require(_has(privs, ("db", db), "viewRole"),
                 f"Not authorized to view roles from the {db} database")


def _field_check(fn: Callable[[Privileges, list[tuple[str, str]]], None]) -> Check:
    return lambda req, privs, sess: fn(privs, _roles(req))


CHECKS: dict[str, Check] = {
    "createUser": _create_user,
    "updateUser": _update_user,
    "dropUser": _on_db("dropUser", "Not authorized to drop users from the {db} database"),
    "dropAllUsersFromDatabase": _on_db("dropUser",
                                       "Not authorized to drop users from the {db} database"),
    "grantRolesToUser": _field_check(grant_roles),
    "revokeRolesFromUser": _field_check(revoke_roles),
    "usersInfo": _users_info,
    "createRole": _create_role,
    "updateRole": _update_role,
    "dropRole": _on_db("dropRole", "Not authorized to drop roles from the {db} database"),
    "dropAllRolesFromDatabase": _on_db("dropRole",
                                       "Not authorized to drop roles from the {db} database"),
    "grantRolesToRole": _field_check(grant_roles),
    "revokeRolesFromRole": _field_check(revoke_roles),
    "grantPrivilegesToRole": lambda req, privs, sess: grant_privileges(
        privs, req.body.get("privileges")),
    "revokePrivilegesFromRole": lambda req, privs, sess: grant_privileges(
        privs, req.body.get("privileges"), "revokeRole"),
    "rolesInfo": _roles_info,
}


def _check_metadata_consistency(req: Request, privs: Privileges, sess: AuthSession) -> None:
    action = "checkMetadataConsistency"
    if _has(privs, ("cluster",), action):
        return
    _require(req.db != "admin", "Not authorized to check cluster metadata consistency")
    if isinstance(req.arg, str):
        _require(_has(privs, ("ns", req.db, req.arg), action),
                 f"Not authorized to check metadata consistency for collection "
                 f"{req.db}.{req.arg}")
    else:
        _require(_has(privs, ("db", req.db), action),
                 f"Not authorized to check metadata consistency for database {req.db}")


CHECKS["checkMetadataConsistency"] = _check_metadata_consistency


def check(name: str, req: Request, privs: Privileges, sess: AuthSession) -> bool:
    """Run the check of command ``name`` (canonical) for an authenticated connection whose
    privileges are ``privs``; False when ``name`` is not one of :data:`CHECKS`.
    Raises Unauthorized (13) with mongod's message."""
    fn = CHECKS.get(name)
    if fn is None:
        return False
    fn(req, privs, sess)
    return True
