"""The hybrid logical clock every process keeps (cluster time as a BSON Timestamp).

Like mongod's ``VectorClockMutable::tickClusterTime`` / ``LogicalClock::reserveTicks``: a tick
is ``max(wall seconds, last seconds)`` with the increment bumped, never behind a gossiped
``$clusterTime``; ``advance`` takes in gossip. Timestamps are ``bson.Timestamp(secs, inc)``.
"""

from __future__ import annotations

import time
from typing import Callable

from bson.timestamp import Timestamp

MAX_INC = 0xFFFFFFFF


def ts_key(ts: Timestamp) -> int:
    """A Timestamp as one ordered 64-bit integer ``(secs << 32) | inc``."""
    return (ts.time << 32) | ts.inc


def ts_from_key(key: int) -> Timestamp:
    """Inverse of :func:`ts_key`."""
    return Timestamp(key >> 32, key & MAX_INC)


def ts_add_ticks(ts: Timestamp, ticks: int = 1) -> Timestamp:
    """``ts`` plus ``ticks`` increments (LogicalTime::addTicks): carries into seconds on overflow."""
    return ts_from_key(ts_key(ts) + ticks)


class HybridLogicalClock:
    """Monotonic cluster time.

    ``tick()`` reserves the next Timestamp for a write (oplog ``ts``); ``advance(ts)`` gossips
    in a ``$clusterTime`` (never moves backwards); ``now()`` is the current cluster time.
    ``wall`` returns wall-clock seconds (injectable for simulations).
    """

    __slots__ = ("_last", "_wall")

    def __init__(self, wall: Callable[[], float] = time.time, start: Timestamp | None = None) -> None:
        self._wall = wall
        self._last = ts_key(start) if start is not None else 0

    def now(self) -> Timestamp:
        """The current cluster time (the last tick or gossiped time, or wall time if newer)."""
        return ts_from_key(self._last)

    def now_key(self) -> int:
        return self._last

    def tick(self, ticks: int = 1) -> Timestamp:
        """Reserve ``ticks`` increments; returns the first reserved Timestamp."""
        wall_secs = int(self._wall())
        if wall_secs > (self._last >> 32):
            first = (wall_secs << 32) | 1
        else:
            first = self._last + 1
        self._last = first + ticks - 1
        return ts_from_key(first)

    def advance(self, ts: Timestamp | None) -> None:
        """Gossip in: move forward to ``ts`` if it is newer."""
        if ts is not None:
            key = ts_key(ts)
            if key > self._last:
                self._last = key

    def advance_to_wall(self) -> Timestamp:
        """Move to the wall clock without reserving a tick (used for idle promises)."""
        wall_key = int(self._wall()) << 32
        if wall_key > self._last:
            self._last = wall_key
        return ts_from_key(self._last)
