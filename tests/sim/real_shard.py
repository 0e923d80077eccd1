"""Shards that run shardsim's real shard change-stream code under the seeded scheduler.

A :class:`RealShard` is a :class:`.shard_model.SimShard` (the same skewed hybrid logical clock,
the same writes, commit delays and promise mode names) whose change-stream cursors are the real
ones: each client stream's cursor on it is opened by ``shard.change_stream.aggregate_change_stream``
(the shard's ``aggregate`` handler: ``open_cursor``, the pipeline of
``shard/change_stream/pipeline.py`` run by ``shard/change_stream/cursor.py``
``ChangeStreamCursor``, registered in a real ``shardsim.core.cursors.CursorManager``) over a real
in-memory ``shard.oplog.Oplog``, and each getMore is ``CursorManager.get_more``. The replies
(events with ``$sortKey``, ``postBatchResumeToken``, the vouched layout sizes) are BSON-encoded
and read back by the router's own reply parser (``router.change_stream.cursor._cursor_batch``:
``split_cursor`` Blocks, or ``item_from_raw_event`` per event), so the merge and every checker
judge the real shard's output.

What the simulation still decides (in virtual time, from the seed):

* **Visibility.** A write reserves its timestamp at once and commits after a random delay; an
  entry is appended to the real oplog once every earlier reservation committed (mongod's oplog
  visibility: readers never see a hole). ``node.oplog`` therefore only ever grows in ts order.
* **The clock the cursor reads** (``safe_promise_key`` reads ``node.clock.now_key()``). A real
  shardsim shard ticks its clock and appends the entry in one synchronous step, so no reserved
  timestamp is ever missing from its oplog; the simulated shard has in-flight writes, so its
  clock as the cursor sees it (:class:`ClockView`) is the HLC capped below the oldest in-flight
  write (mode ``clock``), which is that guarantee. Mode ``unsafe-clock`` hands the cursor the raw
  HLC: the real cursor then promises past writes still in flight, and the checkers must see it.
  Mode ``mongod`` runs the cursor in its ``mongod`` promise mode (newest scanned oplog time; the
  periodic no-ops are real ``{op: "n"}`` entries).
* **Waiting.** Every getMore runs to completion in one step (``maxTimeMS: 0``, with a private
  event loop as the running loop: :func:`run_now`), so nothing ever waits in real time and a
  seed replays exactly. The awaitData wait is
  the simulation's: while a getMore is pending the cursor is *parked* as the real ``_wait``
  parks it (its ``_wake`` set, listed in ``node.cs_promise_waiters``), so real oplog appends
  (``_on_append``) and real promise requests (``PromiseWaiters.request``) wake it, or give a
  promise reply, exactly as on a shard; a wake makes the simulation answer the getMore soon.

The config server stays modelled (:class:`.shard_model.SimShard` with ``is_config``).
"""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable

import bson
from bson import Binary, Timestamp
from bson.raw_bson import RawBSONDocument

from shardsim.router.change_stream.cursor import _cursor_batch, _plain
from shardsim.router.change_stream.raw_events import item_from_raw_event
from shardsim.shard.change_stream import aggregate_change_stream
from shardsim.shard.change_stream.check_resumability import INITIATING_SET_MSG
from shardsim.shard.change_stream.cursor import ChangeStreamCursor, PromiseWaiters
from shardsim.shard.change_stream.promise_faults import NO_FAULTS
from shardsim.shard.oplog import Oplog
from shardsim.core import resume_token as rt
from shardsim.core.clock import ts_from_key, ts_key
from shardsim.core.cursors import CursorManager
from shardsim.core.errors import MongoError

from .scheduler import Scheduler
from .shard_model import SimEvent, SimShard

if TYPE_CHECKING:
    from shardsim.router.change_stream.async_results_merger import Remote

    from .stream import Stream

DB, COLL = "db", "coll"
NS = f"{DB}.{COLL}"
# One sharded collection: the same UUID on every shard, so events at the same cluster time on
# two shards are ordered by their documentKey (a cluster-wide unique _id).
COLL_UUID = Binary(bytes.fromhex("5a5e5eed000040008000000000000001"), 4)
WALL = datetime.datetime(2026, 1, 1)


def event_token(ts: int, doc_id: int) -> dict[str, Any]:
    """The resume token the shard must give the insert of ``{_id: doc_id}`` at cluster time
    ``ts`` (a ts key), from the generic encoder (``resume_token.event_token``), not the fused
    path the cursor uses: the two must agree or the event is not recognised."""
    return rt.event_token(ts_from_key(ts), bytes(COLL_UUID), "insert", {"_id": doc_id})


