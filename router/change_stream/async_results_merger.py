"""The router's AsyncResultsMerger for change streams: a pure, sans-IO merge of shard cursors.

Mirrors ``src/mongo/s/query/exec/async_results_merger.{h,cpp}`` (ARM) as described in
``shared/reference/server-internals-notes.md`` §1 and §9: :class:`Remote` is the ARM's
``RemoteCursorData``, :class:`Merger` the ARM itself (sorted, TailableAndAwaitData). The
router-side stages above it are their own modules: :mod:`.merge_cursors` (``$mergeCursors``
driving the stages), :mod:`.handle_topology_change`, :mod:`.ensure_resume_token_present`.

Nothing here does I/O or sleeps. The owner (:mod:`router.change_stream.cursor` on a real router,
or ``tests/sim/`` on a seeded simulated scheduler) feeds it shard replies and asks it what to
release; the same code therefore runs in the simulation and in the router. Where the server's
ARM schedules getMores itself, this one only says which remotes to poll
(:meth:`Merger.remotes_to_poll`); the owner sends them and feeds the replies back.

Vocabulary:

- a *remote* is one shard cursor (or the config server's ``config.shards`` cursor);
- a *key* is the sort key of a resume token ``{_data, [_typeBits]}``: ``(_data, flag, bytes)``
  (:func:`router.change_stream.raw_events.token_key`), which orders exactly like BSON
  comparison of the token documents (``_data`` hex string first, i.e. memcmp of the KeyString;
  a token carrying ``_typeBits`` sorts after one without);
- a remote's *promise* is its latest ``postBatchResumeToken`` (it will never return an event
  with a lower key);
- the *high-water mark* (HWM) is the token the router reports as its own postBatchResumeToken.

Ordering rule (§1.5): a buffered event is released only when its key is ``<=`` the minimum
promise over ALL remotes (config cursor included), and only once every remote has promised.
"""

from __future__ import annotations

import heapq
from collections import deque
from operator import attrgetter
from typing import Any, Iterable

from shardsim.core.errors import MongoError
from shardsim.router.change_stream.raw_events import Block, Item, Key
from shardsim.core.resume_token import token_key

CONFIG_SHARDS_NS = "config.shards"


# ---------------------------------------------------------------------------------------------
# The AsyncResultsMerger core
# ---------------------------------------------------------------------------------------------

class Remote:
    """Per-remote state (ARM ``RemoteCursorData``), created only by :meth:`Merger.add_remote`.

    The merger owns every field except ``address`` and ``more``, which the owner sets (the
    remote's ``host:port``; "its last batch was full"); the owner reads the rest.
    ``rid`` — internal id, in creation order (the ARM's ``id``: breaks ties between equal keys);
    ``name`` — shard id (or ``"config"``); ``ns`` — the remote cursor's namespace;
    ``is_config`` — the ``config.shards`` monitor (never eligible on its first batch, its
    events are swallowed by HandleTopologyChange); ``closed`` — removed, its buffer still drains;
    ``last_key`` — key of the last event it returned (its events must increase);
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
        """True once the remote's cursor id is 0 (``RemoteCursorData::exhausted``)."""
        return self.cursor_id == 0

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Remote({self.name}, id={self.cursor_id}, buf={len(self.buffer)}, "
                f"promise={self.promise and self.promise[0]}, eligible={self.eligible})")


