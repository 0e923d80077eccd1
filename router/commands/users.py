"""User and role management through the router: mongos runs these on the config server
(``src/mongo/s/commands/cluster_user_management_commands.cpp``) and then invalidates its user
cache. ``connectionStatus``, ``saslStart``/``saslContinue`` and ``logout`` are the router's own
(:mod:`shardsim.core.auth.commands`); ``invalidateUserCache`` drops the cache here only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.router.forwarding import forwardable, reply_body
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("users")

FORWARDED = ("createUser", "updateUser", "dropUser", "dropAllUsersFromDatabase", "usersInfo",
             "createRole", "updateRole", "dropRole", "dropAllRolesFromDatabase",
             "grantRolesToUser", "revokeRolesFromUser", "grantRolesToRole", "revokeRolesFromRole",
             "grantPrivilegesToRole", "revokePrivilegesFromRole", "rolesInfo")


async def forward(node: "RouterNode", req: Request) -> dict[str, Any]:
    """Run ``req`` on the config server; drop the user cache after a change."""
    try:
        return reply_body(await node.config_command(forwardable(req.body), db=req.db))
    finally:
        if req.name not in ("usersInfo", "rolesInfo"):
            node.security.store.invalidate()


for _name in FORWARDED:
    commands.add(_name, forward, privileges=priv.checked(_name))


@commands.handler("invalidateUserCache", privileges=priv.on_cluster("invalidateUserCache"))
async def invalidate_user_cache(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``invalidateUserCache``: forget the cached users and roles."""
    node.security.store.invalidate()
    return {}
