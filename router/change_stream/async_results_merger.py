"""The router's AsyncResultsMerger for change streams: a pure, sans-IO merge of shard cursors.

Mirrors ``src/mongo/s/query/exec/async_results_merger.cpp`` (ARM) as described in
``shared/reference/server-internals-notes.md`` §1 and §9, plus the two router-side merge stages
that sit above ``$mergeCursors`` on a real mongos:
``DocumentSourceChangeStreamHandleTopologyChange`` (swallow config.shards events, open cursors on
new shards) and ``DocumentSourceChangeStreamEnsureResumeTokenPresent`` (§8.2).

Nothing here does I/O or sleeps. The owner (``router/change_stream.py`` on a real router, or
``router/sim.py`` on a seeded simulated scheduler) feeds it shard replies and asks it what to
release; the same code therefore runs in the simulation and in the router.

Vocabulary:

- a *remote* is one shard cursor (or the config server's ``config.shards`` cursor);
- a *key* is the sort key of a resume token ``{_data, [_typeBits]}``: ``(_data, flag, bytes)``,
  which orders exactly like BSON comparison of the token documents (``_data`` hex string first,
  i.e. memcmp of the KeyString; a token carrying ``_typeBits`` sorts after one without);
- a remote's *promise* is its latest ``postBatchResumeToken`` (it will never return an event
  with a lower key);
- the *high-water mark* (HWM) is the token the router reports as its own postBatchResumeToken.

Ordering rule (§1.5): a buffered event is released only when its key is ``<=`` the minimum
promise over ALL remotes (config cursor included), and only once every remote has promised.
"""

from __future__ import annotations

import heapq
import struct
from collections import deque
from operator import attrgetter
from dataclasses import dataclass, field
from typing import Any, Iterable

from shardsim import resume_token as rt
from shardsim.clock import ts_from_key
from shardsim.cursors import array_header_bytes
from shardsim.errors import MongoError


from router.change_stream.raw_events import (ID_MODIFIED_MSG, Block, Item, Key, _fmt,  # noqa: F401
                                            item_from_raw_event, split_cursor, strip_sort_key,
                                            token_key)

CONFIG_SHARDS_NS = "config.shards"



# ---------------------------------------------------------------------------------------------
# Token helpers
# ---------------------------------------------------------------------------------------------

def hwm_data(ts_key_value: int, version: int = 2) -> str:
    """``_data`` of ``makeHighWaterMarkToken(ts, version)`` for a Timestamp given as the 64-bit
    integer ``(secs << 32) | inc`` (see :func:`shardsim.clock.ts_key`)."""
    return hwm_token(ts_key_value, version)["_data"]


def hwm_token(ts_key_value: int, version: int = 2) -> dict[str, Any]:
    """The high-water-mark resume token document ``{_data}`` for a Timestamp key."""
    return rt.make_high_water_mark(ts_from_key(ts_key_value), version)


def is_hwm_data(data: str) -> bool:
    """True when ``_data`` is a high-water-mark token (v1 or v2), i.e. ``isHighWaterMarkToken``."""
    ts = token_ts_key(data)
    return ts is not None and data in (hwm_data(ts, 2), hwm_data(ts, 1))


def token_ts_key(data: str) -> int | None:
    """The clusterTime (as a 64-bit key) encoded at the front of a KeyString token, or None."""
    if len(data) >= 18 and data[:2] in ("82", "82".lower()):
        try:
            return int(data[2:18], 16)
        except ValueError:
            return None
    return None


def is_invalidate_data(data: str) -> bool:
    """Does the token ``_data`` decode with ``fromInvalidate: true``? False for anything that is
    not a well-formed token (the shards reject those when the stream is opened)."""
    try:
        return rt.decode({"_data": data}).fromInvalidate
    except MongoError:
        return False


# ---------------------------------------------------------------------------------------------
# The AsyncResultsMerger core
# ---------------------------------------------------------------------------------------------

