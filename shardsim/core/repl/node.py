"""``ReplNode``: one member's replication state machine, sans-IO (time and randomness injected).

It plays the part of the server's ``TopologyCoordinator`` plus the decisions of
``ReplicationCoordinatorImpl`` (src/mongo/db/repl/topology_coordinator.cpp,
replication_coordinator_impl.cpp, replication_coordinator_impl_heartbeat.cpp,
replication_coordinator_impl_elect_v1.cpp): terms, member state, heartbeats, the election
timer, the sync source, the commit point. It owns no oplog: the caller keeps the entries and
tells the node what it appended (:meth:`note_applied`); it sends nothing: the caller drains
:meth:`poll` (messages to send, effects to carry out), delivers incoming messages to
:meth:`receive` (which returns the reply, if the message has one) and calls :meth:`tick` at
:meth:`next_wake`. Elections are in :mod:`.elections`, stepdown/freeze/stepUp in
:mod:`.stepdown`.

Persisted state is :class:`DurableState` (the caller writes it when a :class:`PersistState`
effect says so, and hands the same values back at restart); everything else is volatile.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional

from .commit_point import MAX_OPTIME, advance_commit_point, majority_point, readable_point
from .config import ReplSetConfig
from .elections import ElectionsMixin
from .member_state import MemberState, ReplError, interrupted_due_to_repl_state_change
from .messages import (CommitPointAdvanced, FailWaiters, FetchReply, FetchRequest, Heartbeat,
                       HeartbeatResponse, KillOperations, MemberPosition, OplogQueryMetadata,
                       PersistState, RequestVotes, StartRollback, StateChanged, StepUpRequest,
                       UpdatePosition, VoteResponse)
from .member_state import primary_stepped_down
from .optime import NULL_OPTIME, OpTime, election_id, optime_of
from .rollback import RollbackPlan
from .stepdown import StepDownMixin
from .sync_source import MemberView, choose_sync_source, diverged_or_too_stale
from .votes import NO_RULE_BROKEN, LastVote, Rules

FOLLOWER, CANDIDATE, LEADER = "follower", "candidate", "leader"
FETCH_LIMIT = 100


@dataclass
class DurableState:
    """What survives a restart: the last vote (``local.replset.election``), the rollback id
    (``local.system.rollback.id``) and the last commit point learned (the server restarts its
    majority snapshot from the stable timestamp of its last checkpoint; keeping the commit point
    itself makes it monotonic across restarts; reads stay bounded by what is applied)."""

    last_vote: LastVote = LastVote()
    rbid: int = 1
    commit_point: OpTime = NULL_OPTIME


class ReplNode(ElectionsMixin, StepDownMixin):
    """One member. ``config`` the set's configuration, ``self_id`` this member's ``_id``,
    ``durable`` its persisted state, ``last_applied`` the optime of the newest entry in its
    oplog, ``now`` the caller's clock (ms), ``rng`` the source of election-timeout jitter,
    ``rules`` all False outside mutation tests.

    The term starts at max(last vote's term, last entry's term) (the server reads both at
    startup); the commit point at the persisted one. Call :meth:`start` next."""

    def __init__(self, config: ReplSetConfig, self_id: int, durable: DurableState,
                 last_applied: OpTime, *, now: int, rng: random.Random,
                 rules: Rules = NO_RULE_BROKEN) -> None:
        self.config = config
        self.id = self_id
        self.me = config.member(self_id)
        self.durable = durable
        self.rng = rng
        self.rules = rules
        self.term = max(durable.last_vote.term, last_applied.t, 0)
        self.state = MemberState.STARTUP2
        self.role = FOLLOWER
        self.applied = last_applied
        self.durable_optime = last_applied
        self.commit_point = durable.commit_point
        self.views = {mid: MemberView() for mid in config.ids if mid != self_id}
        self.primary_id: Optional[int] = None
        self.sync_source: Optional[int] = None
        self.sync_source_rbid: Optional[int] = None
        self.fetch_deadline: Optional[int] = None
        self.first_op_of_term = MAX_OPTIME
        self.writable = False
        self.stepdown_until = 0
        # False for a member that was not given the set's initiation and has no oplog yet:
        # it may vote but not stand until it has replicated from an initiated member (the
        # shard wiring clears it on the first oplog entry; see unelectable_reason).
        self.initiated = True
        self.election_deadline: Optional[int] = None
        self.rollback_deadline: Optional[int] = None
        self.next_heartbeat = {mid: now for mid in self.views}
        self._hb_due: Optional[int] = now if self.views else None
        self.hb_seq = 0
        self._init_elections()
        self._init_stepdown()
        self._out: list[tuple[int, Any]] = []
        self._effects: list[Any] = []

    # -- the caller's loop -----------------------------------------------------------------------

    def start(self, now: int) -> None:
        """Leave STARTUP2 (the oplog is loaded; no initial sync here) and arm the election timer."""
        self._set_state(MemberState.SECONDARY, "startup complete")
        self._reset_election_timer(now)

    def poll(self) -> tuple[list[tuple[int, Any]], list[Any]]:
        """Drain ``([(member _id, message), ...], [effect, ...])`` produced since the last call."""
        out, eff = self._out, self._effects
        self._out, self._effects = [], []
        return out, eff

    def next_wake(self) -> Optional[int]:
        """The earliest time (ms) :meth:`tick` has something to do."""
        wake = self._hb_due
        for t in (self.election_deadline, self.rollback_deadline, self.fetch_deadline):
            if t is not None and (wake is None or t < wake):
                wake = t
        if self.role != FOLLOWER or self.catch_up is not None or \
                self.takeover_deadline is not None:
            t = self._elections_wake()
            if t is not None and (wake is None or t < wake):
                wake = t
        if self.step_down_attempt is not None:
            t = self._stepdown_wake()
            if t is not None and (wake is None or t < wake):
                wake = t
        if self.role == LEADER and (wake is None or self._next_majority_check < wake):
            wake = self._next_majority_check
        return wake

    def tick(self, now: int) -> None:
        """Do what is due at ``now``: heartbeats, member timeouts, the election timer, an election
        round's or catch-up's deadline, the primary's majority check, a pending stepdown."""
        self._send_heartbeats(now)
        self._check_member_timeouts(now)
        if self.fetch_deadline is not None and now >= self.fetch_deadline:
            self.fetch_deadline = None
        if self.rollback_deadline is not None and now >= self.rollback_deadline:
            self.rollback_deadline = None
            self.abort_rollback(now)
        if self.role == LEADER and now >= self._majority_check_due():
            self._check_majority_visible(now)
        self._elections_tick(now)
        self._stepdown_tick(now)

    def receive(self, msg: Any, now: int) -> Any:
        """Handle one message from another member; returns the reply to send back (or None)."""
        kind = type(msg)
        if kind is Heartbeat:
            return self._on_heartbeat(msg, now)
        if kind is HeartbeatResponse:
            return self._on_heartbeat_response(msg, now)
        if kind is RequestVotes:
            return self._on_request_votes(msg, now)
        if kind is VoteResponse:
            return self._on_vote_response(msg, now)
        if kind is UpdatePosition:
            return self._on_update_position(msg, now)
        if kind is StepUpRequest:
            try:
                self.step_up(now, skip_dry_run=msg.skip_dry_run)
            except ReplError:
                pass
            return None
        raise TypeError(f"not a replication message: {kind.__name__}")

    # -- what clients and the shard node ask -----------------------------------------------------

    def can_accept_writes(self) -> bool:
        """Writable primary: won, caught up and wrote its "new primary" no-op
        (``canAcceptNonLocalWrites``)."""
        return self.role == LEADER and self.writable

    @property
    def readable_point(self) -> OpTime:
        """The newest optime majority reads and change streams may see here (commit point,
        bounded by last applied)."""
        return readable_point(self.commit_point, self.applied)

    def hello_fields(self) -> dict:
        """The replication part of ``hello`` (hello_response.cpp): ``isWritablePrimary``,
        ``secondary``, ``setName``, ``hosts``, ``primary``, ``me``, ``setVersion`` and, on a
        primary, ``electionId``."""
        doc = {"isWritablePrimary": self.can_accept_writes(),
               "secondary": self.state == MemberState.SECONDARY,
               "setName": self.config.set_name,
               "hosts": [m.host for m in self.config.members if m.priority > 0],
               "me": self.me.host, "setVersion": self.config.version}
        passives = [m.host for m in self.config.members if m.priority == 0]
        if passives:
            doc["passives"] = passives
        if self.primary_id is not None:
            doc["primary"] = self.config.member(self.primary_id).host
        if self.role == LEADER:
            doc["electionId"] = election_id(self.term)
        return doc

    def status(self) -> dict:
        """A ``replSetGetStatus``-like summary (``TopologyCoordinator::prepareStatusResponse``)."""
        return {"set": self.config.set_name, "term": self.term, "myState": int(self.state),
                "stateStr": self.state.state_str,
                "optimes": {"lastCommittedOpTime": self.commit_point,
                            "readConcernMajorityOpTime": self.readable_point,
                            "appliedOpTime": self.applied, "durableOpTime": self.durable_optime},
                "syncSourceId": self.sync_source if self.sync_source is not None else -1,
                "members": {mid: {"stateStr": v.state.state_str, "health": int(v.up),
                                  "optime": v.applied, "optimeDurable": v.durable}
                            for mid, v in self.views.items()}}

    # -- the oplog: what the caller appended, fetched, rolled back ---------------------------------

    def note_applied(self, optime: OpTime, now: int) -> None:
        """The caller appended (and made durable) entries up to ``optime``: a primary's write or
        a secondary's applied batch. Recomputes the commit point on a primary; reports the
        position up the chain on a secondary."""
        if optime > self.applied:
            self.applied = optime
        if optime > self.durable_optime:
            self.durable_optime = optime
        if self.role == LEADER:
            self._update_commit_point_as_primary(now)
            self._stepdown_progress(now)
        elif self.sync_source is not None:
            self._send_update_position()

    def fetch_request(self, now: int) -> Optional[tuple[int, FetchRequest]]:
        """What to fetch next, ``(source _id, request)``, or None (a writable primary, a member
        in rollback, a fetch already in flight, or no eligible source). Chooses the sync source
        when there is none or it stopped being usable."""
        if self.state not in (MemberState.SECONDARY, MemberState.PRIMARY) or self.writable:
            return None
        if self.fetch_deadline is not None:
            return None
        if not self._source_usable():
            self.sync_source = choose_sync_source(self.id, self.applied, self.views,
                                                  self.primary_id,
                                                  self.config.chaining_allowed)
            self.sync_source_rbid = None
        if self.sync_source is None:
            return None
        self.fetch_deadline = now + 2 * self.config.heartbeat_interval_ms
        return self.sync_source, FetchRequest(self.id, self.term, self.applied, FETCH_LIMIT)

    def on_fetch_request(self, req: FetchRequest, now: int) -> OplogQueryMetadata:
        """The source's side: adopt the fetcher's newer term (a stale primary steps down, as an
        oplog ``find`` with ``term`` makes it), then the metadata to send with the entries.
        Raises ReplError NotPrimaryOrSecondary 13436 when this member cannot serve reads."""
        self._update_term(req.term, now, "a newer term was seen in an oplog query")
        if self.state not in (MemberState.PRIMARY, MemberState.SECONDARY):
            raise ReplError(13436, "NotPrimaryOrSecondary",
                            "node is not in primary or recovering state")
        return OplogQueryMetadata(self.term, self.commit_point, self.applied, self.primary_id,
                                  self.sync_source, self.durable.rbid)

    def on_fetch_reply(self, reply: FetchReply, now: int) -> tuple[Any, ...]:
        """The fetcher's side. Returns the entries the caller must append now, oldest first
        (the node counts them as applied); an answer to an older request, or from another
        source, is dropped (returns ``()``). OplogStartMissing starts a rollback (effect
        :class:`StartRollback`) or, when the source's history is gone, RECOVERING."""
        if reply.source_id != self.sync_source or reply.after != self.applied:
            return ()
        if self.state not in (MemberState.SECONDARY, MemberState.PRIMARY) or self.writable:
            return ()
        self.fetch_deadline = None
        md = reply.metadata
        self._update_term(md.term, now, "a newer term was seen in oplog query metadata")
        if self.sync_source_rbid is not None and md.rbid != self.sync_source_rbid:
            self.sync_source = None            # the source rolled back meanwhile: choose again
            return ()
        self.sync_source_rbid = md.rbid
        if reply.error is not None:
            if reply.error.code == 120:
                self._on_oplog_start_missing(reply, now)
            else:
                self.sync_source = None
            return ()
        entries = reply.entries
        if entries:
            last = optime_of(entries[-1])
            self.applied = max(self.applied, last)
            self.durable_optime = max(self.durable_optime, last)
        self._learn_commit_point(md.commit_point, now, from_sync_source=True)
        if entries:
            self._send_update_position()
        elif md.last_applied < self.applied:
            self.sync_source = None            # the source fell behind us: choose again
        elif md.last_applied <= self.applied and md.primary_id != reply.source_id \
                and md.sync_source_id in (self.id, None):
            # a secondary no further than us that syncs from us (a cycle: two secondaries
            # chained to each other wait for each other forever) or from no one
            # (TopologyCoordinator::shouldChangeSyncSource): choose again
            self.sync_source = None
        return entries

    def finish_rollback(self, plan: RollbackPlan, now: int) -> None:
        """The caller truncated its oplog after ``plan.common_point`` and undid ``plan.undo``:
        take the new rollback id, reset the last optimes from the oplog, rejoin as SECONDARY
        (RollbackImpl::runRollback steps 3-5)."""
        if self.state != MemberState.ROLLBACK:
            return
        self.durable.rbid = plan.rbid
        self.applied = self.durable_optime = plan.common_point
        self._effects.append(PersistState())
        self.rollback_deadline = None
        self.sync_source = None
        self.fetch_deadline = None
        self._set_state(MemberState.SECONDARY, "rollback complete")
        self._reset_election_timer(now)

    def abort_rollback(self, now: int) -> None:
        """Give up a rollback that could not run (its source became unreachable): back to
        SECONDARY with the oplog unchanged; the next fetch tries again."""
        if self.state == MemberState.ROLLBACK:
            self.rollback_deadline = None
            self.sync_source = None
            self._set_state(MemberState.SECONDARY, "rollback aborted")
            self._reset_election_timer(now)

    # -- internals: term, state, heartbeats ------------------------------------------------------

    def _set_state(self, new: MemberState, reason: str) -> None:
        if new != self.state:
            self._effects.append(StateChanged(self.state, new, reason))
            self.state = new

    def _update_term(self, term: int, now: int, reason: str) -> bool:
        """Adopt a newer term (``TopologyCoordinator::updateTerm``): a primary steps down, a
        candidate gives up. True when the term changed."""
        if term <= self.term:
            return False
        self.term = term
        self.primary_id = None
        if self.role == LEADER:
            self._step_down_now(now, f"stepping down from primary, because {reason}: {term}")
        elif self.role == CANDIDATE:
            self._abandon_election(now)
        return True

    def _step_down_now(self, now: int, reason: str) -> None:
        """Leave the leader role at once: writes are killed (11602), ``w`` waiters fail (189)."""
        self.role = FOLLOWER
        self.writable = False
        self.first_op_of_term = MAX_OPTIME
        self.catch_up = None
        self.takeover_deadline = None
        if self.primary_id == self.id:
            self.primary_id = None
        self._effects.append(KillOperations(
            interrupted_due_to_repl_state_change("operation was interrupted because a replica "
                                                 "set state change occurred"), "writes"))
        self._effects.append(FailWaiters(primary_stepped_down()))
        self._set_state(MemberState.SECONDARY, reason)
        self._fail_step_down_waiters()
        self._reset_election_timer(now)

    def _send_heartbeats(self, now: int) -> None:
        if self._hb_due is None or now < self._hb_due:
            return
        interval = self.config.heartbeat_interval_ms
        for mid, due in self.next_heartbeat.items():
            if now >= due:
                self.hb_seq += 1
                self._out.append((mid, Heartbeat(self.config.set_name, self.id, self.term,
                                                 self.config.version, self.hb_seq)))
                self.next_heartbeat[mid] = now + interval
        self._hb_due = min(self.next_heartbeat.values())

    def _heartbeat_all_now(self, now: int) -> None:
        for mid in self.next_heartbeat:
            self.next_heartbeat[mid] = now
        self._hb_due = now if self.next_heartbeat else None
        self._send_heartbeats(now)

    def _on_heartbeat(self, hb: Heartbeat, now: int) -> HeartbeatResponse:
        """``ReplicationCoordinatorImpl::processHeartbeatV1``: answer with our state, term,
        optimes, primary and commit point."""
        return HeartbeatResponse(self.id, self.term, self.state, self.applied,
                                 self.durable_optime, self.commit_point,
                                 self.primary_id, self.sync_source, self.config.version, hb.seq)

    def _on_heartbeat_response(self, r: HeartbeatResponse, now: int) -> None:
        """``_handleHeartbeatResponse``: adopt a newer term, record the member, learn the
        primary and the commit point, re-arm the election timer on the primary's word."""
        if r.sender_id not in self.views:
            return None
        self._update_term(r.term, now, "a newer term was seen in a heartbeat")
        v = self.views[r.sender_id]
        v.state, v.term, v.up, v.last_contact = r.state, r.term, True, now
        v.primary_id, v.sync_source_id = r.primary_id, r.sync_source_id
        v.hb_applied = r.applied
        v.advance(r.applied, r.durable)
        if r.state == MemberState.PRIMARY and r.term == self.term and self.role != LEADER:
            self.primary_id = r.sender_id
            if self.role == FOLLOWER:
                self._reset_election_timer(now)
                self._schedule_priority_takeover(now, r.sender_id)
        elif self.primary_id == r.sender_id and r.state != MemberState.PRIMARY:
            self.primary_id = None
        if self.state not in (MemberState.ROLLBACK, MemberState.STARTUP2):
            self._learn_commit_point(r.commit_point, now, from_sync_source=False)
        if self.role == LEADER:
            self._update_commit_point_as_primary(now)
            self._stepdown_progress(now)
        self._catch_up_progress(now, r)
        return None

    def _check_member_timeouts(self, now: int) -> None:
        """Mark members not heard from for heartbeatTimeoutSecs DOWN
        (``TopologyCoordinator::checkMemberTimeouts``)."""
        limit = now - self.config.heartbeat_timeout_ms
        for mid, v in self.views.items():
            if v.up and v.last_contact < limit:
                v.up = False
                v.state = MemberState.DOWN
                if self.primary_id == mid:
                    self.primary_id = None

    def _majority_check_due(self) -> int:
        return self._next_majority_check

    def _check_majority_visible(self, now: int) -> None:
        """A primary that has not heard from a majority of voters (itself included) within
        electionTimeoutMillis steps down ("Can't see a majority of the set, relinquishing
        primary"; TopologyCoordinator::checkMemberTimeouts / _shouldStepDownForMajority)."""
        self._next_majority_check = now + self.config.heartbeat_interval_ms
        horizon = now - self.config.election_timeout_ms
        seen = 1 if self.me.voter else 0
        seen += sum(1 for mid, v in self.views.items()
                    if self.config.member(mid).voter and v.last_contact >= horizon)
        if seen < self.config.majority_vote_count:
            self._step_down_now(now, "Can't see a majority of the set, relinquishing primary")

    # -- internals: positions and the commit point -----------------------------------------------

    def _on_update_position(self, msg: UpdatePosition, now: int) -> None:
        """``processReplSetUpdatePosition``: record the positions (forward only); a primary
        recomputes its commit point, a secondary passes them up its own sync source."""
        self._update_term(msg.term, now, "a newer term was seen in replSetUpdatePosition")
        if msg.sender_id in self.views:
            self.views[msg.sender_id].last_contact = now
        for p in msg.positions:
            if p.member_id in self.views:
                self.views[p.member_id].advance(p.applied, p.durable)
        if self.role == LEADER:
            self._update_commit_point_as_primary(now)
            self._stepdown_progress(now)
        elif self.sync_source is not None:
            self._send_update_position()
        return None

    def _send_update_position(self) -> None:
        positions = [MemberPosition(self.id, self.applied, self.durable_optime)]
        positions += [MemberPosition(mid, v.applied, v.durable) for mid, v in self.views.items()
                      if mid != self.sync_source and v.durable != NULL_OPTIME]
        self._out.append((self.sync_source, UpdatePosition(self.id, self.term, tuple(positions))))

    def _update_commit_point_as_primary(self, now: int) -> None:
        """``TopologyCoordinator::updateLastCommittedOpTimeAndWallTime``."""
        voting = [self.durable_optime] if self.me.voter else []
        voting += [v.durable for mid, v in self.views.items() if self.config.member(mid).voter]
        point = majority_point(voting, self.config.write_majority)
        self._learn_commit_point(point, now, from_sync_source=False)

    def _learn_commit_point(self, candidate: OpTime, now: int, *, from_sync_source: bool) -> None:
        new = advance_commit_point(self.commit_point, candidate, is_primary=self.role == LEADER,
                                   first_op_of_term=self.first_op_of_term,
                                   my_last_applied=self.applied,
                                   from_sync_source=from_sync_source, rules=self.rules)
        if new != self.commit_point:
            self.commit_point = new
            self.durable.commit_point = new
            self._effects.append(CommitPointAdvanced(new))

    # -- internals: fetching and rollback --------------------------------------------------------

    def _source_usable(self) -> bool:
        if self.sync_source is None:
            return False
        v = self.views[self.sync_source]
        return v.up and v.state in (MemberState.PRIMARY, MemberState.SECONDARY)

    def _on_oplog_start_missing(self, reply: FetchReply, now: int) -> None:
        if diverged_or_too_stale(self.applied, reply.source_first) == "too stale":
            self.sync_source = None
            self._set_state(MemberState.RECOVERING, "too stale to catch up")
            return
        if self.role == LEADER:
            # a primary in catch-up never rolls back: it ends the catch-up at once and takes
            # what it has (bgsync.cpp BackgroundSync::_runRollback: abortCatchupIfNeeded
            # kFailedWithError). Retrying instead, with catchUpTimeoutMillis -1, would leave
            # the set with a PRIMARY that never becomes writable.
            self.sync_source = None
            if self.catch_up is not None:
                self._finish_catch_up(now)
            return
        if self.role != FOLLOWER:
            # a candidate does not enter ROLLBACK while it runs (setFollowerMode refuses it
            # during an election): try again later
            self.sync_source = None
            return
        self._effects.append(KillOperations(
            interrupted_due_to_repl_state_change("operation was interrupted because a replica "
                                                 "set state change occurred"), "all"))
        self._set_state(MemberState.ROLLBACK, "rollback")
        self.election_deadline = None
        self.rollback_deadline = now + self.config.heartbeat_timeout_ms
        self._effects.append(StartRollback(reply.source_id))
