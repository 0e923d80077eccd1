"""What the checkers share."""

from __future__ import annotations

from typing import Any


def healthy(world: Any) -> list[Any]:
    """The world's streams that did not fail (the ones the invariants apply to; a failed
    stream is :mod:`.no_stream_error`'s)."""
    return [st for st in world.streams if st.error is None]