class Remote:
    """Per-remote state (ARM ``RemoteCursorData``).

    ``name`` — shard id (or ``"config"``); ``ns`` — the remote cursor's namespace;
    ``cursor_id`` — 0 once exhausted; ``buffer`` — events received, not yet released;
    ``promise``/``promise_token`` — latest postBatchResumeToken (key, document);
    ``eligible`` — may set the HWM (§1.4); ``in_flight`` — a getMore is outstanding;
    ``status`` — the first error (MongoError) this remote reported; ``queued`` — how many of
    its events sit in the merger's release queue (taken from ``buffer``, proven ready);
    ``more`` — set by the owner when the remote's last batch was full (it has a backlog), so
    it may be polled while its buffer still holds fewer than ``PREFETCH_BYTES`` bytes;
    ``batches`` — replies processed (establish batch included), what an out-of-band promise
    is checked against (:meth:`Merger.on_promise`).
    """

    __slots__ = ("rid", "name", "ns", "is_config", "cursor_id", "buffer", "promise",
                 "promise_token", "eligible", "invalidated", "in_flight", "status", "closed",
                 "last_key", "address", "queued", "more", "batches")

    def __init__(self, rid: int, name: str, ns: str, is_config: bool) -> None:
        self.rid = rid
        self.name = name
        self.ns = ns
        self.is_config = is_config
        self.cursor_id = 0
        self.buffer: deque[Item] = deque()
        self.promise: Key | None = None
        self.promise_token: Any = None
        self.eligible = False
        self.invalidated = False
        self.in_flight = False
        self.status: MongoError | None = None
        self.closed = False
        self.last_key: Key | None = None
        self.address = ""
        self.queued = 0
        self.more = False
        self.batches = 0

    @property
    def exhausted(self) -> bool:
        return self.cursor_id == 0

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Remote({self.name}, id={self.cursor_id}, buf={len(self.buffer)}, "
                f"promise={self.promise and self.promise[0]}, eligible={self.eligible})")


