"""Recovery of the reshardings a config-server restart interrupted (``reshardCollection``,
``moveCollection``, ``unshardCollection``), as 8.0's ``ReshardingCoordinatorService`` resumes
its instances from their state documents on step-up
(``src/mongo/db/s/resharding/resharding_coordinator_service.cpp``; the participants'
clean-up: ``resharding_recipient_service.cpp`` ``_cleanupReshardingCollections``,
``resharding_donor_service.cpp``).

Each resharding has a coordinator document in the config server's
``config.reshardingOperations`` (:func:`configsvr.resharding.save_state`): ``state:
"cloning"`` from before the temporary collections exist, ``"committing"`` once the decision is
taken (after the last catch-up, before the catalog switch); it is deleted when the operation is
done or aborted. On start-up (and before a new resharding of the same namespace) every
document left is resumed:

* ``cloning``: aborted. Every shard drops the temporary collection
  (``<db>.system.resharding.<old uuid>``, only the one with this operation's UUID) and leaves
  the critical section of the namespace; the client's command failed with the connection,
  and a retry starts from scratch;
* ``committing``: rolled forward (:func:`configsvr.resharding.finish_commit`: catalog
  switch, renames, metadata, drops, the event), then the critical section is released.

A shard that does not answer is asked again every :data:`RETRY_S` seconds in the background.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from shardsim.configsvr import resharding
from shardsim.configsvr.migration_recovery import UNREACHABLE
from shardsim.core.errors import MongoError
from shardsim.core.protocol import shard as shrq

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.resharding")

RETRY_S = 0.5
_TASKS: dict[int, asyncio.Task] = {}


async def _drop_temp(node: "ConfigServerNode", op: resharding.ReshardOp, shard: str) -> None:
    """Drop ``op``'s temporary collection on ``shard`` when it is this operation's (its
    UUID); ``fromMigrate``, so no change stream shows it."""
    listed = await node.on_shard(shard, op.db, {"listCollections": 1,
                                                "filter": {"name": op.temp}})
    infos = listed["cursor"]["firstBatch"]
    if infos and infos[0].get("info", {}).get("uuid") == op.new_uuid:
        try:
            await node.on_shard(shard, op.db, {"drop": op.temp, "fromMigrate": True})
        except MongoError as exc:
            if exc.code != 26:
                raise


async def resume(node: "ConfigServerNode", doc: dict[str, Any]) -> str:
    """Resume one coordinator document (module docstring); returns ``"committed"`` or
    ``"aborted"``. Raises a shard's MongoError (the document stays)."""
    op = resharding.from_doc(doc)
    if doc.get("state") == "committing":
        await resharding.finish_commit(node, op)
        await resharding.release(node, op)
        log.info("resharding of %s resumed after a restart: committed", op.ns)
        return "committed"
    # every shard: the recipients may not be chosen yet when the document was written
    for shard in [s["_id"] for s in await node.shards()]:
        await _drop_temp(node, op, shard)
        await node.on_shard(shard, "admin",
                            shrq.MigrationCriticalSection(op.ns, False).to_command())
    await resharding.forget_state(node, op)
    log.info("resharding of %s aborted after a restart", op.ns)
    return "aborted"


async def recover(node: "ConfigServerNode", ns: str | None = None) -> int:
    """Resume every coordinator document (of ``ns`` only, when given) whose operation is not
    running in this process; the caller holds the DDL lock. Returns how many are left (a shard
    did not answer)."""
    left = 0
    filt = {"ns": ns} if ns is not None else {}
    for doc in await node.find_all(resharding.STATE_COLL, filt):
        running = node.reshardings.get(doc["ns"])
        if running is not None and running.new_uuid == doc["_id"]:
            continue
        try:
            await resume(node, doc)
        except MongoError as exc:
            if exc.code not in UNREACHABLE:
                raise
            log.warning("resharding of %s not resumed yet: %s", doc["ns"], exc.errmsg)
            left += 1
    return left


def start(node: "ConfigServerNode") -> None:
    """Resume the interrupted reshardings in the background (start-up, a failed commit), under
    the DDL lock, again every :data:`RETRY_S` seconds while one is left; one task at a time;
    not on a config server member that is not the writable primary."""

    async def loop() -> None:
        while True:
            try:
                async with node.ddl_lock:
                    left = await recover(node)
            except MongoError as exc:
                log.warning("resharding recovery: %s", exc.errmsg)
                left = 1
            if not left:
                return
            await asyncio.sleep(RETRY_S)

    repl = node.repl
    if repl is not None and not repl.writable:
        return  # a config secondary: the next primary resumes them on step-up
    running = _TASKS.get(id(node))
    if running is None or running.done():
        _TASKS[id(node)] = asyncio.get_running_loop().create_task(loop())


async def stop(node: "ConfigServerNode") -> None:
    """Cancel the background recovery (shutdown)."""
    task = _TASKS.pop(id(node), None)
    if task is not None:
        task.cancel()
        try:
            await task
        except BaseException:
            pass
