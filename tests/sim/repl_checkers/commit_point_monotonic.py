"""The commit point of each member only moves forward, across restarts too (it restarts from
the persisted stable optime)."""

from __future__ import annotations

from typing import Any


def check(h: Any) -> list[str]:
    """The first backward step of each member's commit point."""
    out = []
    for member, trace in sorted(h.commit_trace.items()):
        for a, b in zip(trace, trace[1:]):
            if b < a:
                out.append(f"commit point of member {member} went back from {a} to {b}")
                break
    return out