class Merger:
    """The change-stream half of the ARM (sorted, TailableAndAwaitData).

    Feed it with :meth:`add_remote` (establish-time batch) and :meth:`on_batch` /
    :meth:`on_error` (getMore replies); ask :meth:`ready`, :meth:`next_ready`,
    :meth:`high_water_mark`, :meth:`remotes_to_poll`. Errors: :meth:`next_ready` raises the
    first remote error (MongoError with the remote's code) once any remote failed.

    Releasing is done in runs: when asked, every buffered event at or below the minimum promise
    is moved, k-way merged (``heapq.merge``), into a release queue at once, instead of scanning
    all remotes for every event. The queue is exactly the sequence the per-event rule would
    release (promises only grow; when a remote is added its promise may be lower, so the queue
    is then put back into the buffers). A remote whose events all moved to the queue has an
    empty buffer and is polled again (its next batch is fetched while the queue drains).
    """

    def __init__(self) -> None:
        self.remotes: list[Remote] = []
        self._next_rid = 0
        self.hwm: Key | None = None
        self.hwm_token: Any = None
        self.status: MongoError | None = None
        self._queue: deque[Item] = deque()

    # -- remotes ------------------------------------------------------------------------------
    def add_remote(self, name: str, ns: str, cursor_id: int, first_batch: Iterable[Item],
                   pbrt: Any, *, is_config: bool = False) -> Remote:
        """Add a remote and process its establish-time batch like a getMore reply
        (``_buildRemote`` / ``addNewShardCursors``): its PBRT participates at once."""
        self._unqueue()  # the new remote's promise may be below queued events
        remote = Remote(self._next_rid, name, ns, is_config or ns == CONFIG_SHARDS_NS)
        self._next_rid += 1
        self.remotes.append(remote)
        self.on_batch(remote, list(first_batch), cursor_id, pbrt)
        return remote

    def set_initial_high_water_mark(self) -> None:
        """``_setInitialHighWaterMark``: the lowest promise of an eligible remote (the config
        cursor is never eligible on its first batch)."""
        cands = sorted((r.promise, r.rid, r) for r in self.remotes
                       if r.promise is not None)
        for key, _, r in cands:
            if r.eligible:
                self.hwm, self.hwm_token = key, r.promise_token
                return

    def remove_remote(self, remote: Remote) -> None:
        """``closeShardCursors``: forget a remote; its buffered events are still released."""
        remote.closed = True
        if not remote.buffer and not remote.queued:
            self.remotes.remove(remote)

    # -- responses ----------------------------------------------------------------------------
    def on_batch(self, remote: Remote, items: list[Item], cursor_id: int, pbrt: Any,
                 *, invalidated: bool = False) -> None:
        """Process one reply (``_updateRemoteMetadata`` + ``_addBatchToBuffer``).

        ``items`` in the remote's order; ``pbrt`` the reply's postBatchResumeToken (or None).
        A PBRT lower than the remote's previous promise, or an event below it, is an
        InternalError (1) recorded as the remote's status (the ARM's invariant).
        """
        remote.in_flight = False
        remote.batches += 1
        remote.cursor_id = int(cursor_id)
        remote.invalidated = invalidated
        old_promise = remote.promise
        if pbrt is not None:
            new_key = token_key(pbrt)
            eligible = self._check_eligibility(new_key, remote, bool(items))
            if remote.promise is not None and new_key < remote.promise:
                self._fail(remote, MongoError(1, f"postBatchResumeToken from {remote.name} went "
                                                 f"backwards: {new_key[0]} < {remote.promise[0]}"))
                return
            remote.eligible = eligible
            remote.promise, remote.promise_token = new_key, pbrt
        if items and old_promise is not None and items[0].key < old_promise:
            # The remote broke its own promise: releasing would reorder the stream.
            self._fail(remote, MongoError(1, f"{remote.name} returned an event "
                                             f"{items[0].key[0]} below its earlier "
                                             f"postBatchResumeToken {old_promise[0]}"))
            return
        for it in items:  # Items, or a Block (its own events are in the shard's order)
            if remote.last_key is not None and it.key <= remote.last_key:
                self._fail(remote, MongoError(1, f"events from {remote.name} out of order: "
                                                 f"{it.key[0]} after {remote.last_key[0]}"))
                return
            remote.last_key = it.last
            it.src = remote
            remote.buffer.append(it)
        if items and remote.promise is not None and items[-1].last > remote.promise:
            self._fail(remote, MongoError(1, f"postBatchResumeToken from {remote.name} is below "
                                             f"its last event"))

    def on_promise(self, remote: Remote, batches: int, pbrt: Any) -> bool:
        """An out-of-band promise (shardsim's promise reply, ``shard/change_stream/cursor.py``
        ``register``): the remote will return no event at or below ``pbrt`` after its first
        ``batches`` replies. Applied like an empty batch's postBatchResumeToken once that many
        replies were processed here; ignored when fewer were (its events may still be on the
        way), when it is not newer than the remote's promise (a later reply already carried
        it), or when the remote failed or closed. Returns True when the promise moved."""
        if remote.closed or remote.status is not None or remote.batches < batches:
            return False
        key = token_key(pbrt)
        if remote.promise is not None and key <= remote.promise:
            return False
        if remote.last_key is not None and key < remote.last_key:
            return False  # below an event it already returned: not a promise of this cursor
        remote.eligible = self._check_eligibility(key, remote, False)
        remote.promise, remote.promise_token = key, pbrt
        return True

    def on_error(self, remote: Remote, exc: MongoError) -> None:
        """A getMore (or establish) on ``remote`` failed: the first error wins (§1.10)."""
        remote.in_flight = False
        self._fail(remote, exc)

    def _fail(self, remote: Remote, exc: MongoError) -> None:
        if remote.status is None:
            remote.status = exc
        if self.status is None:
            self.status = exc

    def _check_eligibility(self, new_key: Key, remote: Remote, non_empty: bool) -> bool:
        """``_checkHighWaterMarkEligibility`` (§1.4): only the config.shards cursor is special."""
        if not remote.is_config:
            return True
        if self.hwm is not None and new_key < self.hwm:
            return False  # future startAtOperationTime: hold the HWM at the user's start
        if non_empty:
            return False  # a shard-added event will be swallowed; its token is not resumable
        if remote.eligible:
            return True
        return remote.promise is not None and new_key > remote.promise

    # -- readiness ----------------------------------------------------------------------------
    def min_promise(self) -> Remote | None:
        """The remote holding the lowest promise, or None unless every remote has one."""
        best: Remote | None = None
        for r in self.remotes:
            if r.closed:
                continue
            if r.promise is None:
                return None
            if best is None or (r.promise, r.rid) < (best.promise, best.rid):
                best = r
        return best

    def _head(self) -> Remote | None:
        best: Remote | None = None
        for r in self.remotes:
            if r.buffer and (best is None or (r.buffer[0].key, r.rid) < (best.buffer[0].key, best.rid)):
                best = r
        return best

    def _unqueue(self) -> None:
        """Put queued events back at the front of their remotes' buffers (in order)."""
        q = self._queue
        while q:
            it = q.pop()
            it.src.buffer.appendleft(it)
            it.src.queued -= it.n

    def _refill(self) -> bool:
        """Move every event that is ready now (key ``<=`` the minimum promise over all
        remotes; everything once only closed remotes are left) into the release queue, in
        merged order (ties: lowest remote id first, as :meth:`_head`). True when it queued any."""
        live = [r for r in self.remotes if r.buffer]
        if not live:
            return False
        mp = self.min_promise()
        if mp is None:
            if not all(r.closed for r in self.remotes):
                return False
            bound = None
        else:
            bound = mp.promise
        runs: list[list[Any]] = []
        for r in live:  # self.remotes is in remote id order
            buf = r.buffer
            if bound is None or buf[-1].last <= bound:
                run = list(buf)
                buf.clear()
            else:
                run = []
                while buf and buf[0].key <= bound:  # type: ignore[operator]
                    e = buf[0]
                    if e.last <= bound:
                        run.append(buf.popleft())
                    else:  # a Block straddling the bound: release its head
                        run.append(e.split(e.count_le(bound)))
                        break
            if run:
                r.queued += sum(e.n for e in run)
                runs.append(run)
        if not runs:
            return False
        if len(runs) == 1:
            self._queue.extend(runs[0])
        else:
            self._queue.extend(_merge_runs(runs))
        return True

    def ready(self) -> bool:
        """``_readySortedTailable``: an error is pending, or the smallest buffered event is
        ``<=`` the minimum promise over all remotes."""
        if self.status is not None:
            return True
        return bool(self._queue) or self._refill()

    def next_ready(self) -> tuple[Item, Remote]:
        """Pop the smallest ready event (``_nextReadySorted``); the HWM follows it when its
        remote is eligible. Raises the pending remote error (MongoError)."""
        if self.status is not None:
            raise self.status
        q = self._queue
        if not q:
            assert self._refill(), "next_ready() called when not ready"
        if type(q[0]) is Block:
            blk = q[0]
            item = blk.pop_item()
            if not blk.n:
                q.popleft()
        else:
            item = q.popleft()
        head: Remote = item.src
        head.queued -= 1
        if head.closed and not head.buffer and not head.queued:
            self.remotes.remove(head)
        if head.eligible and (self.hwm is None or item.key > self.hwm):
            self.hwm, self.hwm_token = item.key, item.token
        return item, head

    def high_water_mark(self) -> Any:
        """``getHighWaterMark`` (§1.7): when nothing is ready, advance to the lowest promise if
        its remote is eligible. Returns the token document (or None before any promise)."""
        mp = self.min_promise()
        if mp is not None and not self.ready() and mp.eligible:
            if self.hwm is None or mp.promise > self.hwm:  # type: ignore[operator]
                self.hwm, self.hwm_token = mp.promise, mp.promise_token
        return self.hwm_token

    def invalidated_remote(self) -> Remote | None:
        """``_assertNotInvalidated``: the remote owning the minimum promise when it is
        invalidated and nothing is ready, else None."""
        mp = self.min_promise()
        if mp is not None and mp.invalidated and not self.ready():
            return mp
        return None

    def remotes_to_poll(self) -> list[Remote]:
        """``_scheduleGetMores``: remotes with an empty buffer, a live cursor and no request
        in flight. A remote holding events is polled only when its last batch was full
        (``more``) and its buffer holds less than ``PREFETCH_BYTES`` (prefetch while its buffer
        drains; still at most one request in flight per remote cursor)."""
        if self.status is not None:
            return []
        return [r for r in self.remotes
                if (not r.buffer or (r.more and sum(e.nbytes for e in r.buffer) < PREFETCH_BYTES))
                and r.cursor_id != 0 and not r.in_flight and not r.closed]

    def blocking_remotes(self) -> tuple[Item | None, list[Remote]]:
        """When the smallest buffered event is not ready only because of promises: that event
        and the live remotes whose promise is missing or below its key (they hold it back).
        ``(None, [])`` when nothing is buffered, an event is ready or an error is pending.
        Pure; used by the router to ask exactly those remotes for a newer promise."""
        if self.status is not None:
            return None, []
        head = self._head()
        if head is None or self.ready():
            return None, []
        first = head.buffer[0]
        item = first.item_at(first.lo) if type(first) is Block else first
        return item, [r for r in self.remotes
                      if not r.closed and not r.buffer and r.cursor_id != 0
                      and (r.promise is None or r.promise < item.key)]

    def has_in_flight(self) -> bool:
        return any(r.in_flight for r in self.remotes)


