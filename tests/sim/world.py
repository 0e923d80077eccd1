"""The simulated cluster and its scenario; :func:`run_seed` runs one seed.

A :class:`World` has N shards with skewed clocks, a config server, and shards still to be
added. Over a random horizon it makes random writes (30% carrying another shard's cluster time,
as a causally consistent client does), periodic no-ops (``mongod`` mode), ``addShard`` (an
insert into ``config.shards`` the streams see as ``kNewShardDetected``), a first client stream
and streams resumed from tokens the first one returned (events and postBatchResumeTokens);
clients issue getMores with random ``maxTimeMS``. Then a quiet tail until every stream has
caught up (or 60 s of virtual time). The :mod:`.checkers` judge what each stream returned.

Which router paths a seed exercises follows from its number (no random draw, so scenarios stay
the same): even seeds release through ``ChangeStreamMerge.take``; seeds 0-1, 4-5, ... hand
shard batches to the merge as real BSON parsed into Blocks (``router.change_stream.raw_events``), half of
those vouched for with the layout fields a shard sends; seeds 0-7, 16-23, ... get promise
replies (the promise alone, the getMore left waiting: ``Merger.on_promise``). Seeds 2, 5,
8, ... (``seed % 3 == 2``; ``real_shards`` forces it on or off) run the data shards on the real
shard change-stream cursor over a real oplog (:mod:`.real_shard`): their events are real inserts
with real resume tokens, their batches and postBatchResumeTokens the real cursor's (whose own
layout vouching replaces the ``vouched`` choice), the router reads them with its own reply
parser (Blocks on the Block seeds, one Item per event otherwise).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

from shardsim.core.resume_token import hwm_data, token_key

from .checkers import check_all
from .real_shard import RealShard, event_token
from .scheduler import Scheduler
from .shard_model import SimEvent, SimShard, event_data
from .stream import Stream


@dataclass
class SimResult:
    """``violations`` is empty when every checker passed; ``events`` the cluster's events,
    ``returned`` the events all streams returned."""

    seed: int
    violations: list[str]
    events: int
    streams: int
    returned: int


class World:
    """The seeded world. ``mode`` is the shards' promise mode (:mod:`.shard_model`);
    ``real_shards`` True/False runs the data shards on the real shard cursor or on the model
    (None: every third seed, see the module docstring)."""

    def __init__(self, seed: int, *, shards: int = 3, writes: int = 60, mode: str = "clock",
                 add_shards: int = 1, resumes: int = 2, noop_interval: int = 1000,
                 real_shards: bool | None = None) -> None:
        self.sched = Scheduler(seed)
        # Data shards running the real shard cursor (real_shard.py): every third seed by default.
        self.real = seed % 3 == 2 if real_shards is None else bool(real_shards)
        self.loop = asyncio.new_event_loop() if self.real else None
        self.next_id = 0
        self.rng = self.sched.rng
        self.seed = seed
        self.mode = mode
        self.batch_limit = self.rng.choice([1, 2, 5, 101])
        self.use_take = seed % 2 == 0
        self.use_blocks = (seed // 2) % 2 == 0
        self.event_by_data: dict[str, SimEvent] = {}
        self.vouch = (seed // 4) % 2 == 0
        self.promise_replies = (seed // 8) % 2 == 0
        self.noop_interval = noop_interval
        self.shards: list[SimShard] = []
        self.pending_shards: list[SimShard] = []
        self.by_name: dict[str, SimShard] = {}
        for _ in range(shards):
            self._new_shard(active=True)
        self.config = SimShard(self.sched, 999, "config", self.rng.randint(0, 1500), mode,
                               is_config=True)
        self.by_name["config"] = self.config
        for _ in range(add_shards):
            self._new_shard(active=False)
        self.router_time = 0
        self.writes_left = writes
        self.streams: list[Stream] = []
        self.resumes_left = resumes
        self.all_events: list[SimEvent] = []

    @property
    def now(self) -> int:
        """The virtual time (ms)."""
        return self.sched.now

    def at(self, t: int, fn: Callable[[], None]) -> None:
        """Schedule ``fn`` at virtual time ``t`` (:meth:`.scheduler.Scheduler.at`)."""
        self.sched.at(t, fn)

    def _new_shard(self, active: bool) -> SimShard:
        idx = len(self.shards) + len(self.pending_shards)
        name, skew = f"shard{idx:02d}", self.rng.randint(0, 1500)
        sh = (RealShard(self.sched, idx, name, skew, self.mode, self.loop) if self.loop is not None
              else SimShard(self.sched, idx, name, skew, self.mode))
        self.by_name[sh.name] = sh
        (self.shards if active else self.pending_shards).append(sh)
        return sh

    # -- world actions ------------------------------------------------------------------------
    def write(self, sh: SimShard, op: str = "insert", meta: dict | None = None) -> int:
        """A write on ``sh``: its timestamp now, its oplog entry after a commit delay."""
        ts = sh.tick()
        if meta is not None and "cluster_time" in meta:
            meta["cluster_time"] = ts
        self.router_time = max(self.router_time, ts)  # the router gossips replies' $clusterTime
        sh.in_flight.append(ts)
        sh.seq += 1
        if isinstance(sh, RealShard):  # an insert of {_id: n}: the token the real shard gives it
            self.next_id += 1
            meta = {"_id": self.next_id}
            tok = event_token(ts, self.next_id)
        else:
            tok = {"_data": event_data(ts, sh.idx, sh.seq)}
        ev = SimEvent(ts, token_key(tok), tok, op, meta or {})
        self.at(self.now + self.rng.randint(0, 40), lambda: sh.commit(ts, ev))
        if not sh.is_config:
            self.all_events.append(ev)
            if isinstance(sh, RealShard):
                self.event_by_data[tok["_data"]] = ev
        return ts

    def noop(self, sh: SimShard) -> None:
        """The periodic no-op writer (moves the oplog only in ``mongod`` mode)."""
        if self.mode == "mongod":
            ts = sh.tick()
            sh.in_flight.append(ts)
            sh.commit(ts, None)
        self.at(self.now + self.noop_interval, lambda: self.noop(sh))

    def add_shard(self) -> None:
        """``addShard``: an insert into config.shards; the shard takes writes from now on."""
        sh = self.pending_shards.pop(0)
        meta = {"is_shard_insert": True, "shard": sh.name, "cluster_time": 0}
        # addShard runs through the router, which gossips its cluster time to the config server.
        self.config.gossip(self.router_time)
        ts = self.write(self.config, "insert", meta)
        # The new shard learns the cluster time (gossip) before it takes any write.
        sh.gossip(ts)
        self.shards.append(sh)

    def run(self) -> SimResult:
        """Run the scenario (see the module docstring) and check it."""
        rng = self.rng
        horizon = self.writes_left * rng.randint(5, 60)
        for _ in range(self.writes_left):
            self.at(rng.randint(0, horizon), self._random_write)
        for sh in self.shards + [self.config] + self.pending_shards:
            self.at(rng.randint(0, self.noop_interval), lambda sh=sh: self.noop(sh))
        for _ in range(len(self.pending_shards)):
            self.at(rng.randint(0, horizon), self.add_shard)
        self.at(rng.randint(0, max(1, horizon // 5)), self._open_first)
        for _ in range(self.resumes_left):
            self.at(rng.randint(horizon // 4, horizon + 500), self._open_resume)
        self.at(0, self._client_loop)
        # Quiet tail: no more writes; run until every stream has caught up (or 60 s pass).
        try:
            self.sched.run(horizon + 60_000, self._caught_up, horizon + 1_000)
        finally:
            if self.loop is not None:
                self.loop.close()
        return SimResult(self.seed, check_all(self), len(self.all_events), len(self.streams),
                         sum(len(s.returned) for s in self.streams))

    def expected(self, st: Stream) -> list[SimEvent]:
        """The events ``st`` must return, in order: every event from its start token on (a
        resumed stream: after its token)."""
        start = token_key(st.start_token)
        truth = sorted(self.all_events, key=lambda e: e.key)
        if st.resume:
            return [e for e in truth if e.key > start]
        return [e for e in truth if e.key >= start]

    def _caught_up(self) -> bool:
        if not self.streams or self.resumes_left and len(self.streams) < 1 + self.resumes_left:
            return False
        if any(sh.in_flight for sh in self.shards):
            return False
        for st in self.streams:
            if st.done:
                continue
            start = token_key(st.start_token)
            want = sum(1 for e in self.all_events
                       if e.key > start or (not st.resume and e.key == start))
            if len(st.returned) < want:
                return False
        return len(self.all_events) > 0

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
        choices: list[dict] = [ev.token for ev in first.returned]
        choices += [{"_data": key[0]} for key, _ in first.pbrts]
        if not choices:
            return
        st = Stream(self, len(self.streams), self.rng.choice(choices), resume=True)
        st.open()
        self.streams.append(st)

    def _client_loop(self) -> None:
        for st in self.streams:
            if st.getmore_deadline is None and not st.done:
                st.client_getmore(self.rng.choice([50, 200, 1000]))
        self.at(self.now + self.rng.randint(1, 200), self._client_loop)


def run_seed(seed: int, **kw: Any) -> SimResult:
    """Run one seeded simulation (keyword arguments: :class:`World`)."""
    return World(seed, **kw).run()


def replay_hint(seed: int, **kw: Any) -> str:
    """How to replay ``seed`` with these :class:`World` arguments from a shell."""
    args = "".join(f" --{k.replace('_', '-')} {v}" for k, v in sorted(kw.items()))
    return f"reproduce with seed={seed}: python tests/sim/run.py --seed {seed}{args}"
