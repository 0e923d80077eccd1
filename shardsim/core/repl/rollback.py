"""Rollback as recover-to-stable-timestamp, in outline: pure functions over oplog entry lists.

After src/mongo/db/repl/rollback_impl.cpp (``RollbackImpl::runRollback``: ``_findCommonPoint``,
the rollback id bump ``_replicationProcess->incrementRollbackID``, then truncation after the
common point) and roll_back_local_operations.cpp (``syncRollBackLocalOperations``: walk both
oplogs from the newest entry back; PV1 optimes identify entries, so the first optime present
in both is the common point).

Entries are mappings with ``ts`` and ``t`` (oplog entries), oldest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .member_state import ReplError
from .optime import NULL_OPTIME, OpTime, format_optime, optime_of


@dataclass(frozen=True)
class RollbackPlan:
    """What a rollback does: keep the local oplog up to and including ``common_point``, undo
    ``undo`` (the local entries after it, newest first, the order their effects are reverted),
    and take ``rbid`` as the new rollback id. ``keep`` is how many local entries remain."""

    common_point: OpTime
    keep: int
    undo: tuple[Mapping[str, Any], ...]
    rbid: int


def find_common_point(local: Sequence[Mapping[str, Any]], remote: Sequence[Mapping[str, Any]],
                      *, complete_history: bool = True) -> tuple[OpTime, int]:
    """``(common point, number of local entries up to and including it)``: the newest optime in
    both oplogs, found by walking both from the end as ``syncRollBackLocalOperations`` does.

    When one walk runs out without a match: if both oplogs hold the set's whole history
    (``complete_history``, uncapped oplogs) nothing is shared and the common point is
    NULL_OPTIME with nothing kept; otherwise ReplError NoMatchingDocument 47
    ("reached beginning of remote oplog" / "... of local oplog")."""
    i, j = len(local) - 1, len(remote) - 1
    while i >= 0 and j >= 0:
        lo, ro = optime_of(local[i]), optime_of(remote[j])
        if lo == ro:
            return lo, i + 1
        if lo > ro:
            i -= 1
        else:
            j -= 1
    if complete_history:
        return NULL_OPTIME, 0
    where = "remote" if j < 0 else "local"
    raise ReplError(47, "NoMatchingDocument", f"reached beginning of {where} oplog")


def plan_rollback(local: Sequence[Mapping[str, Any]], remote: Sequence[Mapping[str, Any]], *,
                  commit_point: OpTime, rbid: int, complete_history: bool = True) -> RollbackPlan:
    """The rollback of ``local`` against its sync source's oplog ``remote``: the common point,
    the entries to undo (newest first) and the bumped rollback id.

    Raises ReplError UnrecoverableRollbackError 127 when the common point is before the
    member's commit point (majority-committed entries never roll back; the server's
    ``RollbackImpl::_findCommonPoint`` refuses a common point below the stable timestamp), and
    NoMatchingDocument 47 (:func:`find_common_point`)."""
    common, keep = find_common_point(local, remote, complete_history=complete_history)
    if common < commit_point:
        raise ReplError(127, "UnrecoverableRollbackError",
                        "Common point must be at least stable timestamp, common point: "
                        f"{format_optime(common)}, stable timestamp: {format_optime(commit_point)}")
    undo = tuple(reversed(local[keep:]))
    return RollbackPlan(common_point=common, keep=keep, undo=undo, rbid=rbid + 1)
