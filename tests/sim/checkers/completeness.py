"""Completeness, no duplicates: every stream returns exactly the cluster's events from its start
point on (after it, for a resumed stream), each once: nothing lost, nothing extra."""

from __future__ import annotations

from typing import Any

from .common import healthy


def check(world: Any) -> list[str]:
    """One violation per stream whose events are not exactly the expected suffix."""
    out = []
    for st in healthy(world):
        keys = [e.key for e in st.returned]
        expected = [e.key for e in world.expected(st)]
        if expected != keys:
            exp_set, got_set = set(expected), set(keys)
            out.append(f"stream {st.sid}: expected {len(expected)} events, got {len(keys)} "
                       f"(missing {len(exp_set - got_set)}, unexpected {len(got_set - exp_set)}, "
                       f"duplicates {len(keys) - len(got_set)})")
    return out
