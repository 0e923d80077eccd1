"""Stepdown, freeze and election handoff, as a mixin of :class:`shardsim.core.repl.node.ReplNode`.

After src/mongo/db/repl/repl_set_commands.cpp (``CmdReplSetStepDown::run``: the argument checks
and defaults; ``CmdReplSetFreeze``), replication_coordinator_impl.cpp
(``ReplicationCoordinatorImpl::stepDown``: wait up to secondaryCatchUpPeriodSecs for a
majority at the primary's last applied optime with one electable member among them, else
ExceededTimeLimit 262; then kill conflicting operations with 11602, fail ``w`` waiters with
189, sit out elections for the stepdown period and hand the election off with
``replSetStepUp``; ``_performElectionHandoff``) and topology_coordinator.cpp
(``tryToStartStepDown``, ``isSafeToStepDown``, ``chooseElectionHandoffCandidate``,
``prepareFreezeResponse``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

from .member_state import MemberState, ReplError, bad_value, not_writable_primary
from .messages import StepUpRequest


@dataclass
class StepDownAttempt:
    """A ``replSetStepDown`` in progress: ``result`` stays None while it waits, then becomes
    ``{"ok": 1.0}`` or a :class:`ReplError`. Times in ms."""

    wait_until: int
    step_down_until: int
    force: bool
    term: int
    result: Any = None


def parse_step_down(cmd: Mapping[str, Any]) -> tuple[int, int, bool]:
    """``{replSetStepDown: secs, secondaryCatchUpPeriodSecs, force}`` ->
    ``(secs, catch_up_secs, force)`` with the server's defaults (secs 0 means 60; catch-up 10,
    or 0 with force). Raises ReplError BadValue 2 with the server's messages."""
    secs = int(cmd.get("replSetStepDown") or 0)
    if secs == 0:
        secs = 60
    elif secs < 0:
        raise bad_value("stepdown period must be a positive integer")
    force = bool(cmd.get("force", False))
    catch_up = cmd.get("secondaryCatchUpPeriodSecs")
    catch_up = (0 if force else 10) if catch_up is None else int(catch_up)
    if catch_up < 0:
        raise bad_value("secondaryCatchUpPeriodSecs period must be a positive or absent")
    if secs < catch_up:
        raise bad_value("stepdown period must be longer than secondaryCatchUpPeriodSecs")
    return secs, catch_up, force


def _iso(now_ms: int) -> str:
    """``dateToISOStringLocal`` of ``now_ms`` (UTC here): ``2026-11-26T09:00:00.000+00:00``."""
    dt = datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now_ms % 1000:03d}+00:00"


