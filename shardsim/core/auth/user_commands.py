"""User and role management on a mongod (``src/mongo/db/commands/user_management_commands.cpp``):
``createUser``, ``updateUser``, ``dropUser``, ``dropAllUsersFromDatabase``, ``usersInfo``,
``createRole``, ``updateRole``, ``dropRole``, ``dropAllRolesFromDatabase``, ``grantRolesToUser``,
``revokeRolesFromUser``, ``grantRolesToRole``, ``revokeRolesFromRole``,
``grantPrivilegesToRole``, ``revokePrivilegesFromRole``, ``rolesInfo``,
``invalidateUserCache``. Who may run each is :mod:`shardsim.core.auth.checks`.

The handlers work on ``node.security.store``, which must have the write methods of
:class:`shardsim.core.auth.store.MemoryUserStore` (``put_user``, ``delete_user``, ``put_role``,
``delete_role``): a shard's and the config server's own ``admin.system.*``. A router forwards
these commands to the config server instead (``router/commands/users.py``).

Errors as mongod: user exists -> 51003 "User "u@db" already exists"; role exists -> 51002;
UserNotFound (11) "User 'u@db' not found"; RoleNotFound (31) "Could not find role: r@db";
BadValue (2) for a missing ``pwd`` or an unknown mechanism; IDL errors for missing ``roles``.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from bson import Binary

from shardsim.core.auth import roles as roles_mod
from shardsim.core.auth.scram import MECHANISMS, make_credentials
from shardsim.core.auth.session import resolve_roles, role_refs
from shardsim.core.commands import CommandFamily, Request, check_type
from shardsim.core.errors import MongoError
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.core.node import Node

commands = CommandFamily("users")


async def _check_roles(node: "Node", refs: list[tuple[str, str]]) -> None:
    for role, db in refs:
        if roles_mod.is_builtin(role, db):
            continue
        if await node.security.store.get_role(db, role) is None:
            raise MongoError(31, f"Could not find role: {role}@{db}")


def _roles_arg(req: Request, field: str = "roles") -> list[tuple[str, str]]:
    value = req.body.get(field)
    if field not in req.body:
        raise MongoError(40414, f"BSON field '{req.name}.{field}' is missing but a required field")
    if not isinstance(value, list):
        raise MongoError(14, f"BSON field '{req.name}.{field}' is the wrong type, expected type "
                             f"'array'")
    for r in value:
        if not isinstance(r, (str, dict)):
            raise MongoError(14, f"BSON field '{req.name}.{field}' is the wrong type, expected "
                                 f"type 'string or object'")
    return role_refs(value, req.db)


def _mechanisms(req: Request) -> list[str]:
    mechs = req.body.get("mechanisms", list(MECHANISMS))
    if not isinstance(mechs, list) or not mechs:
        raise MongoError(2, "mechanisms field must not be empty")
    for m in mechs:
        if m not in MECHANISMS:
            raise MongoError(2, f"Unknown auth mechanism '{m}'")
    return mechs


def _credentials(req: Request, user: str, mechs: list[str]) -> dict[str, Any]:
    pwd = req.body.get("pwd")
    if not isinstance(pwd, str):
        raise MongoError(2, "Must provide a 'pwd' field for all user documents, except those "
                            "with '$external' as the user's source db")
    if not pwd:
        raise MongoError(2, "Password cannot be empty")
    if req.body.get("digestPassword") is False:
        raise MongoError(2, "Use of SCRAM-SHA-256 requires undigested passwords")
    try:
        return make_credentials(user, pwd, mechs)
    except ValueError as exc:
        raise MongoError(2, f"Error preflighting normalization: {exc}") from None


def _role_docs(refs: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"role": r, "db": d} for r, d in refs]


@commands.handler("createUser", privileges=priv.checked("createUser"))
async def create_user(node: "Node", req: Request) -> dict[str, Any]:
    """``{createUser: name, pwd, roles, customData?, mechanisms?}`` on the user's database."""
    name = check_type(req, "createUser", str, "string", required=True)
    if not name:
        raise MongoError(2, "User document needs 'user' field to be non-empty")
    refs = _roles_arg(req)
    store = node.security.store
    if await store.get_user(req.db, name) is not None:
        raise MongoError(51003, f'User "{name}@{req.db}" already exists')
    await _check_roles(node, refs)
    mechs = _mechanisms(req)
    doc: dict[str, Any] = {"_id": f"{req.db}.{name}", "userId": Binary(uuid.uuid4().bytes, 4),
                           "user": name, "db": req.db,
                           "credentials": _credentials(req, name, mechs),
                           "roles": _role_docs(refs)}
    if isinstance(req.body.get("customData"), dict):
        doc["customData"] = req.body["customData"]
    await store.put_user(doc)
    return {}


