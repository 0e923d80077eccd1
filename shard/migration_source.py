"""The donor's side of a chunk migration: ``_shardsvrMoveRange`` runs the whole migration on
the donor shard's primary, and a new primary completes the migrations its predecessor left.

As 8.0 runs it (``src/mongo/db/s/shardsvr_move_range_command.cpp`` -> ``MigrationSourceManager``
in ``migration_source_manager.cpp``, ``MigrationCoordinator`` in ``migration_coordinator.cpp``):

1. refresh the namespace's filtering metadata from the config server and check that this shard
   owns the chunk ``[min, max)`` under the epoch the config server sent (StaleEpoch 150,
   ConflictingOperationInProgress 117); finish first the coordinations of the namespace left
   here (117 while one cannot be finished);
2. persist the coordinator document (``config.migrationCoordinators``: ``{_id: migrationId,
   migrationSessionId, nss, collectionUuid, donorShardId, recipientShardId, range: {min, max},
   keyPattern}``) and the donor's pending range-deletion task, logged and waited for with
   ``w: majority`` (``MigrationCoordinator::startMigration``), and start recording the
   namespace's writes (``startClone``);
3. the recipient clears the range and persists its pending task
   (``_shardsimRecvChunkStart``), then the range's documents are inserted there with
   ``fromMigrate`` (``startClone``/``_migrateClone``) -- fail point ``moveChunkHangAtStep3``;
4. catch-up: ``_transferMods`` rounds until one is small (``awaitToCatchUp``) --
   ``moveChunkHangAtStep4``;
5. the donor's critical section, a last round and the retryable-write session records
   (``enterCriticalSection``) -- ``moveChunkHangAtStep5``; then the recipient's critical
   section (``commitChunkOnRecipient``), so that its writes of the namespace follow the change
   streams' control event below;
6. ``_configsvrCommitChunkMigration`` on the config server (``commitChunkMetadataOnConfig``;
   the config server writes the chunks and the placement history). When its reply is lost
   (fail point ``migrationCommitNetworkError``, a config failover, the network; then
   ``hangBeforePostMigrationCommitRefresh``) the outcome is
   read from a refresh: the range no longer belongs to this shard -> committed
   (``MigrationCoordinator``'s decision recovery, ``recoverMigrationCoordinations``); then the
   donor's own refresh, the ``moveChunk`` control event on the donor
   (``notifyChangeStreamsOnChunkMigrated``) and the ``moveChunk.commit`` changelog entry on
   the config server -- ``moveChunkHangAtStep6``;
7. completion (``MigrationCoordinator::completeMigration``, ``_cleanup``): the decision
   persisted in the coordinator document, both critical sections released and the recording
   ended; committed: the recipient's task deleted and the donor's range deleted; aborted: the
   other way round; the coordinator document deleted. Every step can be repeated.

A donor primary that steps down stops its migrations (the next primary finishes them); a new
primary completes every coordination in its ``config.migrationCoordinators``, deciding those
without a decision from a refresh, again every :data:`RETRY_S` seconds while a shard does not
answer (``migrationutil::resumeMigrationCoordinationsOnStepUp``).

shardsim differences: the donor pushes clone and transfer-mods batches to the recipient (in
8.0 the recipient pulls them with ``_migrateClone``/``_transferMods``); the range deletion runs
before ``_shardsvrMoveRange`` answers (as with ``waitForDelete``); the config server still
pushes every shard the new routing table after the reply (``configsvr/migration.py``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid as uuid_mod
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from bson import Binary, ObjectId
from bson.int64 import Int64

from shardsim.core.auth.session import SYSTEM_USER, AuthSession
from shardsim.core.client import remote_error
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError
from shardsim.core.failpoints import FailPoint
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.protocol import shard as shrq
from shardsim.core.protocol.versions import NETWORK_ERRORS
from shardsim.core.shard_key import KeyPattern, compare_keys
from shardsim.shard.range_deleter import COORDINATORS

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

log = logging.getLogger("shardsim.migration")

CATCH_UP_ROUNDS = 20  # transfer-mods rounds before the critical section at the latest
CATCH_UP_SMALL = 16  # a round this small lets the migration enter the critical section
BATCH = 1000
RETRY_S = 0.5
COMMIT_ATTEMPTS = 3
DECISION_WAIT_S = 60.0  # how long a lost commit reply is resolved by refreshes
MAJORITY_WAIT_MS = 60000  # wtimeout of the w: majority waits for the recoverable documents
# A shard or config server that cannot be reached (network, shutting down, not primary).
UNREACHABLE = NETWORK_ERRORS | {91, 11600, 189, 10107, 13436}
HANG_POINTS = ("moveChunkHangAtStep3", "moveChunkHangAtStep4", "moveChunkHangAtStep5",
               "moveChunkHangAtStep6")
_INTERNAL = ConnectionInfo(id=0, peer="internal", auth=AuthSession(users=[SYSTEM_USER]))


class MigrationSource:
    """``node.migration_source``: the migrations this shard donates (``active``: migration
    ids running in this process), the step-up completion and the donor's fail points
    (``moveChunkHangAtStep3..6``, ``migrationCommitNetworkError``,
    ``hangBeforePostMigrationCommitRefresh``)."""

    def __init__(self, node: "ShardNode") -> None:
        self.node = node
        self.active: set[Any] = set()
        self._running: set[asyncio.Task] = set()
        self._resume_task: asyncio.Task | None = None
        self.hang = {name: FailPoint(name) for name in HANG_POINTS}
        # migration_source_manager.cpp: the commit's reply replaced by an error after it ran,
        # and a pause between the commit's reply (or its loss) and the refresh after it
        self.commit_network_error = FailPoint("migrationCommitNetworkError")
        self.hang_before_refresh = FailPoint("hangBeforePostMigrationCommitRefresh")

    def install_fail_points(self) -> None:
        """Make the fail points configurable (``configureFailPoint``; test commands only)."""
        fps = self.node.failpoints
        if fps is not None:
            for fp in (*self.hang.values(), self.commit_network_error,
                       self.hang_before_refresh):
                fps.add(fp)

    async def _pause(self, name: str) -> None:
        fp = self.hang.get(name) or self.hang_before_refresh
        if fp.should_fail():
            log.info("Hit %s failpoint", fp.name)
            while fp.active:
                await asyncio.sleep(0.01)

    # -- talking to ourselves, the recipient and the config server ---------------------------
    async def _local(self, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        name = next(iter(cmd))
        reply = await self.node.run_command(Request(name, db, {**cmd, "$db": db}, _INTERNAL))
        if not reply.get("ok"):
            raise remote_error(reply)
        return reply

    async def _recipient(self, to: str, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """``cmd`` on the recipient's primary. Its document writes (clone, transfer mods) wait
        for ``w: majority``, so a recipient failover loses none of them before the commit
        (8.0's recipient waits for its majority before the critical section:
        ``MigrationDestinationManager::_migrateDriver``); a ``writeConcernError`` is raised."""
        conn = self.node.sharding.hosts.get(to)
        if conn is None:
            raise MongoError(70, f"Shard {to} not found")
        if next(iter(cmd)) in ("insert", "update", "delete"):
            cmd = {**cmd, "writeConcern": {"w": "majority", "wtimeout": 60000}}
        reply = await self.node.sharding.targets.command(self.node.clock, conn, db, cmd,
                                                         timeout=60.0)
        wce = reply.get("writeConcernError")
        if wce:
            raise MongoError(int(wce.get("code", 64)), str(wce.get("errmsg", "")))
        return reply

    def _writable(self) -> bool:
        repl = self.node.repl
        return repl is None or repl.writable

    # -- _shardsvrMoveRange -------------------------------------------------------------------
    async def move_range(self, request: shrq.ShardsvrMoveRange) -> dict[str, Any]:
        """Run the migration of the module docstring; returns ``{}`` once it is complete.
        Raises the error that aborted it (with its code), NotWritablePrimary (10107) when this
        member is not the primary or stops being it (the next primary completes the
        migration), StaleEpoch (150), ConflictingOperationInProgress (117), ShardNotFound
        (70)."""
        if not self._writable():
            raise MongoError(10107, "not primary")
        # its own task, which a stepdown cancels (on_step_down) without the connection's
        task = asyncio.get_running_loop().create_task(self._move_range(request))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
            raise MongoError(11602, "operation was interrupted because the primary stepped "
                                    "down: the next primary completes the migration") from None

    async def _move_range(self, request: shrq.ShardsvrMoveRange) -> dict[str, Any]:
        node, ns, to = self.node, request.ns, request.toShard
        if any(d.get("nss") == ns for d in node.range_deleter.documents(COORDINATORS)
               if d["_id"] in self.active):
            raise MongoError(117, f"Unable to start new migration because this shard is "
                                  f"currently donating a chunk of {ns}")
        if await self._complete_left(ns):
            raise MongoError(117, f"a previous migration of {ns} is not completed yet: a shard "
                                  f"does not answer")
        meta = await node.sharding.force_refresh(ns)
        if meta is None:
            raise MongoError(118, f"Collection {ns} is not sharded")
        if request.epoch is not None and meta.epoch != request.epoch:
            raise MongoError(150, f"The epoch of collection '{ns}' has changed since the "
                                  f"migration was requested. Expected {request.epoch}, but "
                                  f"found {meta.epoch}")
        pattern = meta.pattern
        lo, hi = pattern.bound_to_key(request.min), pattern.bound_to_key(request.max)
        at = next((i for i, (a, b) in enumerate(meta.chunks)
                   if compare_keys(a, lo) == 0 and compare_keys(b, hi) == 0), None)
        if at is None:
            raise MongoError(117, f"Range {request.min} -> {request.max} of {ns} is not a chunk "
                                  f"owned by shard {node.shard_name}")
        mid = Binary(uuid_mod.uuid4().bytes, 4)
        sid = f"{node.shard_name}_{to}_{uuid_mod.uuid4().hex}"
        doc = {"_id": mid, "migrationSessionId": sid, "nss": ns, "collectionUuid": meta.uuid,
               "donorShardId": node.shard_name, "recipientShardId": to,
               "range": {"min": request.min, "max": request.max},
               "preMigrationChunkVersion": {"e": meta.epoch, "t": meta.timestamp,
                                            "v": meta.lastmods[at]},
               "keyPattern": pattern.pattern}
        self.active.add(mid)
        try:
            await self._local("admin", shrq.MigrationStart(
                ns, sid, pattern.pattern, request.min, request.max, migrationId=mid,
                uuid=meta.uuid, to=to,
                preMigrationChunkVersion=doc["preMigrationChunkVersion"]).to_command())
            await self.node.wait_for_majority(MAJORITY_WAIT_MS)
            decision, error = await self._run_phases(doc, meta, pattern)
            if not self._writable():  # stepped down: the next primary completes it
                raise error or MongoError(10107, "not primary")
            await self._complete_or_defer(doc, decision)
        except BaseException:
            if not self._writable():  # a stepdown: this member may not hold it any more
                node.sharding.exit_critical_section(ns)
            self.active.discard(mid)
            self.resume()  # whatever is left persisted is completed in the background
            raise
        finally:
            self.active.discard(mid)
        if error is not None:
            raise error
        log.info("moved chunk %s of %s from %s to %s", request.min, ns, node.shard_name, to)
        return {}

    async def _run_phases(self, doc: dict[str, Any], meta: Any, pattern: KeyPattern
                          ) -> tuple[str, MongoError | None]:
        """Steps 3-6; returns the decision and the error that aborted the migration (None
        when committed)."""
        node, ns, to = self.node, doc["nss"], doc["recipientShardId"]
        db, coll = ns.split(".", 1)
        sid = doc["migrationSessionId"]
        sent = False  # the commit was sent: its outcome must be read from the config server
        try:
            if meta.routing is not None and not any(c.shard == to for c in meta.routing.chunks):
                # the recipient's first chunk of ns: change streams learn of the new shard
                # before any event of it (_notifyChangeStreamsOnRecipientFirstChunk)
                await self._local(db, shrq.Noop(
                    {"msg": f"Migrating chunk from shard {node.shard_name} to shard {to} "
                            f"with no chunks for this collection"},
                    o2={"migrateChunkToNewShard": ns, "fromShardId": node.shard_name,
                        "toShardId": to}, ns=ns, ui=meta.uuid).to_command())
            await self._recipient(to, "admin", shrq.RecvChunkStart(
                ns, doc["_id"], pattern.pattern, doc["range"]["min"], doc["range"]["max"],
                uuid=meta.uuid, from_=node.shard_name).to_command())
            objects = (await self._local("admin", shrq.MigrateClone(1, sid).to_command()))[
                "objects"]
            for i in range(0, len(objects), BATCH):
                await self._recipient(to, db, {"insert": coll, "documents": objects[i:i + BATCH],
                                               "ordered": False, "fromMigrate": True})
            await self._pause("moveChunkHangAtStep3")
            for _ in range(CATCH_UP_ROUNDS):
                if await self._transfer_mods(to, db, coll, sid) <= CATCH_UP_SMALL:
                    break
            await self._pause("moveChunkHangAtStep4")
            await self._local("admin", shrq.MigrationCriticalSection(ns, True).to_command())
            await self._transfer_mods(to, db, coll, sid)
            records = (await self._local("admin", shrq.SessionRecords(1).to_command()))[
                "records"]
            if records:
                await self._recipient(to, "admin",
                                      shrq.MergeSessionRecords(1, records).to_command())
            await self._pause("moveChunkHangAtStep5")
            await self._recipient(to, "admin",
                                  shrq.MigrationCriticalSection(ns, True).to_command())
            if not self._writable():
                raise MongoError(10107, "not primary: the migration is left to the next one")
            sent = True
            await self._commit(doc, meta)
            await self._pause(self.hang_before_refresh.name)
            decision = "committed"
        except (MongoError, OSError, asyncio.TimeoutError) as err:
            exc = err if isinstance(err, MongoError) else MongoError(6, f"{err!r}")
            if not sent:
                return "aborted", exc
            await self._pause(self.hang_before_refresh.name)
            log.warning("commit of migration %s of %s unknown (%s): deciding by a refresh",
                        doc["_id"], ns, exc.errmsg)
            decision = await self._decide(doc)
            if decision == "aborted":
                return "aborted", exc
        await self._committed(doc, len(objects), notify=True)
        return "committed", None

    async def _transfer_mods(self, to: str, db: str, coll: str, sid: str) -> int:
        """One ``_transferMods`` round applied on the recipient (replacement upserts and
        deletes by ``_id``, ``fromMigrate``); returns its size."""
        mods = await self._local("admin", shrq.TransferMods(1, sid).to_command())
        reload, deleted = mods.get("reload") or [], mods.get("deleted") or []
        for i in range(0, len(reload), BATCH):
            await self._recipient(to, db, {
                "update": coll, "fromMigrate": True, "ordered": True,
                "updates": [{"q": {"_id": d["_id"]}, "u": d, "upsert": True}
                            for d in reload[i:i + BATCH]]})
        for i in range(0, len(deleted), BATCH):
            await self._recipient(to, db, {
                "delete": coll, "fromMigrate": True, "ordered": True,
                "deletes": [{"q": {"_id": d["_id"]}, "limit": 1} for d in deleted[i:i + BATCH]]})
        return int(mods.get("size", 0))

    async def _commit(self, doc: dict[str, Any], meta: Any) -> None:
        """``_configsvrCommitChunkMigration``, sent again (up to :data:`COMMIT_ATTEMPTS`
        times) while the config server cannot be reached, as ``runCommandWithFixedRetryAttempts``
        does; MongoError when it failed or its reply was lost (fail point
        ``migrationCommitNetworkError``: replaced after it ran). After any error the outcome is
        read from a refresh (a resent commit that finds the chunk moved already is refused)."""
        migrated = dict(doc["range"])
        if "preMigrationChunkVersion" in doc:
            migrated["lastmod"] = doc["preMigrationChunkVersion"]["v"]
        cmd = csrq.CommitChunkMigration(
            doc["nss"], self.node.shard_name, doc["recipientShardId"], migrated,
            {"e": meta.epoch, "t": meta.timestamp, "v": meta.version}).to_command()
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                await self.node.sharding.config_command("admin", cmd, timeout=60.0)
                break
            except MongoError as exc:
                if exc.code not in UNREACHABLE or attempt == COMMIT_ATTEMPTS - 1:
                    raise
            await asyncio.sleep(RETRY_S)
        if self.commit_network_error.should_fail():
            raise MongoError(1, "Failpoint 'migrationCommitNetworkError' generated error")

    async def _committed(self, doc: dict[str, Any], cloned: int, *, notify: bool) -> None:
        """After the commit: the donor's refresh, the ``moveChunk`` control event (``notify``:
        ``notifyChangeStreamsOnChunkMigrated``) and the changelog entry; then
        ``moveChunkHangAtStep6``."""
        node, ns = self.node, doc["nss"]
        meta = await self._refresh_until_answered(ns)
        if notify:
            remaining = meta is not None and bool(meta.chunks)
            await self._local(ns.split(".", 1)[0], shrq.Noop(
                {"msg": {"moveChunk": ns}},
                o2={"moveChunk": ns, "donor": node.shard_name,
                    "recipient": doc["recipientShardId"],
                    "allCollectionChunksMigratedFromDonor": not remaining},
                ns=ns, ui=doc.get("collectionUuid")).to_command())
            await self._log_change(doc, cloned)
        await self._pause("moveChunkHangAtStep6")

    async def _log_change(self, doc: dict[str, Any], cloned: int) -> None:
        """``moveChunk.commit`` in the config server's ``config.changelog``, as
        ``ShardingLogging::logChange`` writes it from the donor (``{_id, server, shard,
        clientAddr, time, what, ns, details: {min, max, from, to, counts}}``; ``counts``
        holds only ``cloned`` faithfully). A failure to log is not an error."""
        import datetime
        now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
        me = self.node.shard_name
        entry = {"_id": f"{me}-{now.isoformat()}-{ObjectId()}", "server": me, "shard": me,
                 "clientAddr": "", "time": now, "what": "moveChunk.commit", "ns": doc["nss"],
                 "details": {"min": doc["range"]["min"], "max": doc["range"]["max"],
                             "from": me, "to": doc["recipientShardId"],
                             "counts": {"cloned": Int64(cloned), "clonedBytes": Int64(0),
                                        "catchup": Int64(0), "steady": Int64(0)}}}
        try:
            await self.node.sharding.config_command("config", {
                "insert": "changelog", "documents": [entry],
                "writeConcern": {"w": "majority"}}, timeout=10.0)
        except (MongoError, OSError, asyncio.TimeoutError) as exc:  # pragma: no cover
            log.warning("changelog entry moveChunk.commit not written: %s", exc)

    # -- the decision -----------------------------------------------------------------------
    async def _until_answered(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """``await call()``, again every :data:`RETRY_S` seconds while the config server does
        not answer (a failover: :data:`UNREACHABLE`), for at most :data:`DECISION_WAIT_S`
        seconds; its result, or the error that is not of an unreachable server (or the last
        one once the time is up)."""
        deadline = asyncio.get_running_loop().time() + DECISION_WAIT_S
        while True:
            try:
                return await call()
            except (MongoError, OSError, asyncio.TimeoutError) as exc:
                code = getattr(exc, "code", None)
                if isinstance(exc, MongoError) and code not in UNREACHABLE \
                        or asyncio.get_running_loop().time() > deadline:
                    raise
            await asyncio.sleep(RETRY_S)

    async def _refresh_until_answered(self, ns: str) -> Any:
        """:meth:`ShardingRuntime.force_refresh` of ``ns`` (:meth:`_until_answered`)."""
        return await self._until_answered(lambda: self.node.sharding.force_refresh(ns))

    async def _fence_commit(self, doc: dict[str, Any]) -> None:
        """``_configsvrEnsureChunkVersionIsGreaterThan`` for ``doc``'s range and
        ``preMigrationChunkVersion`` (:meth:`_until_answered`): a commit that an earlier
        primary sent and that has not run yet is refused from then on, so the refresh that
        follows reads the final outcome (``recoverMigrationCoordinations`` calls
        ``ensureChunkVersionIsGreaterThan`` before ``forceShardFilteringMetadataRefresh``)."""
        version = doc.get("preMigrationChunkVersion")
        if not isinstance(version, dict):
            return  # a document of an older shardsim: decided from the refresh alone
        cmd = csrq.EnsureChunkVersionIsGreaterThan(
            1, dict(doc["range"]["min"]), dict(doc["range"]["max"]), dict(version),
            collectionUUID=doc.get("collectionUuid"), nss=doc["nss"]).to_command()
        await self._until_answered(
            lambda: self.node.sharding.config_command("admin", cmd, timeout=60.0))

    async def _decide(self, doc: dict[str, Any]) -> str:
        """The outcome of coordinator document ``doc`` without a persisted decision: the
        commit fenced off (:meth:`_fence_commit`), then from a refresh: ``aborted`` while the
        range's min still belongs to this shard (or the collection is gone or another
        incarnation), else ``committed`` (``recoverMigrationCoordinations``: ``keyBelongsToMe``
        -> aborted)."""
        if doc.get("decision") in ("committed", "aborted"):
            return doc["decision"]
        await self._fence_commit(doc)
        meta = await self._refresh_until_answered(doc["nss"])
        if meta is None or (doc.get("collectionUuid") is not None and meta.uuid is not None
                            and bytes(meta.uuid) != bytes(doc["collectionUuid"])):
            return "aborted"
        key = meta.pattern.bound_to_key(doc["range"]["min"])
        mine = any(compare_keys(a, key) <= 0 and compare_keys(key, b) < 0
                   for a, b in meta.chunks)
        return "aborted" if mine else "committed"

    # -- completion ----------------------------------------------------------------------------
    async def complete(self, doc: dict[str, Any], decision: str | None = None) -> str:
        """Step 7 of the module docstring for coordinator document ``doc`` (``decision``
        decided by the caller, else persisted in ``doc`` or read from a refresh; a committed
        decision read here also writes the ``moveChunk`` control event, as the step-up
        recovery does). Returns the decision. Raises the MongoError of a shard that does not
        answer (the document stays until a completion succeeds)."""
        ns, to, mid = doc["nss"], doc["recipientShardId"], doc["_id"]
        if decision is None:
            known = doc.get("decision")
            decision = await self._decide(doc)
            if known is None and decision == "committed":
                await self._committed(doc, 0, notify=True)
        await self._local("admin", shrq.MigrationDecision(mid, decision).to_command())
        await self._local("admin", shrq.MigrationCriticalSection(ns, False).to_command())
        await self._local("admin",
                          shrq.MigrationEnd(1, doc.get("migrationSessionId")).to_command())
        await self._recipient(to, "admin", shrq.MigrationCriticalSection(ns, False).to_command())
        forget = shrq.RangeDeletionTask(mid, "forget").to_command()
        run = shrq.RangeDeletionTask(mid, "run").to_command()
        if decision == "committed":
            await self._recipient(to, "admin", forget)
            await self._local("admin", run)
        else:
            await self._local("admin", forget)
            await self._recipient(to, "admin", run)
        await self._local("admin", shrq.ForgetMigration(mid).to_command())
        log.info("migration %s of %s [%s, %s) to %s completed: %s", mid, ns,
                 doc["range"]["min"], doc["range"]["max"], to, decision)
        return decision

    async def _complete_or_defer(self, doc: dict[str, Any], decision: str) -> None:
        """:meth:`complete`; when a shard does not answer, the decision is persisted (if this
        member still may) and the completion left to the background (:meth:`resume`)."""
        try:
            await self.complete(doc, decision)
        except MongoError as exc:
            if exc.code not in UNREACHABLE:
                raise
            log.warning("migration %s of %s not completed yet: %s", doc["_id"], doc["nss"],
                        exc.errmsg)
            self.active.discard(doc["_id"])  # the background completion may take it now
            self.resume()

    async def _complete_left(self, ns: str | None = None) -> int:
        """Complete the coordinations persisted here (of ``ns`` only, when given) that no
        migration of this process runs; returns how many are left incomplete."""
        left = 0
        for doc in self.node.range_deleter.documents(COORDINATORS):
            if doc["_id"] in self.active or (ns is not None and doc.get("nss") != ns):
                continue
            self.active.add(doc["_id"])
            try:
                await self.complete(doc)
            except (MongoError, OSError, asyncio.TimeoutError) as exc:
                if isinstance(exc, MongoError) and exc.code not in UNREACHABLE:
                    raise
                log.warning("migration %s of %s not completed yet: %s", doc["_id"],
                            doc.get("nss"), exc)
                left += 1
            finally:
                self.active.discard(doc["_id"])
        return left

    # -- step-up, step-down ----------------------------------------------------------------------
    def resume(self) -> None:
        """Complete the coordinations left here in the background, again every
        :data:`RETRY_S` seconds while one is left; one such task at a time, on the writable
        primary only (``resumeMigrationCoordinationsOnStepUp``)."""
        if not self._writable() or not self.node.range_deleter.documents(COORDINATORS):
            return
        if self._resume_task is None or self._resume_task.done():
            self._resume_task = asyncio.get_running_loop().create_task(self._resume_loop())

    async def _resume_loop(self) -> None:
        while self._writable():
            try:
                left = await self._complete_left()
            except MongoError as exc:
                log.warning("migration recovery: %s", exc.errmsg)
                left = 1
            if not left:
                return
            await asyncio.sleep(RETRY_S)

    def on_step_down(self) -> None:
        """Stop the migrations and the completion running here: the next primary completes
        them from its copy of ``config.migrationCoordinators`` (mongod interrupts them on
        stepdown)."""
        for task in list(self._running):
            task.cancel()
        if self._resume_task is not None:
            self._resume_task.cancel()
            self._resume_task = None

    def close(self) -> None:
        """Stop everything (shutdown)."""
        self.on_step_down()
