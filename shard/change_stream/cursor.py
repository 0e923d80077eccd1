"""The change-stream cursor of a shard: runs the pipeline over the oplog and batches the events.

The stages and their order come from :func:`.pipeline.build_pipeline` (the server's
``_buildPipeline``); the cursor runs that list per oplog entry (:meth:`ChangeStreamCursor.
_process_entry`) and per event (:meth:`ChangeStreamCursor._emit`), and plain CRUD entries through
its fused variant (:mod:`.fast_crud`) when the stream allows it.

Batches (``PlanExecutorPipeline`` + ``CursorResponseBuilder`` semantics):

* the first batch never waits and may be empty (``batchSize: 0`` returns at once); the cursor
  stays open (tailable, awaitData);
* ``getMore`` returns as soon as at least one event is ready, otherwise waits up to its
  ``maxTimeMS`` (default 1000 ms) — woken only by oplog writes that pass this stream's oplog
  filter (an oplog listener), not by unrelated writes, or by the router's internal
  ``_shardsimAdvanceClusterTime`` request for a promise past a time (see :func:`register`);
* a batch holds at most ``batchSize`` events (101 on the first batch by default, unlimited on
  getMore) and at most 16 MiB;
* every reply carries ``postBatchResumeToken``: the last returned event's token; when the batch
  ends with nothing left to return, the high-water mark of the newest oplog time scanned if it is
  newer (``mongod`` promise mode) or of the shard's current cluster time + 1 tick (``clock`` mode, see
  :func:`safe_promise_key`). It never moves backwards;
* the batch carrying ``invalidate`` closes the cursor (id 0);
* events are BSON-encoded once here (``RawBSONDocument``) so the reply path copies bytes; with
  ``needsMerge`` each event ends with ``"$sortKey": [<token>]``.
"""

from __future__ import annotations

import asyncio
import collections
import struct
import operator
from itertools import chain, repeat
from operator import add
from typing import Any

from bson import _dict_to_bson  # C-accelerated encoder; top_level=False keeps field order
from bson.binary import Binary
from bson.int64 import Int64
from bson.codec_options import DEFAULT_CODEC_OPTIONS
from bson.raw_bson import DEFAULT_RAW_BSON_OPTIONS, RawBSONDocument
from bson.timestamp import Timestamp

from shardsim.core import resume_token as rt
from shardsim.core.clock import ts_from_key, ts_key
from shardsim.core.cursors import (BATCH_BYTES_LIMIT, DEFAULT_BATCH_SIZE, ONE_BY_ONE_OP_ELEMENTS,
                              SORT_KEY_LAYOUT_FIELD, SORT_KEY_SIZES_FIELD, Batch, Cursor,
                              array_header_bytes, document_elements)
from shardsim.core.commands import CommandFamily
from shardsim.core.errors import MongoError
from shardsim.core.protocol.shard import AdvanceClusterTime
from shardsim.shard.change_stream import fast_crud, promise_faults
from shardsim.shard.change_stream.check_resumability import HISTORY_LOST_MSG
from shardsim.shard.change_stream.check_topology_change import TopologyChangeDetected
from shardsim.shard.change_stream.pipeline import ShardPipeline, build_pipeline, fused_crud
from shardsim.core.change_stream_spec import StreamSpec
from shardsim.shard.change_stream.split_large_event import event_size_limit, too_large
from shardsim.shard.change_stream.transform import Event
from shardsim.shard.change_stream.add_post_image import RemoteLookup
from shardsim.core.auth import privileges as priv

DEFAULT_AWAIT_MS = 1000
_ID_FIRST = b"\x03_id\x00"


def encode_event(doc: dict[str, Any]) -> bytes:
    """BSON of an event keeping its field order (pymongo's ``bson.encode`` would move ``_id``
    first; the server emits ``txnNumber``/``lsid`` before ``_id`` for transaction events)."""
    return _dict_to_bson(doc, False, DEFAULT_CODEC_OPTIONS, False)