async def _user_doc(node: "Node", req: Request, name: Any) -> dict[str, Any]:
    if not isinstance(name, str):
        raise MongoError(14, f"BSON field '{req.name}.{req.name}' is the wrong type, expected "
                             f"type 'string'")
    doc = await node.security.store.get_user(req.db, name)
    if doc is None:
        raise MongoError(11, f"User '{name}@{req.db}' not found")
    return dict(doc)


@commands.handler("updateUser", privileges=priv.checked("updateUser"))
async def update_user(node: "Node", req: Request) -> dict[str, Any]:
    """``{updateUser: name, pwd?, roles?, customData?, mechanisms?}``."""
    doc = await _user_doc(node, req, req.arg)
    if "pwd" in req.body:
        doc["credentials"] = _credentials(req, doc["user"], _mechanisms(req))
    if "roles" in req.body:
        refs = _roles_arg(req)
        await _check_roles(node, refs)
        doc["roles"] = _role_docs(refs)
    if "customData" in req.body:
        doc["customData"] = req.body["customData"]
    await node.security.store.put_user(doc)
    return {}


@commands.handler("dropUser", privileges=priv.checked("dropUser"))
async def drop_user(node: "Node", req: Request) -> dict[str, Any]:
    """``{dropUser: name}``; UserNotFound (11) when there is none."""
    doc = await _user_doc(node, req, req.arg)
    await node.security.store.delete_user(doc["_id"])
    return {}


@commands.handler("dropAllUsersFromDatabase", privileges=priv.checked("dropAllUsersFromDatabase"))
async def drop_all_users(node: "Node", req: Request) -> dict[str, Any]:
    """``{dropAllUsersFromDatabase: 1}``: ``{n: <dropped>}``."""
    store = node.security.store
    n = 0
    for doc in await store.users():
        if doc.get("db") == req.db:
            n += await store.delete_user(doc["_id"])
    return {"n": n}


@commands.handler("grantRolesToUser", privileges=priv.checked("grantRolesToUser"))
async def grant_roles(node: "Node", req: Request) -> dict[str, Any]:
    """``{grantRolesToUser: name, roles: [...]}``."""
    doc = await _user_doc(node, req, req.arg)
    refs = _roles_arg(req)
    await _check_roles(node, refs)
    have = role_refs(doc.get("roles"), req.db)
    doc["roles"] = _role_docs(have + [r for r in refs if r not in have])
    await node.security.store.put_user(doc)
    return {}


@commands.handler("revokeRolesFromUser", privileges=priv.checked("revokeRolesFromUser"))
async def revoke_roles(node: "Node", req: Request) -> dict[str, Any]:
    """``{revokeRolesFromUser: name, roles: [...]}``."""
    doc = await _user_doc(node, req, req.arg)
    refs = _roles_arg(req)
    doc["roles"] = _role_docs([r for r in role_refs(doc.get("roles"), req.db) if r not in refs])
    await node.security.store.put_user(doc)
    return {}


def _targets(req: Request, key: str) -> list[tuple[str, str]] | None:
    """usersInfo/rolesInfo argument -> ``[(name, db)]``; None for every one of the database."""
    arg = req.arg
    if arg == 1 or (isinstance(arg, (int, float)) and not isinstance(arg, bool)):
        return None
    items = arg if isinstance(arg, list) else [arg]
    out = []
    for item in items:
        if isinstance(item, str):
            out.append((item, req.db))
        elif isinstance(item, dict) and isinstance(item.get(key), str):
            out.append((item[key], item.get("db", req.db)))
        else:
            raise MongoError(2, f"{req.name} argument must be a string, document or array")
    return out


