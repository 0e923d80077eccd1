"""Change streams on the router (mongos): open a cursor on every shard and on the config
server's ``config.shards``, merge them with :mod:`router.merger`, serve the client's getMores.

Entry point: :func:`aggregate_change_stream` (called by the router's ``aggregate`` when
``pipeline[0]`` is ``$changeStream``). It mirrors, in order:

- ``sharded_agg_helpers.cpp`` ``targetPipeline``/``dispatchTargetedShardPipeline``: capture the
  router's cluster time, reload the shard list, fix the start point explicitly for every shard
  (client token, ``startAtOperationTime``, or cluster time + 1 tick —
  ``DocumentSourceChangeStream::getStartTimeForNewStream``), send every shard
  ``aggregate`` with ``needsMerge: true``, ``fromRouter: true``, ``cursor: {batchSize: 0}``, and
  open the ``config.shards`` monitor (``openChangeStreamNewShardMonitor``) at the captured time;
- ``cluster_aggregation_planner.cpp`` ``establishMergingMongosCursor``: an empty first batch, a
  live cursor id and a ``postBatchResumeToken`` (the merger's high-water mark);
- ``cluster_find.cpp`` ``runGetMore`` + ``blocking_results_merger.cpp``: a getMore returns as
  soon as at least one event is ready (taking all that are ready), else waits up to its
  ``maxTimeMS`` (default 1000 ms) and returns an empty batch with the current high-water mark;
- ``async_results_merger.cpp``: getMores to remotes run concurrently, only for remotes with an
  empty buffer and no request in flight, with ``maxTimeMS`` capped at 1000 ms when there is
  more than one remote; the first remote error fails the client's getMore with that code and
  the labels the router computes (``error_labels.cpp``), and kills the other remote cursors;
- ``DocumentSourceChangeStreamHandleTopologyChange``: a ``config.shards`` insert opens a cursor
  on the new shard with ``resumeAfter: HWM(event clusterTime + 1 tick)``.

Events are forwarded as raw BSON bytes: the shard's trailing ``$sortKey`` is cut off by byte
surgery (:func:`router.merger.strip_sort_key`), never decoded and re-encoded.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

import bson
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from router.merger import CONFIG_SHARDS_NS, Block, ChangeStreamMerge, Item, Merger, NewShard, Remote, item_from_raw_event, split_cursor
from shardsim.resume_token import token_ts_key
from router.raw_events import element_headers
from shardsim.gossip import gossip_command, track_operation_time
from shardsim.client import Connection
from shardsim.clock import ts_add_ticks, ts_from_key, ts_key
from shardsim.cursors import BATCH_BYTES_LIMIT, Batch, Cursor
from shardsim.errors import MongoError, change_stream_labels
from shardsim.node import CODEC, DUMMY_SIGNATURE

try:  # the shard's stage parser validates router-side specs; importing it here (≈ 0.1 s from
    # source) keeps that one-off cost at process start instead of in the first watch().
    from shardsim import change_stream_spec as _shard_spec  # noqa: F401
except ImportError:  # pragma: no cover - the shard package is part of the project
    pass

log = logging.getLogger("shardsim.router.change_stream")

DEFAULT_AWAIT_MS = 1000  # mongos' default awaitData timeout for a getMore without maxTimeMS
REMOTE_AWAIT_CAP_MS = 1000  # ARM::setAwaitDataTimeout cap when merging more than one remote
SHORT_AWAIT_MS = 20  # remote await of a one-off poll for a newer promise (ms)
# batchSize of the router's getMores to shards: a backlog then comes in slices, so shards build
# the next slice while the router merges this one and the client reads the previous one.
REMOTE_BATCH_SIZE = 5000
# Internal shard command asking for a promise past a cluster time (shard/change_stream/cursor.py).
PROMISE_REQUEST_COMMAND = "_shardsimAdvanceClusterTime"
# Aggregate fields the router does not pass on to shards (it sets its own cursor/needsMerge).
_NOT_FORWARDED = frozenset({"aggregate", "pipeline", "cursor", "$db", "$clusterTime", "lsid",
                            "txnNumber", "$readPreference", "maxAwaitTimeMS", "maxTimeMS",
                            "writeConcern", "needsMerge", "fromRouter", "fromMongos",
                            "explain", "apiVersion", "apiStrict", "apiDeprecationErrors"})


def _fresh_error(exc: MongoError) -> MongoError:
    """The remote's code/codeName/errmsg without its labels: mongos computes labels itself
    (notes §6.2 "shard labels are not copied")."""
    return MongoError(exc.code, exc.errmsg, code_name_override=exc.code_name)


def _labelled(exc: MongoError, command: str) -> MongoError:
    """``exc`` with the labels the router adds for a change stream's ``command``."""
    err = _fresh_error(exc)
    err.labels = change_stream_labels(err.code, is_change_stream=True, command=command)
    return err


