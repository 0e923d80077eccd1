"""A postBatchResumeToken is a promise to the client too: nothing returned after it sorts at
or below it (else resuming from it would lose that event)."""

from __future__ import annotations

from typing import Any

from .common import healthy


def check(world: Any) -> list[str]:
    """The first event of each stream returned after a postBatchResumeToken that passed it."""
    out = []
    for st in healthy(world):
        keys = [e.key for e in st.returned]
        for key, n in st.pbrts:
            if n < len(keys) and keys[n] <= key:
                out.append(f"stream {st.sid}: event {keys[n][0]} returned after a "
                           f"postBatchResumeToken {key[0]} that had passed it")
                break
    return out