@commands.handler("usersInfo", secondary="optIn", privileges=priv.checked("usersInfo"))
async def users_info(node: "Node", req: Request) -> dict[str, Any]:
    """``{usersInfo: 1 | name | {user, db} | {forAllDBs: true} | [...], showCredentials?,
    showPrivileges?}``:
    ``{users: [{_id, userId, user, db, roles, mechanisms, customData?, inheritedRoles?,
    inheritedPrivileges?}]}`` sorted by ``_id``."""
    store = node.security.store
    every_db = isinstance(req.arg, dict) and req.arg.get("forAllDBs") is True
    targets = None if every_db else _targets(req, "user")
    docs = [d for d in await store.users()
            if every_db or (targets is None and d.get("db") == req.db)
            or (targets is not None and (d.get("user"), d.get("db")) in targets)]
    out = []
    for d in sorted(docs, key=lambda d: d["_id"]):
        u = {"_id": d["_id"], "userId": d.get("userId"), "user": d["user"], "db": d["db"],
             "roles": d.get("roles", [])}
        if "customData" in d:
            u["customData"] = d["customData"]
        u["mechanisms"] = [m for m in MECHANISMS if m in (d.get("credentials") or {})]
        if req.body.get("showCredentials"):
            u["credentials"] = d.get("credentials")
        if req.body.get("showPrivileges"):
            privs: dict = {}
            inherited = await resolve_roles(store, role_refs(d.get("roles"), d["db"]), privs)
            u["inheritedRoles"] = _role_docs(inherited)
            u["inheritedPrivileges"] = roles_mod.privilege_docs(privs)
        out.append(u)
    return {"users": out}


def _privileges_arg(req: Request, role_db: str) -> list[dict[str, Any]]:
    """``privileges: [{resource, actions}]``, each resource valid (BadValue 2), and allowed
    for a role of ``role_db`` (``checkOkayToGrantPrivilegesToRole``: outside ``admin`` only
    ``{db: role_db, collection}`` resources; InvalidRoleModification 49 otherwise)."""
    privileges = check_type(req, "privileges", list, "array", required=True)
    for p in privileges:
        if not isinstance(p, dict) or not isinstance(p.get("actions"), list):
            raise MongoError(2, "privileges must be objects with 'resource' and 'actions'")
        pattern = roles_mod.pattern_from_resource(p.get("resource"))
        if role_db != "admin" and not (pattern[0] in ("db", "exact") and pattern[1] == role_db):
            raise MongoError(49, f"Roles on the '{role_db}' database cannot be granted privileges "
                                 f"that target other databases or the cluster")
    return privileges


async def _check_roles_to_role(node: "Node", role: tuple[str, str],
                               refs: list[tuple[str, str]]) -> None:
    """``checkOkayToGrantRolesToRole`` (user_management_commands.cpp): not itself, from the
    role's own database unless it is in ``admin`` (InvalidRoleModification 49), existing
    (RoleNotFound 31), and no cycle (49)."""
    name = f"{role[0]}@{role[1]}"
    for ref in refs:
        if ref == role:
            raise MongoError(49, f"Cannot grant role {name} to itself.")
        if role[1] != "admin" and ref[1] != role[1]:
            raise MongoError(49, f"Roles on the '{role[1]}' database cannot be granted roles "
                                 f"from other databases")
    try:
        await _check_roles(node, refs)
    except MongoError as exc:
        raise MongoError(exc.code, f"Cannot grant roles to '{name}': {exc.errmsg}") from None
    if role in await resolve_roles(node.security.store, refs, {}):
        raise MongoError(49, f"Granting roles to {name} would introduce a cycle in the role "
                             f"graph")


