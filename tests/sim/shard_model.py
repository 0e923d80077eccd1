"""The simulated shards and config server (what the router's merge talks to).

* A shard's clock is a hybrid logical clock over its skewed wall clock: ``max(wall, last) + 1``
  as ``(secs << 32) | inc``; gossip only moves it forward.
* A write reserves its timestamp at once and becomes visible in the oplog only when it commits
  (after a random delay, possibly out of order): entries are visible up to the oldest write
  still in flight, as on mongod (no oplog holes are ever read).
* A getMore (:meth:`SimShard.answer`) returns the visible events the cursor has not returned
  and a postBatchResumeToken chosen by the shard's *promise mode*: ``mongod`` = HWM(newest
  visible oplog time; a periodic no-op writer keeps it moving), ``clock`` = HWM(min(clock
  now + 1, oldest in-flight write)), shardsim's default, and ``unsafe-clock`` = HWM(clock
  now + 1) ignoring in-flight writes: a bug on purpose, which the checkers must catch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardsim.core.resume_token import hwm_data, token_key

from .scheduler import Scheduler

PROMISE_MODES = ("clock", "mongod", "unsafe-clock")


def event_data(ts: int, shard_idx: int, seq: int) -> str:
    """The ``_data`` of an event token: the v2 layout (Timestamp, version 2, tokenType 128,
    txnOpIndex 0, fromInvalidate false), then a stand-in for uuid/eventIdentifier that breaks
    ties between shards (``shard_idx``) and orders a shard's writes (``seq``)."""
    return f"82{ts:016X}2B042C0100296E{shard_idx:04X}{seq:08X}04"


@dataclass
class SimEvent:
    """One change event: its cluster time ``ts``, sort ``key`` (``token_key`` of ``token``),
    ``op`` and ``meta`` (config.shards inserts: ``is_shard_insert``, ``shard``,
    ``cluster_time``)."""

    ts: int
    key: tuple
    token: dict
    op: str = "insert"
    meta: dict = field(default_factory=dict)


class ShardCursor:
    """A shard's change-stream cursor for one client stream, opened at ``start_token``."""

    def __init__(self, start_token: dict) -> None:
        self.start_key = token_key(start_token)
        # Shards scan from the token's clusterTime inclusive; a HWM start returns events >= it.
        self.scan_from = int(start_token["_data"][2:18], 16)
        self.scanned = 0
        self.last_key: tuple | None = None
        self.pbrt_key: tuple | None = self.start_key
        self.batches = 1  # replies sent, the establish batch included (a promise reply's cover)


class SimShard:
    """One simulated shard (or the config server, ``is_config``) with wall clock skew
    ``skew_ms`` and promise ``mode`` (one of :data:`PROMISE_MODES`)."""

    def __init__(self, sched: Scheduler, idx: int, name: str, skew_ms: int, mode: str,
                 is_config: bool = False) -> None:
        self.sched = sched
        self.idx = idx
        self.name = name
        self.skew_ms = skew_ms
        self.mode = mode
        self.is_config = is_config
        self.last = 0  # HLC as (secs << 32) | inc
        self.oplog: list[tuple[int, SimEvent | None]] = []  # committed, ts order (None = no-op)
        self.in_flight: list[int] = []  # reserved, uncommitted timestamps
        self.seq = 0

    def tick(self) -> int:
        """The next cluster time (``max(wall, last) + 1``)."""
        wall = (self.sched.now + self.skew_ms) // 1000
        if wall > (self.last >> 32):
            self.last = (wall << 32) | 1
        else:
            self.last += 1
        return self.last

    def gossip(self, ts: int) -> None:
        """A ``$clusterTime`` seen in a request: the clock never stays behind it."""
        if ts > self.last:
            self.last = ts

    def visible_upto(self) -> int:
        """Entries with ts below the oldest in-flight write are visible (no oplog holes)."""
        return min(self.in_flight) - 1 if self.in_flight else (1 << 64)

    def commit(self, ts: int, ev: SimEvent | None) -> None:
        """The write reserved at ``ts`` lands in the oplog (``ev`` None: a no-op)."""
        self.in_flight.remove(ts)
        # keep ts order (commits may finish out of order)
        pos = len(self.oplog)
        while pos > 0 and self.oplog[pos - 1][0] > ts:
            pos -= 1
        self.oplog.insert(pos, (ts, ev))

    def has_data(self, cur: ShardCursor) -> bool:
        """Are there visible events the cursor has not returned yet?"""
        upto = self.visible_upto()
        for ts, ev in reversed(self.oplog):
            if ts <= upto and ev is not None:
                return cur.last_key is None or ev.key > cur.last_key
        return False

    def answer(self, cur: ShardCursor, limit: int) -> tuple[list[SimEvent], dict | None]:
        """The events (at most ``limit``) a getMore returns now and its postBatchResumeToken."""
        upto = self.visible_upto()
        out: list[SimEvent] = []
        scanned = cur.scanned
        for ts, ev in self.oplog:
            if ts > upto:
                break
            if ts < cur.scan_from:
                continue
            scanned = max(scanned, ts)
            if ev is None or (cur.last_key is not None and ev.key <= cur.last_key):
                continue
            if cur.start_key is not None and ev.key < cur.start_key:
                continue
            out.append(ev)
            if len(out) >= limit:
                break
        if out:
            cur.last_key = out[-1].key
            cur.scan_from = out[-1].ts
            cur.scanned = max(cur.scanned, out[-1].ts)
            cur.pbrt_key = out[-1].key
            return out, out[-1].token
        cur.scanned = scanned
        cand = self._promise(scanned)
        if cand is not None:
            k = token_key({"_data": hwm_data(cand)})
            if cur.pbrt_key is None or k > cur.pbrt_key:
                cur.pbrt_key = k
        return [], {"_data": cur.pbrt_key[0]} if cur.pbrt_key is not None else None

    def _promise(self, scanned: int) -> int | None:
        """The cluster time an empty batch promises (see the module docstring), or None."""
        if self.mode == "mongod":
            return scanned if scanned else None
        # The next tick is >= max(last + 1, wall << 32 | 1): nothing new can sort below it.
        wall = (self.sched.now + self.skew_ms) // 1000
        cand = max(self.last + 1, (wall << 32) | 1)
        if self.mode == "clock" and self.in_flight:
            cand = min(cand, min(self.in_flight))
        # unsafe-clock ignores in-flight writes (a bug on purpose)
        return cand
