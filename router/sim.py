"""Seeded simulation of sharded change streams: shards, the config server, and the router merge.

FoundationDB-style: everything runs in one process on a deterministic scheduler driven by
``random.Random(seed)``, so an ordering bug found once is found again from its seed. The merge
under test is the real :class:`router.change_stream.merge_cursors.ChangeStreamMerge`; what is
simulated is the rest of the cluster:

- N shards with skewed wall clocks (hybrid logical clocks, ``max(wall, last) + 1``), random
  write times, writes whose oplog entry becomes visible only after a commit delay (an oplog
  *hole*: entries are visible up to the oldest in-flight timestamp, as on mongod);
- each shard answers the router's getMore after a random await/latency with the events visible
  at that moment and a postBatchResumeToken chosen by its *promise mode*:
  ``mongod`` = HWM(newest visible oplog ts; a periodic no-op writer keeps it moving),
  ``clock`` = HWM(min(clock now + 1, oldest in-flight write ts)), the shardsim default, and
  ``unsafe-clock`` = HWM(clock now + 1) ignoring in-flight writes (a deliberate bug, used to
  prove the checker finds violations);
- a config server whose ``config.shards`` inserts (addShard) make the router open a cursor on
  the new shard from HWM(event time + 1), after which writes go to the new shard too;
- client streams: one from the start, and resumed streams opened mid-run from random tokens
  (event tokens and postBatchResumeTokens) the first stream returned.

:func:`run_seed` returns a :class:`SimResult` whose ``violations`` list is empty when every
stream returned exactly the expected suffix of the cluster's events in strictly increasing
token order and every postBatchResumeToken was a safe, monotonic high-water mark.
"""

from __future__ import annotations

import heapq
import random
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

import bson

from router.change_stream.async_results_merger import Merger
from shardsim.resume_token import hwm_data
from router.change_stream.handle_topology_change import NewShard
from router.change_stream.merge_cursors import ChangeStreamMerge
from router.change_stream.raw_events import Block, Item, split_cursor
from shardsim.resume_token import token_key
from shardsim.cursors import SORT_KEY_LAYOUT_FIELD, SORT_KEY_SIZES_FIELD
from shardsim.errors import MongoError

PROMISE_MODES = ("clock", "mongod", "unsafe-clock")


def _event_data(ts: int, shard_idx: int, seq: int, op: str = "insert") -> str:
    # A v2 event token layout: Timestamp, version 2, tokenType 128, txnOpIndex 0, fromInvalidate
    # false, then a stand-in for uuid/eventIdentifier that breaks ties between shards.
    return f"82{ts:016X}2B042C0100296E{shard_idx:04X}{seq:08X}04"


@dataclass
class SimEvent:
    ts: int
    key: tuple
    token: dict
    op: str = "insert"
    meta: dict = field(default_factory=dict)


class SimShard:
    """One simulated shard (or the config server, ``is_config``)."""

    def __init__(self, sim: "Simulation", idx: int, name: str, skew_ms: int, mode: str,
                 is_config: bool = False) -> None:
        self.sim = sim
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
        wall = (self.sim.now + self.skew_ms) // 1000
        if wall > (self.last >> 32):
            self.last = (wall << 32) | 1
        else:
            self.last += 1
        return self.last

    def gossip(self, ts: int) -> None:
        if ts > self.last:
            self.last = ts

    def visible_upto(self) -> int:
        """Entries with ts below the oldest in-flight write are visible (no oplog holes)."""
        return min(self.in_flight) - 1 if self.in_flight else (1 << 64)

    def commit(self, ts: int, ev: SimEvent | None) -> None:
        self.in_flight.remove(ts)
        # keep ts order (commits may finish out of order)
        pos = len(self.oplog)
        while pos > 0 and self.oplog[pos - 1][0] > ts:
            pos -= 1
        self.oplog.insert(pos, (ts, ev))

    def has_data(self, cur: "ShardCursor") -> bool:
        """Are there visible events the cursor has not returned yet?"""
        upto = self.visible_upto()
        for ts, ev in reversed(self.oplog):
            if ts <= upto and ev is not None:
                return cur.last_key is None or ev.key > cur.last_key
        return False

    def answer(self, cur: "ShardCursor", limit: int) -> tuple[list[SimEvent], dict]:
        """The events a getMore returns now and its postBatchResumeToken."""
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
        if self.mode == "mongod":
            cand = scanned if scanned else None
        else:
            # The next tick is >= max(last + 1, wall << 32 | 1): nothing new can sort below it.
            wall = (self.sim.now + self.skew_ms) // 1000
            cand = max(self.last + 1, (wall << 32) | 1)
            if self.mode == "clock" and self.in_flight:
                cand = min(cand, min(self.in_flight))
            # unsafe-clock ignores in-flight writes (a bug on purpose)
        if cand is not None:
            tok = {"_data": hwm_data(cand)}
            k = token_key(tok)
            if cur.pbrt_key is None or k > cur.pbrt_key:
                cur.pbrt_key = k
        return [], {"_data": cur.pbrt_key[0]} if cur.pbrt_key is not None else None