@commands.handler("createRole", privileges=priv.checked("createRole"))
async def create_role(node: "Node", req: Request) -> dict[str, Any]:
    """``{createRole: name, privileges: [{resource, actions}], roles: [...]}``."""
    name = check_type(req, "createRole", str, "string", required=True)
    store = node.security.store
    if roles_mod.is_builtin(name, req.db) or await store.get_role(req.db, name) is not None:
        raise MongoError(51002, f'Role "{name}@{req.db}" already exists')
    privileges = _privileges_arg(req, req.db)
    refs = _roles_arg(req)
    await _check_roles_to_role(node, (name, req.db), refs)
    await store.put_role({"_id": f"{req.db}.{name}", "role": name, "db": req.db,
                          "privileges": privileges, "roles": _role_docs(refs)})
    return {}


@commands.handler("dropRole", privileges=priv.checked("dropRole"))
async def drop_role(node: "Node", req: Request) -> dict[str, Any]:
    """``{dropRole: name}``; RoleNotFound (31)."""
    name = req.arg
    if not isinstance(name, str) or not await node.security.store.delete_role(f"{req.db}.{name}"):
        raise MongoError(31, f"Could not find role: {name}@{req.db}")
    return {}


async def _role_doc(node: "Node", req: Request) -> dict[str, Any]:
    """The custom role the command names (``{<cmd>: name}``): InvalidRoleModification (49)
    for a built-in one, RoleNotFound (31) for none."""
    name = req.arg
    if not isinstance(name, str):
        raise MongoError(14, f"BSON field '{req.name}.{req.name}' is the wrong type, expected "
                             f"type 'string'")
    if roles_mod.is_builtin(name, req.db):
        raise MongoError(49, f"{name}@{req.db} is a built-in role and cannot be modified.")
    doc = await node.security.store.get_role(req.db, name)
    if doc is None:
        raise MongoError(31, f"Could not find role: {name}@{req.db}")
    return dict(doc)


@commands.handler("updateRole", privileges=priv.checked("updateRole"))
async def update_role(node: "Node", req: Request) -> dict[str, Any]:
    """``{updateRole: name, privileges?, roles?}``: replaces what is given; BadValue (2) when
    neither is."""
    if "privileges" not in req.body and "roles" not in req.body:
        raise MongoError(2, "Must specify at least one field to update in updateRole")
    doc = await _role_doc(node, req)
    if "privileges" in req.body:
        doc["privileges"] = _privileges_arg(req, req.db)
    if "roles" in req.body:
        refs = _roles_arg(req)
        await _check_roles_to_role(node, (doc["role"], req.db), refs)
        doc["roles"] = _role_docs(refs)
    await node.security.store.put_role(doc)
    return {}


@commands.handler("grantRolesToRole", privileges=priv.checked("grantRolesToRole"))
async def grant_roles_to_role(node: "Node", req: Request) -> dict[str, Any]:
    """``{grantRolesToRole: name, roles: [...]}``."""
    doc = await _role_doc(node, req)
    refs = _roles_arg(req)
    await _check_roles_to_role(node, (doc["role"], req.db), refs)
    have = role_refs(doc.get("roles"), req.db)
    doc["roles"] = _role_docs(have + [r for r in refs if r not in have])
    await node.security.store.put_role(doc)
    return {}


@commands.handler("revokeRolesFromRole", privileges=priv.checked("revokeRolesFromRole"))
async def revoke_roles_from_role(node: "Node", req: Request) -> dict[str, Any]:
    """``{revokeRolesFromRole: name, roles: [...]}``."""
    doc = await _role_doc(node, req)
    refs = _roles_arg(req)
    doc["roles"] = _role_docs([r for r in role_refs(doc.get("roles"), req.db) if r not in refs])
    await node.security.store.put_role(doc)
    return {}