def oplog_entry(ts: int, ev: SimEvent | None) -> dict[str, Any]:
    """The oplog entry of a committed write (``ShardNode.make_entry``'s field order): an insert
    into ``db.coll``, or a periodic no-op when ``ev`` is None."""
    if ev is None:
        return {"op": "n", "ns": "", "o": {"msg": "periodic noop"}, "ts": ts_from_key(ts),
                "t": 1, "v": 2, "wall": WALL}
    doc_id = ev.meta["_id"]
    return {"op": "i", "ns": NS, "ui": COLL_UUID, "o": {"_id": doc_id},
            "o2": {"_id": doc_id}, "ts": ts_from_key(ts), "t": 1, "v": 2, "wall": WALL}


class ClockView:
    """``node.clock`` as the real cursor reads it (see the module docstring): ``now_key()``
    the shard's HLC, capped below its oldest in-flight write unless the mode is
    ``unsafe-clock``; ``advance(ts)`` gossips in (a promise request's time)."""

    __slots__ = ("shard",)

    def __init__(self, shard: SimShard) -> None:
        self.shard = shard

    def now_key(self) -> int:
        sh = self.shard
        if sh.in_flight and sh.mode != "unsafe-clock":
            return min(sh.last, min(sh.in_flight) - 1)
        return sh.last

    def now(self) -> Timestamp:
        return ts_from_key(self.now_key())

    def advance(self, ts: Timestamp | None) -> None:
        if ts is not None:
            self.shard.gossip(ts_key(ts))


class FakeNode:
    """The little of a ``ShardNode`` the change-stream code reads: ``oplog``, ``clock``,
    ``options['promise_mode']``, ``cs_promise_waiters`` and ``cursors`` (as in
    ``tests/unit/test_change_stream_cursor.py``)."""

    def __init__(self, shard: SimShard) -> None:
        self.clock = ClockView(shard)
        self.oplog = Oplog()
        self.stream_oplog = self.oplog
        self.repl = None
        self.options = {"promise_mode": "mongod" if shard.mode == "mongod" else "clock"}
        self.cs_promise_waiters = PromiseWaiters()
        self.cursors = CursorManager()
        self.pre_images = None
        self.cs_promise_faults = NO_FAULTS
        self.sharding = None
        self.profile = None
        self.noop_writer_task = None


@dataclass(eq=False)
class RealCursor:
    """One client stream's real cursor on a :class:`RealShard`: ``cursor`` the
    ``ChangeStreamCursor``, ``id`` its cursor id, ``stream``/``remote`` whose it is, ``on_wake``
    the pending getMore's answer (called when the cursor is woken while parked)."""

    shard: RealShard
    stream: Stream
    cursor: ChangeStreamCursor
    id: int
    remote: Remote | None = None
    on_wake: Callable[[], None] | None = None


class SimWake:
    """Stands in for the future a getMore parks on (``ChangeStreamCursor._wait``): setting it
    records the cursor as woken (:meth:`RealShard.flush_wakes` answers it)."""

    __slots__ = ("handle", "_done")

    def __init__(self, handle: RealCursor) -> None:
        self.handle = handle
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, _value: Any) -> None:
        if not self._done:
            self._done = True
            self.handle.shard.woken.append(self.handle)


