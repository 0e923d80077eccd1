"""The messages between members and the effects the core asks of its caller, as plain data.

Nothing here is a wire format: the node that drives the core maps these onto its own commands
(``replSetRequestVotes``, ``replSetHeartbeat``, ``replSetUpdatePosition``, the oplog fetcher's
``find``/``getMore`` with its ``$oplogQueryData`` metadata, ``replSetStepUp``) or, in the
simulation, delivers the objects as they are. Field names follow the server's argument classes
(repl_set_request_votes_args.h, repl_set_heartbeat_args_v1.h, repl_set_heartbeat_response.h,
update_position_args.h, rpc/metadata/oplog_query_metadata.h).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .member_state import MemberState, ReplError
from .optime import OpTime


# -- member to member ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RequestVotes:
    """``replSetRequestVotes``: the candidate's term (its current term on a dry run, the new
    term on a real election), its ``_id`` and its last applied optime (the freshness check)."""

    set_name: str
    config_version: int
    term: int
    candidate_id: int
    last_applied: OpTime
    dry_run: bool


@dataclass(frozen=True, slots=True)
class VoteResponse:
    """The voter's answer: its term, whether it granted the vote, and why not."""

    voter_id: int
    term: int
    vote_granted: bool
    reason: str
    dry_run: bool
    request_term: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """``replSetHeartbeat`` (PV1): sent to every other member every heartbeatIntervalMillis."""

    set_name: str
    sender_id: int
    term: int
    config_version: int
    seq: int


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    """The reply: the responder's state, term, applied and durable optimes, whom it knows as
    primary, and (``$replData`` metadata) its commit point."""

    sender_id: int
    term: int
    state: MemberState
    applied: OpTime
    durable: OpTime
    commit_point: OpTime
    primary_id: Optional[int]
    sync_source_id: Optional[int]
    config_version: int
    seq: int


@dataclass(frozen=True, slots=True)
class MemberPosition:
    """One ``replSetUpdatePosition`` entry: a member's applied and durable optimes."""

    member_id: int
    applied: OpTime
    durable: OpTime


@dataclass(frozen=True, slots=True)
class UpdatePosition:
    """``replSetUpdatePosition``: a secondary's (and its downstream members') positions, sent up
    the sync-source chain to the primary."""

    sender_id: int
    term: int
    positions: tuple[MemberPosition, ...]


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """The oplog fetcher's query: "entries after ``after``" (the fetcher's last fetched optime,
    which must be the first entry of the reply), with the fetcher's term (a source with an
    older term adopts it, as the oplog ``find`` with ``term`` makes it)."""

    requester_id: int
    term: int
    after: OpTime
    limit: int


@dataclass(frozen=True, slots=True)
class OplogQueryMetadata:
    """``$oplogQueryData`` (rpc/metadata/oplog_query_metadata.h): the source's commit point
    (``lastOpCommitted``), ``lastOpApplied``, ``primaryIndex`` (as a member ``_id`` here),
    ``syncSourceIndex`` and ``rbid``; plus its term (``$replData``)."""

    term: int
    commit_point: OpTime
    last_applied: OpTime
    primary_id: Optional[int]
    sync_source_id: Optional[int]
    rbid: int


@dataclass(frozen=True, slots=True)
class FetchReply:
    """What the source answered to "entries after ``after``": the entries (oldest first), or
    an error (OplogStartMissing 120 when its oplog does not contain that optime), its first
    optime (to tell "diverged" from "too stale"), and the metadata."""

    source_id: int
    after: OpTime
    metadata: OplogQueryMetadata
    entries: tuple[Any, ...]
    error: Optional[ReplError]
    source_first: OpTime


@dataclass(frozen=True, slots=True)
class StepUpRequest:
    """``replSetStepUp``; ``skip_dry_run`` is what an election handoff sends."""

    sender_id: int
    skip_dry_run: bool


# -- effects: what the caller must do ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StateChanged:
    """The member state changed (``old`` -> ``new``, ``reason`` as the server logs it); a node
    bumps its ``topologyVersion`` and answers waiting ``hello`` s."""

    old: MemberState
    new: MemberState
    reason: str


@dataclass(frozen=True, slots=True)
class WriteNoop:
    """Append a no-op entry ``{op: "n", o: doc}`` in ``term`` and report its optime with
    :meth:`ReplNode.note_new_primary_noop` (the ``{msg: "new primary"}`` entry a new primary
    writes before it takes writes:
    ReplicationCoordinatorExternalStateImpl::onTransitionToPrimary)."""

    term: int
    doc: dict


@dataclass(frozen=True, slots=True)
class KillOperations:
    """Interrupt user operations with ``error`` (11602). ``scope`` is ``"writes"`` at stepdown
    (reads and cursors survive) and ``"all"`` at rollback (RollbackImpl::_killAllUserOperations)."""

    error: ReplError
    scope: str


@dataclass(frozen=True, slots=True)
class FailWaiters:
    """Fail every ``w`` waiter with ``error`` (PrimarySteppedDown 189)."""

    error: ReplError


@dataclass(frozen=True, slots=True)
class CommitPointAdvanced:
    """The commit point moved to ``optime`` (wake ``w: majority`` waiters and majority reads)."""

    optime: OpTime


@dataclass(frozen=True, slots=True)
class StartRollback:
    """The oplog diverged from ``source_id`` 's: read its oplog, call
    :func:`shardsim.core.repl.rollback.plan_rollback`, apply the plan, then
    :meth:`ReplNode.finish_rollback`."""

    source_id: int


@dataclass(frozen=True, slots=True)
class PersistState:
    """The persisted state changed (last vote, rollback id): write it before answering."""


@dataclass(frozen=True, slots=True)
class StepUpFinished:
    """The election that ``replSetStepUp`` started ended: ``error`` is None when this member won,
    else CommandFailed 125 "Election failed."."""

    error: Optional[ReplError]
