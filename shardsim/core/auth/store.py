"""Where users and roles live: ``admin.system.users`` and ``admin.system.roles``.

A mongod (shard, config server) keeps them in its own ``admin`` database
(:class:`shard.auth_store.LocalUserStore`); a router keeps none and reads the config server's
(:class:`RemoteUserStore`, cached like mongos' ``UserCacheInvalidator``: dropped after the
user-management commands it forwards and every ``userCacheInvalidationIntervalSecs``, 30 s).

Document shapes are mongod's (``src/mongo/db/auth/user_document_parser.cpp``)::

    users: {_id: "<db>.<user>", userId: UUID, user, db, credentials: {...}, roles: [{role, db}],
            customData?, mechanisms: [...]}
    roles: {_id: "<db>.<role>", role, db, privileges: [{resource, actions}], roles: [{role, db}]}

Every store has a ``generation`` that changes when its content may have changed, so an
authenticated connection re-resolves its privileges (mongod's user cache invalidation).
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable


class UserStore:
    """The read side every role needs (authentication, authorization, usersInfo)."""

    generation = 0

    async def get_user(self, db: str, user: str) -> dict[str, Any] | None:
        """The user document of ``user@db`` or None."""
        for doc in await self.users():
            if doc.get("db") == db and doc.get("user") == user:
                return doc
        return None

    async def get_role(self, db: str, role: str) -> dict[str, Any] | None:
        """The custom role document of ``role@db`` or None."""
        for doc in await self.roles():
            if doc.get("db") == db and doc.get("role") == role:
                return doc
        return None

    async def users(self) -> list[dict[str, Any]]:
        """Every user document."""
        return []

    async def roles(self) -> list[dict[str, Any]]:
        """Every custom role document."""
        return []

    async def has_users(self) -> bool:
        """True once any user (or custom role) exists: the localhost exception ends then."""
        return bool(await self.users()) or bool(await self.roles())

    def invalidate(self) -> None:
        """Forget what is cached (nothing here)."""
        self.generation += 1


class MemoryUserStore(UserStore):
    """Users and roles in memory; the base of the mongod-side store and the unit tests'.

    Writes: :meth:`put_user` / :meth:`delete_user` / :meth:`put_role` / :meth:`delete_role`."""

    def __init__(self) -> None:
        self._users: dict[str, dict[str, Any]] = {}
        self._roles: dict[str, dict[str, Any]] = {}

    async def users(self) -> list[dict[str, Any]]:
        return list(self._users.values())

    async def roles(self) -> list[dict[str, Any]]:
        return list(self._roles.values())

    async def get_user(self, db: str, user: str) -> dict[str, Any] | None:
        return self._users.get(f"{db}.{user}")

    async def get_role(self, db: str, role: str) -> dict[str, Any] | None:
        return self._roles.get(f"{db}.{role}")

    async def has_users(self) -> bool:
        return bool(self._users) or bool(self._roles)

    async def put_user(self, doc: dict[str, Any]) -> None:
        self._users[doc["_id"]] = doc
        self.generation += 1

    async def delete_user(self, _id: str) -> bool:
        self.generation += 1
        return self._users.pop(_id, None) is not None

    async def put_role(self, doc: dict[str, Any]) -> None:
        self._roles[doc["_id"]] = doc
        self.generation += 1

    async def delete_role(self, _id: str) -> bool:
        self.generation += 1
        return self._roles.pop(_id, None) is not None


class RemoteUserStore(UserStore):
    """The router's view of the config server's users and roles.

    ``find(coll) -> list of documents`` reads ``admin.<coll>`` on the config server (the router
    passes a function that runs ``find`` there, authenticated as ``__system``). Whole
    collections are cached for ``ttl_s`` seconds (mongos: ``userCacheInvalidationIntervalSecs``
    = 30); :meth:`invalidate` drops them at once (after a user-management command)."""

    def __init__(self, find: Callable[[str], Awaitable[list[dict[str, Any]]]],
                 ttl_s: float = 30.0) -> None:
        self._find = find
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._seen_users = False

    async def _load(self, coll: str) -> list[dict[str, Any]]:
        hit = self._cache.get(coll)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        docs = await self._find(coll)
        if hit is not None and docs != hit[1]:
            self.generation += 1
        self._cache[coll] = (now, docs)
        return docs

    async def users(self) -> list[dict[str, Any]]:
        return await self._load("system.users")

    async def roles(self) -> list[dict[str, Any]]:
        return await self._load("system.roles")

    async def has_users(self) -> bool:
        if not self._seen_users:  # users never go back to none as far as the exception goes
            self._seen_users = await super().has_users()
        return self._seen_users

    def invalidate(self) -> None:
        self._cache.clear()
        self.generation += 1
