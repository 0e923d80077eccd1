"""The majority commit point (shardsim/core/repl/commit_point.py): the majority position, the rule
that an earlier term's entry commits only once one of the primary's own term does, the two ways
a secondary learns the point, monotonicity."""

from __future__ import annotations

from shardsim.core.repl import NULL_OPTIME, OpTime, Rules, advance_commit_point, majority_point
from shardsim.core.repl.commit_point import MAX_OPTIME, readable_point


def op(ts, t):
    return OpTime(ts=ts, t=t)


def test_majority_point_is_the_write_majority_th_newest():
    ops = [op(5, 1), op(9, 1), op(7, 1)]
    assert majority_point(ops, 2) == op(7, 1)
    assert majority_point(ops + [op(1, 1), op(8, 1)], 3) == op(7, 1)
    assert majority_point([op(5, 1)], 2) == NULL_OPTIME
    # term first: an old-term entry with a later ts sorts below
    assert majority_point([op(99, 1), op(3, 2), op(4, 2)], 2) == op(3, 2)


def primary(current, candidate, first, applied, rules=Rules()):
    return advance_commit_point(current, candidate, is_primary=True, first_op_of_term=first,
                                my_last_applied=applied, from_sync_source=False, rules=rules)


def test_an_earlier_term_entry_commits_only_with_one_of_the_current_term():
    # a primary of term 3 whose no-op is at (20, 3): a majority at (15, 2) commits nothing
    assert primary(op(10, 2), op(15, 2), op(20, 3), op(20, 3)) == op(10, 2)
    # during catch-up (first op of term = infinity) nothing commits either
    assert primary(op(10, 2), op(15, 2), MAX_OPTIME, op(15, 2)) == op(10, 2)
    # once a majority has the no-op, everything before it commits with it
    assert primary(op(10, 2), op(20, 3), op(20, 3), op(21, 3)) == op(20, 3)
    # the mutation that breaks the rule commits the old entry directly
    assert primary(op(10, 2), op(15, 2), op(20, 3), op(20, 3),
                   Rules(commit_earlier_term=True)) == op(15, 2)


def test_the_commit_point_never_moves_back():
    assert primary(op(20, 3), op(18, 3), op(5, 3), op(30, 3)) == op(20, 3)
    assert advance_commit_point(op(20, 3), op(18, 3), is_primary=False,
                                first_op_of_term=MAX_OPTIME, my_last_applied=op(30, 3),
                                from_sync_source=True) == op(20, 3)


def test_from_the_sync_source_the_point_is_clamped_to_last_applied():
    got = advance_commit_point(op(1, 1), op(50, 4), is_primary=False,
                               first_op_of_term=MAX_OPTIME, my_last_applied=op(30, 2),
                               from_sync_source=True)
    assert got == op(30, 2)


def test_from_a_heartbeat_only_a_point_of_the_term_of_my_last_entry_counts():
    def hb(candidate, applied):
        return advance_commit_point(op(1, 1), candidate, is_primary=False,
                                    first_op_of_term=MAX_OPTIME, my_last_applied=applied,
                                    from_sync_source=False)
    assert hb(op(50, 4), op(30, 2)) == op(1, 1)          # my last entry is of term 2
    assert hb(op(50, 4), op(30, 4)) == op(50, 4)          # same term: taken (may pass applied)


def test_readable_point_is_bounded_by_what_is_applied():
    assert readable_point(op(50, 4), op(30, 4)) == op(30, 4)
    assert readable_point(op(20, 4), op(30, 4)) == op(20, 4)
