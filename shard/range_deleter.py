"""A shard's persisted migration state: range-deletion tasks (``config.rangeDeletions``) and
the donor's migration coordinator documents (``config.migrationCoordinators``), and the range
deleter that runs the tasks (``node.range_deleter``).

As mongod 8.0 keeps them (``src/mongo/db/s/migration_coordinator.cpp``,
``migration_util.cpp``, ``range_deletion_util.cpp``, ``range_deleter_service.cpp``,
``migration_destination_manager.cpp``):

* the donor persists, before any document is cloned, a coordinator document ``{_id:
  migrationId, migrationSessionId, nss, collectionUuid, donorShardId, recipientShardId, range:
  {min, max}, keyPattern}`` and a range-deletion task for the range, ``pending: true``
  (``MigrationCoordinator::startMigration``);
* the recipient, before it clones, waits for (here: runs) the range deletions overlapping the
  incoming range, refuses while one of them is still pending (its outcome unknown), deletes
  what is left in the range (orphans of an interrupted migration; shardsim's own safety net,
  mongod relies on the tasks alone), and persists its own pending task for the range
  (``MigrationDestinationManager::_migrateDriver``, ``rangedeletionutil::
  checkForConflictingDeletions``);
* the decision (``decision: "committed" | "aborted"``) goes into the coordinator document; on
  commit the recipient's task is deleted and the donor's made ready and run, on abort the
  other way round (``MigrationCoordinator::completeMigration``,
  ``_commitMigrationOnDonorAndRecipient`` / ``_abortMigrationOnDonorAndRecipient``); then the
  coordinator document is deleted;
* a task that is ready (no ``pending``) when the shard starts is run again
  (``RangeDeleterService`` resumes its tasks on step-up).

Every document a range deletion removes is deleted with ``fromMigrate: true``, so no change
stream shows it. All of it is durable with ``--dbpath`` and logged (the two collections are
ordinary collections of the shard's ``config`` database, which change streams never show), so
a replica-set shard's next primary has them; the donor's primary drives the coordination and
its next primary resumes it (:mod:`shard.migration_source`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from shardsim.core.auth.session import SYSTEM_USER, AuthSession
from shardsim.core.client import remote_error
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError
from shardsim.core.shard_key import KeyPattern, compare_keys
from shardsim.core.values import id_key

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

log = logging.getLogger("shardsim.range_deleter")

RANGE_DELETIONS = ("config", "rangeDeletions")
COORDINATORS = ("config", "migrationCoordinators")
# a migration's recoverable critical sections (ShardingRecoveryService):
# {_id: ns, reason, blockReads}; a new primary holds again each one it finds
CRITICAL_SECTIONS = ("config", "collectionCriticalSections")
_BATCH = 1000
_INTERNAL = ConnectionInfo(id=0, peer="internal", auth=AuthSession(users=[SYSTEM_USER]))


def _bounds(doc: dict[str, Any]) -> tuple[KeyPattern, tuple[Any, ...], tuple[Any, ...]]:
    pattern = KeyPattern(dict(doc["keyPattern"]))
    rng = doc["range"]
    return pattern, pattern.bound_to_key(rng["min"]), pattern.bound_to_key(rng["max"])


def overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when the ranges of two task/coordinator documents of one namespace intersect."""
    if a.get("nss") != b.get("nss") or a.get("keyPattern") != b.get("keyPattern"):
        return False
    _, lo1, hi1 = _bounds(a)
    _, lo2, hi2 = _bounds(b)
    return compare_keys(lo1, hi2) < 0 and compare_keys(lo2, hi1) < 0


