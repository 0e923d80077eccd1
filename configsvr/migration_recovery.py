"""Recovery of interrupted chunk migrations, and the migration's fail points.

A migration's outcome is decided by ``config.chunks`` alone: committed when the range's chunk
names the recipient, aborted otherwise. Each donor keeps a coordinator document per migration
(``config.migrationCoordinators``), and donor and recipient a range-deletion task each
(``config.rangeDeletions``, :mod:`shard.range_deleter`), all persisted before any document is
cloned. Completing a migration (:meth:`MigrationRecovery.complete`, as mongod's
``MigrationCoordinator::completeMigration`` in ``src/mongo/db/s/migration_coordinator.cpp``):

1. the decision is persisted in the donor's coordinator document;
2. the donor's critical section is released and its transfer-mods recording ended (a config
   server that died in the critical section leaves the donor's writes waiting until then);
3. committed: the recipient's task is deleted and the donor's run (the donor deletes its copy
   of the range); aborted: the donor's task is deleted and the recipient's run (the recipient
   deletes what it cloned);
4. both shards get the collection's filtering metadata again;
5. the coordinator document is deleted.

Every step can be repeated, so an interrupted completion is completed again. The config
server completes the coordinations it finds on every shard when it starts
(``migration_util::resumeMigrationCoordinationsOnStepUp``, which mongod runs on the donor's
step-up), after a migration failed, and before a migration starts; a shard that does not
answer is asked again every :data:`RETRY_S` seconds in the background until every coordination
is complete. No migration of a namespace starts while one of its coordinations is incomplete
(ConflictingOperationInProgress, 117).

Fail points (the config server's, with test commands; it runs the migration phases here):
``moveChunkHangAtStep3`` (cloned, before the catch-up), ``moveChunkHangAtStep4`` (caught up,
before the critical section), ``moveChunkHangAtStep5`` (in the critical section, before the
commit on the config server), ``moveChunkHangAtStep6`` (committed, before the completion),
named after ``move_chunk_command.cpp``'s; and the resharding coordinator's
``reshardingPauseCoordinatorBeforeBlockingWrites`` (cloned and caught up, at the end of the
``clone`` phase) and ``reshardingPauseCoordinatorBeforeCompletion`` (decision persisted and
catalog switched, before the renames), after ``resharding_coordinator_service.cpp``'s.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from shardsim.configsvr.catalog import chunk_map
from shardsim.core.errors import MongoError
from shardsim.core.failpoints import FailPoint
from shardsim.core.shard_key import KeyPattern
from shardsim.core.protocol import shard as shrq
from shardsim.core.protocol.versions import NETWORK_ERRORS

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr")

RETRY_S = 0.5
# A shard that cannot be reached (network, shutting down, not primary).
UNREACHABLE = NETWORK_ERRORS | {91, 11600, 189, 10107, 13436}
# The config server's fail points (pauseWhileSet), by name.
HANG_POINTS = ("moveChunkHangAtStep3", "moveChunkHangAtStep4", "moveChunkHangAtStep5",
               "moveChunkHangAtStep6", "reshardingPauseCoordinatorBeforeBlockingWrites",
               "reshardingPauseCoordinatorBeforeCompletion")


class MigrationRecovery:
    """``node.migration_recovery``: the coordinations in progress in this process
    (``active``: migration ids, never recovered meanwhile), the background completion and the
    config server's fail points (``hang[name]``, also the resharding's)."""

    def __init__(self, node: "ConfigServerNode") -> None:
        self.node = node
        self.active: set[Any] = set()
        self._task: asyncio.Task | None = None
        self.hang = {name: FailPoint(name) for name in HANG_POINTS}

    def install_fail_points(self) -> None:
        """Make the fail points configurable (``configureFailPoint``; test commands only)."""
        fps = self.node.failpoints
        if fps is not None:
            for fp in self.hang.values():
                fps.add(fp)

    async def pause(self, name: str) -> None:
        """``<name>.pauseWhileSet()`` (one of :data:`HANG_POINTS`)."""
        fp = self.hang[name]
        if fp.should_fail():
            log.info("Hit %s failpoint", fp.name)
            while fp.active:
                await asyncio.sleep(0.01)

    # -- the decision -----------------------------------------------------------------------------
    async def decide(self, doc: dict[str, Any]) -> str:
        """``committed`` when ``config.chunks`` gives the coordinator document's range to its
        recipient, else ``aborted`` (also when the collection is gone)."""
        if doc.get("decision") in ("committed", "aborted"):
            return doc["decision"]
        found = await self.node.find_all("collections", {"_id": doc["nss"]})
        if not found or found[0].get("uuid") != doc.get("collectionUuid"):
            return "aborted"
        pattern = KeyPattern(found[0]["key"])
        chunks = await self.node.find_all("chunks", {"uuid": found[0]["uuid"]})
        if not chunks:
            return "aborted"
        owner = chunk_map(pattern, chunks).find(pattern.bound_to_key(doc["range"]["min"])).shard
        return "committed" if owner == doc["recipientShardId"] else "aborted"

    async def complete(self, doc: dict[str, Any]) -> str:
        """Steps 1-5 of the module docstring for the coordinator document ``doc``; returns the
        decision. Raises the MongoError of a shard that does not answer (nothing is lost: the
        document stays until a completion succeeds)."""
        node = self.node
        decision = await self.decide(doc)
        donor, recipient, mid = doc["donorShardId"], doc["recipientShardId"], doc["_id"]
        await node.on_shard(donor, "admin", shrq.MigrationDecision(mid, decision).to_command())
        await node.on_shard(donor, "admin",
                            shrq.MigrationCriticalSection(doc["nss"], False).to_command())
        await node.on_shard(donor, "admin",
                            shrq.MigrationEnd(1, doc.get("migrationSessionId")).to_command())
        keep, clean = (recipient, donor) if decision == "committed" else (donor, recipient)
        await node.on_shard(keep, "admin", shrq.RangeDeletionTask(mid, "forget").to_command())
        await node.on_shard(clean, "admin", shrq.RangeDeletionTask(mid, "run").to_command())
        try:
            from shardsim.configsvr.migration import push_metadata
            await push_metadata(node, doc["nss"], [donor, recipient])
        except MongoError as exc:
            if exc.code != 118:  # dropped since: nothing to send
                raise
        await node.on_shard(donor, "admin", shrq.ForgetMigration(mid).to_command())
        log.info("migration %s of %s [%s, %s) from %s to %s completed: %s", mid, doc["nss"],
                 doc["range"]["min"], doc["range"]["max"], donor, recipient, decision)
        return decision

    # -- finding the coordinations ----------------------------------------------------------------
    async def recover_once(self, ns: str | None = None) -> int:
        """Complete every coordination found on the shards (of ``ns`` only, when given) that is
        not running in this process. Returns how many are left incomplete, counting a shard
        that could not be read as one."""
        left = 0
        for shard in [s["_id"] for s in await self.node.shards()]:
            try:
                docs = await self.node.shard_find_all(shard, "config", "migrationCoordinators")
            except MongoError as exc:
                if exc.code not in UNREACHABLE:
                    raise
                left += 1
                continue
            for doc in docs:
                if doc["_id"] in self.active or (ns is not None and doc.get("nss") != ns):
                    continue
                try:
                    await self.complete(doc)
                except MongoError as exc:
                    if exc.code not in UNREACHABLE:
                        raise
                    log.warning("migration %s of %s not completed yet: %s", doc["_id"],
                                doc.get("nss"), exc.errmsg)
                    left += 1
        return left

    def kick(self) -> None:
        """Complete the coordinations in the background (under the DDL lock), again every
        :data:`RETRY_S` seconds while one is left; one such task at a time. Not on a member
        of a config server replica set that is not the writable primary: the next primary
        does it on step-up."""
        repl = self.node.repl
        if repl is not None and not repl.writable:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                async with self.node.ddl_lock:
                    left = await self.recover_once()
            except MongoError as exc:
                log.warning("migration recovery: %s", exc.errmsg)
                left = 1
            if not left:
                return
            await asyncio.sleep(RETRY_S)

    async def stop(self) -> None:
        """Cancel the background completion (shutdown)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:
                pass
            self._task = None
