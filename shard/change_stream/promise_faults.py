"""Faults on a shard's change-stream promises and clock, for tests (shardsim's own; test
commands only, like mongod's ``configureFailPoint``).

A shard's *promise* is the ``postBatchResumeToken`` its change-stream cursors give when they
have nothing more to return: a high-water mark (HWM) at the shard's scanned oplog time or safe
clock time (:func:`.cursor.safe_promise_key`), in the replies to empty getMore batches and to the
router's promise requests (``_shardsimAdvanceClusterTime``, :func:`.cursor.register`). The
router releases an event only once every remote promised past it, so these faults make the
merged stream wait for one shard while that shard keeps serving every command:

* fail point ``shardsimStallPromise`` (``configureFailPoint`` modes of
  ``src/mongo/util/fail_point.cpp``; ``{times: n}`` counts promises withheld): the shard's
  promise does not advance past its current value; promise requests get no promise (and do not
  end a waiting getMore). The shard's own events still flow (their tokens are not promises).
  Turning it off wakes the waiting getMores, which then promise at once.
* fail point ``shardsimDelayPromise`` with ``data: {delayMs: N}`` (``{times: n}`` counts
  delayed replies): a getMore reply that carries no event and advances the promise leaves N ms
  after the promise was taken (so it is N ms old on arrival); a batch with events does not
  advance the promise past its last event, and a promise request ends the waiting getMore
  (whose reply is then delayed) instead of answering with promises. BadValue (2) without a
  non-negative number ``delayMs``.
* a clock pin (``{_shardsimSetClusterTime: T}``, :mod:`shard.commands.testing`): the shard's
  next oplog entry gets cluster time exactly T (even when gossip moved the clock to T or past
  it meanwhile), so two shards pinned at one T write events that tie on ``clusterTime`` and the
  router orders them by the rest of the resume token. Until that entry, promises stay at or
  below HWM(T) (which sorts before an event at T, ``resume_token.cpp``), a promise past T is
  never given, and the periodic no-op writer skips (it would take T). A pin below an entry
  already in the oplog is dropped (the entry ticks as usual).

The state is :class:`PromiseFaults`, ``ShardNode.cs_promise_faults``; the cursor pays one
attribute test (``faults.on``) on the paths that give promises while no fault is set.
"""

from __future__ import annotations

from typing import Any

from bson.timestamp import Timestamp

from shardsim.core.clock import ts_from_key, ts_key
from shardsim.core.errors import MongoError
from shardsim.core.failpoints import FailPoint
from shardsim.core.protocol.shard import SetClusterTime

STALL_PROMISE = "shardsimStallPromise"
DELAY_PROMISE = "shardsimDelayPromise"
PIN_COMMAND = SetClusterTime.NAME


class PromiseFailPoint(FailPoint):
    """A :class:`~shardsim.core.failpoints.FailPoint` whose (re)configuration updates the node's
    :class:`PromiseFaults` (and checks ``delayMs`` for ``shardsimDelayPromise``)."""

    def __init__(self, name: str, faults: "PromiseFaults") -> None:
        super().__init__(name)
        self.faults = faults

    def configure(self, mode: Any, data: Any) -> int:
        """As :meth:`FailPoint.configure`; BadValue (2) when ``shardsimDelayPromise`` is turned
        on without ``data.delayMs``, a non-negative number (ms)."""
        if self.name == DELAY_PROMISE and mode != "off":
            ms = data.get("delayMs") if isinstance(data, dict) else None
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms < 0:
                raise MongoError(2, "shardsimDelayPromise needs data.delayMs, a non-negative "
                                    "number of milliseconds")
        prev = super().configure(mode, data)
        self.faults.changed()
        return prev


class PromiseFaults:
    """The promise faults of one shard (see the module docstring).

    ``on``: any fault set (the cursors' one cheap test); ``stall`` / ``delay``: the fail points;
    ``pin``: the pinned cluster time as a ts key (0 = none)."""

    __slots__ = ("node", "on", "stall", "delay", "pin")

    def __init__(self, node: Any) -> None:
        self.node = node
        self.on = False
        self.stall = PromiseFailPoint(STALL_PROMISE, self)
        self.delay = PromiseFailPoint(DELAY_PROMISE, self)
        self.pin = 0

    def changed(self) -> None:
        """Recompute ``on``; wake the getMores waiting for a requested promise, which may be
        given now (a stall or pin cleared)."""
        self.on = self.stall.active or self.delay.active or self.pin != 0
        waiters = self.node.cs_promise_waiters
        if waiters.key:
            waiters.request(waiters.key)

    # -- what the cursor asks ---------------------------------------------------------------
    def promise_key(self, key: int, current: int) -> int:
        """The promise (ts key of a HWM) a cursor at ``current`` may give instead of ``key``:
        ``current`` while stalled, at most the pin while pinned."""
        if key <= current:
            return key
        if self.stall.active and self.stall.should_fail():
            return current
        if self.pin and key > self.pin:
            key = max(self.pin, current)
        return key

    def withholds(self, requested: int) -> bool:
        """True when no promise past ``requested`` (a ts key) can be given now."""
        return self.stall.active or (self.pin != 0 and requested >= self.pin)

    def delay_ms(self) -> float:
        """The delay (ms) of this promise reply, 0 when none (counts ``times``)."""
        d = self.delay
        if d.active and d.should_fail():
            return float(d.data.get("delayMs") or 0)
        return 0.0

    # -- the clock pin ----------------------------------------------------------------------
    def set_pin(self, ts: Timestamp) -> None:
        """Pin the next oplog entry's time at ``ts``; ``Timestamp(0, 0)`` clears the pin.
        BadValue (2) when ``ts`` is not past the shard's cluster time and newest oplog entry
        (it could be promised already)."""
        key = ts_key(ts)
        if key:
            node = self.node
            now = max(node.clock.now_key(), node.oplog.latest_key)
            if key <= now:
                raise MongoError(2, f"{PIN_COMMAND}: {ts} is not after this shard's cluster "
                                    f"time {ts_from_key(now)}")
            node.clock.check(ts, PIN_COMMAND)
        self.pin = key
        self.changed()

    def take_pin(self) -> Timestamp:
        """The time of the oplog entry being made while pinned (``ShardNode.make_entry``): the
        pin, unless an entry at or after it exists (then an ordinary tick); the pin is used up."""
        pin, self.pin = self.pin, 0
        node = self.node
        self.changed()  # wakes waiting getMores after this step (future callbacks)
        if pin <= node.oplog.latest_key:
            return node.clock.tick()
        ts = ts_from_key(pin)
        node.clock.restore(ts)  # never behind the entry; gossip may have moved it past already
        return ts


# The faults of a node that declares none (test doubles of a shard): never on, never changed.
NO_FAULTS = PromiseFaults(None)


def install(node: Any) -> None:
    """Add the promise fail points to ``node.failpoints`` (configurable only with test
    commands on, where ``configureFailPoint`` exists)."""
    faults = node.cs_promise_faults
    node.failpoints.add(faults.stall)
    node.failpoints.add(faults.delay)


__all__ = ["DELAY_PROMISE", "NO_FAULTS", "PIN_COMMAND", "PromiseFaults", "STALL_PROMISE", "install"]