def _merge_privileges(have: list[dict[str, Any]], change: list[dict[str, Any]],
                      grant: bool) -> list[dict[str, Any]]:
    """Add (``grant``) or remove ``change``'s actions per resource."""
    out: dict[tuple, set[str]] = {}
    for p in have:
        try:
            out.setdefault(roles_mod.pattern_from_resource(p.get("resource")), set()).update(
                p.get("actions") or [])
        except MongoError:
            continue
    for p in change:
        acts = out.setdefault(roles_mod.pattern_from_resource(p.get("resource")), set())
        acts.update(p["actions"]) if grant else acts.difference_update(p["actions"])
    return [{"resource": roles_mod.resource_from_pattern(k), "actions": sorted(v)}
            for k, v in out.items() if v]


async def _change_privileges(node: "Node", req: Request, grant: bool) -> dict[str, Any]:
    doc = await _role_doc(node, req)
    privileges = _privileges_arg(req, req.db if grant else "admin")
    doc["privileges"] = _merge_privileges(list(doc.get("privileges") or []), privileges, grant)
    await node.security.store.put_role(doc)
    return {}


@commands.handler("grantPrivilegesToRole", privileges=priv.checked("grantPrivilegesToRole"))
async def grant_privileges(node: "Node", req: Request) -> dict[str, Any]:
    """``{grantPrivilegesToRole: name, privileges: [{resource, actions}]}``: adds the actions
    (InvalidRoleModification 49 for a resource outside a non-admin role's database)."""
    return await _change_privileges(node, req, True)


@commands.handler("revokePrivilegesFromRole", privileges=priv.checked("revokePrivilegesFromRole"))
async def revoke_privileges(node: "Node", req: Request) -> dict[str, Any]:
    """``{revokePrivilegesFromRole: name, privileges: [...]}``: removes the actions."""
    return await _change_privileges(node, req, False)


@commands.handler("dropAllRolesFromDatabase", privileges=priv.checked("dropAllRolesFromDatabase"))
async def drop_all_roles(node: "Node", req: Request) -> dict[str, Any]:
    """``{dropAllRolesFromDatabase: 1}``: ``{n: <dropped>}``."""
    store = node.security.store
    n = 0
    for doc in await store.roles():
        if doc.get("db") == req.db:
            n += await store.delete_role(doc["_id"])
    return {"n": n}


@commands.handler("rolesInfo", secondary="optIn", privileges=priv.checked("rolesInfo"))
async def roles_info(node: "Node", req: Request) -> dict[str, Any]:
    """``{rolesInfo: 1 | name | {role, db} | [...], showPrivileges?, showBuiltinRoles?}``:
    ``{roles: [{role, db, isBuiltin, roles, inheritedRoles, privileges?,
    inheritedPrivileges?}]}``."""
    store = node.security.store
    targets = _targets(req, "role")
    if targets is None:
        targets = [(d["role"], d["db"]) for d in await store.roles() if d.get("db") == req.db]
        if req.body.get("showBuiltinRoles"):
            targets = [(r, req.db) for r in roles_mod.builtin_roles_of(req.db)] + targets
    out = []
    for role, db in targets:
        builtin = roles_mod.is_builtin(role, db)
        doc = None if builtin else await store.get_role(db, role)
        if not builtin and doc is None:
            continue  # mongod leaves unknown roles out
        direct = [] if builtin else role_refs(doc.get("roles"), db)
        privs: dict = {}
        inherited = await resolve_roles(store, [(role, db)], privs)
        r: dict[str, Any] = {"role": role, "db": db, "isBuiltin": builtin,
                             "roles": _role_docs(direct),
                             "inheritedRoles": _role_docs([x for x in inherited if x != (role, db)])}
        if req.body.get("showPrivileges"):
            own: dict = {}
            if builtin:
                roles_mod.builtin_privileges(role, db, own, [])
                r["privileges"] = roles_mod.privilege_docs(own)
            else:
                r["privileges"] = list(doc.get("privileges") or [])
            r["inheritedPrivileges"] = roles_mod.privilege_docs(privs)
        out.append(r)
    return {"roles": out}


@commands.handler("invalidateUserCache", privileges=priv.on_cluster("invalidateUserCache"))
async def invalidate_user_cache(node: "Node", req: Request) -> dict[str, Any]:
    """``invalidateUserCache``: drop cached users (a router's cache; a no-op on a mongod)."""
    node.security.store.invalidate()
    return {}