# At most this many events are produced per scan call ahead of the batch being filled.
_SCAN_AHEAD = 512
_PENDING_BYTES = 16 * 1024 * 1024


class _Deferred:
    """A pending event whose post-image is looked up on shard ``owner`` before it is output
    (then the steps from ``next_step`` on run)."""

    __slots__ = ("event", "owner", "next_step")

    def __init__(self, event: Event, owner: str | None, next_step: int) -> None:
        self.event = event
        self.owner = owner
        self.next_step = next_step


_DOC = operator.itemgetter(0)
_TOKEN = operator.itemgetter(1)
_SIZE = operator.itemgetter(2)


class RawEvent(RawBSONDocument):
    """An encoded event: a :class:`RawBSONDocument` (the reply encoder copies its bytes; tests
    and stages can still read fields) built without re-validating bytes we just encoded."""

    __slots__ = ()

    def __init__(self, raw: bytes) -> None:  # noqa: D107 - see the class docstring
        self._RawBSONDocument__raw = raw
        self._RawBSONDocument__inflated_doc = None
        self._RawBSONDocument__codec_options = DEFAULT_RAW_BSON_OPTIONS


def safe_promise_key(node: Any) -> int:
    """``clock`` promise mode: a cluster time T such that every future oplog entry has ts >= T,
    so HWM(T) may be promised (a high-water mark sorts before every event at its own time:
    tokenType 0 < 128, ``resume_token.cpp``).

    Returns ``clock.now() + 1 tick``. The shard ticks its clock and appends the oplog entry in
    the same synchronous step of the event loop (``ShardNode.make_entry`` + ``append_entry``; no
    ``await`` between), so when a cursor runs every reserved timestamp is already in the oplog,
    and every later tick is ``>= now + 1`` (``HybridLogicalClock.tick``: wall time or last + 1,
    and gossip only moves the clock forward). Promising now + 1 rather than now matters for the
    router: after a write at T the router gossips T to the idle shards, whose promise HWM(T + 1)
    then passes the event at T (HWM(T) would still hold it back).
    ``tests/integration/test_shard_change_stream_promise.py`` checks that no entry is ever
    appended below a promise, against a live shard under concurrent writes and gossip.
    """
    return node.clock.now_key() + 1


# The internal commands of the change-stream machinery (installed by ShardNode).
commands = CommandFamily("change_stream")


class PromiseWaiters:
    """Per-node record of promise requests (``node.cs_promise_waiters``, declared by
    ``ShardNode.__init__``).

    The router sends ``{_shardsimAdvanceClusterTime: T}`` when it holds an event at cluster
    time T that only idle remotes' promises block. ``key`` is the highest such T (as a ts key);
    ``cursors`` are the change-stream cursors waiting in a getMore right now. A request is
    sticky: a getMore that starts waiting after it still sees ``key``.
    """

    __slots__ = ("key", "cursors")

    def __init__(self) -> None:
        self.key = 0
        self.cursors: set[ChangeStreamCursor] = set()

    def request(self, key: int, reply_promises: bool = False) -> list[dict[str, Any]]:
        """Someone wants promises past ``key``: each waiting cursor that can give one either
        ends its getMore (the reply carries the promise), or, with ``reply_promises`` in
        ``clock`` mode, keeps waiting and hands its promise back here (see
        :meth:`ChangeStreamCursor._on_promise_request`). Returns those promises."""
        if key > self.key:
            self.key = key
        out: list[dict[str, Any]] = []
        for cur in list(self.cursors):
            p = cur._on_promise_request(reply_promises)
            if p is not None:
                out.append(p)
        return out


