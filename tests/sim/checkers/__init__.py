"""One checker per invariant of the merged stream. Each module has ``check(world) -> list[str]``
(the violations it finds, each naming the stream); :func:`check_all` runs them all.

A stream that failed is reported by :mod:`.no_stream_error` only: what it returned before the
error is not judged by the others.
"""

from __future__ import annotations

from typing import Any

from . import (completeness, no_stream_error, order, pbrt_covers_batch, pbrt_monotonic,
               pbrt_never_passed, release_after_promises)

CHECKERS = (no_stream_error, order, completeness, release_after_promises, pbrt_monotonic,
            pbrt_covers_batch, pbrt_never_passed)


def check_all(world: Any) -> list[str]:
    """Every checker's violations, in :data:`CHECKERS` order (empty: the run is correct)."""
    out: list[str] = []
    for checker in CHECKERS:
        out.extend(checker.check(world))
    return out

