"""A reply's postBatchResumeToken is at or above the last event returned so far (resuming from
it never returns an event the client already has)."""

from __future__ import annotations

from typing import Any

from .common import healthy


def check(world: Any) -> list[str]:
    """One violation per reply whose postBatchResumeToken is below its batch's last event."""
    out = []
    for st in healthy(world):
        keys = [e.key for e in st.returned]
        for key, n in st.pbrts:
            if n and key < keys[n - 1]:
                out.append(f"stream {st.sid}: postBatchResumeToken below its batch's last event")
    return out