class Merger:
    """The change-stream half of the ARM (sorted, TailableAndAwaitData), without I/O.

    Feed it with :meth:`add_remote` (establish-time batch) and :meth:`on_batch` /
    :meth:`on_promise` / :meth:`on_error` (replies); ask :meth:`ready`, :meth:`next_ready`,
    :meth:`high_water_mark`, :meth:`remotes_to_poll`. Errors: the first remote error (or broken
    promise, InternalError 1) is kept in ``status`` for good; from then on :meth:`ready` is
    True and :meth:`next_ready` raises it (``_status``, notes §1.10). The caller kills the
    remote cursors then.

    Attributes the owner reads: ``remotes`` (live and closed-but-draining :class:`Remote`, in
    ``rid`` order), ``hwm``/``hwm_token`` (the high-water mark's key and token document, None
    before :meth:`set_initial_high_water_mark`), ``status``, ``queue`` (see :meth:`refill`).

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
        self.queue: deque[Item] = deque()

    # -- remotes ------------------------------------------------------------------------------
    def add_remote(self, name: str, ns: str, cursor_id: int, first_batch: Iterable[Item],
                   pbrt: Any, *, is_config: bool = False) -> Remote:
        """Add a remote and process its establish-time batch like a getMore reply
        (``_buildRemote`` / ``addNewShardCursors``): its PBRT participates at once.

        ``name`` — shard id or ``"config"``; ``ns`` — its cursor's namespace (``config.shards``
        makes it the config monitor, as does ``is_config``); ``cursor_id`` — 0 for a cursor
        already exhausted; ``first_batch`` — its events in its order (Items, or one Block);
        ``pbrt`` — the reply's postBatchResumeToken or None. Events already moved to the release
        queue go back to their buffers first, as the new promise may be lower than they are.
        Returns the new :class:`Remote`; a bad batch is recorded as in :meth:`on_batch`, never
        raised."""
        self._unqueue()  # the new remote's promise may be below queued events
        remote = Remote(self._next_rid, name, ns, is_config or ns == CONFIG_SHARDS_NS)
        self._next_rid += 1
        self.remotes.append(remote)
        self.on_batch(remote, list(first_batch), cursor_id, pbrt)
        return remote

    def set_initial_high_water_mark(self) -> None:
        """``_setInitialHighWaterMark``: the lowest promise of an eligible remote (the config
        cursor is never eligible on its first batch). Call once, after every remote of the
        establish step was added; leaves the HWM unset when no eligible remote has promised."""
        cands = sorted((r.promise, r.rid, r) for r in self.remotes
                       if r.promise is not None)
        for key, _, r in cands:
            if r.eligible:
                self.hwm, self.hwm_token = key, r.promise_token
                return

    def remove_remote(self, remote: Remote) -> None:
        """``closeShardCursors``: forget a remote; its buffered events are still released, and
        it leaves ``remotes`` once they are. It no longer holds anything back (its promise stops
        counting). Killing its cursor is the owner's job."""
        remote.closed = True
        if not remote.buffer and not remote.queued:
            self.remotes.remove(remote)

    # -- responses ----------------------------------------------------------------------------
    def on_batch(self, remote: Remote, items: list[Item], cursor_id: int, pbrt: Any,
                 *, invalidated: bool = False) -> None:
        """Process one reply (``_updateRemoteMetadata`` + ``_addBatchToBuffer``).

        ``items`` — its events in the remote's order (Items, or one Block); ``cursor_id`` — the
        reply's cursor id (0: exhausted); ``pbrt`` — its postBatchResumeToken (or None);
        ``invalidated`` — the reply's ``invalidated`` flag. Clears ``in_flight``, moves the
        remote's promise and eligibility (§1.4), buffers the events. A broken invariant of the
        ARM (a PBRT lower than the remote's previous promise, an event below that promise,
        events out of order or above the PBRT) is not raised: it becomes an InternalError (1)
        recorded as the remote's and the merger's ``status`` (releasing would reorder the
        stream). Raises MongoError 1 only when ``pbrt`` has no string ``_data``
        (:func:`token_key`).
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
        it), or when the remote failed or closed. Returns True when the promise moved (the
        owner then looks at :meth:`ready` again). Raises MongoError 1 when ``pbrt`` has no
        string ``_data``; the caller drops such a promise (the remote's getMore still answers)."""
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
        """A getMore (or establish) on ``remote`` failed with ``exc``: clears ``in_flight`` and
        records it; the first error wins and is raised by :meth:`next_ready` (§1.10)."""
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
        """``_getMinPromisedSortKey``: the open remote holding the lowest promise (ties: lowest
        ``rid``), or None unless every open remote has promised. Pure."""
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
        """The remote whose first buffered event is the smallest (ties: lowest ``rid``)."""
        best: Remote | None = None
        for r in self.remotes:
            if r.buffer and (best is None or (r.buffer[0].key, r.rid) < (best.buffer[0].key, best.rid)):
                best = r
        return best

    def _unqueue(self) -> None:
        """Put queued events back at the front of their remotes' buffers (in order)."""
        q = self.queue
        while q:
            it = q.pop()
            it.src.buffer.appendleft(it)
            it.src.queued -= it.n

    def refill(self) -> bool:
        """Move every event that is ready now (key ``<=`` the minimum promise over all
        remotes; everything once only closed remotes are left) into the release queue
        (``queue``, a deque of Items and Blocks, each entry's ``src`` its remote), in merged
        order (ties: lowest remote id first, as :meth:`_head`). True when it queued any.

        For :meth:`ready` and the merge stage's fast path
        (:meth:`router.change_stream.merge_cursors.ChangeStreamMerge.take`), which pops
        ``queue`` itself and then keeps each remote's ``queued`` count, the HWM and closed
        remotes' removal exactly as :meth:`next_ready` does."""
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
            self.queue.extend(runs[0])
        else:
            self.queue.extend(_merge_runs(runs))
        return True

    def ready(self) -> bool:
        """``ready`` / ``_readySortedTailable``: True when :meth:`next_ready` may be called: an
        error is pending, or the smallest buffered event is ``<=`` the minimum promise over all
        remotes (every remote must have promised; once only closed remotes hold events, all of
        them are ready). Moves what is ready into the release queue (:meth:`refill`)."""
        if self.status is not None:
            return True
        return bool(self.queue) or self.refill()

    def next_ready(self) -> tuple[Item, Remote]:
        """``nextReady`` / ``_nextReadySorted``: pop the smallest ready event and return
        ``(item, remote it came from)``; the HWM follows it when that remote is eligible (§1.6).
        Valid only after :meth:`ready` returned True (AssertionError otherwise). Raises the
        pending remote error (MongoError with the remote's code) once any remote failed."""
        if self.status is not None:
            raise self.status
        q = self.queue
        if not q:
            assert self.refill(), "next_ready() called when not ready"
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
        """``getHighWaterMark`` (§1.7): the router's postBatchResumeToken. When nothing is
        ready, first advances the HWM to the lowest promise if its remote is eligible (it never
        moves back). Returns the token document ``{_data[, _typeBits]}``, or None before any
        eligible promise; never raises."""
        mp = self.min_promise()
        if mp is not None and not self.ready() and mp.eligible:
            if self.hwm is None or mp.promise > self.hwm:  # type: ignore[operator]
                self.hwm, self.hwm_token = mp.promise, mp.promise_token
        return self.hwm_token

    def invalidated_remote(self) -> Remote | None:
        """``_assertNotInvalidated``: the remote owning the minimum promise when its cursor was
        invalidated and nothing is ready (the stream ends with that remote's promise as its
        postBatchResumeToken), else None. Pure apart from :meth:`ready`'s refill."""
        mp = self.min_promise()
        if mp is not None and mp.invalidated and not self.ready():
            return mp
        return None

    def remotes_to_poll(self, prefetch_only: bool = False) -> list[Remote]:
        """``_scheduleGetMores``: remotes with an empty buffer, a live cursor and no request
        in flight. A remote holding events is polled only when its last batch was full
        (``more``), its buffer holds less than ``PREFETCH_BYTES`` (prefetch while its buffer
        drains; still at most one request in flight per remote cursor) and its first buffered
        event is releasable now (at or below the minimum promise): a remote whose events all
        wait for another remote's is not read further ahead meanwhile, so on a shared machine
        the shards whose events the client needs next get the CPU (a backlog written shard by
        shard is then read shard by shard, each overlapped with the client, instead of every
        shard building its whole backlog at once while the client waits). Empty once an error
        is pending. ``prefetch_only``: only those remotes holding events (what a promise or
        another remote's reply may have made releasable). Pure: the owner sets each one's
        ``in_flight``, sends its getMore and feeds the reply to :meth:`on_batch` /
        :meth:`on_error`."""
        if self.status is not None:
            return []
        polls = []
        bound: Any = _UNSET
        for r in self.remotes:
            if r.cursor_id == 0 or r.in_flight or r.closed:
                continue
            if r.buffer:
                if not r.more or sum(e.nbytes for e in r.buffer) >= PREFETCH_BYTES:
                    continue
                if bound is _UNSET:
                    mp = self.min_promise()
                    bound = mp.promise if mp is not None else None
                if bound is None or r.buffer[0].key > bound:
                    continue
            elif prefetch_only:
                continue
            polls.append(r)
        return polls

    def blocking_remotes(self) -> tuple[Item | None, list[Remote]]:
        """When the smallest buffered event is not ready only because of promises: that event
        and the live remotes whose promise is missing or below its key (they hold it back).
        ``(None, [])`` when nothing is buffered, an event is ready or an error is pending.
        No side effect apart from :meth:`ready`'s refill; used by the router to ask exactly
        those remotes for a newer promise (:mod:`router.change_stream.promise_requests`)."""
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
        """``_haveOutstandingBatchRequests``: does any remote have a getMore out?"""
        return any(r.in_flight for r in self.remotes)


_KEY = attrgetter("key")
_UNSET = object()


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
