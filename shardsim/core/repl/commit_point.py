"""The majority commit point (``lastCommittedOpTime``), as pure functions.

After src/mongo/db/repl/topology_coordinator.cpp:

* ``TopologyCoordinator::updateLastCommittedOpTimeAndWallTime`` (the primary): sort the voting
  members' durable optimes and take ``votingOptimes[size - writeMajority]``
  -> :func:`majority_point`;
* ``TopologyCoordinator::advanceLastCommittedOpTimeAndWallTime`` (every member): the commit
  point never moves back; a primary ignores a point before ``_firstOpTimeOfMyTerm`` (which is
  "infinity" from ``processWinElection`` until ``completeTransitionToPrimary``) -- so an entry
  of an earlier term commits only once an entry of the primary's own term commits (Raft's rule,
  the server's "new primary" no-op is that entry); a point learned from the sync source
  (``OplogQueryMetadata``) is clamped to the member's last applied optime; a point learned
  from a heartbeat is used only when its term equals the term of the member's last entry
  -> :func:`advance_commit_point`.

What a member may expose to majority readers and change streams is
:func:`readable_point` = min(commit point, last applied): the committed snapshot never passes
what the member has applied.
"""

from __future__ import annotations

from typing import Iterable

from .optime import NULL_OPTIME, OpTime
from .votes import NO_RULE_BROKEN, Rules

#: ``_firstOpTimeOfMyTerm`` between winning an election and writing the "new primary" no-op.
MAX_OPTIME = OpTime(t=2**62, ts=2**62)


def majority_point(voting_durable: Iterable[OpTime], write_majority: int) -> OpTime:
    """The newest optime at least ``write_majority`` of the voting members have made durable
    (``votingOptimes[size - writeMajority]`` after sorting); NULL_OPTIME when fewer members than
    that are known."""
    ops = sorted(voting_durable)
    if write_majority <= 0 or len(ops) < write_majority:
        return NULL_OPTIME
    return ops[len(ops) - write_majority]


def advance_commit_point(current: OpTime, candidate: OpTime, *, is_primary: bool,
                         first_op_of_term: OpTime, my_last_applied: OpTime,
                         from_sync_source: bool,
                         rules: Rules = NO_RULE_BROKEN) -> OpTime:
    """The member's commit point after learning ``candidate`` (``current`` when it is refused),
    following ``advanceLastCommittedOpTimeAndWallTime``:

    * from the sync source: clamped to ``my_last_applied``;
    * otherwise (heartbeats, the primary's own computation): ignored unless its term equals the
      term of the member's last applied entry;
    * never backwards;
    * on a primary, ignored below ``first_op_of_term`` (unless ``rules.commit_earlier_term``,
      the mutation that breaks it)."""
    if from_sync_source:
        candidate = min(candidate, my_last_applied)
    elif candidate.t != my_last_applied.t and not (is_primary and rules.commit_earlier_term):
        return current
    if candidate <= current:
        return current
    if is_primary and candidate < first_op_of_term and not rules.commit_earlier_term:
        return current
    return candidate


def readable_point(commit_point: OpTime, last_applied: OpTime) -> OpTime:
    """The newest optime majority reads and change streams see on this member: its commit point,
    bounded by what it has applied (the committed snapshot, ``_setStableTimestampForStorage``)."""
    return min(commit_point, last_applied)
