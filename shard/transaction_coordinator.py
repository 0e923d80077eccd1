"""The transaction coordinator of a shard: two-phase commit of a cross-shard transaction
(mongod's ``TransactionCoordinator``, ``src/mongo/db/s/transaction_coordinator.cpp``, its
steps in ``transaction_coordinator_util.cpp``).

The router hands the commit of a transaction that wrote on several shards to its first
participant with ``coordinateCommitTransaction {participants: [{shardId, host}]}``
(``TransactionRouter::Router::_handOffCommitToCoordinator``). The coordinator then:

1. persists the participant list (``persistParticipantsList``) in
   ``config.transaction_coordinators`` (a document ``{_id: {lsid, txnNumber}, participants}``;
   durable with ``--dbpath`` like every collection);
2. sends ``prepareTransaction`` to every participant (``sendPrepare``); the decision is commit
   at ``commitTimestamp`` = the newest ``prepareTimestamp`` when all of them prepared, abort as
   soon as one fails (its error is the abort reason);
3. persists the decision (``persistDecision``: ``decision: {decision: "commit",
   commitTimestamp}`` or ``{decision: "abort", abortStatus}``);
4. sends ``commitTransaction {commitTimestamp}`` or ``abortTransaction`` to every participant
   until each has acknowledged it (``sendCommit``/``sendAbort``: retried on any error but a
   vote-abort one, ``sendDecisionToShard``);
5. deletes its document (``deleteCoordinatorDoc``).

A coordinator shard that restarts finds its documents (:meth:`Coordinators.recover`,
``transaction_coordinator_service.cpp``): with a decision it delivers it, without one it
sends the prepares again and decides (``continueCommit``: mongod 8.0 re-runs phase one, so a
transaction every participant still holds prepared commits). A retried ``coordinateCommitTransaction``
joins the running (or recovered) coordination. Two-phase commit never starts again for a
transaction whose coordination is over: mongod's coordinator lives in the
``TransactionCoordinatorCatalog`` from the transaction's first statement on this shard
(``createCoordinator``) until it completes, and ``coordinateCommit`` finds none once it
completed (or after a restart that found no document), so ``coordinateCommitTransaction``
recovers the outcome from this shard's own participant instead
(``txn_two_phase_commit_cmds.cpp``, :func:`shard.commit_recovery.recover_from_participant`).
Here the coordinator "exists" while a coordination runs or is persisted, or while this shard's
participant of the transaction is still in progress (its commit not yet started);
:meth:`Coordinators.coordinate` answers None otherwise.

shardsim differences: the participants' addresses travel with the shard ids (a shard does not
keep a shard registry), and shard-to-shard commands carry no internal authentication.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from bson import Timestamp
from bson.int64 import Int64

from shardsim.core.shard_targets import ShardTargets
from shardsim.core.errors import MongoError, code_name
from shardsim.core.failpoints import FailPoint
from shardsim.core.values import id_key
from shardsim.core.protocol.versions import NETWORK_ERRORS
from shardsim.shard.sessions import session_key

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

log = logging.getLogger("shardsim.coordinator")

COORDINATORS_NS = ("config", "transaction_coordinators")
# Errors after which a participant is asked again (network, shutdown, not primary).
_RETRY_CODES = NETWORK_ERRORS | {91, 11600, 189, 10107, 13436}


class Coordinators:
    """All coordinations of one shard (``node.coordinators``)."""

    def __init__(self, node: "ShardNode") -> None:
        self.node = node
        self._running: dict[tuple[bytes, int], asyncio.Task] = {}
        # participants' primaries, found again after a failover (a participant's ``host`` is
        # its shard's connection string, set/h1,h2,... for a replica set)
        self.targets = ShardTargets()
        # mongod's fail points (transaction_coordinator_util.cpp / transaction_coordinator.cpp),
        # configured with configureFailPoint once install_fail_points() ran: the coordination
        # waits while they are set, between the prepares and the persisted decision, and
        # between the persisted decision and its delivery.
        self.hang_before_decision = FailPoint("hangBeforeWritingDecision")
        self.hang_before_delivery = FailPoint("hangBeforeWaitingForDecisionWriteConcern")
        # transaction_coordinator_futures_util.cpp (AsyncWorkScheduler::_targetHostAsync):
        # evaluated before each prepare/decision sent to another shard, never for this one
        # (mode {skip: n} holds the decision phase after the n remote prepares)
        self.hang_targeting_remote = FailPoint("hangWhileTargetingRemoteHost")

    def install_fail_points(self) -> None:
        """Make the coordinator's fail points configurable (``node.failpoints``)."""
        self.node.failpoints.add(self.hang_before_decision)
        self.node.failpoints.add(self.hang_before_delivery)
        self.node.failpoints.add(self.hang_targeting_remote)

    @staticmethod
    async def _pause_while_set(fp: FailPoint) -> None:
        """``if (fp.shouldFail()) fp.pauseWhileSet()``: wait while the fail point stays on."""
        if fp.should_fail():
            log.info("Hit %s failpoint", fp.name)
            while fp.active:
                await asyncio.sleep(0.01)

    # -- persistence ---------------------------------------------------------------------------
    def _coll(self) -> Any:
        return self.node.ensure_collection(*COORDINATORS_NS)

    def _check_primary(self) -> None:
        """NotWritablePrimary (10107) unless this member may write: a coordinator document is
        written on the shard's primary only (on mongod with a ``DBDirectClient`` write, which a
        secondary refuses); a member that stepped down leaves the coordination to the next
        primary (:meth:`on_step_down`)."""
        repl = self.node.repl
        if repl is not None and not repl.writable:
            raise MongoError(10107, "not primary")

    def _save(self, doc: dict[str, Any]) -> None:
        """Write the coordinator document, logged (replicated: a new primary of this shard
        finds it and finishes the coordination, as the server's coordinator documents are
        majority-written, ``TransactionCoordinatorService::onStepUp``). NotWritablePrimary
        (10107), nothing written, on a member that is not the writable primary."""
        self._check_primary()
        self.node.put_logged(self._coll(), doc)

    def _delete(self, _id: dict[str, Any]) -> None:
        self._check_primary()
        coll = self._coll()
        key = id_key(_id)
        if key in coll.docs:
            coll.delete(key)
            self.node.log_op("d", coll, {"_id": _id})
            self.node.storage.note_doc(coll, key, None)
            self.node.flush()

    def documents(self) -> list[dict[str, Any]]:
        """The coordinator documents of ``config.transaction_coordinators``."""
        coll = self.node.storage.get(*COORDINATORS_NS)
        return list(coll.docs.values()) if coll is not None else []

    # -- talking to participants ---------------------------------------------------------------
    async def _send(self, p: dict[str, Any], cmd: dict[str, Any], *,
                    retry: bool) -> dict[str, Any]:
        host = p["host"]
        if p.get("shardId") != self.node.shard_name:
            await self._pause_while_set(self.hang_targeting_remote)
        delay = 0.05
        while True:
            try:
                reply = await self.targets.command(self.node.clock, host, "admin", cmd,
                                                   timeout=30.0)
                wce = reply.get("writeConcernError")
                if wce:  # ran, but a majority may not have it: not an answer yet
                    raise MongoError(int(wce.get("code", 64)), str(wce.get("errmsg", "")))
                return reply
            except MongoError as exc:
                if not retry or exc.code not in _RETRY_CODES:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -- the protocol ---------------------------------------------------------------------------
    async def coordinate(self, lsid: dict[str, Any], txn_number: int,
                         participants: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Run (or join) the two-phase commit of ``(lsid, txn_number)``; returns the decision
        ``{decision: "commit", commitTimestamp}`` or ``{decision: "abort", abortStatus: {code,
        codeName, errmsg}}`` once every participant has been told. None when this shard has
        no coordinator for it (``TransactionCoordinatorService::coordinateCommit`` returning
        ``boost::none``): its coordination already completed, or a restart lost it, or this
        shard's participant is not in progress; the caller then recovers the outcome from the
        participant. Never a second two-phase commit of one transaction."""
        key = (session_key(lsid), int(txn_number))
        task = self._running.get(key)
        if task is None:
            doc = self._find(lsid, txn_number)
            if doc is None:
                if self.node.sessions.txn_state(lsid, txn_number) != "in_progress":
                    return None
                doc = {"_id": {"lsid": lsid, "txnNumber": Int64(txn_number)},
                       "participants": participants}
                self._save(doc)
            return await self._start(key, doc)
        return await _join(task)

    async def _start(self, key: tuple[bytes, int], doc: dict[str, Any]) -> dict[str, Any]:
        return await _join(self._spawn(key, doc))

    def _spawn(self, key: tuple[bytes, int], doc: dict[str, Any]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._run(doc))
        self._running[key] = task
        task.add_done_callback(
            lambda t, k=key: self._running.pop(k) if self._running.get(k) is t else None)
        return task

    async def decision_of(self, lsid: dict[str, Any],
                          txn_number: int) -> dict[str, Any] | None:
        """The decision of ``(lsid, txn_number)`` when this shard coordinates it (joining the
        running coordination, or finishing a persisted one), else None
        (``TransactionCoordinatorService::recoverCommit``)."""
        key = (session_key(lsid), int(txn_number))
        task = self._running.get(key)
        if task is not None:
            return await _join(task)
        doc = self._find(lsid, txn_number)
        if doc is None:
            return None
        return await self._start(key, doc)

    def _find(self, lsid: dict[str, Any], txn_number: int) -> dict[str, Any] | None:
        for doc in self.documents():
            _id = doc["_id"]
            if session_key(_id["lsid"]) == session_key(lsid) \
                    and int(_id["txnNumber"]) == txn_number:
                return doc
        return None

    def _txn_fields(self, doc: dict[str, Any]) -> dict[str, Any]:
        _id = doc["_id"]
        return {"lsid": _id["lsid"], "txnNumber": Int64(_id["txnNumber"]), "autocommit": False}

    async def _majority(self) -> None:
        """On a replica-set member: wait until this shard's last write (the coordinator
        document) is majority-committed, as the server writes the participant list and the
        decision with ``w: "majority"`` (``persistParticipantsList``, ``persistDecision``);
        PrimarySteppedDown 189 (or 64) when it cannot be: the new primary recovers."""
        await self.node.wait_for_majority()

    async def _run(self, doc: dict[str, Any]) -> dict[str, Any]:
        decision = doc.get("decision")
        if decision is None:
            await self._majority()  # the participant list
            decision = await self._prepare_all(doc)
            await self._pause_while_set(self.hang_before_decision)
            doc = dict(doc, decision=decision)
            self._save(doc)
            await self._majority()
        await self._pause_while_set(self.hang_before_delivery)
        await self._deliver(doc, decision)
        self._delete(doc["_id"])
        return decision

    async def _prepare_all(self, doc: dict[str, Any]) -> dict[str, Any]:
        cmd = {"prepareTransaction": 1, **self._txn_fields(doc),
               "writeConcern": {"w": "majority"}}  # sendPrepare: a majority has the prepare

        async def prepare(p: dict[str, Any]) -> Timestamp:
            reply = await self._send(p, cmd, retry=True)
            ts = reply.get("prepareTimestamp")
            if not isinstance(ts, Timestamp) or (ts.time, ts.inc) == (0, 0):
                # sendPrepareToShard: an ok reply without prepareTimestamp is a vote to abort
                raise MongoError(251, f"Coordinator shard received an OK response to "
                                      f"prepareTransaction without a prepareTimestamp from "
                                      f"shard {p.get('shardId')}, which is not expected "
                                      f"behavior. Interpreting the response as vote to abort")
            return ts

        tasks = [asyncio.ensure_future(prepare(p)) for p in doc["participants"]]
        try:
            stamps = await asyncio.gather(*tasks)
        except MongoError as exc:
            for t in tasks:
                t.cancel()
            return {"decision": "abort",
                    "abortStatus": {"code": exc.code, "codeName": code_name(exc.code),
                                    "errmsg": exc.errmsg}}
        commit_ts = max(stamps, key=lambda t: (t.time, t.inc))
        return {"decision": "commit", "commitTimestamp": commit_ts}

    async def _deliver(self, doc: dict[str, Any], decision: dict[str, Any]) -> None:
        """Send the decision to every participant until each acknowledged it
        (``sendDecisionToShard``: *always* retried, with backoff, until ok or a vote-abort
        error, NoSuchTransaction 251 / TransactionTooOld 225, which counts as an ack; also
        TransactionCommitted 256 for a commit). The document is deleted only after that, so
        no participant is left prepared by a decision that did not reach it."""
        fields = self._txn_fields(doc)
        fields["writeConcern"] = {"w": "majority"}  # sendCommit / sendAbort
        if decision["decision"] == "commit":
            cmd = {"commitTransaction": 1, "commitTimestamp": decision["commitTimestamp"], **fields}
            acks = {251, 225, 256}
        else:
            cmd = {"abortTransaction": 1, **fields}
            acks = {251, 225}

        async def send(p: dict[str, Any]) -> None:
            delay = 0.05
            while True:
                try:
                    await self._send(p, cmd, retry=True)
                    return
                except MongoError as exc:
                    if exc.code in acks:
                        return
                    log.warning("participant %s answered %s to %s; sending it again",
                                p.get("shardId"), exc.errmsg, next(iter(cmd)))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

        await asyncio.gather(*(send(p) for p in doc["participants"]))

    def recover(self) -> None:
        """After a restart: finish every coordination found in
        ``config.transaction_coordinators``, in the background
        (``TransactionCoordinatorService::_scheduleRecoveryTask``, then
        ``TransactionCoordinator::continueCommit``): a persisted decision is delivered; a
        document without one runs the prepare phase again (a participant already prepared
        answers its ``prepareTimestamp`` again, one recovered prepared after its own restart
        too), then decides, persists and delivers as the first attempt would have."""
        for doc in self.documents():
            _id = doc["_id"]
            key = (session_key(_id["lsid"]), int(_id["txnNumber"]))
            running = self._running.get(key)
            if running is not None and not running.done():
                continue  # still coordinating it (never two coordinations of one transaction)
            self._spawn(key, doc)

    def on_step_down(self) -> None:
        """This member stopped being the writable primary: interrupt every coordination
        (``TransactionCoordinatorService::onStepDown`` interrupts its scheduler). Their
        ``coordinateCommitTransaction`` commands answer InterruptedDueToReplStateChange
        (11602, retryable): the router's retry reaches the new primary, which finishes the
        coordination from its copy of the document (:meth:`recover` at step-up) or recovers
        the outcome. A coordination left running would write its decision into this member's
        oplog after the stepdown, an entry no other member has, under an optime the new
        primary also gives one of its own entries (the oplogs diverge unseen)."""
        for task in list(self._running.values()):
            task.cancel()
        self._running.clear()

    def close(self) -> None:
        """Stop the coordinations and close the pools (shutdown)."""
        for task in list(self._running.values()):
            task.cancel()
        self.targets.close()


async def _join(task: asyncio.Task) -> dict[str, Any]:
    """Wait for coordination ``task`` without cancelling it when the caller is cancelled;
    InterruptedDueToReplStateChange (11602) when the coordination itself was interrupted by a
    stepdown (:meth:`Coordinators.on_step_down`)."""
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if task.cancelled():
            raise MongoError(11602, "operation was interrupted because a replica set state "
                                    "change occurred") from None
        raise