def run_now(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    """Run ``coro`` to its end in one step, with ``loop`` as the running loop (the cursor reads
    ``loop.time()``), and return its result. Every shard call of the simulation finishes
    without waiting (``maxTimeMS: 0``, ``batchSize: 0``); one that awaits is a harness bug:
    AssertionError. (Cheaper than ``run_until_complete``, which adds a Task per call.)"""
    asyncio._set_running_loop(loop)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    finally:
        asyncio._set_running_loop(None)
    coro.close()
    raise AssertionError("a shard call waited: the simulation runs them with maxTimeMS 0")


def _wire(reply: dict[str, Any]) -> RawBSONDocument:
    """A shard's ``cursor`` reply subdocument as the router receives it (raw BSON)."""
    return RawBSONDocument(bson.encode({"cursor": reply, "ok": 1.0}))["cursor"]


class RealShard(SimShard):
    """A data shard whose change-stream cursors are shardsim's own (see the module docstring).
    ``loop`` is the world's private event loop every shard call runs to completion on."""

    def __init__(self, sched: Scheduler, idx: int, name: str, skew_ms: int, mode: str,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(sched, idx, name, skew_ms, mode)
        self.loop = loop
        self.node = FakeNode(self)
        # mongod's first entry: streams may start before it without ChangeStreamHistoryLost.
        self.node.oplog.append({"op": "n", "ns": "", "o": {"msg": INITIATING_SET_MSG},
                                "ts": Timestamp(0, 1), "wall": WALL})
        self.last = max(self.last, 1)
        self.published = 0  # entries of self.oplog appended to node.oplog
        self.woken: list[RealCursor] = []
        self.handles: dict[int, RealCursor] = {}
        self.getmores = 0  # counters, for the tests: getMores run, wakes, promise replies
        self.wakes = 0
        self.promises = 0

    # -- writes -------------------------------------------------------------------------------
    def commit(self, ts: int, ev: SimEvent | None) -> None:
        """The write at ``ts`` commits; every entry now visible goes to the real oplog (which
        wakes the parked cursors whose filter admits it)."""
        assert not self.published or ts > self.oplog[self.published - 1][0], "below visibility"
        super().commit(ts, ev)
        upto = self.visible_upto()
        log = self.oplog
        while self.published < len(log) and log[self.published][0] <= upto:
            t, e = log[self.published]
            self.published += 1
            self.node.oplog.append(oplog_entry(t, e))
        self.flush_wakes()

    # -- the router's requests ----------------------------------------------------------------
    def open(self, stream: Stream, start: dict[str, Any], at_time: bool
             ) -> tuple[RealCursor, list[Any], int, Any]:
        """The router's establish ``aggregate`` (``startAtOperationTime`` of the start token's
        time when ``at_time``, else ``resumeAfter: start``; ``needsMerge``, ``batchSize: 0``):
        the cursor, its first batch's items, cursor id and postBatchResumeToken. Raises the
        shard's MongoError (e.g. ChangeStreamHistoryLost, 286)."""
        spec: dict[str, Any] = ({"startAtOperationTime": ts_from_key(rt.token_ts_key(start["_data"]))}
                                if at_time else {"resumeAfter": start})
        body = {"aggregate": COLL, "pipeline": [{"$changeStream": spec}], "needsMerge": True,
                "fromRouter": True, "cursor": {"batchSize": 0}}
        reply = run_now(self.loop, aggregate_change_stream(self.node,
                                                           SimpleNamespace(db=DB, body=body)))
        meta, items = _cursor_batch(_wire(reply["cursor"]), "firstBatch", False)
        cid = int(meta.get("id", 0))
        handle = RealCursor(self, stream, self.node.cursors.get(cid), cid)
        self.handles[cid] = handle
        return handle, items, cid, _plain(meta.get("postBatchResumeToken"))

    def ready(self, h: RealCursor) -> bool:
        """Would a getMore on ``h`` return at once (events to return, or a requested promise it
        can give)? Scans as the cursor's own promise-request path does."""
        cur = h.cursor
        try:
            cur._scan(1)
        except MongoError:  # e.g. history lost: the getMore reports it at once
            return True
        return bool(cur.pending) or cur.closing or cur._can_promise_past_request()

    def park(self, h: RealCursor, on_wake: Callable[[], None]) -> None:
        """``h``'s getMore waits (as ``ChangeStreamCursor._wait``): oplog appends and promise
        requests can now wake it; ``on_wake`` then answers it."""
        h.on_wake = on_wake
        h.cursor._wake = SimWake(h)  # type: ignore[assignment]
        self.node.cs_promise_waiters.cursors.add(h.cursor)

    def getmore(self, h: RealCursor, limit: int, use_blocks: bool) -> tuple[list[Any], int, Any]:
        """Unpark ``h`` and run a getMore (``batchSize: limit``, ``maxTimeMS: 0``): its items
        (``split_cursor`` when ``use_blocks``, else ``item_from_raw_event`` per event), cursor
        id and postBatchResumeToken. Raises the shard's MongoError."""
        cur = h.cursor
        cur._wake = None
        self.node.cs_promise_waiters.cursors.discard(cur)
        h.on_wake = None
        self.getmores += 1
        reply = run_now(self.loop, self.node.cursors.get_more(h.id, COLL, limit, 0))
        raw = _wire(reply)
        if use_blocks:
            meta, items = _cursor_batch(raw, "nextBatch", False)
        else:
            meta, items = raw, [item_from_raw_event(e) for e in raw.get("nextBatch", [])]
        return items, int(meta.get("id", 0)), _plain(meta.get("postBatchResumeToken"))

    def promise_request(self, t: int, reply_promises: bool) -> list[tuple[RealCursor, int, Any]]:
        """The router's ``_shardsimAdvanceClusterTime: T`` (after its gossip moved the clock):
        the real ``PromiseWaiters.request``; returns the promise replies as (cursor, batches,
        postBatchResumeToken), in stream order. Woken getMores are answered soon."""
        promises = self.node.cs_promise_waiters.request(t, reply_promises)
        self.flush_wakes()
        out = [(self.handles[int(p["id"])], int(p["batches"]), p["postBatchResumeToken"])
               for p in promises]
        out.sort(key=lambda x: x[0].stream.sid)
        self.promises += len(out)
        return out

    def flush_wakes(self) -> None:
        """Schedule the answers of the getMores woken since the last call, in stream order (a
        set's order would not replay)."""
        woken, self.woken = self.woken, []
        for h in sorted(woken, key=lambda h: h.stream.sid):
            if h.on_wake is not None:
                self.wakes += 1
                self.sched.at(self.sched.now + self.sched.rng.randint(0, 5), h.on_wake)
