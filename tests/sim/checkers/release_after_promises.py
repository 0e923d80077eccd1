"""No event is released before every remote promised past it: when the merge hands an event
to the client, every remote (shard and config cursors) has a promise (its latest
postBatchResumeToken) at or above the event's token, so no remote can still return an event
that sorts before it (``AsyncResultsMerger``'s rule, DESIGN.md "One change event", step 5)."""

from __future__ import annotations

from typing import Any

from .common import healthy


def check(world: Any) -> list[str]:
    """The first premature release of each stream (recorded by ``Stream._output``)."""
    out = []
    for st in healthy(world):
        for key, floor in st.releases:
            if floor is None or key > floor:
                shown = "no promise" if floor is None else f"promise {floor[0]}"
                out.append(f"stream {st.sid}: event {key[0]} released while a remote had "
                           f"{shown}")
                break
    return out
