"""Per-connection authentication state and privilege resolution
(``AuthorizationSession`` in ``src/mongo/db/auth/authorization_session_impl.cpp``).

An :class:`AuthSession` hangs off :class:`shardsim.core.commands.ConnectionInfo` (``conn.auth``):
the authenticated users (``[(user, db)]``, at most one per database as in mongod), the SCRAM
conversation in progress, and the privileges resolved from the users' roles, re-resolved when
the user store's ``generation`` changes (user cache invalidation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardsim.core.auth import roles as roles_mod
from shardsim.core.auth.roles import Privileges
from shardsim.core.auth.store import UserStore

SYSTEM_USER = ("__system", "local")


@dataclass
class AuthSession:
    """One connection's authentication. ``users``: ``[(user, db)]``; ``conversation``: the
    :class:`shardsim.core.auth.scram.ServerConversation` in progress (with ``conversation_db``);
    ``privileges``/``roles``: resolved from ``users`` for ``generation``."""

    users: list[tuple[str, str]] = field(default_factory=list)
    conversation: Any = None
    conversation_db: str = ""
    privileges: Privileges = field(default_factory=dict)
    roles: list[tuple[str, str]] = field(default_factory=list)
    generation: int = -1

    @property
    def authenticated(self) -> bool:
        return bool(self.users)

    @property
    def is_system(self) -> bool:
        """Authenticated as the cluster's internal user (``__system@local``)."""
        return SYSTEM_USER in self.users

    def add_user(self, user: str, db: str) -> None:
        """A successful authentication: replaces any user of the same database."""
        self.users = [u for u in self.users if u[1] != db] + [(user, db)]
        self.generation = -1

    def logout(self, db: str) -> None:
        """``logout`` on ``db``: forget that database's user."""
        self.users = [u for u in self.users if u[1] != db]
        self.generation = -1

    async def resolve(self, store: UserStore) -> Privileges:
        """The privileges of every authenticated user (cached per store generation)."""
        if self.generation == store.generation:
            return self.privileges
        gen = store.generation
        privs: Privileges = {}
        direct: list[tuple[str, str]] = []
        for user, db in self.users:
            if (user, db) == SYSTEM_USER:
                roles_mod.add_privilege(privs, ("any",), ["*"])
                direct.append(("__system", "admin"))
                continue
            doc = await store.get_user(db, user)
            if doc is None:  # dropped meanwhile: mongod logs it out on its next command
                continue
            direct.extend(role_refs(doc.get("roles"), db))
        await resolve_roles(store, direct, privs)
        self.privileges, self.roles, self.generation = privs, direct, gen
        return privs


def role_refs(value: Any, default_db: str) -> list[tuple[str, str]]:
    """``roles`` of a user or role document (or a command) -> ``[(role, db)]``; a bare string
    names a role of ``default_db``."""
    out: list[tuple[str, str]] = []
    for r in value or []:
        if isinstance(r, str):
            out.append((r, default_db))
        elif isinstance(r, dict) and isinstance(r.get("role"), str) and isinstance(r.get("db"), str):
            out.append((r["role"], r["db"]))
    return out


async def resolve_roles(store: UserStore, direct: list[tuple[str, str]], privs: Privileges,
                        ) -> list[tuple[str, str]]:
    """Add the privileges of ``direct`` roles and everything they inherit to ``privs``;
    returns the inherited roles (direct ones included) in discovery order. Unknown roles are
    skipped (mongod ignores a role dropped after it was granted)."""
    seen: list[tuple[str, str]] = []
    todo = list(direct)
    while todo:
        role, db = todo.pop(0)
        if (role, db) in seen:
            continue
        seen.append((role, db))
        if roles_mod.is_builtin(role, db):
            inherited: list[tuple[str, str]] = []
            roles_mod.builtin_privileges(role, db, privs, inherited)
            seen.extend(r for r in inherited if r not in seen)
            continue
        doc = await store.get_role(db, role)
        if doc is None:
            continue
        for p in doc.get("privileges") or []:
            try:
                pattern = roles_mod.pattern_from_resource(p.get("resource"))
            except Exception:
                continue
            roles_mod.add_privilege(privs, pattern, p.get("actions") or [])
        todo.extend(role_refs(doc.get("roles"), db))
    return seen
