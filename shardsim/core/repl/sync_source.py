"""Sync-source selection and the oplog fetch, as data and pure functions.

After src/mongo/db/repl/topology_coordinator.cpp ``TopologyCoordinator::chooseNewSyncSource`` /
``_isEligibleSyncSource`` (a source must be up, PRIMARY or SECONDARY, and ahead of the last
fetched optime; with ``chainingAllowed: false`` only the primary), and oplog_fetcher.cpp
``OplogFetcher::_checkRemoteOplogStart`` (the first entry of the source's answer must be the
fetcher's last fetched entry, else OplogStartMissing 120; bgsync.cpp then rolls back, or goes
"too stale" when the source's oldest entry is newer than the last fetched one).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from .member_state import MemberState, ReplError
from .optime import NULL_OPTIME, OpTime, format_optime


@dataclass
class MemberView:
    """What a member knows of another (member_data.h ``MemberData``): its state, term, applied
    and durable optimes (only ever moved forward: what the commit point counts), the applied
    optime of its last heartbeat reply (``getHeartbeatAppliedOpTime``: may go back after a
    rollback; what sync-source choice and catch-up use), whether it is up, when it was last
    heard from (heartbeat reply or replSetUpdatePosition, ms), whom it knows as primary and
    syncs from."""

    state: MemberState = MemberState.UNKNOWN
    term: int = -1
    applied: OpTime = NULL_OPTIME
    durable: OpTime = NULL_OPTIME
    hb_applied: OpTime = NULL_OPTIME
    up: bool = False
    last_contact: int = -(2**62)
    primary_id: Optional[int] = None
    sync_source_id: Optional[int] = None

    def advance(self, applied: OpTime, durable: OpTime) -> None:
        """Move the positions forward only (``MemberData::advanceLastAppliedOpTimeAndWallTime``)."""
        if applied > self.applied:
            self.applied = applied
        if durable > self.durable:
            self.durable = durable


def choose_sync_source(self_id: int, last_fetched: OpTime, views: Mapping[int, MemberView],
                       primary_id: Optional[int], chaining_allowed: bool,
                       exclude: frozenset = frozenset()) -> Optional[int]:
    """The member to fetch from, or None: an up PRIMARY/SECONDARY whose applied optime (as its
    last heartbeat reply said) is ahead of ``last_fetched``; the primary when it qualifies
    (or when chaining is off, only it),
    otherwise the freshest (ties: lowest ``_id``). ``exclude`` are sources just found unusable
    (the server's denylist)."""
    def eligible(mid: int) -> bool:
        v = views.get(mid)
        return (mid != self_id and mid not in exclude and v is not None and v.up
                and v.state in (MemberState.PRIMARY, MemberState.SECONDARY)
                and v.hb_applied > last_fetched)

    if primary_id is not None and eligible(primary_id):
        return primary_id
    if not chaining_allowed:
        return None
    best = None
    for mid in sorted(views):
        if eligible(mid) and (best is None or views[mid].hb_applied > views[best].hb_applied):
            best = mid
    return best


def serve_fetch(optimes: Sequence[OpTime], entries: Sequence[Any], after: OpTime,
                limit: int, *, oplog_truncated: bool = False
                ) -> tuple[tuple[Any, ...], Optional[ReplError], OpTime]:
    """The source's side of a fetch over its oplog (``optimes[i]`` is the optime of
    ``entries[i]``, both oldest first): ``(entries after `after`, at most limit; error; the
    source's first optime when its oplog was truncated (capped), else NULL_OPTIME: the whole
    history is there)``.

    ``after`` NULL_OPTIME (an empty fetcher) reads from the start. When ``after`` is not in the
    oplog, the error is OplogStartMissing 120 with the fetcher's message ("Our last optime
    fetched: X. source's GTE: Y")."""
    first = optimes[0] if optimes and oplog_truncated else NULL_OPTIME
    if after == NULL_OPTIME:
        return tuple(entries[:limit]), None, first
    i = bisect_left(optimes, after)
    if i < len(optimes) and optimes[i] == after:
        return tuple(entries[i + 1:i + 1 + limit]), None, first
    gte = format_optime(optimes[i]) if i < len(optimes) else "(none)"
    return (), ReplError(120, "OplogStartMissing",
                         f"Our last optime fetched: {format_optime(after)}. "
                         f"source's GTE: {gte}"), first


def diverged_or_too_stale(last_fetched: OpTime, source_first: OpTime) -> str:
    """After OplogStartMissing: ``"too stale"`` when the source's oldest entry is newer than the
    fetcher's last fetched one (its history is gone: RECOVERING, resync needed), else
    ``"rollback"`` (the oplogs diverged: bgsync.cpp ``_runRollback``). ``source_first`` is
    NULL_OPTIME when the source holds its whole history (never too stale)."""
    if source_first != NULL_OPTIME and source_first > last_fetched:
        return "too stale"
    return "rollback"