_KEY = attrgetter("key")


def _merge_runs(runs: list[list[Any]]) -> Iterable[Any]:
    """Merge the ready runs of several remotes (each in key order; ties: lower remote id
    first, the order of ``runs``). When their key ranges do not overlap (a backlog read shard
    by shard) the runs are concatenated whole, Blocks intact; otherwise every Block is
    unrolled into Items and the events are k-way merged."""
    spans = sorted(((run[0].key, i, run[-1].last) for i, run in enumerate(runs)))
    if all(spans[j][2] < spans[j + 1][0] for j in range(len(spans) - 1)):
        return [e for _, i, _ in spans for e in runs[i]]
    unrolled = []
    for run in runs:
        items: list[Item] = []
        for e in run:
            if type(e) is Block:
                items.extend(e.item_at(i) for i in range(e.lo, e.hi))
            else:
                items.append(e)
        unrolled.append(items)
    return heapq.merge(*unrolled, key=_KEY)


# A remote with a backlog is asked for its next batch while its buffer holds less than this
# (bytes; one maximum-size reply). Large enough that, when the merge releases one shard's
# events while the others' wait for it (a backlog read), every shard keeps reading its backlog
# at the same time instead of one shard at a time; bounded per remote.
PREFETCH_BYTES = 16 * 1024 * 1024