class StepDownMixin:
    """replSetStepDown, replSetFreeze, election handoff."""

    def _init_stepdown(self) -> None:
        self.step_down_attempt: Optional[StepDownAttempt] = None
        self._next_majority_check = 0
        self.handoff_enabled = True

    def _stepdown_wake(self) -> Optional[int]:
        a = self.step_down_attempt
        return a.wait_until if a is not None and a.result is None else None

    def _stepdown_tick(self, now: int) -> None:
        self._stepdown_progress(now)

    def step_down(self, now: int, secs: int = 60, catch_up_secs: int = 10,
                  force: bool = False) -> StepDownAttempt:
        """Start ``replSetStepDown`` (arguments already checked by :func:`parse_step_down`).
        Returns the attempt; it completes at once when it can, else on later calls (positions
        arriving, :meth:`tick`). Raises ReplError NotWritablePrimary 10107 "not primary so
        can't step down" on a non-primary, ConflictingOperationInProgress 117 while another
        stepdown waits (``TopologyCoordinator::prepareForStepDownAttempt``)."""
        if self.role != "leader":
            raise not_writable_primary("not primary so can't step down")
        if self.step_down_attempt is not None and self.step_down_attempt.result is None:
            raise ReplError(117, "ConflictingOperationInProgress",
                            "This node is already in the process of stepping down")
        attempt = StepDownAttempt(now + catch_up_secs * 1000, now + secs * 1000, force, self.term)
        self.step_down_attempt = attempt
        self._stepdown_progress(now)
        return attempt

    def is_safe_to_step_down(self) -> bool:
        """``TopologyCoordinator::isSafeToStepDown``: a majority of voters (this one included)
        have applied up to this member's last applied optime, and one of them is an electable
        secondary."""
        mine = self.applied
        caught_up = [mid for mid, v in self.views.items()
                     if self.config.member(mid).voter and v.up and v.applied >= mine]
        count = len(caught_up) + (1 if self.me.voter else 0)
        if count < self.config.majority_vote_count:
            return False
        return self.election_handoff_candidate() is not None

    def election_handoff_candidate(self) -> Optional[int]:
        """``chooseElectionHandoffCandidate``: the up, electable SECONDARY caught up to this
        member's last applied optime with the highest priority (ties: lowest ``_id``)."""
        best = None
        for mid in sorted(self.views):
            v, m = self.views[mid], self.config.member(mid)
            if not (v.up and v.state == MemberState.SECONDARY and m.electable and m.voter
                    and v.applied >= self.applied):
                continue
            if best is None or m.priority > self.config.member(best).priority:
                best = mid
        return best

    def _stepdown_progress(self, now: int) -> None:
        """``tryToStartStepDown``/``finishAttemptedStepDown``: complete, keep waiting, or fail."""
        a = self.step_down_attempt
        if a is None or a.result is not None:
            return
        if self.role != "leader" or self.term != a.term:
            a.result = ReplError(189, "PrimarySteppedDown",
                                 "Primary stepped down while waiting for replication")
            return
        if now >= a.step_down_until:
            a.result = ReplError(262, "ExceededTimeLimit",
                                 "By the time we were ready to step down, we were already past "
                                 "the time we were supposed to step down until")
            return
        force_now = a.force and now >= a.wait_until
        if force_now or self.is_safe_to_step_down():
            candidate = self.election_handoff_candidate()
            self._step_down_now(now, "stepping down from primary because of a replSetStepDown")
            self.stepdown_until = max(self.stepdown_until, a.step_down_until)
            a.result = {"ok": 1.0}
            if self.handoff_enabled and candidate is not None:
                self._out.append((candidate, StepUpRequest(self.id, skip_dry_run=True)))
            return
        if now >= a.wait_until:
            a.result = ReplError(262, "ExceededTimeLimit",
                                 f"No electable secondaries caught up as of {_iso(now)}"
                                 "Please use the replSetStepDown command with the argument "
                                 "{force: true} to force node to step down.")

    def _fail_step_down_waiters(self) -> None:
        a = self.step_down_attempt
        if a is not None and a.result is None:
            a.result = ReplError(189, "PrimarySteppedDown",
                                 "Primary stepped down while waiting for replication")

    def freeze(self, now: int, secs: int) -> dict:
        """``replSetFreeze`` (``prepareFreezeResponse``): do not stand for ``secs`` seconds
        (0 unfreezes; a one-node set then stands at once). Returns the reply fields. Raises
        ReplError NotSecondary 95 on a primary or a candidate."""
        if self.role != "follower":
            state = "Primary" if self.role == "leader" else "Running-Election"
            raise ReplError(95, "NotSecondary",
                            "Cannot freeze node when primary or running for election, "
                            f"state: {state}")
        if secs == 0:
            self.stepdown_until = now
            if not self.views and self.unelectable_reason(now) is None:
                self._start_election(now, "singleNodePromptElection", skip_dry_run=True)
            return {"info": "unfreezing", "ok": 1.0}
        reply: dict = {"ok": 1.0}
        if secs == 1:
            reply = {"warning": "you really want to freeze for only 1 second?", "ok": 1.0}
        self.stepdown_until = max(self.stepdown_until, now + secs * 1000)
        return reply
