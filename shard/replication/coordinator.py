"""The replication coordinator of a shard member: the sans-IO core driven by a real process.

:class:`ReplicationCoordinator` owns one :class:`shardsim.core.repl.node.ReplNode` (terms,
elections, heartbeats, the commit point, stepdown; see ``docs/replication.md``) and does what
the core asks of its caller, as the server's ``ReplicationCoordinatorImpl`` does around its
``TopologyCoordinator`` (``src/mongo/db/repl/replication_coordinator_impl.cpp``):

* **time**: the event loop's monotonic clock in ms; a task sleeps until the core's
  ``next_wake`` or until a message arrives;
* **messages** to other members go out as commands on a pool per member
  (:mod:`shardsim.core.protocol.repl`: ``replSetHeartbeat``, ``replSetRequestVotes``,
  ``replSetUpdatePosition``, ``replSetStepUp``) and their replies come back to the core;
* **the oplog fetcher** (``bgsync.cpp``, ``oplog_fetcher.cpp``): a task that asks the sync source
  for the entries after the last applied one (``_shardsimFetchOplog``, answered as soon as there
  are entries or the source's commit point moved, else after one heartbeat interval, like an
  awaitData ``getMore``), and applies them (:mod:`shard.replication.applier`);
* **effects**: a state change bumps ``topologyVersion``; ``WriteNoop`` writes the "new primary"
  no-op in the new term; ``KillOperations`` / ``FailWaiters`` fail the ``w`` waiters (189) and,
  at rollback, close the cursors; ``CommitPointAdvanced`` wakes ``w: "majority"`` waiters and
  moves what change streams may read (:mod:`shard.replication.committed_oplog`);
  ``StartRollback`` runs :mod:`shard.replication.rollback`; ``PersistState`` writes the last vote,
  rollback id and commit point to ``<dbpath>/replset.state.bson`` (``local.replset.election``
  and ``local.system.rollback.id`` on mongod).

The test kit's faults act here too: :meth:`isolate` cuts every replication link of the member
both ways (the kit also refuses its client connections), :meth:`heal` restores them. Between
processes (``shardsim fault`` on a detached cluster) the links are cut with the test command
``_shardsimCutLinks`` (:mod:`shardsim.core.links`; :meth:`link_down` reads it), and the lag and
hold faults are the fail points ``shardsimDelayApply`` and mongod's ``stopReplProducer``
(:attr:`lag_ms`, :attr:`fetch_held`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
from typing import Any, Callable

import bson
from bson import ObjectId
from bson.int64 import Int64

from shardsim.core.client import Pool, parse_address
from shardsim.core.errors import MongoError
from shardsim.core.links import LINKS
from shardsim.core.protocol import repl as wire
from shardsim.core.repl.config import MemberConfig, ReplSetConfig
from shardsim.core.repl.member_state import MemberState, ReplError
from shardsim.core.repl.messages import (CommitPointAdvanced, FailWaiters, Heartbeat,
                                         KillOperations, PersistState, RequestVotes,
                                         StartRollback, StateChanged, StepUpFinished,
                                         StepUpRequest, UpdatePosition, WriteNoop)
from shardsim.core.repl.node import DurableState, ReplNode
from shardsim.core.repl.optime import NULL_OPTIME, OpTime, optime_of
from shardsim.core.repl.votes import LastVote

log = logging.getLogger("shardsim.shard.replication")

STATE_FILE = "replset.state.bson"
PROMISE_NOOP = {"msg": "promise"}  # shardsim's no-op for a promise request (promise_noop)
# How long a member command may take before the link counts as down (ms of the config's
# heartbeat interval: the server's heartbeat times out after heartbeatTimeoutSecs).
FETCH_BATCH = 500
#: The lag fault's fail point: ``data: {delayMs}``, every fetched batch is applied that late.
DELAY_APPLY = "shardsimDelayApply"
#: mongod's fail point that stops the oplog fetcher (``bgsync.cpp``; jstests'
#: ``stopServerReplication``): the hold_commit_point fault sets it on every secondary.
STOP_REPL_PRODUCER = "stopReplProducer"


def member_error(err: ReplError) -> MongoError:
    """The MongoError of a core :class:`ReplError` (same code, codeName and errmsg)."""
    return MongoError(err.code, err.errmsg, code_name_override=err.code_name)


class ReplicationCoordinator:
    """Replication for one member of shard ``node`` (a :class:`shard.node.ShardNode`).

    ``set_name`` (the shard name), ``hosts`` (every member's ``host:port``, the ``_id`` of a
    member is its index), ``settings``: ``election_timeout_ms``, ``heartbeat_interval_ms``,
    ``heartbeat_timeout_ms``, ``catch_up_timeout_ms`` (ms; the server's defaults 10000, 2000,
    10000, -1 when absent), ``priorities`` (list of floats), ``seed`` (election-timeout jitter).
    Raises MongoError InvalidReplicaSetConfig 93 when this member's address is not in ``hosts``.
    """

    def __init__(self, node: Any, set_name: str, hosts: list[str],
                 settings: dict[str, Any] | None = None) -> None:
        settings = dict(settings or {})
        self.node = node
        prios = settings.get("priorities") or [1.0] * len(hosts)
        members = tuple(MemberConfig(id=i, host=h, priority=float(prios[i]))
                        for i, h in enumerate(hosts))
        kw = {k: int(settings[k]) for k in ("election_timeout_ms", "heartbeat_interval_ms",
                                             "heartbeat_timeout_ms", "catch_up_timeout_ms")
              if settings.get(k) is not None}
        try:
            self.config = ReplSetConfig(set_name, members, **kw)
        except ReplError as err:
            raise member_error(err) from None
        if node.address not in hosts:
            raise MongoError(93, f"No host described in new configuration with version 1 for "
                                 f"replica set {set_name} maps to this node ({node.address})")
        self.self_id = hosts.index(node.address)
        self.rng = random.Random(settings.get("seed"))
        self.core: ReplNode | None = None
        self.pools: dict[int, Pool] = {mid: Pool(*parse_address(m.host))
                                       for mid, m in enumerate(members) if mid != self.self_id}
        self.isolated = False
        self._cut: set[int] = set()  # member ids whose link is cut (partition faults)
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._fetch_task: asyncio.Task | None = None
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future]] = []  # w waiters
        self._fetch_waiters: set[asyncio.Event] = set()  # the fetch source's awaitData
        self._step_up_waiters: list[asyncio.Future] = []
        self._writable = False
        self._stopping = False
        self.stall_tolerant = bool(settings.get("stall_tolerant"))
        # clock promise mode asked for: promise requests write a no-op (promise_noop)
        self.promise_noops = str(node.options.get("promise_mode") or "clock") == "clock"
        # the lag and hold_commit_point faults, as fail points (configureFailPoint on the
        # member, test commands on): shardsimDelayApply {delayMs}, mongod's stopReplProducer
        from shardsim.core.failpoints import FailPoint
        self.fp_delay_apply = FailPoint(DELAY_APPLY)
        self.fp_stop_producer = FailPoint(STOP_REPL_PRODUCER)
        node.failpoints.add(self.fp_delay_apply)
        node.failpoints.add(self.fp_stop_producer)
        self._paused_ms = 0
        self._last_real = 0
        self._applying = False  # the fetcher is appending entries the core counted already
        self.rollback_task: asyncio.Task | None = None
        self.listeners: list[Callable[[], None]] = []  # state changes (committed oplog, kit)
        self.rollbacks = 0
        self.last_rollback: Any = None
        # what change streams read: the oplog up to the readable point (committed_oplog.py)
        from shardsim.shard.replication.committed_oplog import CommittedOplog
        self.committed = CommittedOplog(node.oplog, self.readable_key)
        digest = hashlib.sha1(set_name.encode()).digest()[:12]
        self.replica_set_id = ObjectId(digest)  # the same on every member of the set

    # -- lifecycle -------------------------------------------------------------------------------
    def now(self) -> int:
        """The member's clock for the core: the event loop's monotonic time in ms; with
        ``stall_tolerant`` less the time the loop stood still.

        The timer loop runs at least every heartbeat interval, so a gap of more than two
        intervals between two readings means the event loop stood still. In the test kit every
        member of every set shares one loop, so such a stall paused them all alike: it counts
        as paused time (as a process stopped by the OS sees it, minus one interval), not as
        seconds of silence from everyone, which would depose a healthy primary."""
        real = int(asyncio.get_running_loop().time() * 1000)
        hb = self.config.heartbeat_interval_ms
        if self.stall_tolerant and self._last_real and real - self._last_real > 2 * hb:
            self._paused_ms += real - self._last_real - hb
        self._last_real = real
        return real - self._paused_ms

    def _state_path(self) -> str | None:
        dbpath = self.node.options.get("dbpath")
        return os.path.join(dbpath, STATE_FILE) if dbpath else None

    def _load_durable(self) -> DurableState:
        path = self._state_path()
        if path and os.path.exists(path):
            with open(path, "rb") as f:
                doc = bson.decode(f.read())
            return DurableState(LastVote(int(doc["lastVote"]["term"]),
                                         int(doc["lastVote"]["candidateIndex"])),
                                int(doc["rbid"]), wire.parse_optime(doc["commitPoint"]))
        return DurableState()

    def _persist(self) -> None:
        path = self._state_path()
        if path is None or self.core is None:
            return
        d = self.core.durable
        doc = {"lastVote": {"term": Int64(d.last_vote.term),
                            "candidateIndex": d.last_vote.candidate_id},
               "rbid": d.rbid, "commitPoint": wire.optime_doc(d.commit_point)}
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(bson.encode(doc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # the vote is on disk before the reply leaves

    def last_applied(self) -> OpTime:
        """The optime of the newest oplog entry (NULL_OPTIME for an empty oplog)."""
        last = self.node.oplog.last_ts()
        if last is None:
            return NULL_OPTIME
        entry = self.node.oplog.get(self.node.oplog.latest_key)
        return optime_of(entry) if entry is not None else NULL_OPTIME

    def start(self) -> None:
        """Build the core from the oplog and the persisted state; start the timer loop and the
        oplog fetcher (inside the node's event loop)."""
        now = self.now()
        self.core = ReplNode(self.config, self.self_id, self._load_durable(),
                             self.last_applied(), now=now, rng=self.rng)
        self.node.oplog_term = Int64(max(self.core.term, 0))
        if not self.node.options.get("repl_initiate") and len(self.node.oplog) == 0:
            # Not initiated here and nothing replicated yet: no candidacy until the first
            # entry arrives from an initiated member (ReplNode.unelectable_reason).
            self.core.initiated = False
        self.core.start(now)
        self.node.oplog.add_listener(self._on_append)
        LINKS.listeners.append(self.links_changed)
        loop = asyncio.get_running_loop()
        self._loop_task = loop.create_task(self._run())
        self._fetch_task = loop.create_task(self._fetcher())
        self.after_core()
        if self.node.options.get("repl_initiate"):
            self._spawn(self._first_election())

    async def _first_election(self) -> None:
        """The member that initiated the set stands at once instead of after an election
        timeout (as the server's ReplSetTest ``initiate`` steps its first node up); if the
        others are not up yet it loses and the timer decides, as usual."""
        await asyncio.sleep(self.config.heartbeat_interval_ms / 1000.0)
        try:
            self.core.step_up(self.now())
        except ReplError:
            pass
        self.after_core()

    async def stop(self) -> None:
        """Stop the tasks and close the member pools (shutdown)."""
        self._stopping = True
        self._forget_links()
        self._wake.set()
        tasks = [t for t in (self._loop_task, self._fetch_task, self.rollback_task, *self._tasks)
                 if t is not None]
        while tasks:
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks, timeout=0.5)
            tasks = [t for t in tasks if not t.done()]
        self._tasks.clear()
        for p in self.pools.values():
            p.close()
        self._fail_waiters(ReplError(11600, "InterruptedAtShutdown",
                                     "interrupted at shutdown"))
        try:
            self.node.oplog.remove_listener(self._on_append)
        except Exception:
            pass

    def crash(self) -> None:
        """``kill -9``: the tasks stop at once; nothing is flushed (the state file is written
        before every vote's reply already)."""
        self._stopping = True
        self._forget_links()
        self._wake.set()
        for t in (self._loop_task, self._fetch_task, self.rollback_task, *self._tasks):
            if t is not None:
                t.cancel()
        self._tasks.clear()
        for p in self.pools.values():
            p.close()

    # -- the lag and hold faults (fail points) ------------------------------------------------
    @property
    def lag_ms(self) -> float:
        """The lag fault: ms before each fetched batch is applied (0: none). Set by the kit's
        ``lag`` or ``configureFailPoint: "shardsimDelayApply", mode: "alwaysOn", data:
        {delayMs}``."""
        fp = self.fp_delay_apply
        if not fp.active:
            return 0.0
        try:
            return max(0.0, float(fp.data.get("delayMs", 0)))
        except (TypeError, ValueError):
            return 0.0

    @lag_ms.setter
    def lag_ms(self, ms: float) -> None:
        if ms:
            self.fp_delay_apply.configure("alwaysOn", {"delayMs": ms})
        else:
            self.fp_delay_apply.configure("off", None)

    @property
    def fetch_held(self) -> bool:
        """The hold_commit_point fault: this member fetches nothing (mongod's
        ``stopReplProducer`` fail point, ``bgsync.cpp``)."""
        return self.fp_stop_producer.active

    @fetch_held.setter
    def fetch_held(self, on: bool) -> None:
        self.fp_stop_producer.configure("alwaysOn" if on else "off", None)

    # -- what the node asks ----------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        """Writable primary (``canAcceptNonLocalWrites``)."""
        return self.core is not None and self.core.can_accept_writes()

    @property
    def state(self) -> MemberState:
        return self.core.state if self.core is not None else MemberState.STARTUP

    def readable_key(self) -> int:
        """The newest oplog time key majority readers and change streams may see here."""
        if self.core is None:
            return 0
        return max(self.core.readable_point.ts, 0)

    def _on_append(self, entry: dict[str, Any]) -> None:
        """Every oplog append: a primary's write counts as applied and durable at once (the
        journal is committed before the reply); the source's fetchers wake."""
        core = self.core
        if core is not None and not core.initiated:
            core.initiated = True  # replicated from an initiated member: may stand now
        if core is not None and not self._applying:
            core.note_applied(optime_of(entry), self.now())
            self.after_core()
        self._wake_fetchers()

    def _wake_fetchers(self) -> None:
        for ev in self._fetch_waiters:
            ev.set()

    def may_log(self) -> bool:
        """May this member append an oplog entry of its own now (not one it fetched)? Only
        the primary of the current term writes entries (its ``t`` is that term): a writable
        primary, a new primary writing its "new primary" no-op, or the member initiating the
        set (its first entry). Entries are appended while the fetcher or a rollback's catch-up
        applies (:meth:`applying`) too. Anything else would put an entry with a term and a
        ``ts`` another member also uses into this member's oplog: the optimes would match and
        the fetcher could never see that the oplogs diverged (``repl::logOp`` uasserts
        NotWritablePrimary then, ``_logOpsInner`` in ``src/mongo/db/repl/oplog.cpp``)."""
        core = self.core
        return (self._applying or core is None or core.role == "leader"
                or len(self.node.oplog) == 0)

    def applying(self, on: bool) -> None:
        """The caller appends entries the core counted already (the fetcher, the rollback's
        catch-up): their appends are not new local writes."""
        self._applying = on

    def promise_noop(self, key: int) -> None:
        """A promise past time key ``key`` was asked of this member's change streams
        (``_shardsimAdvanceClusterTime``). Their promise cannot pass the commit point, so on a
        writable primary whose newest entry is not past ``key`` write a no-op now (its ``ts``
        is past the request's, which moved the clock): it commits within a replication round
        trip and lets the idle shard's streams promise past ``key``, instead of waiting for the
        periodic no-op (mongod's behaviour, kept with ``--promise-mode mongod``)."""
        if self.promise_noops and self.writable and self.node.oplog.latest_key < key:
            self.node.write_noop(dict(PROMISE_NOOP))

    # -- the timer loop and effects --------------------------------------------------------------
    def after_core(self) -> None:
        """Carry out what the core produced since the last call, and re-arm the timer."""
        core = self.core
        if core is None:
            return
        out, effects = core.poll()
        for mid, msg in out:
            self._spawn(self._send(mid, msg))
        for eff in effects:
            self._effect(eff)
        self.committed.advance()
        if self._waiters:
            self._check_waiters()
        if core.can_accept_writes() != self._writable:
            self._writable = not self._writable
            self.node.topology_version.bump()
            self._notify()
            if self._writable:
                self.node.on_became_writable_primary()
            else:
                self.node.on_lost_writable_primary()
        self._wake.set()

    def _notify(self) -> None:
        for cb in list(self.listeners):
            cb()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        while not self._stopping:
            core = self.core
            wake = core.next_wake()
            timeout = None if wake is None else max(0.0, (wake - self.now()) / 1000.0)
            self._wake.clear()
            # a timer sets the event (asyncio.wait_for can swallow a cancellation that races
            # with the event on Python 3.11, and stop() would wait for this task forever)
            timer = None if timeout is None else \
                asyncio.get_running_loop().call_later(timeout, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()
            if self._stopping:
                return
            core.tick(self.now())
            self.after_core()

    def _effect(self, eff: Any) -> None:
        kind = type(eff)
        node = self.node
        if kind is StateChanged:
            log.info("%s: %s -> %s (%s)", node.address, eff.old.state_str, eff.new.state_str,
                     eff.reason)
            node.oplog_term = Int64(max(self.core.term, 0))
            node.topology_version.bump()
            self._notify()
        elif kind is WriteNoop:
            core = self.core
            if core.role != "leader" or core.term != eff.term or core.writable:
                # asked for before a stepdown in the same round: not the primary of that term
                # any more, so no entry of it here (may_log would refuse it)
                log.info("%s: no 'new primary' no-op for term %s (term %s, %s)", node.address,
                         eff.term, core.term, core.role)
                return
            node.oplog_term = Int64(eff.term)
            ts = node.write_noop(dict(eff.doc))
            self.core.note_new_primary_noop(OpTime(t=eff.term, ts=(ts.time << 32) | ts.inc),
                                            self.now())
        elif kind is KillOperations:
            self._fail_waiters(eff.error)
            if eff.scope == "all":
                self._spawn(node.cursors.kill_all())
        elif kind is FailWaiters:
            self._fail_waiters(eff.error)
        elif kind is CommitPointAdvanced:
            self._wake_fetchers()
            self._notify()
        elif kind is StartRollback:
            from shardsim.shard.replication import rollback_run
            self.rollback_task = asyncio.get_running_loop().create_task(
                rollback_run.run(self, eff.source_id))
        elif kind is PersistState:
            self._persist()
        elif kind is StepUpFinished:
            waiters, self._step_up_waiters = self._step_up_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(eff.error)
        # the term may have changed with any effect: entries take the current term
        if self.core is not None and not self.core.can_accept_writes():
            node.oplog_term = Int64(max(self.core.term, 0))

    # -- messages --------------------------------------------------------------------------------
    def link_down(self, mid: int) -> bool:
        """The link to member ``mid`` is cut: the kit's isolate / partition faults, or
        ``_shardsimCutLinks`` naming its host (:mod:`shardsim.core.links`)."""
        if self.isolated or mid in self._cut:
            return True
        if LINKS.cut and 0 <= mid < len(self.config.members):
            return LINKS.is_cut(self.config.members[mid].host)
        return False

    def _forget_links(self) -> None:
        try:
            LINKS.listeners.remove(self.links_changed)
        except ValueError:
            pass

    def links_changed(self) -> None:
        """``_shardsimCutLinks`` changed the cut hosts: close the pools to cut members and
        wake the timer loop (heartbeats go out again at once after a heal)."""
        for mid, pool in self.pools.items():
            if self.link_down(mid):
                pool.close()
        self._wake.set()

    async def _send(self, mid: int, msg: Any) -> None:
        """Send one core message to member ``mid`` and feed its reply back."""
        kind = type(msg)
        if kind is Heartbeat:
            cmd = wire.heartbeat_command(msg)
        elif kind is RequestVotes:
            cmd = wire.request_votes_command(msg)
        elif kind is UpdatePosition:
            cmd = wire.update_position_command(msg)
        elif kind is StepUpRequest:
            cmd = wire.step_up_command(msg)
        else:  # pragma: no cover - the core sends nothing else
            return
        reply = await self.member_command(mid, cmd)
        if reply is None or self.core is None:
            return
        now = self.now()
        try:
            if kind is Heartbeat and reply.get("ok"):
                self.core.receive(wire.parse_heartbeat_reply(reply), now)
            elif kind is RequestVotes and reply.get("ok"):
                self.core.receive(wire.parse_vote_reply(reply), now)
        except (KeyError, ValueError, TypeError):
            log.warning("bad reply from member %s to %s", mid, kind.__name__)
        self.after_core()

    async def member_command(self, mid: int, cmd: dict[str, Any],
                             timeout_ms: int | None = None) -> dict[str, Any] | None:
        """Run ``cmd`` on member ``mid``; None when the link is cut or the member did not
        answer in time (``heartbeatTimeoutSecs`` / the given timeout)."""
        if self.link_down(mid):
            return None
        timeout = (timeout_ms or self.config.heartbeat_timeout_ms) / 1000.0
        try:
            reply = await self.pools[mid].command("admin", cmd, timeout=timeout, check=False)
        except (MongoError, OSError, asyncio.TimeoutError):
            return None
        if self.link_down(mid):
            return None  # cut while in flight: the reply is lost
        return reply

    def receive(self, msg: Any) -> Any:
        """A member command arrived: hand it to the core, return its reply message."""
        reply = self.core.receive(msg, self.now())
        self.after_core()
        return reply

    # -- the oplog fetcher -----------------------------------------------------------------------
    async def _fetcher(self) -> None:
        """bgsync: while a sync source is known and we are a secondary (or a catching-up
        primary), fetch and apply; otherwise wait for a state change."""
        from shardsim.shard.replication import applier
        while not self._stopping:
            core = self.core
            req = None if self.fetch_held else core.fetch_request(self.now())
            self.after_core()
            if req is None:
                await asyncio.sleep(self.config.heartbeat_interval_ms / 4000.0)
                continue
            source, fetch = req
            cmd = wire.fetch_command(fetch)
            cmd["limit"] = FETCH_BATCH
            cmd["lastKnownCommitted"] = wire.optime_doc(core.commit_point)
            cmd["maxAwaitTimeMS"] = self.config.heartbeat_interval_ms
            doc = await self.member_command(source, cmd,
                                            timeout_ms=2 * self.config.heartbeat_interval_ms
                                            + 1000)
            if self.fetch_held:  # held while the fetch was out: what it brought is dropped
                core.fetch_deadline = None
                continue
            if doc is None or not doc.get("ok"):
                core.fetch_deadline = None
                core.sync_source = None if doc is not None else core.sync_source
                await asyncio.sleep(self.config.heartbeat_interval_ms / 2000.0)
                continue
            try:
                reply = wire.parse_fetch_reply(fetch.after, doc)
            except (KeyError, ValueError, TypeError):
                core.fetch_deadline = None
                continue
            if self.lag_ms:  # the kit's lag fault: this secondary applies late
                await asyncio.sleep(self.lag_ms / 1000.0)
            entries = core.on_fetch_reply(reply, self.now())
            if entries:
                self._applying = True
                try:
                    applier.apply_entries(self.node, list(entries))
                except MongoError as exc:
                    # mongod stops (fassert) on an entry it cannot apply; a member here logs it,
                    # goes back to what its oplog holds and tries again after a pause
                    log.error("%s: cannot apply fetched entries: %s", self.node.address,
                              exc.errmsg)
                    core.applied = core.durable_optime = self.last_applied()
                    await asyncio.sleep(self.config.heartbeat_interval_ms / 1000.0)
                finally:
                    self._applying = False
            self.after_core()

    async def serve_fetch(self, body: dict[str, Any]) -> dict[str, Any]:
        """The sync source's side of ``_shardsimFetchOplog``: the entries after the fetcher's
        last optime (OplogStartMissing 120 when that entry is not here), waiting up to
        ``maxAwaitTimeMS`` for new entries or a new commit point."""
        req = wire.parse_fetch(body)
        core = self.core
        try:
            core.on_fetch_request(req, self.now())
        except ReplError as err:
            self.after_core()
            raise member_error(err) from None
        self.after_core()
        known = wire.parse_optime(body.get("lastKnownCommitted"))
        max_await = float(body.get("maxAwaitTimeMS") or 0) / 1000.0
        entries, error, first = self._entries_after(req.after, req.limit)
        if not entries and error is None and core.commit_point == known and max_await > 0:
            changed = asyncio.Event()
            self._fetch_waiters.add(changed)
            timer = asyncio.get_running_loop().call_later(max_await, changed.set)
            try:
                await changed.wait()
            finally:
                timer.cancel()
                self._fetch_waiters.discard(changed)
            entries, error, first = self._entries_after(req.after, req.limit)
        try:  # again after the wait: this member may have left PRIMARY/SECONDARY meanwhile
            md = core.on_fetch_request(req, self.now())
        except ReplError as err:
            self.after_core()
            raise member_error(err) from None
        self.after_core()
        return wire.fetch_reply(self.self_id, md, entries, error, first)

    def _entries_after(self, after: OpTime, limit: int) -> tuple[list[Any], Any, OpTime]:
        """``serve_fetch`` over the node's oplog: entries after ``after`` (which must be here,
        with its term), the error, the first optime when the oplog was truncated."""
        oplog = self.node.oplog
        first = NULL_OPTIME
        if oplog.truncated_through:
            head = next(iter(oplog.entries_from(0)), None)
            if head is not None:
                first = optime_of(head)
        if after == NULL_OPTIME:
            return list(_take(oplog.entries_from(0), limit)), None, first
        entry = oplog.get(after.ts)
        if entry is None or int(entry["t"]) != after.t:
            gte = next(iter(oplog.entries_from(after.ts)), None)
            from shardsim.core.repl.optime import format_optime
            return [], ReplError(120, "OplogStartMissing",
                                 f"Our last optime fetched: {format_optime(after)}. source's "
                                 f"GTE: {format_optime(optime_of(gte)) if gte else '(none)'}"), first
        return list(_take(oplog.entries_after(after.ts), limit)), None, first

    # -- write concern ---------------------------------------------------------------------------
    async def write_concern_error(self, wc: Any) -> dict[str, Any] | None:
        """Wait for the request's ``writeConcern`` after a command ran on this primary; the
        ``writeConcernError`` document when it failed, else None (``waitForWriteConcern``,
        ``src/mongo/db/write_concern.cpp``; ``ReplicationCoordinatorImpl::awaitReplication``).

        ``w: "majority"`` waits for the commit point, ``w: N`` for N members (this one
        included) to have the newest entry; UnsatisfiableWriteConcern 100 when N is more than
        the members, UnknownReplWriteConcern 79 for a tag set, WriteConcernFailed 64
        (``errInfo.wtimeout``) after ``wtimeout`` ms, PrimarySteppedDown 189 when this member
        stops being primary meanwhile."""
        if not isinstance(wc, dict):
            return None
        w = wc.get("w", 1)
        if w is None or (isinstance(w, (int, float)) and not isinstance(w, bool) and w <= 1):
            return None
        core = self.core
        target = core.applied
        n_members = len(self.config.members)
        if isinstance(w, str) and w != "majority":
            return {"code": 79, "codeName": "UnknownReplWriteConcern",
                    "errmsg": f"No write concern mode named '{w}' found in replica set "
                              f"configuration"}
        if w == "majority":
            def done() -> bool:
                return core.commit_point >= target
        else:
            if int(w) > n_members:
                return {"code": 100, "codeName": "UnsatisfiableWriteConcern",
                        "errmsg": "Not enough data-bearing nodes"}

            def done() -> bool:
                have = 1 + sum(1 for v in core.views.values() if v.applied >= target)
                return have >= int(w)
        if done():
            return None
        if core.role != "leader":
            return _wce(189, "PrimarySteppedDown",
                        "Primary stepped down while waiting for replication")
        wtimeout = wc.get("wtimeout") or 0
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((done, fut))
        try:
            err = await asyncio.wait_for(fut, wtimeout / 1000.0 if wtimeout else None)
        except asyncio.TimeoutError:
            doc = _wce(64, "WriteConcernFailed", "waiting for replication timed out")
            doc["errInfo"] = {"wtimeout": True,
                              "writeConcern": {"w": w, "wtimeout": wtimeout,
                                               "provenance": "clientSupplied"}}
            return doc
        finally:
            self._waiters = [(p, f) for p, f in self._waiters if f is not fut]
        if err is not None:
            return _wce(err.code, err.code_name, err.errmsg)
        return None

    def _check_waiters(self) -> None:
        keep = []
        for done, fut in self._waiters:
            if fut.done():
                continue
            if done():
                fut.set_result(None)
            else:
                keep.append((done, fut))
        self._waiters = keep

    def _fail_waiters(self, err: ReplError) -> None:
        waiters, self._waiters = self._waiters, []
        if err.code == 11602:
            err = ReplError(189, "PrimarySteppedDown",
                            "Primary stepped down while waiting for replication")
        for _, fut in waiters:
            if not fut.done():
                fut.set_result(err)

    # -- commands --------------------------------------------------------------------------------
    async def step_up(self) -> None:
        """``replSetStepUp``: stand now and wait for the outcome (CommandFailed 125)."""
        fut = asyncio.get_running_loop().create_future()
        self._step_up_waiters.append(fut)
        try:
            self.core.step_up(self.now())
        except ReplError as err:
            self._step_up_waiters.remove(fut)
            raise member_error(err) from None
        self.after_core()
        if self.core.role == "leader" and self.core.writable:
            return
        err = await fut
        if err is not None:
            raise member_error(err)

    def handoff(self) -> None:
        """An election handoff from the old primary (``replSetStepUp`` with ``skipDryRun``):
        stand at once when electable, without waiting for the outcome."""
        try:
            self.core.step_up(self.now(), skip_dry_run=True)
        except ReplError:
            pass
        self.after_core()

    async def step_down(self, secs: int, catch_up_secs: int, force: bool) -> None:
        """``replSetStepDown``: wait for the attempt's result (see the core's ``step_down``)."""
        try:
            attempt = self.core.step_down(self.now(), secs, catch_up_secs, force)
        except ReplError as err:
            raise member_error(err) from None
        self.after_core()
        while attempt.result is None:
            await asyncio.sleep(0.01)
            self.core.tick(self.now())
            self.after_core()
        if isinstance(attempt.result, ReplError):
            raise member_error(attempt.result)

    def freeze(self, secs: int) -> dict[str, Any]:
        """``replSetFreeze`` (NotSecondary 95 on a primary)."""
        try:
            reply = self.core.freeze(self.now(), secs)
        except ReplError as err:
            raise member_error(err) from None
        self.after_core()
        return reply

    # -- faults ----------------------------------------------------------------------------------
    def isolate(self) -> None:
        """Cut every replication link of this member, both ways (until :meth:`heal`)."""
        self.isolated = True
        for p in self.pools.values():
            p.close()

    def cut(self, mids: set[int]) -> None:
        """Cut the links to the members ``mids`` (a partition)."""
        self._cut |= set(mids)

    def heal(self) -> None:
        """Restore every link; end the lag and hold faults."""
        self.isolated = False
        self._cut.clear()
        self.lag_ms = 0
        self.fetch_held = False
        self._wake.set()


def _wce(code: int, code_name: str, errmsg: str) -> dict[str, Any]:
    return {"code": code, "codeName": code_name, "errmsg": errmsg}


def _take(it: Any, n: int) -> Any:
    for i, e in enumerate(it):
        if i >= n:
            return
        yield e
