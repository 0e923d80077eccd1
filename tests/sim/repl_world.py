"""The seeded replica-set simulation: N members running the real replication core
(``shardsim.core.repl.ReplNode``) on the deterministic scheduler of :mod:`.scheduler`.

A :class:`ReplWorld` has 3 or 5 members, each a ``ReplNode`` plus its oplog (a list of entries
``{ts, t, op, o, uid}``) and its persisted state (``DurableState``). The network delivers the
core's messages as objects with random delays, drops some, and honours partitions; members
crash (volatile state lost: the node is rebuilt from the persisted state and the oplog) and
restart. Clients write with ``w: 1`` and ``w: "majority"`` to whichever member will take the
write (stale primaries included), and now and then an operator sends ``replSetStepDown``,
``replSetFreeze`` or ``replSetStepUp``. After the chaos phase the world heals (no partition,
no drop, every member up) and runs a quiet phase in which a primary must appear and a majority
write must be acknowledged.

The world records a :class:`History`; the checkers in :mod:`.repl_checkers` judge it, one per
invariant. ``python tests/sim/repl_run.py --seed N`` replays one seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from shardsim.core.repl import (DurableState, MemberConfig, MemberState, ReplError, ReplNode,
                           ReplSetConfig, Rules, plan_rollback, serve_fetch)
from shardsim.core.repl.messages import (CommitPointAdvanced, FailWaiters, FetchReply, FetchRequest,
                                    Heartbeat, RequestVotes, StartRollback, StateChanged,
                                    WriteNoop)
from shardsim.core.repl.optime import NULL_OPTIME, OpTime

from .scheduler import Scheduler

ELECTION_TIMEOUT = 1000
HEARTBEAT_INTERVAL = 200
CATCH_UP_TIMEOUT = 600
FETCH_IDLE = 60
#: the freshness window of a priority takeover in this world's ts units (ts ~ 10 x ms): 200 ms
TAKEOVER_FRESHNESS_TS = 2000
#: a writable primary must exist this long after the world healed (liveness bound, ms): two
#: election timeouts with jitter, a dry run and a real round, catch-up, and a few heartbeats.
LIVENESS_BOUND = 3 * ELECTION_TIMEOUT + CATCH_UP_TIMEOUT + 4 * HEARTBEAT_INTERVAL


def catch_up_timeout(seed: int) -> int:
    """``catchUpTimeoutMillis`` of seed ``seed``'s world: the server's default -1 (no bound: a
    new primary catches up for as long as it takes) on odd seeds, :data:`CATCH_UP_TIMEOUT` on
    even ones. A bound hides a catch-up that can never finish: with -1 only, the set stays
    without a writable primary (the liveness checker's find before bgsync's abort on
    rollback was built, 10 of 6,000 seeds)."""
    return -1 if seed % 2 else CATCH_UP_TIMEOUT


def members_for(seed: int) -> int:
    """The set size a seed runs with when none is given: 5 members on every fourth seed."""
    return 5 if seed % 4 == 3 else 3


@dataclass
class History:
    """What the checkers read (times in virtual ms)."""

    members: int = 0
    wins: list = field(default_factory=list)          # (time, term, member)
    win_logs: list = field(default_factory=list)      # (time, term, member, frozenset(uids))
    appends: list = field(default_factory=list)       # (member, optime, uid, prev optime)
    commit_trace: dict = field(default_factory=dict)  # member -> [commit point, ...]
    acked: list = field(default_factory=list)         # (time, uid, optime) w:majority acks
    exposed: dict = field(default_factory=dict)       # uid -> (time, member) first exposure
    rolled_back: list = field(default_factory=list)   # (time, member, uid)
    rollback_errors: list = field(default_factory=list)
    stuck: list = field(default_factory=list)         # (time, member, wake) busy-loops
    final_logs: dict = field(default_factory=dict)    # member -> [(optime, uid), ...]
    heal_time: int = 0
    primary_after_heal: Optional[int] = None          # first time a current writable primary
    final_write_issued: Optional[int] = None
    final_write_acked: Optional[int] = None
    end_time: int = 0


class Member:
    """One simulated mongod: its node (None while crashed), oplog, persisted state."""

    def __init__(self, mid: int) -> None:
        self.id = mid
        self.node: Optional[ReplNode] = None
        self.oplog: list[dict] = []
        self.optimes: list[OpTime] = []
        self.durable = DurableState()
        self.incarnation = 0
        self.tick_at: Optional[int] = None
        self.tick_token = 0
        self.tick_time = -1
        self.ticks_now = 0
        self.exposed_upto = 0
        self.waiters: list[tuple[OpTime, int, int]] = []    # (optime, uid, term)

    @property
    def last(self) -> OpTime:
        return self.optimes[-1] if self.optimes else NULL_OPTIME


class ReplWorld:
    """One seeded run. ``members`` 3 or 5; ``rules`` breaks a protocol rule (mutation checks);
    ``chaos_ms``/``quiet_ms`` the two phases."""

    def __init__(self, seed: int, *, members: int = 3, rules: Rules = Rules(),
                 chaos_ms: int = 6000, quiet_ms: int = 6000) -> None:
        self.seed = seed
        self.sched = Scheduler(seed)
        self.rng = self.sched.rng
        self.rules = rules
        self.config = ReplSetConfig(
            "rs0", tuple(MemberConfig(i, f"m{i}:27017", priority=self._priority(i, members))
                         for i in range(members)),
            election_timeout_ms=ELECTION_TIMEOUT, heartbeat_interval_ms=HEARTBEAT_INTERVAL,
            heartbeat_timeout_ms=ELECTION_TIMEOUT, catch_up_timeout_ms=catch_up_timeout(seed),
            priority_takeover_freshness_ts=TAKEOVER_FRESHNESS_TS)
        self.members = [Member(i) for i in range(members)]
        self.h = History(members=members)
        self.chaos_end = chaos_ms
        self.end = chaos_ms + quiet_ms
        self.drop = self.rng.choice([0.0, 0.01, 0.05])
        self.max_delay = self.rng.choice([5, 20, 60])
        self.blocked: set[tuple[int, int]] = set()
        self.healed = False
        self.next_uid = 0
        self.ts = 0

    def _priority(self, i: int, n: int) -> float:
        # a priority-0 member on some seeds (never stands, still votes); a priority-2 member on
        # others (priority takeover)
        if self.seed % 7 == 3 and i == n - 1:
            return 0.0
        return 2.0 if (self.seed % 5 == 1 and i == 0) else 1.0

    # -- running ---------------------------------------------------------------------------------

    def run(self) -> History:
        """Run the seed to its end; the history for the checkers."""
        for m in self.members:
            self._boot(m)
        t = 0
        while t < self.chaos_end:
            t += self.rng.randint(300, 1200)
            if t < self.chaos_end:
                self.sched.at(t, self._fault)
        t = 0
        while t < self.end - 500:
            t += self.rng.randint(20, 160)
            self.sched.at(t, self._client_write)
        self.sched.at(self.chaos_end, self._heal)
        self.sched.run(self.end, self._settled, check_from=self.chaos_end, every=50)
        self.h.end_time = self.sched.now
        for m in self.members:
            self.h.final_logs[m.id] = [(op, e["uid"]) for op, e in zip(m.optimes, m.oplog)]
        return self.h

    def _boot(self, m: Member) -> None:
        now = self.sched.now
        m.incarnation += 1
        m.node = ReplNode(self.config, m.id, m.durable, m.last, now=now, rng=self.rng,
                          rules=self.rules)
        self.h.commit_trace.setdefault(m.id, []).append(m.node.commit_point)
        m.exposed_upto = 0
        m.node.start(now)
        self._flush(m)
        self._schedule_fetch(m, 1)

    # -- faults ------------------------------------------------------------------------------------

    def _fault(self) -> None:
        kind = self.rng.choice(["partition", "partition", "crash", "crash", "stepdown",
                                "freeze", "stepup", "isolate_primary"])
        n = len(self.members)
        if kind in ("partition", "isolate_primary"):
            if kind == "isolate_primary":
                prim = [m.id for m in self.members if m.node and m.node.role == "leader"]
                side = set(prim[:1]) or {self.rng.randrange(n)}
            else:
                side = set(self.rng.sample(range(n), self.rng.randint(1, n // 2)))
            pairs = {(a, b) for a in side for b in range(n) if b not in side}
            pairs |= {(b, a) for a, b in pairs}
            self.blocked |= pairs
            self.sched.at(self.sched.now + self.rng.randint(300, 3000),
                          lambda: self.blocked.difference_update(pairs))
        elif kind == "crash":
            m = self.rng.choice(self.members)
            if m.node is not None:
                self._crash(m)
                self.sched.at(self.sched.now + self.rng.randint(100, 2500),
                              lambda: self._restart(m))
        else:
            self._operator(kind)

    def _operator(self, kind: str) -> None:
        now = self.sched.now
        live = [m for m in self.members if m.node is not None]
        if not live:
            return
        if kind == "stepdown":
            for m in live:
                if m.node.role == "leader":
                    force = self.rng.random() < 0.3
                    try:
                        m.node.step_down(now, secs=2, catch_up_secs=1, force=force)
                    except ReplError:
                        pass
                    self._flush(m)
                    return
        m = self.rng.choice(live)
        try:
            if kind == "freeze":
                m.node.freeze(now, self.rng.choice([0, 1, 2]))
            else:
                m.node.step_up(now, skip_dry_run=self.rng.random() < 0.5)
        except ReplError:
            pass
        self._flush(m)

    def _crash(self, m: Member) -> None:
        m.node = None
        m.tick_at = None
        m.waiters.clear()

    def _restart(self, m: Member) -> None:
        if m.node is None:
            self._boot(m)

    def _heal(self) -> None:
        self.healed = True
        self.h.heal_time = self.sched.now
        self.blocked.clear()
        self.drop = 0.0
        for m in self.members:
            if m.node is None:
                self._boot(m)
        self._watch_liveness()

    def _settled(self) -> bool:
        """Healed, the final majority write acknowledged, every oplog ending at the same entry
        (the run can stop: nothing the checkers judge changes any more)."""
        if self.h.final_write_acked is None:
            return False
        last = self.members[0].last
        return all(m.node is not None and m.last == last for m in self.members)

    def _watch_liveness(self) -> None:
        now = self.sched.now
        live = [m for m in self.members if m.node is not None]
        top = max(m.node.term for m in live)
        prim = [m for m in live if m.node.can_accept_writes() and m.node.term == top]
        if prim and self.h.primary_after_heal is None:
            self.h.primary_after_heal = now
        pending = any(w[1] == getattr(self, "final_uid", None)
                      for m in live for w in m.waiters)
        if prim and self.h.final_write_acked is None and not pending:
            # the first try, or a retry after the waiter failed (189 at a stepdown)
            if self.h.final_write_issued is None:
                self.h.final_write_issued = now
            self._write(prim[0], majority=True, final=True)
        if self.h.final_write_acked is None and now + 50 < self.end:
            self.sched.at(now + 50, self._watch_liveness)

    # -- clients ---------------------------------------------------------------------------------

    def _client_write(self) -> None:
        writable = [m for m in self.members if m.node is not None and m.node.can_accept_writes()]
        if writable:
            self._write(self.rng.choice(writable), majority=self.rng.random() < 0.6)

    def _append(self, m: Member, term: int, op: str, o: dict) -> OpTime:
        self.ts = max(self.ts + 1, self.sched.now * 10)
        self.next_uid += 1
        optime = OpTime(t=term, ts=max(self.ts, m.last.ts + 1))
        self.ts = optime.ts
        entry = {"ts": optime.ts, "t": term, "op": op, "o": o, "uid": self.next_uid}
        self.h.appends.append((m.id, optime, self.next_uid, m.last))
        m.oplog.append(entry)
        m.optimes.append(optime)
        return optime

    def _write(self, m: Member, *, majority: bool, final: bool = False) -> None:
        node = m.node
        optime = self._append(m, node.term, "i", {"_id": self.next_uid + 1})
        uid = self.next_uid
        if final:
            self.final_uid = uid
        node.note_applied(optime, self.sched.now)
        if majority:
            m.waiters.append((optime, uid, node.term))
        self._flush(m)

    # -- the node's outputs ----------------------------------------------------------------------

    def _flush(self, m: Member) -> None:
        node = m.node
        if node is None:
            return
        now = self.sched.now
        while True:
            sends, effects = node.poll()
            if not sends and not effects:
                break
            for dst, msg in sends:
                self._send(m.id, dst, msg)
            for eff in effects:
                self._effect(m, eff, now)
        self._expose(m, now)
        self._arm(m)

    def _effect(self, m: Member, eff: Any, now: int) -> None:
        kind = type(eff)
        if kind is StateChanged:
            if eff.new == MemberState.PRIMARY:
                self.h.wins.append((now, m.node.term, m.id))
                self.h.win_logs.append((now, m.node.term, m.id,
                                        frozenset(e["uid"] for e in m.oplog)))
        elif kind is WriteNoop:
            optime = self._append(m, eff.term, "n", eff.doc)
            m.node.note_new_primary_noop(optime, now)
        elif kind is FailWaiters:
            m.waiters.clear()
        elif kind is CommitPointAdvanced:
            self.h.commit_trace[m.id].append(eff.optime)
            if m.waiters:
                done = [w for w in m.waiters if w[0] <= eff.optime and w[2] == m.node.term]
                for optime, uid, _ in done:
                    self.h.acked.append((now, uid, optime))
                    if getattr(self, "final_uid", None) == uid:
                        self.h.final_write_acked = now
                m.waiters = [w for w in m.waiters if w not in done]
        elif kind is StartRollback:
            self._send(m.id, eff.source_id, ("rollback-fetch", m.id))

    def _expose(self, m: Member, now: int) -> None:
        """Entries up to the member's readable point are what a change stream there returns."""
        point = m.node.readable_point
        i, ops = m.exposed_upto, m.optimes
        while i < len(ops) and ops[i] <= point:
            uid = m.oplog[i]["uid"]
            if uid not in self.h.exposed:
                self.h.exposed[uid] = (now, m.id)
            i += 1
        m.exposed_upto = i

    def _arm(self, m: Member) -> None:
        wake = m.node.next_wake()
        if wake is None or (m.tick_at is not None and m.tick_at <= wake):
            return
        m.tick_at = wake
        m.tick_token += 1
        token, inc = m.tick_token, m.incarnation
        self.sched.at(max(wake, self.sched.now), lambda: self._tick(m, token, inc))

    def _tick(self, m: Member, token: int, inc: int) -> None:
        if m.node is None or m.incarnation != inc or m.tick_token != token:
            return
        m.tick_at = None
        now = self.sched.now
        m.ticks_now = m.ticks_now + 1 if m.tick_time == now else 1
        m.tick_time = now
        if m.ticks_now > 100:      # a node that asks to be woken now, again and again
            self.h.stuck.append((now, m.id, repr(m.node.next_wake())))
            return
        m.node.tick(self.sched.now)
        self._flush(m)

    # -- the network -----------------------------------------------------------------------------

    def _send(self, src: int, dst: int, msg: Any) -> None:
        if (src, dst) in self.blocked or (self.drop and self.rng.random() < self.drop):
            return
        target = self.members[dst]
        inc = target.incarnation
        self.sched.at(self.sched.now + 1 + int(self.rng.random() * self.max_delay),
                      lambda: self._deliver(src, target, inc, msg))

    def _deliver(self, src: int, m: Member, inc: int, msg: Any) -> None:
        if m.node is None or m.incarnation != inc:
            return
        now = self.sched.now
        kind = type(msg)
        if kind is FetchRequest:
            self._serve_fetch(src, m, msg, now)
        elif kind is FetchReply:
            self._on_fetch_reply(m, msg, now)
        elif kind is tuple:
            self._rollback_message(src, m, msg, now)
        else:
            reply = m.node.receive(msg, now)
            if reply is not None and kind in (Heartbeat, RequestVotes):
                self._send(m.id, src, reply)
        self._flush(m)

    # -- oplog fetching and rollback -------------------------------------------------------------

    def _schedule_fetch(self, m: Member, delay: int) -> None:
        inc = m.incarnation
        self.sched.at(self.sched.now + delay, lambda: self._fetch(m, inc))

    def _fetch(self, m: Member, inc: int) -> None:
        if m.node is None or m.incarnation != inc:
            return
        req = m.node.fetch_request(self.sched.now)
        if req is not None:
            self._send(m.id, req[0], req[1])
        self._flush(m)
        self._schedule_fetch(m, FETCH_IDLE)

    def _serve_fetch(self, src: int, m: Member, req: FetchRequest, now: int) -> None:
        try:
            md = m.node.on_fetch_request(req, now)
        except ReplError:
            return
        entries, err, first = serve_fetch(m.optimes, m.oplog, req.after, req.limit)
        self._send(m.id, src, FetchReply(m.id, req.after, md, entries, err, first))

    def _on_fetch_reply(self, m: Member, reply: FetchReply, now: int) -> None:
        entries = m.node.on_fetch_reply(reply, now)
        for e in entries:
            optime = OpTime(t=e["t"], ts=e["ts"])
            self.h.appends.append((m.id, optime, e["uid"], m.last))
            m.oplog.append(e)
            m.optimes.append(optime)
        if entries:
            self._flush(m)
            inc = m.incarnation
            self.sched.at(now + 1, lambda: self._fetch_again(m, inc))

    def _fetch_again(self, m: Member, inc: int) -> None:
        if m.node is None or m.incarnation != inc:
            return
        req = m.node.fetch_request(self.sched.now)
        if req is not None:
            self._send(m.id, req[0], req[1])
        self._flush(m)

    def _rollback_message(self, src: int, m: Member, msg: tuple, now: int) -> None:
        if msg[0] == "rollback-fetch":
            self._send(m.id, src, ("rollback-oplog", tuple(m.oplog)))
            return
        node = m.node
        if node.state != MemberState.ROLLBACK:
            return
        try:
            plan = plan_rollback(m.oplog, msg[1], commit_point=node.commit_point,
                                 rbid=m.durable.rbid)
        except ReplError as exc:
            # a correct core never gets here; roll back anyway so the checkers see the damage
            self.h.rollback_errors.append((now, m.id, exc.errmsg))
            plan = plan_rollback(m.oplog, msg[1], commit_point=NULL_OPTIME, rbid=m.durable.rbid)
        for e in plan.undo:
            self.h.rolled_back.append((now, m.id, e["uid"]))
        del m.oplog[plan.keep:]
        del m.optimes[plan.keep:]
        m.exposed_upto = min(m.exposed_upto, plan.keep)
        node.finish_rollback(plan, now)
