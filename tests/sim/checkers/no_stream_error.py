"""No stream fails: the merge raised nothing (a remote breaking its own promise, a resume token
not found, ...) for any client stream."""

from __future__ import annotations

from typing import Any


def check(world: Any) -> list[str]:
    """One violation per failed stream, with the error's code and message."""
    return [f"stream {st.sid}: failed with {st.error.code}: {st.error.errmsg}"
            for st in world.streams if st.error is not None]