class ShardCursor:
    def __init__(self, start_token: dict) -> None:
        self.start_key = token_key(start_token)
        # Shards scan from the token's clusterTime inclusive; a HWM start returns events >= it.
        self.scan_from = int(start_token["_data"][2:18], 16)
        self.scanned = 0
        self.last_key: tuple | None = None
        self.pbrt_key: tuple | None = self.start_key
        self.batches = 1  # replies sent, the establish batch included (a promise reply's cover)


class Stream:
    """One client change stream through the simulated router (the driver of the merge)."""

    def __init__(self, sim: "Simulation", sid: int, start_token: dict, resume: bool) -> None:
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

    def open(self) -> None:
        sim = self.sim
        for sh in sim.shards:
            self._add(sh, self.start_token)
        cfg_start = {"_data": hwm_data(sim.router_time)}
        self._add(sim.config, cfg_start)
        self.merger.set_initial_high_water_mark()
        self.cs = ChangeStreamMerge(self.merger, resume_token=self.start_token if self.resume else None,
                                    known_shards=[s.name for s in sim.shards])
        hwm = self.merger.high_water_mark()
        self.pbrts.append((token_key(hwm), 0))

    def _add(self, sh: SimShard, start: dict) -> None:
        cur = ShardCursor(start)
        self.cursors[sh.name] = cur
        r = self.merger.add_remote(sh.name, "config.shards" if sh.is_config else "db.coll",
                                   1, [], start, is_config=sh.is_config)
        self.remote_of[sh.name] = r

    # -- client getMore ---------------------------------------------------------------------
    def client_getmore(self, max_time: int) -> None:
        if self.getmore_deadline is not None or self.done:
            return
        self.getmore_deadline = self.sim.now + max_time
        self.batch = []
        self.sim.at(self.getmore_deadline, lambda: self.on_deadline())
        self.drive()

    def on_deadline(self) -> None:
        if self.getmore_deadline is not None and self.sim.now >= self.getmore_deadline and not self.opening:
            self.finish()

    def finish(self) -> None:
        hwm = self.merger.high_water_mark()
        self.returned.extend(self.batch)
        self.pbrts.append((token_key(hwm), len(self.returned)))
        self.getmore_deadline = None
        self.batch = []

    def drive(self) -> None:
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
                self.error = exc
                self.done = True
                self.getmore_deadline = None
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
        ``request_for_held_event``): the remotes holding back the smallest buffered event get its
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
        if self.sim.vouch and all(e.op not in ("invalidate", "kNewShardDetected") for e in evs):
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
        """The SimEvents of one output of the merge (a payload, an Item or a Block)."""
        by_data = self.sim.event_by_data
        if isinstance(x, Block):
            return [by_data[x.key_at(i)[0]] for i in range(x.lo, x.hi)]
        if isinstance(x, Item):
            return [by_data[x.key[0]]] if isinstance(x.payload, bytes) else [x.payload]
        return [by_data[bson.decode(x)["_id"]["_data"]]] if isinstance(x, bytes) else [x]

    def _remote_getmore(self, r: Any, max_await: int) -> None:
        sim = self.sim
        sh = sim.by_name[r.name]
        cur = self.cursors[r.name]
        # The router's getMore carries its $clusterTime (gossip); a shard answers at once when it
        # has events, else it awaits data for a random part of maxTimeMS.
        if not sh.is_config or sim.rng.random() < 0.5:
            sh.gossip(sim.router_time)
        wait = sim.rng.randint(0, 20) if sh.has_data(cur) else sim.rng.randint(0, max_await)
        latency = sim.rng.randint(0, 20)

        def answer() -> None:
            if self.pending_answer.get(sh.name) is not answer:
                return  # already answered early (a promise request)
            del self.pending_answer[sh.name]
            evs, pbrt = sh.answer(cur, sim.rng.randint(1, 8))
            cur.batches += 1

            def arrive() -> None:
                if r not in self.merger.remotes:
                    return
                items = self._block(evs) if sim.use_blocks and not sh.is_config else None
                if items is None:
                    items = [Item(e.key, e.token, e, e.op, e.meta) for e in evs]
                self.merger.on_batch(r, items, 1, pbrt)
                self.drive()
            sim.at(sim.now + latency, arrive)
        self.pending_answer[sh.name] = answer
        sim.at(sim.now + wait, answer)


@dataclass
class SimResult:
    seed: int
    violations: list[str]
    events: int
    streams: int
    returned: int


