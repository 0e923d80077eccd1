"""The seeded discrete-event scheduler of the simulation.

Time is virtual milliseconds (``now``); callbacks scheduled with :meth:`Scheduler.at` run in
time order, ties in scheduling order. One ``random.Random(seed)`` (``rng``) makes every choice
of a run, so the same seed replays the same run (as long as the world draws in the same order).
"""

from __future__ import annotations

import heapq
import random
from typing import Callable


class Scheduler:
    """``rng`` the run's only source of randomness; ``now`` the current virtual time (ms)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self._q: list[tuple[int, int, Callable[[], None]]] = []
        self._n = 0

    def at(self, t: int, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at virtual time ``t`` (after everything already scheduled for ``t``)."""
        self._n += 1
        heapq.heappush(self._q, (t, self._n, fn))

    def run(self, end: int, done: Callable[[], bool], check_from: int, every: int = 500) -> None:
        """Run callbacks in order until none is left at or before ``end``; from ``check_from``
        on, every ``every`` ms of virtual time, stop early once ``done()`` says so."""
        next_check = check_from
        q = self._q
        while q and q[0][0] <= end:
            t, _, fn = heapq.heappop(q)
            self.now = t
            fn()
            if t >= next_check:
                next_check = t + every
                if done():
                    return