# ---------------------------------------------------------------------------------------------
# Router-side stages above the ARM
# ---------------------------------------------------------------------------------------------

# Operation types :meth:`ChangeStreamMerge.take` leaves to :meth:`ChangeStreamMerge.next`.
_GENERAL_OPS = frozenset({"invalidate", "kNewShardDetected"})


@dataclass(slots=True)
class NewShard:
    """Output of :meth:`ChangeStreamMerge.next`: open a cursor on ``shard`` with
    ``resumeAfter: start_token`` (HWM of the addShard event's clusterTime + 1 tick) and add it
    with :meth:`Merger.add_remote` before asking for the next event."""

    shard: str
    start_token: dict[str, str]
    host: str | None = None


class ChangeStreamMerge:
    """The merged stream: ARM + HandleTopologyChange + EnsureResumeTokenPresent + invalidate.

    ``resume_token`` — the client's resumeAfter/startAfter token (dict) or None. When it is an
    event token (not a HWM) the merged stream must contain it: identical tokens are swallowed,
    and the first event past it raises ChangeStreamFatalError 280 unless it was seen (§8.2).
    ``known_shards`` — shard names that already have a cursor (config.shards inserts for
    them are ignored).
    """

    def __init__(self, merger: Merger, *, resume_token: Any = None,
                 known_shards: Iterable[str] = (), start_after: bool = False) -> None:
        self.merger = merger
        self.known_shards = set(known_shards)
        self._resume_key: Key | None = None
        self._resume_seen = False
        self._resume_is_invalidate = False
        if resume_token is not None:
            key = token_key(resume_token)
            if not is_hwm_data(key[0]):
                self._resume_key = key
                self._resume_is_invalidate = is_invalidate_data(key[0])
        self.last_key: Key | None = None
        self.invalidated = False
        self._stashed: Item | None = None

    def take(self, limit: int, budget: int | None, count: int, used: int) -> tuple[list[Any], Any, int]:
        """Fast path of :meth:`next` for a catch-up: pop ready plain events (shard events that
        are not ``invalidate``/``kNewShardDetected``, in strictly increasing order, no resume
        check pending) while fewer than ``limit`` are taken and the reply stays within
        ``budget`` bytes. ``count``/``used`` — events/bytes already in the reply (each event
        costs its size plus its array element header; ``budget`` None = payloads are not bytes,
        no byte limit, as in the simulation). Returns (outputs, token of the last event or
        None, new ``used``): each output is one event's payload or a :class:`Block` of several
        (see :meth:`Block.write`). Stops at the first event needing :meth:`next`'s general
        handling, which then takes it; the HWM follows exactly as with :meth:`next`."""
        out: list[Any] = []
        m = self.merger
        if self._stashed is not None or self._resume_key is not None or m.status is not None:
            return out, None, used
        q = m._queue
        last_key = self.last_key
        last: Any = None  # the last output (Item payload's item, or Block)
        hwm = m.hwm
        hwm_src: Any = None  # what set the HWM last here (its token is read once, at the end)
        taken = 0
        while taken < limit and (q or m._refill()):
            e = q[0]
            r = e.src
            key = e.key
            if last_key is not None and key <= last_key:
                break
            if type(e) is Block:
                n = min(limit - taken, e.n)
                if budget is not None:
                    n = e.fit(n, count, used, budget)
                    if n == 0:
                        break
                    used += e.payload_bytes(n) + array_header_bytes(count, count + n)
                if n < e.n:
                    e = e.split(n)
                else:
                    q.popleft()
                key = e.last
                out.append(e)
            else:
                if r.is_config or e.op in _GENERAL_OPS:
                    break
                n = 1
                if budget is not None:
                    sz = len(e.payload) + len(str(count)) + 2
                    if count and used + sz > budget:
                        break
                    used += sz
                q.popleft()
                out.append(e.payload)
            r.queued -= n
            if r.closed and not r.buffer and not r.queued:
                m.remotes.remove(r)
            if r.eligible and (hwm is None or key > hwm):
                hwm, hwm_src = key, e
            last_key = key
            last = e
            count += n
            taken += n
        if hwm_src is not None:
            m.hwm = hwm
            m.hwm_token = hwm_src.last_token
        self.last_key = last_key
        if last is None:
            return out, None, used
        tok = last.last_token
        return out, tok, used

    def push_back(self, item: Item) -> None:
        """Return ``item`` again from the next :meth:`next` (a batch was full, 16 MiB)."""
        self._stashed = item

    def next(self) -> Item | NewShard | None:
        """The next event to return (an :class:`Item`), a :class:`NewShard` action, or None
        when nothing is ready. Raises MongoError for a remote error or a failed resume check."""
        if self._stashed is not None:
            item, self._stashed = self._stashed, None
            return item
        m = self.merger
        while m.ready():
            item, remote = m.next_ready()
            if remote.is_config:
                # HandleTopologyChange: config.shards events are swallowed; inserts add shards.
                meta = item.meta
                if meta.get("is_shard_insert") and meta.get("shard") and meta["shard"] not in self.known_shards:
                    ct = meta.get("cluster_time")
                    if ct is None:
                        ct = token_ts_key(item.key[0]) or 0
                    self.known_shards.add(meta["shard"])
                    return NewShard(meta["shard"], hwm_token(ct + 1), meta.get("host"))
                continue
            if item.op == "kNewShardDetected":
                continue  # legacy signal, swallowed by mongos 4.4+
            if self.last_key is not None and item.key <= self.last_key:
                if item.key == self.last_key:
                    continue  # the same event from two shards (identical token): return it once
                raise MongoError(1, f"change stream merge out of order: {item.key[0]} after "
                                    f"{self.last_key[0]}")
            if self._resume_key is not None:
                if item.key < self._resume_key:
                    continue
                if item.key == self._resume_key:
                    self._resume_seen = True
                    continue
                if not self._resume_seen and not self._resume_is_invalidate:
                    raise MongoError(280, "cannot resume stream; the resume token was not found. "
                                          f"{_fmt(item.token)}")
                self._resume_key = None
            self.last_key = item.key
            if item.op == "invalidate":
                self.invalidated = True
            return item
        return None
