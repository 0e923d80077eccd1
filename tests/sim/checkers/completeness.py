"""Completeness, no duplicates: every stream returns exactly the cluster's events from its start
point on (after it, for a resumed stream), each once: nothing lost, nothing extra."""

from __future__ import annotations

from typing import Any

from shardsim.testing import invariants

from .common import healthy


def check(world: Any) -> list[str]:
    """One violation per stream whose events are not exactly the expected suffix."""
    out = []
    for st in healthy(world):
        keys = [e.key for e in st.returned]
        expected = [e.key for e in world.expected(st)]
        if expected != keys:
            exp_set = set(expected)
            missing = set(invariants.lost_events(expected, keys))
            unexpected = {keys[i] for i in invariants.unexpected_events(keys, exp_set)}
            duplicates = invariants.duplicate_events(keys)
            out.append(f"stream {st.sid}: expected {len(expected)} events, got {len(keys)} "
                       f"(missing {len(missing)}, unexpected {len(unexpected)}, "
                       f"duplicates {len(duplicates)})")
    return out