@commands.handler(AdvanceClusterTime.NAME, secondary="always", privileges=priv.INTERNAL)
async def advance_cluster_time(node: Any, req: Any) -> dict[str, Any]:
    """:class:`shardsim.core.protocol.shard.AdvanceClusterTime`, on a shard or config node.

    ``{_shardsimAdvanceClusterTime: Timestamp T}`` (plus the usual ``$clusterTime`` gossip)
    moves the node's cluster time to at least T and asks its change-stream cursors for a promise
    past T: in ``clock`` mode a waiting getMore returns at once with HWM(now + 1); in ``mongod``
    mode it returns as soon as an oplog entry after T (e.g. the periodic no-op) is appended,
    instead of sitting out its await time (the reply is still a real shard's: promise = newest
    oplog time). Not a MongoDB command; the router sends it (shardsim's addition, for latency
    only). Errors: TypeMismatch (14) when T is not a Timestamp. Reply ``{ok: 1}``.

    With ``promises: true`` a ``clock``-mode cursor whose getMore is waiting with nothing to
    return does not end that getMore: the reply lists its promise instead, ``promises: [{id:
    cursor id (Int64), batches: replies this cursor has sent so far (Int64),
    postBatchResumeToken: HWM}]``. The promise covers the cursor's replies up to ``batches``:
    every event at or below it was in one of them, and later replies (the waiting getMore's
    included) carry only events above it and a postBatchResumeToken at or above it. The router
    applies it once it has read that many replies (``router/change_stream/promise_requests.py``); the idle
    getMore keeps waiting, so a promise costs one request and one reply instead of a getMore
    reply and a new getMore.
    """
    request = AdvanceClusterTime.parse(req.body)
    node.clock.advance(request.ts)
    if node.repl is not None:  # a replica-set primary may write a no-op past T (see there)
        node.repl.promise_noop(ts_key(request.ts))
    want = request.promises is True
    promises = node.cs_promise_waiters.request(ts_key(request.ts), want)
    return {"promises": promises} if want else {}


