"""The hybrid logical clock every process keeps (cluster time as a BSON Timestamp).

Like mongod's ``VectorClockMutable::tickClusterTime`` / ``LogicalClock::reserveTicks``: a tick
is ``max(wall seconds, last seconds)`` with the increment bumped, never behind a gossiped
``$clusterTime``; ``advance`` takes in gossip. Timestamps are ``bson.Timestamp(secs, inc)``.

Limits, as ``src/mongo/db/vector_clock/vector_clock.cpp`` / ``vector_clock_mutable.cpp`` keep them:
a gossiped time whose seconds are more than ``maxAcceptableLogicalClockDriftSecs`` (default 365
days) ahead of this process's wall clock is refused with ClusterTimeFailsRateLimiter (205) and
moves nothing (``VectorClock::_ensurePassesRateLimiter``); no part of a cluster time may exceed
``VectorClock::kMaxValue`` (2**31 - 1): gossip beyond it fails with 40484, a tick with 40482,
a trusted restore (oplog reload) with 40483. So the clock can never produce a Timestamp that
does not fit a signed 64-bit ``ts_key`` (SQLite INTEGER) or overflows its increment.
"""

from __future__ import annotations

import time
from typing import Callable

from bson.timestamp import Timestamp

from shardsim.core.errors import MongoError

MAX_INC = 0xFFFFFFFF
MAX_TIME_VALUE = 0x7FFFFFFF  # VectorClock::kMaxValue (std::numeric_limits<int32_t>::max())
DEFAULT_MAX_DRIFT_S = 365 * 24 * 3600  # maxAcceptableLogicalClockDriftSecs default (one year)


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
    ``wall`` returns wall-clock seconds (injectable for simulations); ``max_drift_s`` is
    ``maxAcceptableLogicalClockDriftSecs`` (seconds a gossiped time may be ahead of ``wall``).
    """

    __slots__ = ("_last", "_wall", "max_drift_s", "_now")

    def __init__(self, wall: Callable[[], float] = time.time, start: Timestamp | None = None,
                 max_drift_s: int = DEFAULT_MAX_DRIFT_S) -> None:
        self._wall = wall
        self._last = ts_key(start) if start is not None else 0
        self.max_drift_s = max_drift_s
        # (key, Timestamp) of the last now(): every command reads the time two or three times
        # (gossip out, operationTime, each shard request), mostly without a tick between
        self._now: tuple[int, Timestamp] = (-1, Timestamp(0, 0))

    def now(self) -> Timestamp:
        """The current cluster time (the last tick or gossiped time, or wall time if newer)."""
        key, ts = self._now
        if key != self._last:  # moved since: the cache is keyed by the time itself
            key = self._last
            ts = ts_from_key(key)
            self._now = (key, ts)
        return ts

    def now_key(self) -> int:
        return self._last

    def tick(self, ticks: int = 1) -> Timestamp:
        """Reserve ``ticks`` increments; returns the first reserved Timestamp.

        Like ``LogicalClock::reserveTicks``: seconds catch up with the wall clock; an increment
        that would pass 2**31 - 1 moves to the next second. MongoError 40482 when the time would
        pass ``VectorClock::kMaxValue`` (the process keeps serving; nothing is reserved)."""
        secs, inc = self._last >> 32, self._last & MAX_INC
        wall_secs = int(self._wall())
        if wall_secs > secs:
            secs, inc = wall_secs, 0
        elif inc > MAX_TIME_VALUE - ticks:
            secs, inc = secs + 1, 0
        if secs > MAX_TIME_VALUE or inc > MAX_TIME_VALUE - ticks:
            raise MongoError(40482, "$clusterTime cannot be advanced beyond the maximum logical "
                                    "time value")
        first = (secs << 32) | (inc + 1)
        self._last = first + ticks - 1
        return ts_from_key(first)

    def next_tick_key(self) -> int:
        """The ts key :meth:`tick` would reserve now (seconds caught up with the wall clock,
        increment bumped), without reserving it: what a process whose clock equals this one
        stamps its next write with (the router's early promise requests)."""
        secs, inc = self._last >> 32, self._last & MAX_INC
        wall_secs = int(self._wall())
        if wall_secs > secs:
            return (wall_secs << 32) | 1
        if inc >= MAX_TIME_VALUE:
            return (secs + 1) << 32 | 1
        return (secs << 32) | (inc + 1)

    def check(self, ts: Timestamp, name: str = "$clusterTime") -> None:
        """Refuse a gossiped time as ``VectorClock::_ensurePassesRateLimiter`` does: seconds
        more than ``max_drift_s`` ahead of the wall clock -> ClusterTimeFailsRateLimiter (205);
        seconds or increment beyond 2**31 - 1 -> 40484."""
        wall_secs = int(self._wall())
        if ts.time > wall_secs and ts.time - wall_secs > self.max_drift_s:
            raise MongoError(205, f"New {name}, {ts.time}, is too far from this node's wall "
                                  f"clock time, {wall_secs}.")
        if ts.time > MAX_TIME_VALUE or ts.inc > MAX_TIME_VALUE:
            raise MongoError(40484, f"{name} cannot be advanced beyond its maximum value")

    def advance(self, ts: Timestamp | None) -> None:
        """Gossip in: move forward to ``ts`` if it is newer. Raises MongoError 205/40484 (see
        :meth:`check`) without moving when ``ts`` fails the rate limiter."""
        if ts is not None:
            key = ts_key(ts)
            if key > self._last:
                self.check(ts)
                self._last = key

    def try_advance(self, ts: Timestamp | None) -> bool:
        """:meth:`advance` for paths that cannot report an error (a reply's gossip read by a
        background task): False, and no move, when ``ts`` fails the rate limiter."""
        try:
            self.advance(ts)
        except MongoError:
            return False
        return True

    def restore(self, ts: Timestamp) -> None:
        """Advance from a trusted source (the durable oplog at start-up) without the rate
        limiter, like ``VectorClockMutable::_advanceComponentTimeTo``; 40483 past kMaxValue."""
        if ts.time > MAX_TIME_VALUE or ts.inc > MAX_TIME_VALUE:
            raise MongoError(40483, "$clusterTime cannot be advanced beyond the maximum logical "
                                    "time value")
        key = ts_key(ts)
        if key > self._last:
            self._last = key

    def advance_to_wall(self) -> Timestamp:
        """Move to the wall clock without reserving a tick (used for idle promises)."""
        wall_key = int(self._wall()) << 32
        if wall_key > self._last:
            self._last = wall_key
        return ts_from_key(self._last)
