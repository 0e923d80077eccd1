"""One client change stream through the simulated router: the driver of the real merge.

A :class:`Stream` holds the router's state for one client cursor: a real
``router.change_stream.async_results_merger.Merger`` with one remote per shard cursor (and the config server's
``config.shards`` cursor) and a real ``ChangeStreamMerge`` over it. It answers the client's
getMores (:meth:`Stream.client_getmore`) as the router does: release what the merge allows,
else poll the remotes that may advance it (:meth:`Stream._remote_getmore`) and ask the shards
that hold the smallest buffered event back for a promise past it
(:meth:`Stream._request_promises`, the router's ``_shardsimAdvanceClusterTime``). A
``kNewShardDetected`` from the config cursor makes it open a cursor on the new shard.

What the client saw is recorded for the checkers: ``returned`` (events in order), ``pbrts``
(each reply's postBatchResumeToken key and how many events were returned before it),
``releases`` (each released event's key with the lowest remote promise at that moment) and
``error``.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Callable

import bson

from shardsim.router.change_stream.async_results_merger import Merger
from shardsim.router.change_stream.handle_topology_change import NewShard
from shardsim.router.change_stream.merge_cursors import ChangeStreamMerge
from shardsim.router.change_stream.raw_events import Block, Item, split_cursor
from shardsim.core.resume_token import hwm_data, token_key
from shardsim.core.cursors import SORT_KEY_LAYOUT_FIELD, SORT_KEY_SIZES_FIELD
from shardsim.core.errors import MongoError

from .real_shard import NS, RealShard
from .shard_model import ShardCursor, SimEvent, SimShard

if TYPE_CHECKING:
    from .world import World


class Stream:
    """Client stream ``sid`` of the world ``sim``, opened at ``start_token`` (a resumed stream
    when ``resume``: the token's own event is not returned again)."""

    def __init__(self, sim: World, sid: int, start_token: dict, resume: bool) -> None:
        self.sim = sim
        self.sid = sid
        self.start_token = start_token
        self.merger = Merger()
        self.cursors: dict[str, ShardCursor] = {}
        self.cs: ChangeStreamMerge
        self.returned: list[SimEvent] = []
        self.pbrts: list[tuple] = []  # (key, number of events returned before it)
        self.opening = False
        self.getmore_deadline: int | None = None
        self.batch: list[SimEvent] = []
        self.done = False
        self.resume = resume
        self.remote_of: dict[str, Any] = {}
        self.error: MongoError | None = None
        self.requested: dict[str, int] = {}  # shard -> highest time a promise was asked past
        self.pending_answer: dict[str, Callable[[], None]] = {}  # shard -> its waiting getMore
        # (released event's key, lowest remote promise key then, None if one had none)
        self.releases: list[tuple[tuple, tuple | None]] = []

    def open(self) -> None:
        """Open a cursor on every shard at the start token and on the config server at the
        router's time; the first postBatchResumeToken is the merge's initial high-water mark."""
        sim = self.sim
        for sh in sim.shards:
            self._add(sh, self.start_token)
        if self.done:
            return  # a shard refused the stream (recorded in ``error``)
        cfg_start = {"_data": hwm_data(sim.router_time)}
        self._add(sim.config, cfg_start)
        self.merger.set_initial_high_water_mark()
        self.cs = ChangeStreamMerge(self.merger, resume_token=self.start_token if self.resume else None,
                                    known_shards=[s.name for s in sim.shards])
        hwm = self.merger.high_water_mark()
        self.pbrts.append((token_key(hwm), 0))

    def _add(self, sh: SimShard, start: dict) -> None:
        if isinstance(sh, RealShard):
            # The establish aggregate on the real shard code: the first stream's shards start
            # at its time (startAtOperationTime), resumed streams and new shards resumeAfter.
            try:
                h, items, cid, pbrt = sh.open(self, start, start is self.start_token
                                              and not self.resume)
            except MongoError as exc:
                self.fail(exc)
                return
            self.cursors[sh.name] = h
            h.remote = self.remote_of[sh.name] = self.merger.add_remote(sh.name, NS, cid, items,
                                                                        pbrt)
            return
        cur = ShardCursor(start)
        self.cursors[sh.name] = cur
        r = self.merger.add_remote(sh.name, "config.shards" if sh.is_config else "db.coll",
                                   1, [], start, is_config=sh.is_config)
        self.remote_of[sh.name] = r

    # -- client getMore ---------------------------------------------------------------------
    def client_getmore(self, max_time: int) -> None:
        """The client's getMore with ``maxTimeMS`` ``max_time``: ends with the events the merge
        releases, or empty at its deadline."""
        if self.getmore_deadline is not None or self.done:
            return
        self.getmore_deadline = self.sim.now + max_time
        self.batch = []
        self.sim.at(self.getmore_deadline, lambda: self.on_deadline())
        self.drive()

    def on_deadline(self) -> None:
        """The client getMore's maxTimeMS is over: reply (unless a new shard is being opened)."""
        if self.getmore_deadline is not None and self.sim.now >= self.getmore_deadline and not self.opening:
            self.finish()

    def finish(self) -> None:
        """Reply to the client: the batch and the merge's high-water mark."""
        hwm = self.merger.high_water_mark()
        self.returned.extend(self.batch)
        self.pbrts.append((token_key(hwm), len(self.returned)))
        self.getmore_deadline = None
        self.batch = []

    def fail(self, exc: MongoError) -> None:
        """The stream failed with ``exc`` (the client's getMore returns it; no more getMores)."""
        self.error = exc
        self.done = True
        self.getmore_deadline = None

    def drive(self) -> None:
        """Release what the merge allows into the current batch; if nothing, poll the remotes
        and request promises (called again whenever a reply arrives)."""
        if self.opening or self.getmore_deadline is None:
            return
        sim = self.sim
        while True:
            if sim.use_take and len(self.batch) < sim.batch_limit:
                # the router's fast path for runs of plain events (ChangeStreamMerge.take)
                got, _, _ = self.cs.take(sim.batch_limit - len(self.batch), None, len(self.batch), 0)
                if got:
                    for o in got:
                        self.batch.extend(self._output(o))
                    if len(self.batch) >= sim.batch_limit:
                        self.finish()
                        return
                    continue
            try:
                x = self.cs.next()
            except MongoError as exc:  # the router fails the client's getMore and the stream
                self.fail(exc)
                return
            if isinstance(x, NewShard):
                self.opening = True
                sh = sim.by_name[x.shard]

                def opened(sh: SimShard = sh, tok: dict = x.start_token) -> None:
                    self._add(sh, tok)
                    self.opening = False
                    if self.getmore_deadline is not None and sim.now >= self.getmore_deadline:
                        self.finish()
                    else:
                        self.drive()
                sim.at(sim.now + sim.rng.randint(1, 30), opened)
                return
            if isinstance(x, Item):
                self.batch.extend(self._output(x))
                if len(self.batch) >= sim.batch_limit:
                    self.finish()
                    return
                continue
            break
        if self.batch:
            self.finish()
            return
        max_await = min(1000, self.getmore_deadline - sim.now) if len(self.merger.remotes) > 1 else 1000
        for r in self.merger.remotes_to_poll():
            r.in_flight = True
            self._remote_getmore(r, max(1, max_await))
        self._request_promises()

    def _request_promises(self) -> None:
        """The router's ``_shardsimAdvanceClusterTime`` (router/change_stream/promise_requests.py
        ``request_promises``): the remotes holding back the smallest buffered event get its
        cluster time T gossiped after a random delay; a ``clock``-mode shard then answers its
        waiting getMore at once, a ``mongod`` one only when a visible entry passes T."""
        item, blockers = self.merger.blocking_remotes()
        if item is None:
            return
        sim = self.sim
        t = int(item.key[0][2:18], 16)
        for r in blockers:
            if self.requested.get(r.name, -1) >= t:
                continue
            self.requested[r.name] = t
            sh = sim.by_name[r.name]

            def arrive(sh: SimShard = sh, t: int = t) -> None:
                sh.gossip(max(t, sim.router_time))
                if isinstance(sh, RealShard):
                    self._real_promise_request(sh, t)
                    return
                fn = self.pending_answer.get(sh.name)
                if fn is None:
                    return
                if sh.mode == "mongod" and not any(ts > t for ts, _ in sh.oplog
                                                   if ts <= sh.visible_upto()):
                    return
                cur = self.cursors[sh.name]
                if sim.promise_replies and sh.mode != "mongod" and not sh.has_data(cur):
                    # The promise reply (shard/change_stream/cursor.py register): the promise
                    # comes back on its own connection, the getMore keeps waiting.
                    evs, pbrt = sh.answer(cur, 1)
                    assert not evs and pbrt is not None
                    r, k = self.remote_of[sh.name], cur.batches

                    def promised() -> None:
                        if r in self.merger.remotes and self.merger.on_promise(r, k, pbrt):
                            self.drive()
                    sim.at(sim.now + sim.rng.randint(0, 20), promised)
                    return
                fn()
            sim.at(sim.now + sim.rng.randint(0, 20), arrive)

    def _real_promise_request(self, sh: RealShard, t: int) -> None:
        """A promise request reaching a real shard: ``PromiseWaiters.request`` wakes the parked
        getMores that can now promise past ``t`` (their answers are scheduled) or, with promise
        replies, returns promises, each applied by its stream (``Merger.on_promise``)."""
        sim = self.sim
        for h, k, pbrt in sh.promise_request(t, sim.promise_replies):
            def promised(st: Stream = h.stream, r: Any = h.remote, k: int = k,
                         pbrt: Any = pbrt) -> None:
                if r in st.merger.remotes and st.merger.on_promise(r, k, pbrt):
                    st.drive()
            sim.at(sim.now + sim.rng.randint(0, 20), promised)

    def _block(self, evs: list[SimEvent]) -> list[Any] | None:
        """A shard batch as the router sees it: BSON events ``{_id, operationType, $sortKey}``
        split by :func:`router.change_stream.raw_events.split_cursor` (a Block for plain events)."""
        if not evs:
            return None
        batch = []
        for e in evs:
            self.sim.event_by_data[e.token["_data"]] = e
            batch.append({"_id": e.token, "operationType": e.op, "$sortKey": [e.token]})
        reply: dict[str, Any] = {"nextBatch": batch, "id": 1}
        if self.sim.vouch and all(e.op not in ("invalidate", "kNewShardDetected", "migrateChunkToNewShard") for e in evs):
            # as a shard does (shard/change_stream/cursor.py _sort_key_layout)
            encoded = [bson.encode(d) for d in batch]
            reply[SORT_KEY_LAYOUT_FIELD] = True
            reply[SORT_KEY_SIZES_FIELD] = bson.Binary(struct.pack(
                f"<{2 * len(batch)}i", *map(len, encoded),
                *(len(bson.encode(e.token)) for e in evs)), 0)
        split = split_cursor(bson.encode(reply), "nextBatch")
        assert split is not None
        return split[1]

    def _output(self, x: Any) -> list[SimEvent]:
        """The SimEvents of one output of the merge (a payload, an Item or a Block), each
        recorded in ``releases`` with the lowest remote promise at this moment."""
        by_data = self.sim.event_by_data
        if isinstance(x, Block):
            evs = [by_data[x.key_at(i)[0]] for i in range(x.lo, x.hi)]
        elif isinstance(x, Item):
            evs = [by_data[x.key[0]]] if isinstance(x.payload, bytes) else [x.payload]
        else:
            evs = [by_data[bson.decode(x)["_id"]["_data"]]] if isinstance(x, bytes) else [x]
        lowest = self.merger.min_promise()
        floor = lowest.promise if lowest is not None else None
        self.releases.extend((e.key, floor) for e in evs)
        return evs

    def _remote_getmore(self, r: Any, max_await: int) -> None:
        sim = self.sim
        sh = sim.by_name[r.name]
        cur = self.cursors[r.name]
        # The router's getMore carries its $clusterTime (gossip); a shard answers at once when it
        # has events, else it awaits data for a random part of maxTimeMS.
        if not sh.is_config or sim.rng.random() < 0.5:
            sh.gossip(sim.router_time)
        real = isinstance(sh, RealShard)
        ready = sh.ready(cur) if real else sh.has_data(cur)
        wait = sim.rng.randint(0, 20) if ready else sim.rng.randint(0, max_await)
        latency = sim.rng.randint(0, 20)

        def answer() -> None:
            if self.pending_answer.get(sh.name) is not answer:
                return  # already answered early (a promise request, a wake)
            del self.pending_answer[sh.name]
            limit = sim.rng.randint(1, 8)
            if real:
                try:
                    items, cid, pbrt = sh.getmore(cur, limit, sim.use_blocks)
                except MongoError as exc:
                    self.fail(exc)
                    return
            else:
                evs, pbrt = sh.answer(cur, limit)
                cur.batches += 1
                cid = 1

            def arrive() -> None:
                if r not in self.merger.remotes:
                    return
                if real:
                    got = items
                else:
                    got = self._block(evs) if sim.use_blocks and not sh.is_config else None
                    if got is None:
                        got = [Item(e.key, e.token, e, e.op, e.meta) for e in evs]
                self.merger.on_batch(r, got, cid, pbrt)
                self.drive()
            sim.at(sim.now + latency, arrive)
        self.pending_answer[sh.name] = answer
        if real:
            sh.park(cur, answer)  # real oplog appends and promise requests can wake it
        sim.at(sim.now + wait, answer)