class ChangeStreamCursor(Cursor):
    """A tailable, awaitData cursor over ``node.oplog`` for one :class:`StreamSpec`."""

    tailable = True
    await_data = True
    is_change_stream = True

    def __init__(self, node: Any, spec: StreamSpec, start_key: int,
                 initial_pbrt: dict[str, Any]) -> None:
        super().__init__(spec.cursor_ns)
        self.node = node
        self.spec = spec
        self.oplog = node.stream_oplog  # committed entries only on a replica-set member
        self.scan_key = start_key
        self.latest_scanned = start_key - 1
        # (event document, its token, its BSON size): the token is a dict, or the token's BSON
        # bytes for events of the fast path (turned into a dict only for postBatchResumeToken).
        self.pending: collections.deque[tuple[Any, Any, int]] = collections.deque()
        self.deferred = 0  # pending events waiting for a post-image from another shard
        self.pbrt = initial_pbrt
        self.pbrt_ts_key = ts_key(rt.decode(initial_pbrt).clusterTime)
        pipeline = ShardPipeline(build_pipeline(node, spec))
        self.pipeline = pipeline
        # What runs per entry or per event, held here (one attribute lookup per use).
        self.match = pipeline.match
        self.transform = pipeline.transform
        self._transform = pipeline.transform.process
        self._steps = pipeline.steps
        self.resume = pipeline.resume
        self._event_limit = event_size_limit(spec)
        self.closing = False
        self.closing_token: dict[str, Any] | None = None
        self.history_lost = False
        self.promise_mode = str(node.options.get("promise_mode") or "clock")
        self._wake: asyncio.Future[None] | None = None  # set while a getMore waits (_wait)
        self.batches = 0  # replies sent (first batch included): what a promise reply covers
        self._scope_kw = self._scan_scope()
        self._waiters: PromiseWaiters = node.cs_promise_waiters
        # Test faults on promises (promise_faults.py); none for nodes that declare none.
        self._faults = node.cs_promise_faults or promise_faults.NO_FAULTS
        # The pipeline's fused variant for plain CRUD entries (fast_crud), used once the stream
        # is past its resume point: entries at or before the resume token's time may need its
        # version.
        self.fast: fast_crud.Run | None = fused_crud(spec, self.pending.append, RawEvent)
        rk = self.transform._resume_key
        self._fast_min_key = rk[0] + 1 if rk is not None else 0
        # No truncation callback: _scan compares scan_key with oplog.truncated_through, so an
        # oplog at its size cap does not call every open cursor on each write.
        self.oplog.add_listener(self._on_append, **self._listen_scope())

    def _scan_scope(self) -> dict[str, str]:
        """The oplog index a scan may use (``Oplog.scoped_batch``): this stream's
        namespace or database; a cluster-wide stream reads every entry. (A v2 collection stream
        reads its database: the database-level ``namespacePlacementChanged`` no-ops concern it,
        shard/change_stream/control_events.py.)"""
        spec = self.spec
        if spec.kind == "collection" and spec.reader_version != "v2":
            return {"ns": f"{spec.db}.{spec.coll}"}
        if spec.kind != "cluster":
            return {"db": spec.db}
        return {}

    def _listen_scope(self) -> dict[str, str]:
        """Which appends can wake this cursor (``Oplog.add_listener`` scope): in ``clock`` mode
        only entries its oplog filter can admit (the namespace of a collection stream, the
        database of a database stream, everything for a cluster stream), so writes elsewhere
        never call it. ``mongod`` mode listens to every entry: any entry past a requested
        promise time wakes it (see ``_on_append``)."""
        spec = self.spec
        if self.promise_mode != "clock" or spec.kind == "cluster":
            return {}
        if spec.kind == "collection" and spec.reader_version != "v2":
            return {"ns": f"{spec.db}.{spec.coll}"}
        return {"db": spec.db}

    # -- oplog notifications ------------------------------------------------------------------
    def _on_append(self, entry: dict[str, Any]) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            if self.match(entry):
                wake.set_result(None)
            elif self.promise_mode != "clock" and self._promise_requested() \
                    and ts_key(entry["ts"]) > self._waiters.key:
                wake.set_result(None)  # mongod mode: this entry (e.g. a no-op) lets us promise past T

    def _promise_requested(self) -> bool:
        """A promise past some T was requested (``_shardsimAdvanceClusterTime``) and ours does
        not pass it yet (HWM(p) passes events at T only when p > T), and a fault does not
        withhold such a promise (:mod:`.promise_faults`)."""
        key = self._waiters.key
        if self._faults.on and self._faults.withholds(key):
            return False
        return key >= self.pbrt_ts_key

    def _can_promise_past_request(self) -> bool:
        """True when the batch being built should end now, empty, because it can carry a
        promise past the requested time: at once in ``clock`` mode (the request moved the clock
        to >= T, so the safe promise is > T), once an entry after T was scanned in ``mongod``."""
        if not self._promise_requested():
            return False
        if self.promise_mode == "clock":
            return True
        return self.latest_scanned > self._waiters.key

    def _on_promise_request(self, reply_promise: bool = False) -> dict[str, Any] | None:
        """A promise past the requested time is wanted (:meth:`PromiseWaiters.request`). If
        this cursor's getMore is waiting and could end with such a promise: with
        ``reply_promise`` in ``clock`` mode, return ``{id, batches, postBatchResumeToken}`` and
        let the getMore wait on (see :func:`register`); otherwise end the wait (in ``mongod``
        mode only once an entry after the requested time exists)."""
        wake = self._wake
        if wake is None or wake.done() or not self._promise_requested():
            return None
        if self.promise_mode != "clock":
            if self.oplog.latest_key > self._waiters.key:
                wake.set_result(None)
            return None
        if not reply_promise or self._faults.delay.active:  # a delayed promise: in the getMore
            wake.set_result(None)
            return None
        # What the woken getMore would do (fetch): scan, and promise only with nothing to return.
        try:
            self._scan(1)
        except MongoError:
            wake.set_result(None)  # the getMore reports it
            return None
        if self.pending or self.closing:
            wake.set_result(None)
            return None
        self._advance_hwm(at_end=self.oplog.latest_key < self.scan_key)
        if self._promise_requested():
            wake.set_result(None)
            return None
        return {"id": Int64(self.id), "batches": Int64(self.batches),
                "postBatchResumeToken": self.pbrt}

    async def close(self) -> None:
        """Stop listening to the oplog (killCursors, exhaustion, failure, reaping)."""
        self.oplog.remove_listener(self._on_append)

    # -- the pipeline ---------------------------------------------------------------------------
    def _emit(self, ev: Event) -> Any:
        """Run the event stages (:attr:`ShardPipeline.steps`: resumability, topology change,
        pre-image, post-image, user stages) on ``ev`` and output what comes out: the encoded
        event (ending with ``$sortKey`` for the router), or its fragments when the pipeline
        splits large events, appended to ``pending``. Returns the step that dropped the event,
        or None when it was output. Raises BSONObjectTooLarge (10334) for an oversized event
        without the split stage, and whatever a stage raises."""
        steps = self._steps
        try:
            for i, step in enumerate(steps):
                ev = step(ev)
                if ev is None:
                    return step
        except TopologyChangeDetected as detected:
            ev = detected.event  # past the remaining stages, intact, to the router
        except RemoteLookup as lookup:  # resolved over the wire by fetch, in stream order
            self.pending.append((_Deferred(lookup.event, lookup.owner, i + 1), lookup.event.token, 0))
            self.deferred += 1
            return None
        self._output(ev, self.pending)
        return None

    def _output(self, ev: Event, pending: Any) -> None:
        """Encode ``ev`` (or its fragments) onto ``pending``."""
        doc = ev.doc
        token = ev.token
        needs_merge = self.spec.needs_merge
        if needs_merge:
            doc.pop("$sortKey", None)
            doc["$sortKey"] = [token]
        raw = encode_event(doc)
        size = len(raw)
        if size > self._event_limit or ev.fragment_skip is not None:
            split = self.pipeline.split
            if split is None:
                raise too_large(size, token)
            for frag, ftoken in split.process({k: v for k, v in doc.items() if k != "$sortKey"},
                                              token, ev.fragment_skip):
                if needs_merge:
                    frag["$sortKey"] = [ftoken]
                fraw = encode_event(frag)
                pending.append((RawEvent(fraw), ftoken, len(fraw)))
            return
        pending.append((RawEvent(raw), token, size))

    async def _resolve_deferred(self) -> None:
        """Look up the post-images of the pending events whose document lives on another
        shard now (:class:`.add_post_image.RemoteLookup`), run the stages after the look-up on
        them and encode them in place. A shard that cannot be reached gives a null
        ``fullDocument``."""
        resolved: collections.deque[tuple[Any, Any, int]] = collections.deque()
        sharding = self.node.sharding
        while self.pending:
            entry = self.pending.popleft()
            item = entry[0]
            if type(item) is not _Deferred:
                resolved.append(entry)
                continue
            self.deferred -= 1
            ev = item.event
            try:
                post = await sharding.lookup_remote(ev.ns, item.owner,
                                                    ev.doc.get("documentKey") or {})
            except MongoError:
                post = None
            ev.doc["fullDocument"] = post
            out: Event | None = ev
            try:
                for step in self._steps[item.next_step:]:
                    out = step(out)
                    if out is None:
                        break
            except TopologyChangeDetected as detected:
                out = detected.event
            if out is not None:
                self._output(out, resolved)
        self.pending.extend(resolved)

    def _process_entry(self, entry: dict[str, Any]) -> None:
        """One oplog entry the oplog match admitted: unwind transaction -> transform -> check
        invalidate -> :meth:`_emit`; an invalidate that gets past the resumability check
        closes the stream (after this batch)."""
        if entry.get("op") != "c":
            # Hot path: unwinding passes a non-command entry on as it is, and its event (CRUD,
            # no-op) never invalidates, so check invalidate would pass it on too.
            ev = self._transform(entry)
            if ev is None:
                return
            if not ev.invalidating:
                self._emit(ev)
                return
            events: Any = (ev,)
        else:
            # Only commands (applyOps) unwind into several operations.
            events = filter(None, map(self._transform, self.pipeline.unwind(entry)))
        invalidate = self.pipeline.invalidate
        resume_step = self.pipeline.resume_step
        for ev in events:
            for out in (invalidate(ev) if invalidate is not None else (ev,)):
                closes = out.doc["operationType"] == "invalidate" and out.invalidating
                dropped = self._emit(out)
                if dropped is not None and dropped is resume_step:
                    continue  # before the resume point: not this stream's invalidate
                if closes:
                    self.closing = True
                    self.closing_token = out.token
                    return

    def _scan(self, want: int = 1) -> None:
        """Read oplog entries until ``want`` outputs are pending (or the stream closes) or the
        oplog end is reached. ``fetch`` asks for up to a batch's worth at once (capped), so a
        catch-up does not re-enter the batch loop once per event.

        Collection and database streams read through the oplog's namespace/database index
        (``Oplog.scoped_batch``): entries of other namespaces cannot match their filter, so an
        idle stream's getMore costs nothing per unrelated write; reaching the end of the index
        counts as having scanned to the newest entry. Entries come in slices of at least the
        number of events still wanted (one index lookup per slice, not per event); plain CRUD
        entries go through the fused fast path (:mod:`.fast_crud`) when the stream allows it."""
        if self.history_lost or self.oplog.truncated_through >= self.scan_key:
            # Entries at or after our position were truncated since the last scan.
            self.history_lost = True
            raise MongoError(286, HISTORY_LOST_MSG)
        oplog = self.oplog
        batch = oplog.scoped_batch
        scope = self._scope_kw
        match = self.match
        pending = self.pending
        fast = self._fast_run()
        fast_min = self._fast_min_key
        short_reads = oplog.short_reads
        while True:
            need = want - len(pending)
            chunk = need if need > 32 else 32
            keys, entries = batch(self.scan_key, chunk, **scope)
            nk = len(keys)
            i = 0
            while i < nk:
                if fast is not None and keys[i] >= fast_min:
                    i, made = fast(keys, entries, i, nk, need)
                    if made:
                        key = keys[i - 1]
                        self.latest_scanned = key
                        self.scan_key = key + 1
                        need -= made
                        if need <= 0:
                            return
                        if i >= nk:
                            break
                key = keys[i]
                entry = entries[i]
                i += 1
                self.latest_scanned = key
                self.scan_key = key + 1
                if match(entry):
                    self._process_entry(entry)
                    need = want - len(pending)
                    if need <= 0 or self.closing:
                        return
                    if fast is None:
                        fast = self._fast_run()
            if len(keys) < chunk and not (short_reads and keys):
                break  # the scope has no more entries (a disk oplog may stop short before)
        end = oplog.latest_key
        if end >= self.scan_key:  # the index skipped entries this stream cannot match
            self.latest_scanned = end
            self.scan_key = end + 1

    def _fast_run(self) -> fast_crud.Run | None:
        """The fast emitter when it may be used now: the stream is eligible and no resume
        check is still pending (the general path decides up to and at the resume point)."""
        if self.resume is not None and not self.resume.done:
            return None
        return self.fast

    # -- batches --------------------------------------------------------------------------------
    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        """One batch (see the module docstring); ``max_time_ms`` is the awaitData wait (ms)."""
        if batch_size is None:
            limit = DEFAULT_BATCH_SIZE if first else 1 << 62
        else:
            limit = batch_size
        out: list[Any] = []
        taken: list[Any] = []  # out's (event, token, size) entries, for _sort_key_layout
        size = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (DEFAULT_AWAIT_MS if max_time_ms is None else max_time_ms) / 1000.0
        full = False
        pending = self.pending
        # Events made ahead of the batch: _SCAN_AHEAD, or fewer when the oplog's entries are
        # large (pending events then hold about _PENDING_BYTES, not 512 large documents).
        oplog = self.oplog
        ahead = min(_SCAN_AHEAD, 1 + _PENDING_BYTES * len(oplog) // (oplog.size_bytes + 1))
        while limit > 0:
            if self.deferred:
                await self._resolve_deferred()
            last = None
            n = len(pending)
            if n and len(out) + n <= limit:
                # Everything pending fits the count: take it at once if it fits the bytes too
                # (the usual catch-up case; the loop below decides otherwise, event by event).
                k = len(out)
                add = sum(map(_SIZE, pending)) + array_header_bytes(k, k + n)
                if size + add <= BATCH_BYTES_LIMIT:
                    out.extend(map(_DOC, pending))
                    taken.extend(pending)
                    last = pending[-1][1]
                    pending.clear()
                    size += add
            while pending and len(out) < limit:
                doc, token, sz = pending[0]
                sz += len(str(len(out))) + 2  # array element header: the reply must stay legal BSON
                if out and size + sz > BATCH_BYTES_LIMIT:
                    full = True
                    break
                taken.append(pending.popleft())
                out.append(doc)
                size += sz
                last = token
            if last is not None:
                self._set_pbrt(last)  # once per run: parsing the token's time costs per call
            if full or len(out) >= limit:
                break
            if self.closing:
                break
            self._scan(min(limit - len(out), ahead))
            if self.pending or self.closing:
                continue
            if out or first or self._can_promise_past_request():
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await self._wait(remaining)
        exhausted = self.closing and not self.pending
        if exhausted:
            if self.closing_token is not None:
                self._set_pbrt(self.closing_token)
        elif not self.pending and limit > 0:
            # Entries up to latest_scanned are fully returned; the clock may be promised only
            # when the scan reached the end of the oplog.
            if self._faults.on and self._faults.delay.active:
                await self._delayed_hwm(bool(out))
            else:
                self._advance_hwm(at_end=self.oplog.latest_key < self.scan_key)
        extra = _sort_key_layout(taken) if out and self.spec.needs_merge else {}
        self.batches += 1
        if self.pbrt_ts_key > self.node.clock.now_key():
            # A new stream's first token is HWM(lastApplied + 1 tick): the reply's $clusterTime
            # must cover it too (see _advance_hwm).
            self._cover_with_clock(ts_from_key(self.pbrt_ts_key))
        # The events are encoded already: the reply splices their bytes (one join when the
        # message is framed) instead of passing each through the encoder again.
        return Batch(out, exhausted=exhausted, post_batch_resume_token=self.pbrt, extra=extra,
                     raw_docs=document_elements(out) if out else None, n_raw=len(out))

    def _set_pbrt(self, token: Any) -> None:
        if type(token) is bytes:
            token = fast_crud.token_from_doc(token)
        self.pbrt = token
        # Every token starts with the clusterTime: 0x82 + 8 bytes (secs << 32 | inc).
        self.pbrt_ts_key = int(token["_data"][2:18], 16)

    def _cover_with_clock(self, ts: Timestamp) -> None:
        """Move the node's clock up to ``ts`` (as gossip does: never back, no oplog entry) for
        a client's own stream, so the reply's ``$clusterTime`` covers its token; a time the rate
        limiter refuses (205/40484) moves nothing. Not for a router's cursor (``needsMerge``):
        the router covers the token it hands out itself
        (``router.change_stream.cursor._cover_with_cluster_time``), and moving the shards'
        clocks with every promise would make idle shards and the router push each other's
        clocks up one tick per reply."""
        if self.spec.needs_merge:
            return
        try:
            self.node.clock.advance(ts)
        except MongoError:
            pass

    def _advance_hwm(self, at_end: bool) -> None:
        """End of a batch with nothing left: promise the scanned (or safe clock) time."""
        key = self.latest_scanned
        if self.promise_mode == "clock" and at_end:
            key = max(key, safe_promise_key(self.node))
        if key > self.pbrt_ts_key and self._faults.on:
            key = self._faults.promise_key(key, self.pbrt_ts_key)  # stalled, or pinned
        if key > self.pbrt_ts_key:
            promised = ts_from_key(key)
            # Never promise a client past our own cluster time: a clock promise is now + 1 tick,
            # so move the clock there (gossip-style, no oplog entry; later ticks stay above
            # it). The reply's $clusterTime then covers its postBatchResumeToken, as on mongod,
            # whose promise is an oplog time (<= its clock): the client may read with
            # afterClusterTime at the promise's time (else 72).
            self._cover_with_clock(promised)
            self.pbrt = rt.make_high_water_mark(promised, self.spec.token_version)
            self.pbrt_ts_key = key

    async def _delayed_hwm(self, has_events: bool) -> None:
        """End of a batch under ``shardsimDelayPromise`` (:mod:`.promise_faults`): a batch with
        events promises nothing past them; an empty one takes its promise now and leaves
        ``delayMs`` later."""
        if has_events:
            return
        before = self.pbrt_ts_key
        self._advance_hwm(at_end=self.oplog.latest_key < self.scan_key)
        if self.pbrt_ts_key > before:
            ms = self._faults.delay_ms()
            if ms > 0:
                await asyncio.sleep(ms / 1000.0)

    async def _wait(self, timeout_s: float) -> None:
        """Sleep until a write this stream's filter admits is appended, a promise past some
        time is requested that this cursor can now give (see :func:`register`), or
        ``timeout_s``."""
        if self.oplog.latest_key >= self.scan_key:
            return  # something new arrived since the last scan
        # A bare future and a timer: a wake resumes this getMore in the next loop iteration
        # (wait_for on an Event would add a Task, and an iteration, per wait).
        loop = asyncio.get_running_loop()
        wake: asyncio.Future[None] = loop.create_future()
        self._wake = wake
        waiters = self._waiters
        waiters.cursors.add(self)
        timer = loop.call_later(timeout_s, _resolve, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None
            waiters.cursors.discard(self)


def _sort_key_layout(taken: list[Any]) -> dict[str, Any]:
    """The cursor reply fields that vouch for a ``needsMerge`` batch's layout (see
    ``shardsim/cursors.py`` SORT_KEY_LAYOUT_FIELD / SORT_KEY_SIZES_FIELD), or ``{}``: every
    event starts with ``_id`` (no transaction fields before it, no user stage moved it; ``_emit``
    and fast_crud put ``$sortKey`` last) and none is ``invalidate``/``kNewShardDetected``
    (the router handles those one by one). ``taken``: the batch's pending entries (event,
    token, size). Events of the fast path (:mod:`.fast_crud`; their token is the ``_id``
    document's bytes) have that layout by construction, so a batch of only those is vouched
    for from the sizes it already knows; others are checked byte by byte."""
    n = len(taken)
    toks = list(map(_TOKEN, taken))
    if set(map(type, toks)) == {bytes}:
        sizes = struct.pack(f"<{2 * n}i", *map(_SIZE, taken), *map(len, toks))
    else:
        # (map over C callables, not generator steps: a batch can hold thousands of events)
        raws = list(map(_RAW, map(_DOC, taken)))
        if not all(map(bytes.startswith, raws, repeat(_ID_FIRST), repeat(4))):
            return {}
        id_lens = list(chain.from_iterable(map(_I32.unpack_from, raws, repeat(9))))
        if any(map(bytes.startswith, raws, repeat(ONE_BY_ONE_OP_ELEMENTS),
                   map(add, id_lens, repeat(9)))):
            return {}
        sizes = struct.pack(f"<{2 * n}i", *map(len, raws), *id_lens)
    return {SORT_KEY_LAYOUT_FIELD: True, SORT_KEY_SIZES_FIELD: Binary(sizes, 0)}


_I32 = struct.Struct("<i")
_RAW = operator.attrgetter("raw")


def _resolve(fut: asyncio.Future[None]) -> None:
    """Timer callback of :meth:`ChangeStreamCursor._wait`: end the wait (await time over)."""
    if not fut.done():
        fut.set_result(None)