class Simulation:
    """The seeded world. ``mode`` is the shards' promise mode (see module docstring)."""

    def __init__(self, seed: int, *, shards: int = 3, writes: int = 60, mode: str = "clock",
                 add_shards: int = 1, resumes: int = 2, noop_interval: int = 1000) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.now = 0
        self._q: list[tuple[int, int, Callable[[], None]]] = []
        self._n = 0
        self.mode = mode
        self.batch_limit = self.rng.choice([1, 2, 5, 101])
        # Half the seeds release through ChangeStreamMerge.take (no rng draw: scenarios unchanged).
        self.use_take = seed % 2 == 0
        # Seeds 0-1, 4-5, ... hand shard batches of plain events to the merge as real BSON
        # parsed into Blocks (router/change_stream/raw_events.py), as the router does; the
        # others as Items.
        self.use_blocks = (seed // 2) % 2 == 0
        self.event_by_data: dict[str, SimEvent] = {}
        # ...and half of those with the layout mark and sizes a shard vouches with.
        self.vouch = (seed // 4) % 2 == 0
        # Half the seeds answer promise requests as a clock-mode shard does when asked for a
        # reply: the promise on its own, the waiting getMore left waiting (Merger.on_promise).
        self.promise_replies = (seed // 8) % 2 == 0
        self.noop_interval = noop_interval
        self.shards: list[SimShard] = []
        self.pending_shards: list[SimShard] = []
        self.by_name: dict[str, SimShard] = {}
        for i in range(shards):
            self._new_shard(active=True)
        self.config = SimShard(self, 999, "config", self.rng.randint(0, 1500), mode, is_config=True)
        self.by_name["config"] = self.config
        for i in range(add_shards):
            self._new_shard(active=False)
        self.router_time = 0
        self.writes_left = writes
        self.streams: list[Stream] = []
        self.resumes_left = resumes
        self.all_events: list[SimEvent] = []

    def _new_shard(self, active: bool) -> SimShard:
        idx = len(self.shards) + len(self.pending_shards)
        sh = SimShard(self, idx, f"shard{idx:02d}", self.rng.randint(0, 1500), self.mode)
        self.by_name[sh.name] = sh
        (self.shards if active else self.pending_shards).append(sh)
        return sh

    # -- scheduler ----------------------------------------------------------------------------
    def at(self, t: int, fn: Callable[[], None]) -> None:
        self._n += 1
        heapq.heappush(self._q, (t, self._n, fn))

    # -- world actions ------------------------------------------------------------------------
    def write(self, sh: SimShard, op: str = "insert", meta: dict | None = None) -> int:
        ts = sh.tick()
        if meta is not None and "cluster_time" in meta:
            meta["cluster_time"] = ts
        self.router_time = max(self.router_time, ts)  # the router gossips replies' $clusterTime
        sh.in_flight.append(ts)
        sh.seq += 1
        data = _event_data(ts, sh.idx, sh.seq, op)
        tok = {"_data": data}
        ev = SimEvent(ts, token_key(tok), tok, op, meta or {})
        self.at(self.now + self.rng.randint(0, 40), lambda: sh.commit(ts, ev))
        if not sh.is_config:
            self.all_events.append(ev)
        return ts

    def noop(self, sh: SimShard) -> None:
        if self.mode == "mongod":  # the periodic no-op writer moves the oplog forward
            ts = sh.tick()
            sh.in_flight.append(ts)
            sh.commit(ts, None)
        self.at(self.now + self.noop_interval, lambda: self.noop(sh))

    def add_shard(self) -> None:
        sh = self.pending_shards.pop(0)
        meta = {"is_shard_insert": True, "shard": sh.name, "cluster_time": 0}
        # addShard runs through the router, which gossips its cluster time to the config server.
        self.config.gossip(self.router_time)
        ts = self.write(self.config, "insert", meta)
        # The new shard learns the cluster time (gossip) before it takes any write.
        sh.gossip(ts)
        self.shards.append(sh)

    def run(self) -> SimResult:
        rng = self.rng
        # Write at random times; the router's first stream opens early.
        horizon = self.writes_left * rng.randint(5, 60)
        for _ in range(self.writes_left):
            t = rng.randint(0, horizon)
            self.at(t, lambda: self._random_write())
        for sh in self.shards + [self.config] + self.pending_shards:
            self.at(rng.randint(0, self.noop_interval), lambda sh=sh: self.noop(sh))
        for _ in range(len(self.pending_shards)):
            self.at(rng.randint(0, horizon), self.add_shard)
        self.at(rng.randint(0, max(1, horizon // 5)), self._open_first)
        for _ in range(self.resumes_left):
            self.at(rng.randint(horizon // 4, horizon + 500), self._open_resume)
        self.at(0, self._client_loop)
        # Quiet tail: no more writes; run until every stream has caught up (or 60 s pass).
        end = horizon + 60_000
        next_check = horizon + 1_000
        while self._q and self._q[0][0] <= end:
            t, _, fn = heapq.heappop(self._q)
            self.now = t
            fn()
            if t >= next_check:
                next_check = t + 500
                if self._caught_up():
                    break
        return self.check()

    def _caught_up(self) -> bool:
        if not self.streams or self.resumes_left and len(self.streams) < 1 + self.resumes_left:
            return False
        if any(sh.in_flight for sh in self.shards):
            return False
        n = len(self.all_events)
        for st in self.streams:
            if st.done:
                continue
            start = token_key(st.start_token)
            want = sum(1 for e in self.all_events if e.key > start or (not st.resume and e.key == start))
            if len(st.returned) < want:
                return False
        return n > 0

    def _random_write(self) -> None:
        sh = self.rng.choice(self.shards)
        # Occasionally a client carries gossip from another shard (causal ordering).
        if self.rng.random() < 0.3:
            sh.gossip(self.rng.choice(self.shards).last)
        self.write(sh)

    def _open_first(self) -> None:
        self.router_time = max(self.router_time, max(s.last for s in self.shards))
        st = Stream(self, 0, {"_data": hwm_data(self.router_time + 1)}, resume=False)
        st.open()
        self.streams.append(st)

    def _open_resume(self) -> None:
        if not self.streams:
            return
        first = self.streams[0]
        choices: list[tuple[dict, int]] = []
        for i, ev in enumerate(first.returned):
            choices.append((ev.token, i + 1))
        for key, n in first.pbrts:
            choices.append(({"_data": key[0]}, n))
        if not choices:
            return
        tok, _ = self.rng.choice(choices)
        st = Stream(self, len(self.streams), tok, resume=True)
        st.open()
        self.streams.append(st)

    def _client_loop(self) -> None:
        for st in self.streams:
            if st.getmore_deadline is None and not st.done:
                st.client_getmore(self.rng.choice([50, 200, 1000]))
        self.at(self.now + self.rng.randint(1, 200), self._client_loop)

    # -- checking -----------------------------------------------------------------------------
    def check(self) -> SimResult:
        v: list[str] = []
        truth = sorted(self.all_events, key=lambda e: e.key)
        for st in self.streams:
            start = token_key(st.start_token)
            got = st.returned
            if st.error is not None:
                v.append(f"stream {st.sid}: failed with {st.error.code}: {st.error.errmsg}")
                continue
            keys = [e.key for e in got]
            for a, b in zip(keys, keys[1:]):
                if not a < b:
                    v.append(f"stream {st.sid}: order violation {a[0]} then {b[0]}")
                    break
            if st.resume:
                expected = [e for e in truth if e.key > start]
            else:
                expected = [e for e in truth if e.key >= start]
            if [e.key for e in expected] != keys:
                exp_set = {e.key for e in expected}
                got_set = set(keys)
                v.append(f"stream {st.sid}: expected {len(expected)} events, got {len(keys)} "
                         f"(missing {len(exp_set - got_set)}, unexpected {len(got_set - exp_set)})")
            prev = None
            for key, n in st.pbrts:
                if prev is not None and key < prev:
                    v.append(f"stream {st.sid}: postBatchResumeToken went backwards")
                prev = key
                if n and key < keys[n - 1]:
                    v.append(f"stream {st.sid}: postBatchResumeToken below its batch's last event")
                # Safety: nothing returned after this PBRT may sort at or below it.
                if n < len(keys) and keys[n] <= key:
                    v.append(f"stream {st.sid}: event {keys[n][0]} returned after a "
                             f"postBatchResumeToken {key[0]} that had passed it")
                    break
        return SimResult(self.seed, v, len(truth), len(self.streams),
                         sum(len(s.returned) for s in self.streams))


def run_seed(seed: int, **kw: Any) -> SimResult:
    """Run one seeded simulation (see :class:`Simulation` for keyword arguments)."""
    return Simulation(seed, **kw).run()


def main(argv: list[str] | None = None) -> int:
    """``python -m router.sim [SEEDS] [MODE]``: run seeds 0..SEEDS-1 and print violations."""
    import sys
    import time
    args = list(sys.argv[1:] if argv is None else argv)
    n = int(args[0]) if args else 1000
    mode = args[1] if len(args) > 1 else "clock"
    t0 = time.perf_counter()
    bad = 0
    events = 0
    for seed in range(n):
        res = run_seed(seed, mode=mode)
        events += res.events
        if res.violations:
            bad += 1
            print(f"seed {seed}: {res.violations[:3]}")
    print(f"{n} seeds, mode {mode}: {bad} with violations, {events} events, "
          f"{time.perf_counter() - t0:.1f} s")
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