class RangeDeleter:
    """``node.range_deleter``: the two collections and the deletions (module docstring)."""

    def __init__(self, node: "ShardNode") -> None:
        self.node = node
        self._tasks: set[asyncio.Task] = set()

    # -- persistence (like shard.transaction_coordinator.Coordinators._save) -------------------
    def documents(self, which: tuple[str, str]) -> list[dict[str, Any]]:
        """The documents of ``which`` (:data:`RANGE_DELETIONS` or :data:`COORDINATORS`)."""
        coll = self.node.storage.get(*which)
        return list(coll.docs.values()) if coll is not None else []

    def find(self, which: tuple[str, str], _id: Any) -> dict[str, Any] | None:
        """The document ``_id`` of ``which``, or None."""
        coll = self.node.storage.get(*which)
        return coll.docs.get(id_key(_id)) if coll is not None else None

    def save(self, which: tuple[str, str], doc: dict[str, Any]) -> None:
        """Insert or replace ``doc`` in ``which`` with its oplog entry
        (:meth:`ShardNode.put_logged`: a replica set's next primary has it, as mongod's
        majority-written coordinator and task documents) and commit it (durable shards).
        NotWritablePrimary (10107) on a member that may not write."""
        self.node.put_logged(self.node.ensure_collection(*which), doc)

    def remove(self, which: tuple[str, str], _id: Any) -> bool:
        """Delete the document ``_id`` of ``which``, logged; False when there was none."""
        coll = self.node.storage.get(*which)
        key = id_key(_id)
        if coll is None or key not in coll.docs:
            return False
        coll.delete(key)
        self.node.log_op("d", coll, {"_id": _id})
        self.node.storage.note_doc(coll, key, None)
        self.node.flush()
        return True

    # -- deleting a range -------------------------------------------------------------------------
    async def delete_range(self, ns: str, pattern: KeyPattern, lo: tuple[Any, ...],
                           hi: tuple[Any, ...]) -> int:
        """Delete every document of ``ns`` whose shard key is in ``[lo, hi)``, in batches, as
        ``fromMigrate`` deletes (``rangedeletionutil::deleteRangeInBatches``); returns how many.
        A document without the shard key's fields is left alone."""
        db, _, name = ns.partition(".")
        coll = self.node.storage.get(db, name)
        if coll is None:
            return 0
        ids = []
        for doc in list(coll.docs.values()):
            try:
                key = pattern.key_of_doc(doc)
            except MongoError:
                continue
            if compare_keys(lo, key) <= 0 and compare_keys(key, hi) < 0:
                ids.append(doc["_id"])
        n = 0
        for i in range(0, len(ids), _BATCH):
            body = {"delete": name, "fromMigrate": True, "ordered": True, "$db": db,
                    "deletes": [{"q": {"_id": {"$in": ids[i:i + _BATCH]}}, "limit": 0}]}
            reply = await self.node.run_command(Request("delete", db, body, _INTERNAL))
            if not reply.get("ok"):
                raise remote_error(reply)
            n += int(reply.get("n", 0))
        return n

    async def run_task(self, _id: Any) -> int:
        """Make the task ``_id`` ready (``pending`` removed, persisted), delete its range, then
        the task; returns the documents deleted (0 when there is no such task)."""
        task = self.find(RANGE_DELETIONS, _id)
        if task is None:
            return 0
        if task.get("pending"):
            task = {k: v for k, v in task.items() if k != "pending"}
            self.save(RANGE_DELETIONS, task)
        pattern, lo, hi = _bounds(task)
        n = await self.delete_range(task["nss"], pattern, lo, hi)
        self.remove(RANGE_DELETIONS, _id)
        log.info("range deletion %s of %s done: %d documents", task["range"], task["nss"], n)
        return n

    async def clear_incoming(self, task: dict[str, Any]) -> int:
        """The recipient's step before cloning ``task``'s range (module docstring): run the
        ready overlapping tasks, refuse (ConflictingOperationInProgress, 117) while an
        overlapping one of another migration is pending, delete what is left in the range,
        persist ``task`` (pending). Returns the documents deleted."""
        n = 0
        for other in self.documents(RANGE_DELETIONS):
            if other["_id"] == task["_id"] or not overlaps(other, task):
                continue
            if other.get("pending"):
                raise MongoError(117, f"Migration aborted because the requested range "
                                      f"{task['range']} for {task['nss']} overlaps with a range "
                                      f"deletion task that is still pending")
            n += await self.run_task(other["_id"])
        pattern, lo, hi = _bounds(task)
        n += await self.delete_range(task["nss"], pattern, lo, hi)
        self.save(RANGE_DELETIONS, task)
        return n

    # -- start-up ---------------------------------------------------------------------------------
    def resume(self) -> None:
        """After a restart: run every ready task again, in the background (a pending task
        waits for its migration's decision)."""
        ready = [t["_id"] for t in self.documents(RANGE_DELETIONS) if not t.get("pending")]
        if not ready:
            return

        async def run() -> None:
            for _id in ready:
                try:
                    await self.run_task(_id)
                except MongoError as exc:  # pragma: no cover - storage errors only
                    log.warning("range deletion %s not resumed: %s", _id, exc)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        """Stop the resumed deletions (shutdown)."""
        for task in list(self._tasks):
            task.cancel()
