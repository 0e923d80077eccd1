"""Each replica-set checker (repl_checkers/) catches the violation it is about, on hand-made
histories, and passes a clean one."""

from __future__ import annotations

from shardsim.core.repl import OpTime
from sim.repl_checkers import (check_all, commit_point_monotonic, election_safety, liveness,
                               log_matching, no_acked_write_lost, no_uncommitted_exposed)
from sim.repl_world import History

NULL = OpTime(t=-1, ts=0)


def op(ts, t=1):
    return OpTime(t=t, ts=ts)


def clean() -> History:
    h = History(members=3)
    h.wins = [(100, 1, 0)]
    h.win_logs = [(100, 1, 0, frozenset())]
    h.appends = [(0, op(1), 1, NULL), (1, op(1), 1, NULL), (0, op(2), 2, op(1))]
    h.commit_trace = {0: [NULL, op(1), op(2)], 1: [NULL, op(1)]}
    h.acked = [(150, 1, op(1))]
    h.exposed = {1: (150, 0)}
    h.final_logs = {0: [(op(1), 1), (op(2), 2)], 1: [(op(1), 1)]}
    h.heal_time, h.primary_after_heal, h.end_time = 1000, 1500, 5000
    h.final_write_issued, h.final_write_acked = 1500, 1600
    return h


def test_a_clean_history_passes_every_checker():
    assert check_all(clean()) == []


def test_each_checker_finds_its_violation():
    h = clean()
    h.wins.append((300, 1, 2))
    assert election_safety.check(h)

    h = clean()
    h.appends.append((2, op(2), 9, op(1)))                  # another entry at the same optime
    assert log_matching.check(h)
    h = clean()
    h.appends.append((2, op(2), 2, NULL))                   # same entry, another predecessor
    assert log_matching.check(h)
    h = clean()
    h.final_logs[1] = [(op(0, 0), 7), (op(1), 1)]           # same optime, different prefix
    assert log_matching.check(h)

    h = clean()
    h.commit_trace[1].append(NULL)
    assert commit_point_monotonic.check(h)

    h = clean()
    h.win_logs.append((200, 2, 1, frozenset()))             # a later primary without entry 1
    assert no_acked_write_lost.check(h)
    h = clean()
    h.final_logs[1] = []
    assert no_acked_write_lost.check(h)

    h = clean()
    h.rolled_back.append((200, 1, 1))                       # exposed at 150, rolled back at 200
    assert no_uncommitted_exposed.check(h)
    h = clean()
    h.rolled_back.append((100, 1, 1))                       # rolled back before its exposure
    assert no_uncommitted_exposed.check(h) == []
    h.rollback_errors.append((100, 1, "Common point must be at least stable timestamp"))
    assert no_uncommitted_exposed.check(h)

    h = clean()
    h.primary_after_heal = None
    assert liveness.check(h)
    h = clean()
    h.primary_after_heal = 9000
    assert liveness.check(h)
    h = clean()
    h.final_write_acked = None
    assert liveness.check(h)
    h = clean()
    h.stuck.append((10, 0, "10"))
    assert liveness.check(h)
