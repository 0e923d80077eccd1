"""Rollback (shardsim/core/repl/rollback.py): the common point of two oplogs, the entries to undo,
the rollback id bump, and the refusal to roll back committed entries."""

from __future__ import annotations

import pytest

from shardsim.core.repl import NULL_OPTIME, OpTime, ReplError, find_common_point, plan_rollback


def e(ts, t, tag=""):
    return {"ts": ts, "t": t, "op": "i", "o": {"tag": tag}}


COMMON = [e(1, 1), e(2, 1), e(3, 1)]


def test_the_deposed_primarys_suffix_is_undone_newest_first():
    local = COMMON + [e(4, 1, "lost"), e(5, 1, "lost too")]
    remote = COMMON + [e(4, 2, "new primary"), e(6, 2)]
    plan = plan_rollback(local, remote, commit_point=OpTime(ts=2, t=1), rbid=4)
    assert plan.common_point == OpTime(ts=3, t=1) and plan.keep == 3
    assert [x["ts"] for x in plan.undo] == [5, 4]
    assert plan.rbid == 5


def test_common_point_walks_both_oplogs_back_by_optime():
    # the remote has entries the local never saw on both sides of the divergence
    local = [e(1, 1), e(3, 1), e(7, 1)]
    remote = [e(1, 1), e(3, 1), e(5, 2), e(6, 2)]
    assert find_common_point(local, remote) == (OpTime(ts=3, t=1), 2)
    # identical oplogs: nothing to undo
    assert find_common_point(COMMON, COMMON) == (OpTime(ts=3, t=1), 3)


def test_no_shared_entry():
    local = [e(1, 1, "lost")]
    remote = [e(2, 2)]
    assert find_common_point(local, remote) == (NULL_OPTIME, 0)
    plan = plan_rollback(local, remote, commit_point=NULL_OPTIME, rbid=1)
    assert plan.keep == 0 and [x["o"]["tag"] for x in plan.undo] == ["lost"]
    with pytest.raises(ReplError) as exc:
        find_common_point(local, remote, complete_history=False)
    assert exc.value.code == 47 and exc.value.code_name == "NoMatchingDocument"


def test_a_common_point_below_the_commit_point_is_unrecoverable():
    local = COMMON + [e(4, 1)]
    remote = COMMON[:1] + [e(5, 2)]
    with pytest.raises(ReplError) as exc:
        plan_rollback(local, remote, commit_point=OpTime(ts=3, t=1), rbid=1)
    assert exc.value.code == 127 and exc.value.code_name == "UnrecoverableRollbackError"
    assert exc.value.errmsg.startswith("Common point must be at least stable timestamp")


def test_bson_timestamps_work_too():
    from bson import Timestamp
    local = [{"ts": Timestamp(10, 1), "t": 1}, {"ts": Timestamp(10, 2), "t": 1}]
    remote = [{"ts": Timestamp(10, 1), "t": 1}, {"ts": Timestamp(11, 1), "t": 2}]
    plan = plan_rollback(local, remote, commit_point=NULL_OPTIME, rbid=1)
    assert plan.common_point.to_doc() == {"ts": Timestamp(10, 1), "t": 1}