def _split_ns(ns: str) -> tuple[str, str]:
    db, _, coll = ns.partition(".")
    return db, coll


async def aggregate_change_stream(router: Any, req: Any) -> dict[str, Any]:
    """Run ``aggregate`` with a ``$changeStream`` pipeline on the router.

    Returns the reply body ``{cursor: {firstBatch: [], postBatchResumeToken, id, ns}}``.
    Raises MongoError: the shard parser's validation errors (e.g. 40415/14/2/50865/40674/260/
    73), FailedToParse (9) when ``cursor`` is missing, and the first shard error while
    establishing cursors (labels computed by the router).
    """
    body = req.body
    pipeline = body["pipeline"]
    target = body.get("aggregate")
    db = req.db
    spec_doc = pipeline[0].get("$changeStream") if isinstance(pipeline[0], dict) else None
    try:  # validate exactly like a shard would (same parser) before touching any shard
        from shardsim import change_stream_spec as _spec
        _spec.parse(db, target, pipeline)
    except ImportError:  # pragma: no cover - the shard package is part of the project
        if not isinstance(spec_doc, dict):
            raise MongoError(50808, "$changeStream stage expects a document as argument")
    if isinstance(spec_doc, dict) and spec_doc.get("showMigrationEvents"):
        # assertIsLegalSpecification (document_source_change_stream.cpp)
        raise MongoError(31123, "Change streams from mongos may not show migration events")
    rc = body.get("readConcern")
    level = rc.get("level") if isinstance(rc, dict) else None
    if level is not None and level != "majority":
        # DocumentSourceChangeStream::LiteParsed::supportsReadConcern: majority only.
        raise MongoError(72, f"Command aggregate does not support {{ readConcern: {{ level: \"{level}\" }} }}"
                             " :: caused by :: Only read concern level majority is supported")
    cursor_opt = body.get("cursor")
    if cursor_opt is None:
        raise MongoError(9, "The 'cursor' option is required, except for aggregate with the "
                            "explain argument")
    if not isinstance(cursor_opt, dict):
        raise MongoError(14, "BSON field 'aggregate.cursor' is the wrong type, expected type 'object'")
    batch_size = cursor_opt.get("batchSize")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, (int, float))):
        raise MongoError(14, "BSON field 'cursor.batchSize' is the wrong type, expected type 'long'")
    if batch_size is not None and batch_size < 0:
        raise MongoError(51024, f"BatchSize value must be non-negative, but received: {int(batch_size)}")
    if isinstance(target, str):
        ns = f"{db}.{target}"
    else:
        ns = f"{db}.$cmd.aggregate"

    stream = RouterChangeStream(router, db, target, ns, dict(spec_doc), pipeline[1:], body)
    await stream.establish()
    reply = await router.cursors.run_first_batch(stream.cursor, int(batch_size) if batch_size is not None else None)
    return {"cursor": reply}


