"""Each checker of :mod:`shardsim.testing.invariants` finds the violation it is about, and only
that one (the seeded simulation, the fault trials and the load verifier all use them)."""

from __future__ import annotations

from shardsim.testing import invariants as inv


def test_writes_against_the_final_documents() -> None:
    applied = {("insert", 1): 1, ("update", 1): 2, ("insert", 2): 1, ("insert", 9): 1}
    assert inv.lost_writes([("insert", 1), ("insert", 3), ("update", 1)], applied) == \
        [("insert", 3)]
    possible = {("insert", 1), ("update", 1), ("insert", 2)}
    assert sorted(inv.doubled_writes(applied, possible)) == [(("insert", 9), 1),
                                                            (("update", 1), 2)]
    assert inv.final_state_diff({"c": {1: {"a": 1}}}, {"c": {1: {"a": 1}}}) is None
    assert inv.final_state_diff({"c": {1: {"a": 1}}}, {"c": {}})[0] == "missing"
    assert inv.final_state_diff({"c": {1: {"a": 1}}}, {"c": {1: {"a": 2}}})[0] == "different"
    assert inv.final_state_diff({"c": {}}, {"c": {4: {}}})[:3] == ("extra", "c", 4)


def test_events_against_the_writes() -> None:
    assert inv.lost_events([1, 2, 3, 4], [3, 1]) == [2, 4]
    assert inv.unexpected_events([1, 7, 2, 8], {1, 2}) == [1, 3]
    assert inv.unexpected_events([1, 7, 2, 8], {1, 2}, first=True) == [1]
    assert inv.duplicate_events(["a", "b", "c"]) == []
    assert inv.duplicate_events(["a", "b", "a", "b"]) == [(2, 0), (3, 1)]
    assert inv.duplicate_events([5, -1, -1, 6], ignore=-1) == []
    assert inv.duplicate_events([5, -1, 5], ignore=-1, first=True) == [(2, 0)]
    assert inv.unordered_events(["01", "02", "03"]) == []
    assert inv.unordered_events(["01", "03", "02", "02"]) == [2, 3]
    assert inv.unordered_events(["01", "01", "02"], strict=False) == []
    assert inv.unordered_events(["01", "03", "02", "00"], first=True) == [2]


def test_a_write_before_the_one_it_follows() -> None:
    prev = [-1, 0, 1, -1]  # writes 0 -> 1 -> 2 on one document, 3 alone
    assert inv.events_before_predecessor([0, 3, 1, 2], prev) == []
    assert inv.events_before_predecessor([0, 2, 1], prev) == [(1, 1)]
    assert inv.events_before_predecessor([-1, 1, 0], prev, first=True) == [(1, 0)]


def test_no_event_of_a_rolled_back_write() -> None:
    assert inv.rolled_back_events([("insert", 1), ("insert", 2)], set()) == []
    assert inv.rolled_back_events([("insert", 1), ("insert", 2), ("insert", 3)],
                                  {("insert", 2), ("insert", 3)}) == [1, 2]
    assert inv.rolled_back_events([1, 2, 3], {2, 3}, first=True) == [1]
