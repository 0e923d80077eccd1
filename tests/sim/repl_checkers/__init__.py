"""One checker per invariant of the replica-set simulation (:mod:`sim.repl_world`). Each module
has ``check(history) -> list[str]`` (the violations it finds); :func:`check_all` runs them all.
"""

from __future__ import annotations

from typing import Any

from . import (commit_point_monotonic, election_safety, liveness, log_matching,
               no_acked_write_lost, no_uncommitted_exposed)

CHECKERS = (election_safety, log_matching, commit_point_monotonic, no_acked_write_lost,
            no_uncommitted_exposed, liveness)


def check_all(history: Any) -> list[str]:
    """Every checker's violations, in :data:`CHECKERS` order (empty: the run is correct)."""
    out: list[str] = []
    for checker in CHECKERS:
        out.extend(checker.check(history))
    return out
