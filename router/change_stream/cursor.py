"""The router's change-stream cursor: the stream that opens and drives the remotes, and the
client's cursor that serves its getMores.

:class:`RouterChangeStream` (one per client stream) mirrors, in order:

- ``sharded_agg_helpers.cpp`` ``targetPipeline``/``dispatchTargetedShardPipeline``
  (:meth:`RouterChangeStream.establish`): capture the router's cluster time, reload the shard
  list, fix the start point explicitly for every shard (client token, ``startAtOperationTime``,
  or cluster time + 1 tick — ``DocumentSourceChangeStream::getStartTimeForNewStream``), send
  every shard ``aggregate`` with ``needsMerge: true``, ``fromRouter: true``,
  ``cursor: {batchSize: 0}``, and open the ``config.shards`` monitor
  (``openChangeStreamNewShardMonitor``) at the captured time;
- ``async_results_merger.cpp`` ``_scheduleGetMores`` (:meth:`RouterChangeStream.schedule_getmores`):
  getMores to remotes run concurrently, only for remotes with an empty buffer and no request in
  flight, with ``maxTimeMS`` capped at 1000 ms when there is more than one remote; the first
  remote error fails the client's getMore with that code and the labels the router computes
  (``error_labels.cpp``), and kills the other remote cursors;
- ``establishShardCursorsOnNewShards`` (:meth:`RouterChangeStream.open_new_shard`): the new
  shard's cursor from ``resumeAfter: HWM(event clusterTime + 1 tick)``, decided by
  :mod:`router.change_stream.handle_topology_change`.

:class:`RouterChangeStreamCursor` mirrors ``cluster_aggregation_planner.cpp``
``establishMergingMongosCursor`` (an empty first batch, a live cursor id and a
``postBatchResumeToken``, the merger's high-water mark) and ``cluster_find.cpp`` ``runGetMore``
+ ``blocking_results_merger.cpp``: a getMore returns as soon as at least one event is ready
(taking all that are ready), else waits up to its ``maxTimeMS`` (default 1000 ms) and returns
an empty batch with the current high-water mark.

The merge itself is pure (:mod:`.async_results_merger`, :mod:`.merge_cursors`); this module
does the I/O around it, plus shardsim's promise requests (:mod:`.promise_requests`) at the two
points where an event waits for idle shards. Events are forwarded as raw BSON bytes
(:mod:`.raw_events`): the shard's trailing ``$sortKey`` is cut off by byte surgery, never
decoded and re-encoded.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from shardsim.router.change_stream.async_results_merger import CONFIG_SHARDS_NS, Merger, Remote
from shardsim.core.resume_token import make_high_water_mark, token_ts_key
from shardsim.router.change_stream.handle_topology_change import NewShard
from shardsim.router.change_stream.merge_cursors import ChangeStreamMerge
from shardsim.router.change_stream import reader_v2
from shardsim.router.change_stream.raw_events import Item, item_from_raw_event, split_cursor
from shardsim.router.change_stream.staged_batch import StagedBatch, write_outputs
from shardsim.core.gossip import gossip_command, gossip_in, gossip_out, track_operation_time
from shardsim.core.clock import ts_add_ticks, ts_from_key, ts_key
from shardsim.core.cursors import BATCH_BYTES_LIMIT, Batch, Cursor, element_headers
from shardsim.core.replica_set_monitor import ReadPreference
from shardsim.core.errors import MongoError, change_stream_labels

log = logging.getLogger("shardsim.router.change_stream")

DEFAULT_AWAIT_MS = 1000  # mongos' default awaitData timeout for a getMore without maxTimeMS
REMOTE_AWAIT_CAP_MS = 1000  # ARM::setAwaitDataTimeout cap when merging more than one remote
SHORT_AWAIT_MS = 20  # remote await of a one-off poll for a newer promise (ms)
# How long the first batch of a stream resumed from an event token waits to pass the token
# (so a token that is not in the stream fails the aggregate with 280, as on mongos, where
# establishing the merged cursor pulls the shards' first results).
RESUME_CHECK_WAIT_MS = 2000
# batchSize of the router's getMores to shards: a backlog then comes in slices, so shards build
# the next slice while the router merges this one and the client reads the previous one.
# A remote's first getMore (and the first after a batch that was not full, i.e. after it caught
# up) asks for REMOTE_FIRST_BATCH_SIZE; each full batch doubles the next one, up to
# REMOTE_BATCH_SIZE. So a catch-up's first events reach the client after a small batch, not
# after every shard built a full one at once (three shards' 5,000-event batches took both cores
# for ~50 ms before the client had anything to decode), and the stages overlap from the start.
REMOTE_BATCH_SIZE = 5000
REMOTE_FIRST_BATCH_SIZE = 500
# A client batch taking at least this many bytes of events at once sends the remote getMores
# it makes possible before the reply is built (RouterChangeStreamCursor.fetch); a smaller one
# (the live case: an event or a few) answers the client first.
EARLY_REMOTE_GETMORE_BYTES = 256 * 1024
# Aggregate fields the router does not pass on to shards (it sets its own cursor/needsMerge).
_NOT_FORWARDED = frozenset({"aggregate", "pipeline", "cursor", "$db", "$clusterTime", "lsid",
                            "txnNumber", "$readPreference", "maxAwaitTimeMS", "maxTimeMS",
                            "writeConcern", "needsMerge", "fromRouter", "fromMongos",
                            "explain", "apiVersion", "apiStrict", "apiDeprecationErrors"})


def _fresh_error(exc: MongoError) -> MongoError:
    """The remote's code/codeName/errmsg without its labels: mongos computes labels itself
    (notes §6.2 "shard labels are not copied")."""
    return MongoError(exc.code, exc.errmsg, code_name_override=exc.code_name)


def _labelled(exc: MongoError, command: str, profile: Any = None) -> MongoError:
    """``exc`` with the labels the router adds for a change stream's ``command`` (``profile``:
    the router's server-version profile)."""
    err = _fresh_error(exc)
    err.labels = change_stream_labels(err.code, is_change_stream=True, command=command,
                                      profile=profile)
    return err


