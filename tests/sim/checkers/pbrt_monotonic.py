"""The client's postBatchResumeToken never goes backwards (a resume from a later reply never
starts before an earlier one)."""

from __future__ import annotations

from typing import Any

from .common import healthy


def check(world: Any) -> list[str]:
    """One violation per backward step."""
    out = []
    for st in healthy(world):
        prev = None
        for key, _ in st.pbrts:
            if prev is not None and key < prev:
                out.append(f"stream {st.sid}: postBatchResumeToken went backwards")
            prev = key
    return out
