"""The config server's HMAC keys for signed cluster time (``KeysCollectionManager`` with its
``KeyGenerator``: ``src/mongo/db/keys_collection_manager.cpp``, ``key_generator.cpp``).

With authentication on, the config server makes one key in ``admin.system.keys`` at its first
start (kept across restarts with ``--dbpath``) and signs with it. Routers read the collection
(``router/security.py``); shards are handed the keys with ``_shardsimSetClusterKeys`` every
:data:`PUSH_INTERVAL_S` seconds (a real shard reads them from the config server itself; the
push spares a shard from knowing the config server's address). Key rotation (a new key every
``keyValidIntervalSecs``, 90 days) is not done.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from shardsim.core.auth.cluster_time import new_key_doc
from shardsim.core.errors import MongoError
from shardsim.core.protocol import shard as shrq

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr.keys")
PUSH_INTERVAL_S = 2.0
_TASKS: dict[int, asyncio.Task] = {}


async def start(node: "ConfigServerNode") -> None:
    """Make the first key when there is none, load the keys and start handing them out."""
    if not node.security.enabled:
        return
    store = node.security.store
    if not store.keys():
        now = node.clock.now()
        if now.time == 0:
            now = node.clock.advance_to_wall()
        store.put("system.keys", new_key_doc(now))
    node.security.keyring.load(store.keys())
    _TASKS[id(node)] = asyncio.get_running_loop().create_task(_push_loop(node))


def stop(node: "ConfigServerNode") -> None:
    """Stop the hand-out task."""
    task = _TASKS.pop(id(node), None)
    if task is not None:
        task.cancel()


async def push(node: "ConfigServerNode") -> None:
    """Send the keys to every shard in ``config.shards`` (unreachable ones are skipped)."""
    docs = node.security.store.keys()
    for entry in await node.shards():
        try:
            await node.on_shard(entry["_id"], "admin", shrq.SetClusterKeys(docs).to_command())
        except MongoError as exc:
            log.debug("cannot hand keys to %s: %s", entry["_id"], exc.errmsg)


async def _push_loop(node: "ConfigServerNode") -> None:
    while True:
        try:
            await push(node)
        except Exception:  # keep handing out keys whatever happened
            log.exception("key hand-out failed")
        await asyncio.sleep(PUSH_INTERVAL_S)
