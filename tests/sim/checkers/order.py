"""Order: every stream returns its events in strictly increasing resume-token order (cluster
time first), so no two are swapped and none repeats back to back."""

from __future__ import annotations

from typing import Any

from shardsim.testing import invariants

from .common import healthy


def check(world: Any) -> list[str]:
    """The first out-of-order pair of each stream."""
    out = []
    for st in healthy(world):
        keys = [e.key for e in st.returned]
        for i in invariants.unordered_events(keys, first=True):
            out.append(f"stream {st.sid}: order violation {keys[i - 1][0]} then {keys[i][0]}")
    return out
