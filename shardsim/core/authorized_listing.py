"""What ``listDatabases {authorizedDatabases}`` and ``listCollections {authorizedCollections,
nameOnly}`` show a user who may not list everything (``list_databases.cpp`` /
``list_databases_common.h`` ``filterDatabases``, ``list_collections.cpp``).

* ``listDatabases``: a user without the ``listDatabases`` action on the cluster sees only the
  databases on which some privilege grants an action
  (``AuthorizationSession::isAuthorizedForAnyActionOnAnyResourceInDB``); ``authorizedDatabases:
  true`` asks for that filter even with the action.
* ``listCollections`` with ``authorizedCollections: true`` and ``nameOnly: true`` by a user
  without ``listCollections`` on the database: only the collections on which some privilege
  grants an action (``isAuthorizedForAnyActionOnResource(forExactNamespace)``).

Used by the router and by a shard answering a client directly (Airbyte points at a shard).
Uses the connection's resolved privileges (:meth:`AuthSession.resolve`); nothing is filtered
when security is off, for ``__system`` (the router's own requests to the shards), or for a
connection without users (the command's own authorization already refused it then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.auth import roles as roles_mod

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.core.commands import Request
    from shardsim.core.node import Node as RouterNode  # any role: the router and a shard


async def privileges(node: "RouterNode", req: "Request") -> dict[Any, set[str]] | None:
    """The connection's privileges (``{pattern: actions}``), or None when nothing is filtered."""
    security = node.security
    sess = getattr(req.conn, "auth", None) if req.conn is not None else None
    if security is None or not security.enabled or sess is None or not sess.users \
            or sess.is_system:
        return None
    return await sess.resolve(security.store)


def any_action_in_db(privs: dict[Any, set[str]], db: str) -> bool:
    """Whether some privilege grants an action on ``db`` or a collection of it."""
    for pattern, actions in privs.items():
        if not actions:
            continue
        kind = pattern[0]
        if kind == "any" or (kind == "db" and pattern[1] == db) \
                or (kind == "exact" and pattern[1] == db) or kind == "coll" \
                or (kind == "anyNormal" and db not in ("local", "config")):
            return True
    return False


def any_action_on_collection(privs: dict[Any, set[str]], db: str, coll: str) -> bool:
    """Whether some privilege grants an action on ``db.coll``."""
    return any(privs.get(p) for p in roles_mod.search_list(("ns", db, coll)))


async def filter_databases(node: "RouterNode", req: "Request", names: list[str]) -> list[str]:
    """``names`` as ``listDatabases`` shows them to ``req``'s user."""
    privs = await privileges(node, req)
    if privs is None:
        return names
    if roles_mod.authorized(privs, ("cluster",), ["listDatabases"]) \
            and not req.get("authorizedDatabases"):
        return names
    return [n for n in names if any_action_in_db(privs, n)]


async def filter_collections(node: "RouterNode", req: "Request", docs: list[Any]) -> list[Any]:
    """``docs`` (listCollections entries) as ``req``'s user may see them."""
    if not (req.get("authorizedCollections") and req.get("nameOnly")):
        return docs
    privs = await privileges(node, req)
    if privs is None or roles_mod.authorized(privs, ("db", req.db), ["listCollections"]):
        return docs
    return [d for d in docs if any_action_on_collection(privs, req.db, str(d.get("name")))]