class RouterChangeStream:
    """Everything one client change stream owns on the router: the merge, the remotes and their
    pools, and the commands to (re)open shard cursors."""

    def __init__(self, router: Any, db: str, target: Any, ns: str, spec: dict[str, Any],
                 user_stages: list[Any], body: dict[str, Any]) -> None:
        self.router = router
        self.db = db
        self.target = target
        self.ns = ns
        self.spec = spec
        self.user_stages = list(user_stages)
        self.passthrough = {k: v for k, v in body.items() if k not in _NOT_FORWARDED}
        self.merger = Merger()
        self.merge: ChangeStreamMerge | None = None
        self.cursor = RouterChangeStreamCursor(self)
        self.pools: dict[int, Any] = {}  # remote id -> Pool
        self.wake = asyncio.Event()
        self.closed = False
        self.op_time: Timestamp | None = None
        self.remote_await_ms = DEFAULT_AWAIT_MS
        self.nudged: dict[int, int] = {}  # remote id -> router time it was last short-polled for
        self.idle: dict[int, bool] = {}  # remote id -> its last getMore reply had no events
        self.sent_at: dict[int, float] = {}  # remote id -> monotonic time of its last getMore

    # -- opening -------------------------------------------------------------------------------
    def _shard_command(self, spec: dict[str, Any]) -> dict[str, Any]:
        cmd: dict[str, Any] = {"aggregate": self.target,
                               "pipeline": [{"$changeStream": spec}] + self.user_stages}
        cmd.update(self.passthrough)
        cmd["needsMerge"] = True
        cmd["fromRouter"] = True
        cmd["cursor"] = {"batchSize": 0}
        return cmd

    async def establish(self) -> None:
        """Open every shard cursor and the config.shards monitor; set the initial HWM."""
        router = self.router
        clock = router.clock
        now = clock.now()
        if now.time == 0 and now.inc == 0:
            now = clock.advance_to_wall()
        registry_time = now  # shardRegistryReloadTime: captured BEFORE the shard list reload
        spec = dict(self.spec)
        token = spec.get("resumeAfter", spec.get("startAfter"))
        if token is None and "startAtOperationTime" not in spec:
            # getStartTimeForNewStream on mongos: cluster time + 1 tick, the same for all shards.
            spec["startAtOperationTime"] = ts_add_ticks(now, 1)
        self.spec = spec
        try:
            await router.catalog.refresh()
        except MongoError as exc:
            log.warning("catalog refresh before opening a change stream failed: %s", exc.errmsg)
        shards = [s[0] for s in router.catalog.shards()]
        if not shards:
            raise MongoError(70, "no shards found")
        cmd = self._shard_command(spec)  # the same explicit start for every shard
        opens = [self._open(name, self.db, cmd) for name in shards]
        config_cmd = None
        if self.db != "config":
            config_cmd = {"aggregate": "shards",
                          "pipeline": [{"$changeStream": {"startAtOperationTime": registry_time,
                                                          "allowToRunOnConfigDB": True}}],
                          "needsMerge": True, "fromRouter": True, "cursor": {"batchSize": 0}}
            opens.append(self._open(None, "config", config_cmd))
        results = await asyncio.gather(*opens, return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            for r in results:
                if isinstance(r, Remote):
                    self._kill_remote(r)
            if isinstance(failure, MongoError):
                raise _fresh_error(failure)
            raise failure
        self.merger.set_initial_high_water_mark()
        if EARLY_PROMISE_REQUESTS:
            _promise_requests(router).streams.add(self)
            router._cs_write_hook = on_shard_write
        self.merge = ChangeStreamMerge(self.merger, resume_token=token, known_shards=shards,
                                       start_after="startAfter" in spec)

    async def _open(self, shard: str | None, db: str, cmd: dict[str, Any]) -> Remote:
        """Send the establish ``aggregate`` to ``shard`` (None = config server) and add the
        remote with its first batch."""
        router = self.router
        pool = router.config_pool if shard is None else router.pool_for(shard)
        reply = await gossip_command(router.clock, pool, db, cmd, raw=True)
        is_config = shard is None
        cur, items = _cursor_batch(reply["cursor"], "firstBatch", is_config)
        remote_ns = cur.get("ns") or (CONFIG_SHARDS_NS if shard is None else self.ns)
        pbrt = cur.get("postBatchResumeToken")
        remote = self.merger.add_remote("config" if is_config else shard, remote_ns,
                                        int(cur.get("id", 0)), items, _plain(pbrt),
                                        is_config=is_config)
        remote.address = pool.address
        self.pools[remote.rid] = pool
        return remote

    async def open_new_shard(self, action: NewShard) -> None:
        """A config.shards insert was merged: open the new shard's cursor from
        ``resumeAfter: HWM(shardAddedTime + 1)`` (``createUpdatedCommandForNewShard``)."""
        router = self.router
        if router.catalog.shard_address(action.shard) is None:
            await router.catalog.refresh()
        spec = {k: v for k, v in self.spec.items()
                if k not in ("resumeAfter", "startAfter", "startAtOperationTime")}
        spec["resumeAfter"] = action.start_token
        try:
            await self._open(action.shard, self.db, self._shard_command(spec))
        except MongoError as exc:
            raise _labelled(exc, "getMore") from None

    # -- remote getMores ----------------------------------------------------------------------
    def schedule_getmores(self, nudge: bool = False) -> None:
        """``_scheduleGetMores``: one getMore per remote that has nothing buffered and no
        request outstanding. Tasks run in a fresh context (they outlive client operations)."""
        polls = self.merger.remotes_to_poll()
        if not polls:
            return
        # (An event held back only by promises is handled by request_promises, which also
        # cuts short the getMores already waiting.) When a client getMore starts, a remote whose
        # promise is older than the router's cluster time can promise more right away (our
        # getMore gossips that time to it): ask it once without a long await, so a write the router has seen does not wait for idle
        # shards' await periods. (Only at the start of a client getMore: idle streams then cost
        # at most one extra round per remote and client getMore.)
        now_key = ts_key(self.router.clock.now())
        for r in polls:
            short = False
            if nudge and r.promise is not None:
                pts = token_ts_key(r.promise[0])
                if pts is not None and pts < now_key and self.nudged.get(r.rid) != now_key:
                    self.nudged[r.rid] = now_key
                    short = True
            r.in_flight = True
            asyncio.get_running_loop().create_task(self._remote_getmore(r, short),
                                                   context=contextvars.Context())

    def request_promises(self) -> float | None:
        """An event is buffered but held back only by other remotes' promises: ask those
        remotes' shards, on a connection kept for these requests, for a promise past the event's
        cluster time T (``{_shardsimAdvanceClusterTime: T}`` with our ``$clusterTime`` >= T).

        A ``clock``-mode shard answers the request with HWM(>= T + 1) for each cursor whose
        getMore is waiting with nothing to return, and that getMore keeps waiting (a cursor
        with events to return, or not waiting, ends its getMore at once instead); a
        ``mongod``-mode shard answers the waiting getMore when its next oplog entry (the
        periodic no-op) passes T, as its promise is still only its newest oplog time. Without
        this the event would wait until every idle remote's await period (up to 1 s) ends,
        because a getMore already waiting on an idle shard is not woken by a write elsewhere.
        Latency only: what is released, and when it may be, is still decided by the merge rule
        (an event is released only once every remote has promised past it). Not part of
        mongos' ARM.

        See :func:`_send_promise_request`. Cost control: the request is sticky on the shard (a
        getMore that starts waiting later still honours it), so the router sends at most one
        per shard address and newer T, and has at most one out per address (a newer T wanted
        meanwhile goes out when its reply is in), whatever the number of streams. A remote whose last reply
        carried events is busy and will answer soon anyway: it is asked only once its getMore
        has been out for ``ACTIVE_REQUEST_DELAY_MS``. Returns the delay (s) after which this
        should be called again (a busy remote becomes eligible), or None.
        """
        item, remotes = self.merger.blocking_remotes()
        if item is None or not remotes:
            return None
        t = token_ts_key(item.key[0])
        if t is None:
            return None
        state = _promise_requests(self.router)
        now = time.monotonic()
        again: float | None = None
        for r in remotes:
            if not r.in_flight or r.rid not in self.pools:
                continue  # no getMore out on it: nothing to cut short
            if not self.idle.get(r.rid, True):
                wait = self.sent_at.get(r.rid, now) + ACTIVE_REQUEST_DELAY_MS / 1000 - now
                if wait > 0:
                    again = wait if again is None else min(again, wait)
                    continue
            addr = r.address or str(r.rid)
            if state.sent.get(addr, -1) >= t:
                continue  # asked already (by any stream): the shard keeps the request
            _send_promise_request(self.router, self.pools[r.rid], addr, t, self)
        return again

    def watches(self, ns: str) -> bool:
        """Can a write to ``ns`` ("db.coll") produce an event for this stream?"""
        if isinstance(self.target, str):
            return ns == self.ns
        return self.db == "admin" or ns.startswith(self.db + ".")

    async def _remote_getmore(self, r: Remote, blocked: bool = False) -> None:
        db, coll = _split_ns(r.ns)
        await_ms = self.remote_await_ms
        if len(self.merger.remotes) > 1:
            await_ms = min(await_ms, REMOTE_AWAIT_CAP_MS)
        if blocked:
            await_ms = min(await_ms, SHORT_AWAIT_MS)
        cmd = {"getMore": Int64(r.cursor_id), "collection": coll, "maxTimeMS": int(await_ms),
               "batchSize": REMOTE_BATCH_SIZE}
        pool = self.pools[r.rid]
        self.sent_at[r.rid] = time.monotonic()
        try:
            reply = await gossip_command(self.router.clock, pool, db, cmd, raw=True,
                                         timeout=await_ms / 1000 + 30)
            if self.closed:
                return
            op_time = reply.get("operationTime")
            if isinstance(op_time, Timestamp) and (self.op_time is None or ts_key(op_time) > ts_key(self.op_time)):
                self.op_time = op_time
            cur, items = _cursor_batch(reply["cursor"], "nextBatch", r.is_config)
            cid = int(cur.get("id", 0))
            if cid != 0 and cid != r.cursor_id:
                raise MongoError(2, f"Expected cursorid {r.cursor_id} but received {cid}")
            self.idle[r.rid] = not items
            r.more = sum(e.n for e in items) >= REMOTE_BATCH_SIZE  # Items, or one Block
            self.merger.on_batch(r, items, cid, _plain(cur.get("postBatchResumeToken")),
                                 invalidated=bool(cur.get("invalidated", False)))
            if items:
                # Ask the idle remotes for promises now, not when the client's next getMore
                # arrives: the client is often between getMores when a write's event comes in.
                self.request_promises()
        except MongoError as exc:
            if not self.closed:
                if exc.code == 43 and r.cursor_id:
                    exc = MongoError(43, f"cursor id {r.cursor_id} not found on {r.name} "
                                         f"({r.address}): {exc.errmsg}")
                self.merger.on_error(r, exc)
        except Exception as exc:  # a bug or malformed reply must fail the stream, not hang it
            log.exception("getMore on %s failed", r.name)
            if not self.closed:
                self.merger.on_error(r, MongoError(1, f"{type(exc).__name__}: {exc}"))
        finally:
            r.in_flight = False
            self.wake.set()
        if r.more and not self.closed:
            self.schedule_getmores()  # a full batch: prefetch the rest of the backlog

    # -- closing ------------------------------------------------------------------------------
    def _kill_remote(self, r: Remote) -> None:
        if r.cursor_id == 0 or r.rid not in self.pools:
            return
        st = r.status
        if st is not None and st.code in (43, 175, 237):
            return  # ARM::kill does not kill a cursor the remote already dropped
        db, coll = _split_ns(r.ns)
        pool = self.pools[r.rid]
        cmd = {"killCursors": coll, "cursors": [Int64(r.cursor_id)]}
        r.cursor_id = 0

        async def kill() -> None:
            try:
                await pool.command(db, cmd, check=False, timeout=10)
            except Exception:
                pass
        asyncio.get_running_loop().create_task(kill(), context=contextvars.Context())

    def close(self) -> None:
        """Kill every remote cursor (fire and forget, as ``ARM::kill``)."""
        if self.closed:
            return
        self.closed = True
        _promise_requests(self.router).streams.discard(self)
        for r in list(self.merger.remotes):
            self._kill_remote(r)
        self.wake.set()


ACTIVE_REQUEST_DELAY_MS = 10  # see RouterChangeStream.request_promises


# How long the router waits for a promise reply (s); a shard that does not answer only costs
# latency (its getMore still ends with its await period).
PROMISE_REPLY_TIMEOUT_S = 30.0


class _PromiseRequests:
    """Router-wide record of ``_shardsimAdvanceClusterTime`` requests, per shard address: the
    highest time asked for (``sent``), the connection they go out on (``channels``), the request
    out now (``pending``, its task), the newest time wanted meanwhile (``want``) and the streams
    to wake once that is sent (``deferred``); plus the open streams (``streams``, weak)."""

    __slots__ = ("sent", "channels", "pending", "want", "deferred", "streams")

    def __init__(self) -> None:
        import weakref
        self.sent: dict[str, int] = {}
        self.channels: dict[str, Connection] = {}
        self.pending: dict[str, Any] = {}
        self.want: dict[str, int] = {}
        self.deferred: dict[str, set[Any]] = {}
        self.streams: Any = weakref.WeakSet()


def _send_promise_request(router: Any, pool: Any, addr: str, t: int, stream: Any = None) -> None:
    """Ask the shard at ``addr`` (reached through ``pool``'s host/port) for promises past the
    time key ``t``: ``{_shardsimAdvanceClusterTime: Timestamp(t), promises: true,
    $clusterTime}`` on a connection kept for these requests. Its reply lists the promises of
    the shard's cursors whose getMores keep waiting (``shard/change_stream/cursor.py``
    ``register``); they are applied to the streams' remotes by :func:`_apply_promises`. Sent at
    once unless a request to ``addr`` is out: then ``t`` is remembered and sent (the newest
    wanted) when its reply is in, and ``stream`` is woken then. Nothing is sent when ``addr``
    was already asked for ``t`` or later (requests are sticky on the shard). Latency only: a
    lost request only means the remote answers at the end of its await."""
    state = _promise_requests(router)
    if state.sent.get(addr, -1) >= t:
        return
    state.sent[addr] = t
    _dispatch_promise_request(router, pool, addr, t, stream)


def _dispatch_promise_request(router: Any, pool: Any, addr: str, t: int, stream: Any) -> None:
    """Send the request for ``t`` to ``addr`` now, or remember it (see
    :func:`_send_promise_request`)."""
    state = _promise_requests(router)
    if addr in state.pending:
        if state.want.get(addr, -1) < t:
            state.want[addr] = t
        if stream is not None:
            state.deferred.setdefault(addr, set()).add(stream)
        return
    # Written now when the channel is open (the request should reach the shard while the
    # write's event travels to the router); its reply is read by a task.
    conn = state.channels.get(addr)
    if conn is not None and not conn.write_request(_promise_request_body(router, t)):
        conn = None
    state.pending[addr] = asyncio.get_running_loop().create_task(
        _promise_exchange(router, pool, addr, t, conn), context=contextvars.Context())


async def _promise_exchange(router: Any, pool: Any, addr: str, t: int,
                            sent_on: Connection | None) -> None:
    """Read the reply to the promise request already written on ``sent_on``, or (None) open
    ``addr``'s kept connection first and send it; apply the reply, then send the newest time
    wanted meanwhile. A network error drops the connection and what was wanted (latency only:
    the getMores report real failures)."""
    state = _promise_requests(router)
    ok = False
    try:
        conn = sent_on
        if conn is None:
            old = state.channels.pop(addr, None)
            if old is not None:
                old.close()
            conn = state.channels[addr] = Connection(pool.host, pool.port)
            await conn.connect()
            if not conn.write_request(_promise_request_body(router, t)):
                raise MongoError(9001, f"connection to {addr} closed")
        reply = await conn.read_reply(PROMISE_REPLY_TIMEOUT_S)
        _apply_promises(router, addr, bson.decode(reply, codec_options=CODEC))
        ok = True
    except MongoError:
        old = state.channels.pop(addr, None)
        if old is not None:
            old.close()
    except Exception:  # a malformed reply must not leave the address stuck as pending
        log.exception("promise request to %s failed", addr)
    finally:
        state.pending.pop(addr, None)
        want = state.want.pop(addr, None)
        if ok and want is not None:
            _dispatch_promise_request(router, pool, addr, want, None)
        for st in state.deferred.pop(addr, ()):
            st.wake.set()  # look again: a newer event may want a newer promise


def _apply_promises(router: Any, addr: str, reply: dict[str, Any]) -> None:
    """Apply a promise reply from ``addr`` (``{promises: [{id, batches,
    postBatchResumeToken}]}``): each to the remote of an open stream whose cursor on ``addr``
    has that id (:meth:`router.merger.Merger.on_promise`), waking the stream when its promise
    moved. Advances the router's cluster time from the reply's ``$clusterTime``."""
    ct = reply.get("$clusterTime")
    if isinstance(ct, dict) and isinstance(ct.get("clusterTime"), Timestamp):
        router.clock.try_advance(ct["clusterTime"])
    promises = reply.get("promises")
    if not promises:
        return
    by_id = {int(p["id"]): p for p in promises if isinstance(p, dict) and "id" in p}
    for st in list(_promise_requests(router).streams):
        if st.closed:
            continue
        for r in st.merger.remotes:
            p = by_id.get(r.cursor_id) if r.address == addr else None
            if p is None:
                continue
            try:
                moved = st.merger.on_promise(r, int(p.get("batches", 1 << 62)),
                                             p["postBatchResumeToken"])
            except (KeyError, TypeError, ValueError, MongoError):
                continue  # not a usable promise: the remote's getMore still answers
            if moved:
                st.wake.set()


def _promise_request_body(router: Any, t: int) -> bytes:
    """The raw BSON of a promise request for time key ``t``, gossiping the router's cluster
    time (>= ``t``: the router has seen the write at ``t``)."""
    body: dict[str, Any] = {PROMISE_REQUEST_COMMAND: ts_from_key(t), "promises": True,
                            "$db": "admin"}
    now = router.clock.now()
    if now.time or now.inc:
        body["$clusterTime"] = {"clusterTime": now, "signature": DUMMY_SIGNATURE}
    return bson.encode(body, codec_options=CODEC)


def close_promise_channels(router: Any) -> None:
    """Close the router's promise-request connections (router shutdown)."""
    state = getattr(router, "_cs_promise_requests", None)
    if state is None:
        return
    for task in state.pending.values():
        task.cancel()
    state.pending.clear()
    for conn in state.channels.values():
        conn.close()
    state.channels.clear()


# Ask idle shards for promises from the write path (see on_shard_write).
EARLY_PROMISE_REQUESTS = True


def on_shard_write(router: Any, shard: str, ns: str, op_time: Any) -> None:
    """The router got ``shard``'s reply to a write on ``ns`` (``op_time`` = its operationTime,
    the write's oplog time T). For every open change stream that can see ``ns``, the other
    remotes that have not promised past T are asked right away for a promise past T
    (:func:`_send_promise_request`: no reply, newest T wins), so the idle shards' promises reach
    the router about when the write's event does, instead of a round trip after it (latency
    only; the merge rule still decides what is released). Called by ``router/writes.py``."""
    if not isinstance(op_time, Timestamp):
        return
    state = _promise_requests(router)
    if not state.streams:
        return
    t = ts_key(op_time)
    for st in list(state.streams):
        if st.closed or not st.watches(ns):
            continue
        for r in st.merger.remotes:
            if r.name == shard or r.closed or not r.in_flight:
                continue
            addr = r.address
            if not addr or state.sent.get(addr, -1) >= t:
                continue
            if r.promise is not None and (token_ts_key(r.promise[0]) or 0) > t:
                continue
            _send_promise_request(router, st.pools[r.rid], addr, t)


def _promise_requests(router: Any) -> _PromiseRequests:
    state = getattr(router, "_cs_promise_requests", None)
    if state is None:
        state = router._cs_promise_requests = _PromiseRequests()
    return state


def _cursor_batch(cur: Any, field: str, is_config: bool) -> tuple[Any, list[Item]]:
    """A shard reply's ``cursor`` subdocument (RawBSONDocument) as (its other fields, the
    batch's items). Shard events are parsed in place from the reply's bytes
    (:func:`router.merger.split_cursor`); the config cursor's few events, and anything
    unusual, go through RawBSONDocument and :func:`router.merger.item_from_raw_event`."""
    if not is_config:
        split = split_cursor(cur.raw, field)
        if split is not None:
            return split
    return cur, [item_from_raw_event(e, is_config=is_config) for e in cur.get(field, [])]


def _plain(token: Any) -> Any:
    """A token from a raw reply as a plain dict (it is stored and re-sent)."""
    if token is None:
        return None
    if isinstance(token, RawBSONDocument):
        return dict(token.items())
    return token


class RouterChangeStreamCursor(Cursor):
    """The client's cursor on the router (registered in ``router.cursors``)."""

    is_change_stream = True
    tailable = True
    await_data = True

    def __init__(self, stream: RouterChangeStream) -> None:
        super().__init__(stream.ns)
        self.stream = stream

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        """One batch: every event that is ready (up to ``batch_size`` / 16 MiB). The first
        batch never waits; a getMore waits up to ``max_time_ms`` (default 1000 ms) for the first
        event. Raises the first remote error with the router's labels (the cursor is then
        killed by the cursor manager, which kills the remote cursors)."""
        st = self.stream
        merge = st.merge
        assert merge is not None
        limit = batch_size if batch_size else (101 if first else 1 << 62)
        if first and batch_size == 0:
            limit = 0
        wait_ms = DEFAULT_AWAIT_MS if max_time_ms is None else int(max_time_ms)
        if not first:
            st.remote_await_ms = wait_ms if wait_ms > 0 else DEFAULT_AWAIT_MS
        deadline = time.monotonic() + wait_ms / 1000
        parts: list[bytes] = []  # the reply's array elements, encoded (see Block.write)
        n_out = 0
        size = 0
        exhausted = False
        invalidate_pbrt = None
        stashed = False
        nudge = True
        last_token: Any = None
        command = "aggregate" if first else "getMore"
        while n_out < limit:
            st.wake.clear()  # before looking: a reply arriving from now on wakes the wait below
            outputs, tok, size = merge.take(limit - n_out, BATCH_BYTES_LIMIT, n_out, size)
            if outputs:  # the plain events of a run, without the general path's per-event work
                for o in outputs:
                    if type(o) is Block:
                        n_out = o.write(parts, n_out)
                    else:
                        parts.append(element_headers(n_out, 1)[0])
                        parts.append(o)
                        n_out += 1
                last_token = tok
                continue
            try:
                x = merge.next()
            except MongoError as exc:
                st.close()
                raise _labelled(exc, command) from None
            if isinstance(x, NewShard):
                await st.open_new_shard(x)
                continue
            if isinstance(x, Item):
                # element header (type, index key, NUL) counts too: the reply must stay legal BSON
                if n_out and size + len(x.payload) + len(str(n_out)) + 2 > BATCH_BYTES_LIMIT:
                    merge.push_back(x)  # mongos stashes it for the next batch
                    stashed = True
                    break
                size += len(x.payload) + len(str(n_out)) + 2
                parts.append(element_headers(n_out, 1)[0])
                parts.append(x.payload)
                n_out += 1
                last_token = x.token
                if merge.invalidated:
                    exhausted = True
                    break
                continue
            # Nothing ready.
            inv = st.merger.invalidated_remote()
            if inv is not None:
                invalidate_pbrt = inv.promise_token
                exhausted = True
                break
            if n_out or first:
                break
            st.schedule_getmores(nudge=nudge)
            recheck = st.request_promises()
            nudge = False
            remaining = deadline - time.monotonic()
            if remaining <= 0 or st.closed:
                break
            if merge.merger.ready():
                continue
            try:
                await asyncio.wait_for(st.wake.wait(),
                                       remaining if recheck is None else min(remaining, recheck))
            except asyncio.TimeoutError:
                if recheck is None or recheck >= remaining:
                    break
        st.schedule_getmores()  # first batch: start waiting on shards now; later: prefetch
        track_operation_time(st.op_time)
        if invalidate_pbrt is not None:
            pbrt = invalidate_pbrt
        elif stashed or merge.invalidated:
            pbrt = _plain(last_token)  # the last returned event; the HWM already passed it
        else:
            pbrt = st.merger.high_water_mark()
            if n_out and pbrt is None:
                pbrt = _plain(last_token)
        return Batch([], exhausted, pbrt, raw_docs=parts)

    async def close(self) -> None:
        self.stream.close()
