"""Elections of protocol version 1, as a mixin of :class:`shardsim.core.repl.node.ReplNode`.

After src/mongo/db/repl/replication_coordinator_impl_elect_v1.cpp (``ElectionState::start``:
a dry run at the current term, then ``_startRealElection``: term + 1, the vote for itself
persisted by ``_writeLastVoteForMyElection``, then the real vote requests;
``_onVoteRequestComplete`` -> ``processWinElection``), vote_requester.cpp,
topology_coordinator.cpp (``becomeCandidateIfElectable``, ``_getMyUnelectableReason``,
``processWinElection``, ``completeTransitionToPrimary``) and replication_coordinator_impl.cpp
(``_cancelAndRescheduleElectionTimeout_inlock`` with ``_getRandomizedElectionOffset_inlock``:
electionTimeoutMillis plus 0-15 % jitter; ``CatchupState``: the new primary catches up to the
newest optime it hears of, bounded by catchUpTimeoutMillis, then ``signalDrainComplete``
writes the "new primary" no-op; the priority takeover).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .commit_point import MAX_OPTIME
from .member_state import MemberState, ReplError
from .messages import (HeartbeatResponse, PersistState, RequestVotes, StateChanged,
                       StepUpFinished, VoteResponse, WriteNoop)
from .optime import OpTime
from .votes import LastVote, VoteTally, process_request_votes


#: ``replElectionTimeoutOffsetLimitFraction`` (replication_coordinator_external_state_impl.cpp).
ELECTION_OFFSET_FRACTION = 0.15
NEW_PRIMARY_MSG = {"msg": "new primary"}


@dataclass
class CatchUp:
    """The new primary's catch-up (``ReplicationCoordinatorImpl::CatchupState``): ``target`` the
    newest optime heard of in heartbeat replies since winning (``heard``;
    ``latestKnownOpTimeSinceHeartbeatRestart``), None until every other member answered or
    ``target_deadline`` passed; ``deadline`` the catchUpTimeoutMillis bound (None: none)."""

    waiting_for: set
    target: Optional[OpTime]
    target_deadline: int
    deadline: Optional[int]
    heard: dict = field(default_factory=dict)


class ElectionsMixin:
    """Election timer, dry run and real election, voting, winning and catch-up."""

    def _init_elections(self) -> None:
        self.tally: Optional[VoteTally] = None
        self.round_deadline: Optional[int] = None
        self.election_reason = ""
        self.catch_up: Optional[CatchUp] = None
        self.step_up_waiting = False
        self.won_terms: list[int] = []
        self.takeover_deadline: Optional[int] = None

    # -- timer ----------------------------------------------------------------------------------

    def _reset_election_timer(self, now: int) -> None:
        """Re-arm the election timeout: electionTimeoutMillis + a random 0-15 % (the seeded
        ``rng``). Only followers that can vote or stand keep one."""
        base = self.config.election_timeout_ms
        jitter = self.rng.randint(0, int(base * ELECTION_OFFSET_FRACTION))
        self.election_deadline = now + base + jitter

    def _elections_wake(self) -> Optional[int]:
        times = [t for t in (self.round_deadline, self.takeover_deadline) if t is not None]
        if self.catch_up is not None:
            times.append(self.catch_up.target_deadline if self.catch_up.target is None
                         else self.catch_up.deadline)
        return min((t for t in times if t is not None), default=None)

    def _elections_tick(self, now: int) -> None:
        if self.round_deadline is not None and now >= self.round_deadline:
            self._election_lost(now, "election round timed out")
        if self.catch_up is not None:
            self._catch_up_progress(now, None)
        if self.takeover_deadline is not None and now >= self.takeover_deadline:
            self.takeover_deadline = None
            self._try_priority_takeover(now)
        if (self.election_deadline is not None and now >= self.election_deadline
                and self.role == "follower"):
            if self.unelectable_reason(now) is None:
                self._start_election(now, "electionTimeout", skip_dry_run=False)
            else:
                self._reset_election_timer(now)

    def unelectable_reason(self, now: int) -> Optional[str]:
        """Why this member may not stand now (``_getMyUnelectableReason``), or None.
        ``NotInitiated``: a member started without the set's initiation and with an empty
        oplog. In mongod such a member has no replica-set config yet (STARTUP, no election
        timer: ``ReplicationCoordinatorImpl::_startLoadLocalConfig`` finds none) until the
        initiated member's heartbeat brings it; shardsim's members all know the config from
        ``--members``, so without this a set whose initiating member starts last would elect
        an empty member and roll the 'initiating set' entry back."""
        if not self.initiated:
            return "NotInitiated"
        if not self.me.voter:
            return "NotAVoter"
        if not self.me.electable:
            return "NoPriority"
        if self.state != MemberState.SECONDARY:
            return "NotSecondary"
        if now < self.stepdown_until:
            return "StepDownPeriodActive"
        if self.role != "follower":
            return "RunningForElection" if self.role == "candidate" else "AlreadyPrimary"
        return None

    # -- priority takeover ----------------------------------------------------------------------

    def _schedule_priority_takeover(self, now: int, primary_id: int) -> None:
        """A heartbeat from a primary of lower priority: stand in ``(priorityRank + 1) *
        electionTimeoutMillis`` (+ the random offset), unless already scheduled
        (``_scheduleNextLivenessUpdate``/``_cancelAndReschedulePriorityTakeover``)."""
        if (self.takeover_deadline is not None or self.role != "follower"
                or self.config.member(primary_id).priority >= self.me.priority):
            return
        base = self.config.election_timeout_ms
        delay = (self.config.priority_rank(self.id) + 1) * base
        self.takeover_deadline = now + delay + self.rng.randint(
            0, int(base * ELECTION_OFFSET_FRACTION))

    def _try_priority_takeover(self, now: int) -> None:
        """The takeover timer fired: stand (dry run first) if a lower-priority primary is still
        known and this member is electable and fresh enough (``_amIFreshEnoughForPriorityTakeover``:
        same term as the primary's last entry, within the freshness window)."""
        p = self.primary_id
        if p is None or p == self.id or self.role != "follower":
            return
        if self.config.member(p).priority >= self.me.priority or self.unelectable_reason(now):
            return
        latest = self.views[p].applied
        if latest.t != self.applied.t or \
                self.applied.ts + self.config.priority_takeover_freshness_ts < latest.ts:
            self._schedule_priority_takeover(now, p)      # not fresh enough yet: try later
            return
        self._start_election(now, "priorityTakeover", skip_dry_run=False)

    # -- the candidate ------------------------------------------------------------------------

    def _start_election(self, now: int, reason: str, *, skip_dry_run: bool) -> None:
        """``ElectionState::start``: become candidate; a dry run first unless skipped."""
        self.role = "candidate"
        self.election_deadline = None
        self.takeover_deadline = None
        self.election_reason = reason
        if skip_dry_run:
            self._start_real_election(now)
        else:
            self._start_round(now, self.term, dry_run=True)

    def _start_round(self, now: int, term: int, *, dry_run: bool) -> None:
        voters = frozenset(self.config.voter_ids)
        self.tally = VoteTally(term, dry_run, self.config.majority_vote_count, voters)
        self.tally.yes.add(self.id)
        self.round_deadline = now + self.config.election_timeout_ms
        req = RequestVotes(self.config.set_name, self.config.version, term, self.id,
                           self.applied, dry_run)
        for mid in self.config.voter_ids:
            if mid != self.id:
                self._out.append((mid, req))
        self._check_tally(now)

    def _start_real_election(self, now: int) -> None:
        """``_startRealElection``: term + 1, vote for self (persisted), request votes."""
        self.term += 1
        self.primary_id = None
        self.durable.last_vote = LastVote(self.term, self.id)
        self._effects.append(PersistState())
        self._start_round(now, self.term, dry_run=False)

    def _on_vote_response(self, resp: VoteResponse, now: int) -> None:
        if resp.term > self.term:
            self._update_term(resp.term, now, "a newer term was seen in a vote response")
            return None
        if self.role != "candidate" or self.tally is None:
            return None
        self.tally.record(resp)
        self._check_tally(now)
        return None

    def _check_tally(self, now: int) -> None:
        t = self.tally
        if t is None:
            return
        if t.won:
            if t.dry_run:
                if t.term != self.term:     # superseded during the dry run
                    self._election_lost(now, "term changed during the dry run")
                else:
                    self._start_real_election(now)
            else:
                self._win_election(now)
        elif t.lost:
            self._election_lost(now, "lost the election")

    def _election_lost(self, now: int, why: str) -> None:
        self.tally = None
        self.round_deadline = None
        if self.role == "candidate":
            self.role = "follower"
            self._reset_election_timer(now)
        if self.step_up_waiting:
            self.step_up_waiting = False
            self._effects.append(StepUpFinished(ReplError(125, "CommandFailed",
                                                          "Election failed.")))

    def _abandon_election(self, now: int) -> None:
        """A newer term arrived while a candidate (``_updateTerm_inlock`` cancels the election)."""
        self._election_lost(now, "a newer term")

    # -- the voter ------------------------------------------------------------------------------

    def _on_request_votes(self, req: RequestVotes, now: int) -> VoteResponse:
        """``ReplicationCoordinatorImpl::processReplSetRequestVotes``: adopt a newer term, decide,
        persist a granted real vote and re-arm the election timer."""
        self._update_term(req.term, now, "a newer term was seen in a vote request")
        resp, vote = process_request_votes(
            req, voter_id=self.id, my_term=self.term, set_name=self.config.set_name,
            config_version=self.config.version, my_last_applied=self.applied,
            last_vote=self.durable.last_vote, rules=self.rules)
        if vote != self.durable.last_vote:
            self.durable.last_vote = vote
            self._effects.append(PersistState())
        if resp.vote_granted and not req.dry_run and self.role == "follower":
            self._reset_election_timer(now)
        return resp

    # -- winning, catch-up, the "new primary" no-op ----------------------------------------------

    def _win_election(self, now: int) -> None:
        """``processWinElection``: leader in catch-up (PRIMARY, not writable), electionId from the
        term, ``_firstOpTimeOfMyTerm`` = infinity; restart heartbeats to learn the newest optime."""
        self.tally = None
        self.round_deadline = None
        self.role = "leader"
        self.writable = False
        self.primary_id = self.id
        self.first_op_of_term = MAX_OPTIME
        self.won_terms.append(self.term)
        self._effects.append(StateChanged(self.state, MemberState.PRIMARY,
                                          f"election won ({self.election_reason})"))
        self.state = MemberState.PRIMARY
        for v in self.views.values():           # resetMemberTimeouts
            v.last_contact = now
        self._next_majority_check = now + self.config.heartbeat_interval_ms
        timeout = self.config.catch_up_timeout_ms
        self.catch_up = CatchUp(set(self.views), None, now + self.config.heartbeat_interval_ms,
                                None if timeout < 0 else now + timeout)
        self._heartbeat_all_now(now)
        if timeout == 0 or not self.views:
            self._finish_catch_up(now)

    def _catch_up_progress(self, now: int, r: Optional[HeartbeatResponse]) -> None:
        """Feed the catch-up with a heartbeat answer (or a tick): fix the target once every
        member answered (or the first heartbeat interval passed), follow newer optimes heard
        of, finish when caught up or at the catch-up deadline."""
        c = self.catch_up
        if c is None or self.role != "leader":
            return
        if r is not None:
            c.waiting_for.discard(r.sender_id)
            c.heard[r.sender_id] = r.applied
            if c.target is not None and r.applied > c.target:
                c.target = r.applied
        if c.target is None and (not c.waiting_for or now >= c.target_deadline):
            c.target = max([self.applied, *c.heard.values()])
        if c.target is None:
            return
        if self.applied >= c.target or (c.deadline is not None and now >= c.deadline):
            self._finish_catch_up(now)

    def _finish_catch_up(self, now: int) -> None:
        """Catch-up over: drain, then ask the caller for the "new primary" no-op."""
        self.catch_up = None
        self.sync_source = None
        self.fetch_deadline = None
        self._effects.append(WriteNoop(self.term, dict(NEW_PRIMARY_MSG)))

    def note_new_primary_noop(self, optime: OpTime, now: int) -> None:
        """The caller wrote the ``{msg: "new primary"}`` no-op at ``optime`` (its term must be
        this term): ``completeTransitionToPrimary``; writes are accepted from now on."""
        if self.role != "leader" or optime.t != self.term or self.writable:
            return
        self.first_op_of_term = optime
        self.writable = True
        self.note_applied(optime, now)
        if self.step_up_waiting:
            self.step_up_waiting = False
            self._effects.append(StepUpFinished(None))

    # -- replSetStepUp -------------------------------------------------------------------------

    def step_up(self, now: int, *, skip_dry_run: bool = False) -> None:
        """``replSetStepUp`` (``ReplicationCoordinatorImpl::stepUpIfEligible``): stand now. Its
        result comes later as :class:`StepUpFinished`. Raises ReplError CommandFailed 125
        "Election failed." when this member cannot stand (a primary already is one: no error,
        no effect)."""
        if self.role == "leader":
            return
        if self.unelectable_reason(now) is not None:
            raise ReplError(125, "CommandFailed", "Election failed.")
        self.step_up_waiting = True
        self._start_election(now, "stepUpRequestSkipDryRun" if skip_dry_run else "stepUpRequest",
                             skip_dry_run=skip_dry_run)