def _split_ns(ns: str) -> tuple[str, str]:
    db, _, coll = ns.partition(".")
    return db, coll


class RouterChangeStream:
    """Everything one client change stream owns on the router: the merge, the remotes and their
    pools, and the commands to (re)open shard cursors.

    ``router`` — the :class:`router.node.RouterNode` (``clock``, ``catalog``, ``config_pool``,
    ``pool_for``, ``promise_requests``); ``db``/``target``/``ns`` — the stream's database,
    ``aggregate`` target (collection name, or 1 for a database/cluster stream) and cursor
    namespace; ``spec`` — the ``$changeStream`` document (its start made explicit by
    :meth:`establish`); ``user_stages`` — the client's stages after it, sent to the shards;
    ``body`` — the client's ``aggregate`` (its other fields are forwarded). Built by
    :func:`router.change_stream.aggregate_change_stream`, then :meth:`establish`.
    """

    def __init__(self, router: Any, db: str, target: Any, ns: str, spec: dict[str, Any],
                 user_stages: list[Any], body: dict[str, Any]) -> None:
        self.router = router
        self.db = db
        self.target = target
        self.ns = ns
        self.spec = spec
        self.user_stages = list(user_stages)
        self.passthrough = {k: v for k, v in body.items() if k not in _NOT_FORWARDED}
        # the client's $readPreference: the member of each shard the remote cursors open on
        self.read_preference = ReadPreference.parse(body.get("$readPreference"))
        self.merger = Merger()
        self.merge: ChangeStreamMerge | None = None
        self.pools: dict[int, Any] = {}  # remote id -> Pool
        self.wake = asyncio.Event()
        self.closed = False
        self.op_time: Timestamp | None = None
        self.remote_await_ms = DEFAULT_AWAIT_MS
        self.nudged: dict[int, int] = {}  # remote id -> router time it was last short-polled for
        self.idle: dict[int, bool] = {}  # remote id -> its last getMore reply had no events
        self.sent_at: dict[int, float] = {}  # remote id -> monotonic time of its last getMore
        self.batch_sizes: dict[int, int] = {}  # remote id -> batchSize of its next getMore
        self.promises = router.promise_requests  # router-wide, shared by its streams
        # $currentOp's originatingCommand: the client's aggregate (without $db and gossip)
        self.originating_command = {k: v for k, v in body.items()
                                    if k not in ("$clusterTime", "lsid", "$readPreference")}
        self.cursor = RouterChangeStreamCursor(self)
        self.topology_v2: Any = None  # reader_v2.HandleTopologyChangeV2 of a v2 stream
        # The next reply built ahead during a catch-up (staged_batch.py): its events, the
        # client's batch limit it is built for (0: not staging) and whether a client
        # getMore is running (it takes the events itself then).
        self.staged: StagedBatch | None = None
        self.stage_limit = 0
        self.fetching = False

    # -- opening -------------------------------------------------------------------------------
    def _v1_tokens(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A 6.0 mongos asks every remote for v1 resume tokens (``$_generateV2ResumeTokens:
        false``, ``sharded_agg_helpers.cpp`` of 6.0): ``spec`` with that field when the
        router's profile makes v1 tokens, else ``spec`` itself."""
        if self.router.profile.resume_token_version == 1 and "$_generateV2ResumeTokens" not in spec:
            return {**spec, "$_generateV2ResumeTokens": False}
        return spec

    def _shard_command(self, spec: dict[str, Any]) -> dict[str, Any]:
        spec = self._v1_tokens(spec)
        cmd: dict[str, Any] = {"aggregate": self.target,
                               "pipeline": [{"$changeStream": spec}] + self.user_stages}
        cmd.update(self.passthrough)
        cmd["needsMerge"] = True
        cmd["fromRouter"] = True
        cmd["cursor"] = {"batchSize": 0}
        return cmd

    async def establish(self) -> None:
        """Open every shard cursor and the config.shards monitor (not for a stream on the
        ``config`` database), all concurrently; set the initial HWM; build the merge. Raises
        ShardNotFound (70) when the catalog lists no shard, and the first error of any
        ``aggregate`` (without the remote's labels), after killing the cursors that did open."""
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
        if reader_v2.wants_v2(router, spec, self.target):  # 9.0 precise shard targeting
            start = spec.get("startAtOperationTime")
            if start is None:
                start = ts_from_key(token_ts_key(token["_data"]) or 0)
            if await reader_v2.establish(self, spec, start):
                self.merger.set_initial_high_water_mark()
                self.promises.streams.add(self)
                self.merge = ChangeStreamMerge(self.merger, resume_token=token,
                                               start_after="startAfter" in spec)
                self.merge.use_v2_reader(self.topology_v2)
                return
        # The v1 reader (also kSwitchToV1): the shards run the v1 pipeline (no control events),
        # and the reader's options are the router's alone (a shard of an older release in a
        # mixed cluster does not know them).
        if "version" in spec or "ignoreRemovedShards" in spec:
            self.spec = spec = {k: v for k, v in spec.items()
                                if k not in ("version", "ignoreRemovedShards")}
        shards = [s[0] for s in router.catalog.shards()]
        if not shards:
            raise MongoError(70, "no shards found")
        cmd = self._shard_command(spec)  # the same explicit start for every shard
        opens = [self._open(name, self.db, cmd) for name in shards]
        config_cmd = None
        if self.db != "config":
            config_cmd = {"aggregate": "shards",
                          "pipeline": [{"$changeStream": self._v1_tokens(
                              {"startAtOperationTime": registry_time,
                               "allowToRunOnConfigDB": True})}],
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
        self.promises.streams.add(self)  # promise replies and the write path reach it now
        self.merge = ChangeStreamMerge(self.merger, resume_token=token, known_shards=shards,
                                       start_after="startAfter" in spec)

    async def _open(self, shard: str | None, db: str, cmd: dict[str, Any]) -> Remote:
        """Send the establish ``aggregate`` to ``shard`` (None = config server) and add the
        remote with its first batch."""
        router = self.router
        if shard is None:
            pool = router.config_pool
            pin = getattr(pool, "pin", None)
            if pin is not None:  # a config server replica set: the cursor is on its primary
                pool = await pin()
            reply = await gossip_command(router.clock, pool, db, cmd, raw=True)
        else:  # the member the stream's read preference selects, with retries (133 at worst)
            pool, reply = await router.establish_cursor(shard, db, cmd, raw=True,
                                                        read_preference=self.read_preference)
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
        ``resumeAfter: HWM(shardAddedTime + 1)`` (``createUpdatedCommandForNewShard``) and add
        it to the merger before anything later is released. Raises the shard's error with the
        labels the router adds to a getMore (the client's getMore fails with it)."""
        router = self.router
        if router.catalog.shard_address(action.shard) is None:
            await router.catalog.refresh()
        spec = {k: v for k, v in self.spec.items()
                if k not in ("resumeAfter", "startAfter", "startAtOperationTime")}
        start = action.start_token
        if router.profile.resume_token_version == 1:  # 6.0: the HWM in the stream's version
            start = make_high_water_mark(ts_from_key(token_ts_key(start["_data"]) or 0), 1)
        spec["resumeAfter"] = start
        try:
            await self._open(action.shard, self.db, self._shard_command(spec))
        except MongoError as exc:
            raise _labelled(exc, "getMore", router.profile) from None

    # -- remote getMores ----------------------------------------------------------------------
    def schedule_getmores(self, nudge: bool = False, prefetch_only: bool = False) -> bool:
        """``_scheduleGetMores``: one getMore per remote that has nothing buffered and no
        request outstanding (and the prefetches :meth:`Merger.remotes_to_poll` allows; only
        those with ``prefetch_only``). Tasks run in a fresh context (they outlive client
        operations). Returns whether any was scheduled."""
        polls = self.merger.remotes_to_poll(prefetch_only)
        if not polls:
            return False
        # (An event held back only by promises is handled by the promise requests, which also
        # cut short the getMores already waiting.) When a client getMore starts, a remote whose
        # promise is older than the router's cluster time can promise more right away (our
        # getMore gossips that time to it): ask it once without a long await, so a write the
        # router has seen does not wait for idle shards' await periods. (Only at the start of a
        # client getMore: idle streams then cost at most one extra round per remote and client
        # getMore.)
        now_key = ts_key(self.router.clock.now())
        for r in polls:
            short = False
            if nudge and r.promise is not None:
                pts = token_ts_key(r.promise[0])
                if pts is not None and pts < now_key and self.nudged.get(r.rid) != now_key:
                    self.nudged[r.rid] = now_key
                    short = True
            r.in_flight = True
            # Written to the shard now, not when the task first runs: that is only once the
            # running task yields the loop (e.g. after a client getMore built and wrote its
            # reply), and the shard would sit idle meanwhile. The task reads the reply.
            db, cmd = self._getmore_command(r, short)
            pool = self.pools[r.rid]
            self.sent_at[r.rid] = time.monotonic()
            conn = self._write_now(pool, db, cmd)
            asyncio.get_running_loop().create_task(self._remote_getmore(r, db, cmd, pool, conn),
                                                   context=contextvars.Context())
        return True

    def _getmore_command(self, r: Remote, blocked: bool) -> tuple[str, dict[str, Any]]:
        """``(db, getMore command)`` for ``r`` (a short await when ``blocked``)."""
        db, coll = _split_ns(r.ns)
        await_ms = self.remote_await_ms
        if len(self.merger.remotes) > 1:
            await_ms = min(await_ms, REMOTE_AWAIT_CAP_MS)
        if blocked:
            await_ms = min(await_ms, SHORT_AWAIT_MS)
        return db, {"getMore": Int64(r.cursor_id), "collection": coll,
                    "maxTimeMS": int(await_ms),
                    "batchSize": self.batch_sizes.get(r.rid, REMOTE_FIRST_BATCH_SIZE)}

    def _write_now(self, pool: Any, db: str, cmd: dict[str, Any]) -> Any:
        """Write ``cmd`` with the router's ``$clusterTime`` (:func:`gossip_out`) on an idle
        connection of ``pool`` at once; that connection, or None when the pool has none idle
        (or is not a plain pool): the task then sends it the usual way."""
        write_now = getattr(pool, "write_now", None)
        if write_now is None:
            return None
        return write_now(db, gossip_out(self.router.clock, cmd))

    def watches(self, ns: str) -> bool:
        """Can a write to ``ns`` ("db.coll") produce an event for this stream?"""
        if isinstance(self.target, str):
            return ns == self.ns
        return self.db == "admin" or ns.startswith(self.db + ".")

    async def _remote_getmore(self, r: Remote, db: str, cmd: dict[str, Any], pool: Any,
                              conn: Any) -> None:
        """The getMore ``cmd`` on ``r`` (already written on ``conn`` by
        :meth:`schedule_getmores`, or sent here when ``conn`` is None), its reply fed to the
        merger (or its error recorded there); wakes the client's getMore when done."""
        batch_size = cmd["batchSize"]
        timeout = cmd["maxTimeMS"] / 1000 + 30
        clock = self.router.clock
        try:
            if conn is None:
                reply = await gossip_command(clock, pool, db, cmd, raw=True, timeout=timeout)
            else:
                reply = gossip_in(clock, await pool.finish(conn, raw=True, timeout=timeout))
            if self.closed:
                return
            op_time = reply.get("operationTime")
            if isinstance(op_time, Timestamp) and (self.op_time is None
                                                   or ts_key(op_time) > ts_key(self.op_time)):
                self.op_time = op_time
            cur, items = _cursor_batch(reply["cursor"], "nextBatch", r.is_config)
            cid = int(cur.get("id", 0))
            if cid != 0 and cid != r.cursor_id:
                raise MongoError(2, f"Expected cursorid {r.cursor_id} but received {cid}")
            self.idle[r.rid] = not items
            r.more = sum(e.n for e in items) >= batch_size  # Items, or one Block
            # a backlog: ask for more next time; caught up: start small again
            self.batch_sizes[r.rid] = (min(2 * batch_size, REMOTE_BATCH_SIZE) if r.more
                                       else REMOTE_FIRST_BATCH_SIZE)
            self.merger.on_batch(r, items, cid, _plain(cur.get("postBatchResumeToken")),
                                 invalidated=bool(cur.get("invalidated", False)))
            if items:
                # Ask the idle remotes for promises now, not when the client's next getMore
                # arrives: the client is often between getMores when a write's event comes in.
                self.promises.request_for_held_event(self)
        except MongoError as exc:
            if not r.is_config:  # the shard's monitor learns what the error says of the member
                report = getattr(getattr(self.router, "shards", None), "report", None)
                if report is not None:
                    report(r.name, pool.address, exc)
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
        self.stage_more()  # (nothing unless a catch-up is staging and no getMore runs)
        if not self.closed:
            if r.more:
                self.schedule_getmores()  # a full batch: prefetch the rest of the backlog
            else:  # its promise may have made another remote's backlog releasable: read on
                self.schedule_getmores(prefetch_only=True)

    # -- the next batch, built ahead -------------------------------------------------------
    def stage_more(self) -> None:
        """During a catch-up (``stage_limit`` set by the last large reply) and while no client
        getMore runs: take the events that are releasable now into :attr:`staged`, up to the
        client's batch limit and 16 MiB (see :mod:`.staged_batch`); the parts are joined once
        the batch is full. Called after a large reply is written and whenever a remote batch
        arrives."""
        limit = self.stage_limit
        if not limit or self.fetching or self.closed or self.merge is None:
            return
        stg = self.staged
        if stg is None:
            stg = StagedBatch()
        if stg.n >= limit:
            return
        outputs, tok, size = self.merge.take(limit - stg.n, BATCH_BYTES_LIMIT, stg.n, stg.size)
        if not outputs:
            return
        stg.add(outputs, tok, size)
        self.staged = stg
        if stg.n >= limit:
            stg.compact()
        self.schedule_getmores()  # the buffers it emptied can be refilled now

    def _staged_start(self, limit: int) -> StagedBatch | None:
        """The staged events this getMore starts from (at most ``limit``; the rest stays
        staged), or None."""
        stg = self.staged
        if stg is None:
            return None
        if stg.n <= limit:
            self.staged = None
            return stg
        head, self.staged = stg.split(limit)
        return head

    # -- closing ------------------------------------------------------------------------------
    def _kill_remote(self, r: Remote) -> None:
        """``killCursors`` on ``r``'s cursor, fire and forget (not when it is exhausted or the
        remote already dropped it)."""
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
            """Send it; a failure is ignored (fire and forget, as ``ARM::kill``)."""
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
        self.staged = None
        self.promises.streams.discard(self)
        for r in list(self.merger.remotes):
            self._kill_remote(r)
        self.wake.set()


def _cursor_batch(cur: Any, field: str, is_config: bool) -> tuple[Any, list[Item]]:
    """A shard reply's ``cursor`` subdocument (RawBSONDocument) as (its other fields, the
    batch's items). Shard events are parsed in place from the reply's bytes
    (:func:`router.change_stream.raw_events.split_cursor`); the config cursor's few events, and
    anything unusual, go through RawBSONDocument and
    :func:`router.change_stream.raw_events.item_from_raw_event`."""
    if not is_config:
        split = split_cursor(cur.raw, field)
        if split is not None:
            return split
    return cur, [item_from_raw_event(e, is_config=is_config) for e in cur.get(field, [])]


def _cover_with_cluster_time(clock: Any, pbrt: Any) -> None:
    """Move the router's clock up to ``pbrt``'s cluster time when it is behind.

    mongos never hands out a postBatchResumeToken past its own ``$clusterTime``: the ARM's
    high-water mark is the lowest of the shards' tokens (``AsyncResultsMerger::
    _updateRemoteMetadata``), each at or below the cluster time its shard gossiped with it,
    which the router's vector clock took in (``VectorClock::gossipIn``); the start of a new
    stream is its clock + 1 tick, gossiped to the shards with their ``aggregate``. So a client
    may read with ``afterClusterTime`` at the token's time (else InvalidOptions 72). The clock
    is moved as gossip would move it (never backwards; a time failing the rate limiter is
    ignored)."""
    data = pbrt.get("_data") if hasattr(pbrt, "get") else None
    key = token_ts_key(data) if isinstance(data, str) else None
    if key is not None and key > clock.now_key():
        clock.try_advance(ts_from_key(key))


def _plain(token: Any) -> Any:
    """A token from a raw reply as a plain dict (it is stored and re-sent)."""
    if token is None:
        return None
    if isinstance(token, RawBSONDocument):
        return dict(token.items())
    return token


class RouterChangeStreamCursor(Cursor):
    """The client's cursor on the router (registered in ``router.cursors``, which calls
    :meth:`fetch` for the first batch and every getMore, and :meth:`close` on killCursors)."""

    is_change_stream = True
    tailable = True
    await_data = True

    def __init__(self, stream: RouterChangeStream) -> None:
        super().__init__(stream.ns)
        self.stream = stream
        self.originating_command = stream.originating_command

    def current_op_extra(self) -> dict[str, Any]:
        """``{changeStream: {...}}``: why the stream waits (shardsim's own field,
        :mod:`router.change_stream.current_op`)."""
        from shardsim.router.change_stream.current_op import change_stream_report
        st = self.stream
        router = st.router

        def state_of(remote: Any) -> str | None:
            return router.shards.member_state(None if remote.is_config else remote.name,
                                              remote.address, router.config_pool)
        staged = st.staged.n if st.staged is not None else 0
        return {"changeStream": change_stream_report(st.merger, router.clock.now(), state_of,
                                                     staged)}

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        """One batch: every event that is ready (up to ``batch_size`` / 16 MiB). The first
        batch does not wait, except for a stream resumed from an event token: it reads on
        (up to :data:`RESUME_CHECK_WAIT_MS`) until the token is found or passed, so a token
        that is not in the stream fails the ``aggregate`` with 280; a getMore waits up to
        ``max_time_ms`` (default 1000 ms) for the first event. Raises the first remote error with the router's labels (the cursor is then
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
        # A resumed stream's first batch: read until the client's token is found or passed.
        resuming = first and merge.resume_check is not None \
            and not merge.resume_check.is_invalidate  # (an invalidate token never fails: 280)
        if resuming:
            wait_ms = RESUME_CHECK_WAIT_MS
            st.remote_await_ms = SHORT_AWAIT_MS
        deadline = time.monotonic() + wait_ms / 1000
        command = "aggregate" if first else "getMore"
        st.fetching = True
        try:
            return await self._fetch(st, merge, limit, first, resuming, deadline, command)
        finally:
            st.fetching = False

    async def _fetch(self, st: RouterChangeStream, merge: Any, limit: int, first: bool,
                     resuming: bool, deadline: float, command: str) -> Batch:
        """:meth:`fetch`'s body, with ``st.fetching`` set (no staging meanwhile)."""
        parts: list[bytes] = []  # the reply's array elements, encoded (see Block.write)
        n_out = 0
        size = 0
        exhausted = False
        invalidate_pbrt = None
        stashed = False
        nudge = True
        last_token: Any = None
        staged = None if first else st._staged_start(limit)
        if staged is not None:  # built ahead (staged_batch.py): start from it
            parts = staged.parts
            n_out = staged.n
            size = staged.size
            last_token = staged.last_token
            stashed = st.staged is not None  # the rest waits: HWM may be past this reply's end
        while n_out < limit:
            st.wake.clear()  # before looking: a reply arriving from now on wakes the wait below
            before = size
            outputs, tok, size = merge.take(limit - n_out, BATCH_BYTES_LIMIT, n_out, size)
            if outputs and size - before >= EARLY_REMOTE_GETMORE_BYTES:
                # A large take (a backlog read): the remote getMores it makes possible go out
                # (written at once, see schedule_getmores) before this reply is built and
                # written, so the shards read their next batches meanwhile instead of after it.
                # (No yield to let tasks write them: the client's reply would wait behind
                # whatever else is ready on the loop.)
                st.schedule_getmores()
            if outputs:  # the plain events of a run, without the general path's per-event work
                n_out = write_outputs(parts, outputs, n_out)
                last_token = tok
                continue
            try:
                x = merge.next()
            except MongoError as exc:
                st.close()
                raise _labelled(exc, command, st.router.profile) from None
            if isinstance(x, NewShard):
                await st.open_new_shard(x)
                continue
            if isinstance(x, reader_v2.Retarget):
                await reader_v2.apply(st, x)
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
            if n_out or (first and not (resuming and merge.resume_check is not None
                                        and not merge.resume_check.seen)):
                break
            st.schedule_getmores(nudge=nudge)
            recheck = st.promises.request_for_held_event(st)
            nudge = False
            remaining = deadline - time.monotonic()
            if remaining <= 0 or st.closed:
                break
            if merge.merger.ready():
                continue
            try:
                # (asyncio.timeout, not wait_for: no Task wrapped around the wait per round)
                async with asyncio.timeout(remaining if recheck is None
                                           else min(remaining, recheck)):
                    await st.wake.wait()
            except TimeoutError:
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
        _cover_with_cluster_time(st.router.clock, pbrt)
        # A large reply (a catch-up): build the next one while the client decodes this one,
        # from after this reply is written (its postBatchResumeToken is fixed above; staging
        # moves the merge on). A small one (a live stream) stops that.
        st.stage_limit = limit if not first and not exhausted \
            and size >= EARLY_REMOTE_GETMORE_BYTES else 0
        if st.stage_limit:
            asyncio.get_running_loop().call_soon(st.stage_more)
        return Batch([], exhausted, pbrt, raw_docs=parts, n_raw=n_out)

    async def close(self) -> None:
        """The client killed the cursor (or it ended): kill the remote cursors."""
        self.stream.close()
