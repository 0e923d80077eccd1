"""The router's side of security: its users come from the config server
(:class:`shardsim.core.auth.store.RemoteUserStore` over ``admin.system.users``/``system.roles``
there) and so do its HMAC keys (``admin.system.keys``, read at start-up and with every catalog
refresh, like mongos' ``KeysCollectionManager`` refresher).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.router.forwarding import BIG_BATCH
from shardsim.core.auth.store import RemoteUserStore
from shardsim.core.errors import MongoError

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode


async def _find_admin(node: "RouterNode", coll: str) -> list[dict[str, Any]]:
    reply = await node.config_command({"find": coll, "filter": {}, "batchSize": BIG_BATCH},
                                      db="admin")
    return list(reply["cursor"]["firstBatch"])


def install(node: "RouterNode") -> None:
    """Give ``node`` the config server's users."""
    async def find(coll: str) -> list[dict[str, Any]]:
        return await _find_admin(node, coll)
    node.security.store = RemoteUserStore(find)


async def refresh_keys(node: "RouterNode") -> None:
    """Read the config server's ``admin.system.keys`` (with authentication on)."""
    if not node.security.enabled:
        return
    try:
        node.security.keyring.load(await _find_admin(node, "system.keys"))
    except MongoError:
        pass  # the config server is not up yet: the next refresh tries again
