"""A mongod's own users and roles: ``admin.system.users`` / ``admin.system.roles`` (and the
config server's ``admin.system.keys``) as ordinary collections of the node's storage.

Writes go through the node's write path (the collection's documents, the oplog entry and the
durable journal), so a ``--dbpath`` node keeps its users across restarts and the writes are in
the oplog like mongod's. A shard keeps its *own* users (a client connecting straight to a
shard authenticates against them, as with a real shard's shard-local users); the config
server's are the cluster's, which every router uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.auth.store import UserStore
from shardsim.core.values import id_key

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode


class LocalUserStore(UserStore):
    """:class:`shardsim.core.auth.store.UserStore` over ``node.storage`` (``admin.system.*``)."""

    def __init__(self, node: "ShardNode") -> None:
        self.node = node

    def _docs(self, coll: str) -> list[dict[str, Any]]:
        c = self.node.storage.get("admin", coll)
        return list(c.docs.values()) if c is not None else []

    async def users(self) -> list[dict[str, Any]]:
        return self._docs("system.users")

    async def roles(self) -> list[dict[str, Any]]:
        return self._docs("system.roles")

    async def get_user(self, db: str, user: str) -> dict[str, Any] | None:
        c = self.node.storage.get("admin", "system.users")
        return c.docs.get(id_key(f"{db}.{user}")) if c is not None else None

    async def get_role(self, db: str, role: str) -> dict[str, Any] | None:
        c = self.node.storage.get("admin", "system.roles")
        return c.docs.get(id_key(f"{db}.{role}")) if c is not None else None

    async def has_users(self) -> bool:
        return bool(self._docs("system.users")) or bool(self._docs("system.roles"))

    def keys(self) -> list[dict[str, Any]]:
        """``admin.system.keys`` (HMAC keys for signed cluster time)."""
        return self._docs("system.keys")

    # -- writes ---------------------------------------------------------------------------
    def put(self, coll_name: str, doc: dict[str, Any]) -> None:
        """Insert or replace ``doc`` (by ``_id``) in ``admin.<coll_name>``, with its oplog
        entry (:meth:`ShardNode.put_logged`: durable nodes commit it before returning)."""
        node = self.node
        coll = node.storage.get("admin", coll_name)
        if coll is None:
            coll = node.create_collection("admin", coll_name)
        node.put_logged(coll, doc)
        self.generation += 1

    def delete(self, coll_name: str, _id: Any) -> bool:
        """Remove the document ``_id`` of ``admin.<coll_name>``; False when there is none."""
        node = self.node
        coll = node.storage.get("admin", coll_name)
        key = id_key(_id)
        if coll is None or key not in coll.docs:
            return False
        coll.delete(key)
        node.log_op("d", coll, {"_id": _id})
        node.storage.note_doc(coll, key, None)
        node.flush()
        self.generation += 1
        return True

    async def put_user(self, doc: dict[str, Any]) -> None:
        self.put("system.users", doc)

    async def delete_user(self, _id: str) -> bool:
        return self.delete("system.users", _id)

    async def put_role(self, doc: dict[str, Any]) -> None:
        self.put("system.roles", doc)

    async def delete_role(self, _id: str) -> bool:
        return self.delete("system.roles", _id)
