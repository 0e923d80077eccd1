"""Order: every stream returns its events in strictly increasing resume-token order (cluster
time first), so no two are swapped and none repeats back to back."""

from __future__ import annotations

from typing import Any

from .common import healthy


def check(world: Any) -> list[str]:
    """The first out-of-order pair of each stream."""
    out = []
    for st in healthy(world):
        keys = [e.key for e in st.returned]
        for a, b in zip(keys, keys[1:]):
            if not a < b:
                out.append(f"stream {st.sid}: order violation {a[0]} then {b[0]}")
                break
    return out
