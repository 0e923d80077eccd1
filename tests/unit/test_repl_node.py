"""ReplNode (shardsim/core/repl/node.py, elections.py, stepdown.py) driven by hand: messages are
delivered at once by a tiny harness, time moves only when the test says so."""

from __future__ import annotations

import random

import pytest

from shardsim.core.repl import (DurableState, MemberConfig, MemberState, OpTime, ReplError,
                           ReplNode, ReplSetConfig, election_id, parse_step_down, plan_rollback,
                           serve_fetch)
from shardsim.core.repl.messages import (FailWaiters, FetchReply, FetchRequest, Heartbeat,
                                    KillOperations,
                                    RequestVotes, StartRollback, StateChanged, StepUpFinished,
                                    WriteNoop)
from shardsim.core.repl.sync_source import choose_sync_source, diverged_or_too_stale, MemberView


class Harness:
    """Members 0..n-1 (priorities given), delivering every message at once."""

    def __init__(self, n=3, priorities=None):
        prios = priorities or [1.0] * n
        self.config = ReplSetConfig("rs0", tuple(MemberConfig(i, f"h{i}:1", priority=prios[i])
                                                 for i in range(n)),
                                    election_timeout_ms=1000, heartbeat_interval_ms=200,
                                    heartbeat_timeout_ms=1000, catch_up_timeout_ms=500)
        self.now = 0
        self.durable = [DurableState() for _ in range(n)]
        self.oplogs = [[] for _ in range(n)]
        self.effects = [[] for _ in range(n)]
        self.down = set()
        self.nodes = [ReplNode(self.config, i, self.durable[i], OpTime(t=-1, ts=0), now=0,
                               rng=random.Random(i)) for i in range(n)]
        for node in self.nodes:
            node.start(0)
        self.ts = 0

    def optimes(self, i):
        return [OpTime(t=e["t"], ts=e["ts"]) for e in self.oplogs[i]]

    def append(self, i, term, o):
        self.ts += 1
        self.oplogs[i].append({"ts": self.ts, "t": term, "op": "n" if "msg" in o else "i",
                               "o": o})
        return OpTime(t=term, ts=self.ts)

    def pump(self):
        busy = True
        while busy:
            busy = False
            for i, node in enumerate(self.nodes):
                if i in self.down:
                    node.poll()
                    continue
                sends, effects = node.poll()
                for eff in effects:
                    self.effects[i].append(eff)
                    if isinstance(eff, WriteNoop):
                        node.note_new_primary_noop(self.append(i, eff.term, eff.doc), self.now)
                        busy = True
                    elif isinstance(eff, StartRollback):
                        plan = plan_rollback(self.oplogs[i], self.oplogs[eff.source_id],
                                             commit_point=node.commit_point,
                                             rbid=self.durable[i].rbid)
                        del self.oplogs[i][plan.keep:]
                        node.finish_rollback(plan, self.now)
                        busy = True
                for dst, msg in sends:
                    busy = True
                    if dst in self.down:
                        continue
                    reply = self.nodes[dst].receive(msg, self.now)
                    if reply is not None and isinstance(msg, (Heartbeat, RequestVotes)):
                        node.receive(reply, self.now)

    def fetch_all(self):
        for i, node in enumerate(self.nodes):
            if i in self.down:
                continue
            req = node.fetch_request(self.now)
            if req is None or req[0] in self.down:
                continue
            src = self.nodes[req[0]]
            md = src.on_fetch_request(req[1], self.now)
            entries, err, first = serve_fetch(self.optimes(req[0]), self.oplogs[req[0]],
                                              req[1].after, req[1].limit)
            got = node.on_fetch_reply(FetchReply(req[0], req[1].after, md, entries, err, first),
                                      self.now)
            self.oplogs[i].extend(got)
        self.pump()

    def advance(self, until, step=50, fetch=True):
        while self.now < until:
            self.now += step
            for i, node in enumerate(self.nodes):
                if i not in self.down:
                    node.tick(self.now)
            self.pump()
            if fetch:
                self.fetch_all()

    def primary(self):
        prim = [i for i, n in enumerate(self.nodes) if i not in self.down and n.can_accept_writes()]
        assert len(prim) <= 1
        return prim[0] if prim else None


def elected():
    h = Harness()
    h.advance(3000)
    p = h.primary()
    assert p is not None
    return h, p


def test_a_primary_is_elected_writes_the_new_primary_noop_and_reports_its_election_id():
    h, p = elected()
    node = h.nodes[p]
    assert node.state == MemberState.PRIMARY and node.term == 1
    assert h.oplogs[p][0]["o"] == {"msg": "new primary"} and h.oplogs[p][0]["op"] == "n"
    assert node.first_op_of_term == OpTime(t=1, ts=h.oplogs[p][0]["ts"])
    hello = node.hello_fields()
    assert hello["isWritablePrimary"] is True and hello["electionId"] == election_id(1)
    assert str(election_id(1)) == "7fffffff0000000000000001"
    assert h.durable[p].last_vote.term == 1 and h.durable[p].last_vote.candidate_id == p
    # the others follow, replicate the no-op and learn the commit point
    h.advance(h.now + 600)
    for i in range(3):
        assert h.nodes[i].commit_point == node.first_op_of_term
        assert h.nodes[i].hello_fields().get("primary") == f"h{p}:1"


def test_the_election_timeout_has_up_to_15_percent_jitter():
    lows, highs = [], []
    for seed in range(200):
        node = ReplNode(Harness().config, 0, DurableState(), OpTime(t=-1, ts=0), now=0,
                        rng=random.Random(seed))
        node.start(0)
        lows.append(node.election_deadline)
        highs.append(node.election_deadline)
    assert min(lows) >= 1000 and max(highs) <= 1150 and max(highs) > 1100


def test_writes_commit_with_a_majority_and_the_commit_point_wakes_waiters():
    h, p = elected()
    node = h.nodes[p]
    op = h.append(p, node.term, {"_id": 1})
    node.note_applied(op, h.now)
    assert node.commit_point < op
    h.fetch_all()
    assert node.commit_point == op


def test_a_primary_partitioned_from_the_majority_steps_down_and_a_new_one_is_elected():
    h, p = elected()
    h.down = {p}
    h.nodes[p].tick(h.now + 1100)
    effects = h.nodes[p].poll()[1]
    assert any(isinstance(e, StateChanged) and e.new == MemberState.SECONDARY
               and e.reason == "Can't see a majority of the set, relinquishing primary"
               for e in effects)
    assert any(isinstance(e, KillOperations) and e.error.code == 11602 for e in effects)
    assert any(isinstance(e, FailWaiters) and e.error.code == 189 for e in effects)
    h.advance(h.now + 3000)
    q = h.primary()
    assert q is not None and q != p and h.nodes[q].term == 2


def test_priority_zero_never_stands():
    h = Harness(priorities=[0, 0, 1])
    h.advance(3000)
    assert h.primary() == 2
    assert h.nodes[0].unelectable_reason(h.now) == "NoPriority"
    with pytest.raises(ReplError) as exc:
        h.nodes[0].step_up(h.now)
    assert exc.value.code == 125 and exc.value.errmsg == "Election failed."


def test_members_not_initiated_wait_for_the_initiated_one_but_vote_for_it():
    """Members started without the set's initiation and with no oplog (``initiated`` False,
    set by the shard wiring) never stand, however long the initiating member takes to start;
    they vote for it once it does, and its entries (the 'initiating set' one) are kept."""
    h = Harness()
    h.down.add(0)  # the initiating member has not started yet
    for i in (1, 2):
        h.nodes[i].initiated = False
    h.advance(10_000)
    assert h.primary() is None and h.nodes[1].term == 0 and h.nodes[2].term == 0
    assert h.nodes[1].unelectable_reason(h.now) == "NotInitiated"
    with pytest.raises(ReplError) as exc:
        h.nodes[2].step_up(h.now)
    assert exc.value.code == 125
    h.append(0, -1, {"msg": "initiating set"})
    h.down.discard(0)
    h.advance(h.now + 3000)
    assert h.primary() == 0
    for i in range(3):  # the shard wiring clears `initiated` on a member's first entry
        assert h.oplogs[i][0]["o"] == {"msg": "initiating set"}


def test_step_down_without_a_caught_up_secondary_fails_with_262_after_the_catch_up_period():
    h, p = elected()
    node = h.nodes[p]
    op = h.append(p, node.term, {"_id": 1})    # the secondaries stay up but do not fetch it
    node.note_applied(op, h.now)
    attempt = node.step_down(h.now, secs=60, catch_up_secs=10)
    assert attempt.result is None
    with pytest.raises(ReplError) as exc:
        node.step_down(h.now, secs=60, catch_up_secs=10)
    assert exc.value.code == 117 and exc.value.code_name == "ConflictingOperationInProgress"
    h.advance(h.now + 9_900, fetch=False)
    assert attempt.result is None
    h.advance(h.now + 200, fetch=False)
    assert isinstance(attempt.result, ReplError) and attempt.result.code == 262
    assert attempt.result.code_name == "ExceededTimeLimit"
    assert attempt.result.errmsg.startswith("No electable secondaries caught up as of ")
    assert attempt.result.errmsg.endswith("Please use the replSetStepDown command with the "
                                          "argument {force: true} to force node to step down.")
    assert node.can_accept_writes()


def test_step_down_with_a_caught_up_secondary_hands_the_election_off():
    h, p = elected()
    h.advance(h.now + 400)
    node = h.nodes[p]
    attempt = node.step_down(h.now, secs=60, catch_up_secs=10)
    assert attempt.result == {"ok": 1.0}
    assert node.state == MemberState.SECONDARY and node.stepdown_until == h.now + 60_000
    seen = len(h.effects[p])
    h.pump()                           # the handoff: replSetStepUp{skipDryRun} to a secondary
    effects = h.effects[p][seen:]
    kills = [e for e in effects if isinstance(e, KillOperations)]
    assert [(e.error.code, e.scope) for e in kills] == [(11602, "writes")]
    assert [e.error.code for e in effects if isinstance(e, FailWaiters)] == [189]
    assert node.hello_fields()["isWritablePrimary"] is False and "electionId" not in \
        node.hello_fields()
    h.advance(h.now + 300)
    q = h.primary()
    assert q is not None and q != p and h.nodes[q].term == 2
    assert h.nodes[q].election_reason == "stepUpRequestSkipDryRun"
    # the old primary sits out elections for the stepdown period
    assert h.nodes[p].unelectable_reason(h.now) == "StepDownPeriodActive"


def test_force_steps_down_after_the_catch_up_period_even_alone():
    h, p = elected()
    h.down = {q for q in range(3) if q != p}
    node = h.nodes[p]
    attempt = node.step_down(h.now, secs=60, catch_up_secs=0, force=True)
    assert attempt.result == {"ok": 1.0} and not node.can_accept_writes()


def test_step_down_on_a_secondary_and_bad_arguments():
    h, p = elected()
    with pytest.raises(ReplError) as exc:
        h.nodes[(p + 1) % 3].step_down(h.now)
    assert (exc.value.code, exc.value.errmsg) == (10107, "not primary so can't step down")
    assert parse_step_down({"replSetStepDown": 0}) == (60, 10, False)
    assert parse_step_down({"replSetStepDown": 5, "force": True}) == (5, 0, True)
    assert parse_step_down({"replSetStepDown": 30, "secondaryCatchUpPeriodSecs": 30}) == \
        (30, 30, False)
    for cmd, msg in [({"replSetStepDown": 5}, "stepdown period must be longer than "
                      "secondaryCatchUpPeriodSecs"),
                     ({"replSetStepDown": -1}, "stepdown period must be a positive integer"),
                     ({"replSetStepDown": 5, "secondaryCatchUpPeriodSecs": -1},
                      "secondaryCatchUpPeriodSecs period must be a positive or absent")]:
        with pytest.raises(ReplError) as exc:
            parse_step_down(cmd)
        assert (exc.value.code, exc.value.code_name, exc.value.errmsg) == (2, "BadValue", msg)


def test_freeze():
    h, p = elected()
    with pytest.raises(ReplError) as exc:
        h.nodes[p].freeze(h.now, 10)
    assert exc.value.code == 95 and exc.value.code_name == "NotSecondary"
    assert exc.value.errmsg == ("Cannot freeze node when primary or running for election, "
                                "state: Primary")
    s = (p + 1) % 3
    assert h.nodes[s].freeze(h.now, 1) == {"warning": "you really want to freeze for only 1 "
                                                      "second?", "ok": 1.0}
    assert h.nodes[s].freeze(h.now, 30) == {"ok": 1.0}
    assert h.nodes[s].unelectable_reason(h.now) == "StepDownPeriodActive"
    assert h.nodes[s].freeze(h.now, 0) == {"info": "unfreezing", "ok": 1.0}
    assert h.nodes[s].unelectable_reason(h.now) is None


def test_step_up_elects_the_member_and_reports_it():
    h, p = elected()
    h.advance(h.now + 400)
    s = (p + 1) % 3
    h.nodes[s].step_up(h.now)
    h.pump()
    h.advance(h.now + 300)
    assert h.primary() == s and h.nodes[s].term == 2
    assert any(isinstance(e, StepUpFinished) and e.error is None for e in h.effects[s])


def test_a_restarted_member_keeps_its_vote():
    h, p = elected()
    voter = (p + 1) % 3
    lv = h.durable[voter].last_vote
    assert lv.term == 1
    node = ReplNode(h.config, voter, h.durable[voter], OpTime(t=-1, ts=0), now=h.now,
                    rng=random.Random(9))
    resp = node.receive(RequestVotes("rs0", 1, 1, (p + 2) % 3, OpTime(t=5, ts=9), False), h.now)
    assert not resp.vote_granted and resp.reason.startswith("already voted")


def test_sync_source_choice_and_oplog_start_missing():
    views = {1: MemberView(MemberState.SECONDARY, 1, hb_applied=OpTime(t=1, ts=9), up=True),
             2: MemberView(MemberState.PRIMARY, 1, hb_applied=OpTime(t=1, ts=5), up=True)}
    assert choose_sync_source(0, OpTime(t=1, ts=4), views, 2, True) == 2
    assert choose_sync_source(0, OpTime(t=1, ts=5), views, 2, True) == 1
    assert choose_sync_source(0, OpTime(t=1, ts=5), views, 2, False) is None
    ops = [OpTime(t=1, ts=1), OpTime(t=1, ts=2), OpTime(t=2, ts=5)]
    got, err, _ = serve_fetch(ops, ["a", "b", "c"], OpTime(t=1, ts=2), 10)
    assert got == ("c",) and err is None
    got, err, first = serve_fetch(ops, ["a", "b", "c"], OpTime(t=1, ts=3), 10)
    assert got == () and err.code == 120 and err.code_name == "OplogStartMissing"
    assert err.errmsg == ("Our last optime fetched: { ts: Timestamp(0, 3), t: 1 }. source's "
                          "GTE: { ts: Timestamp(0, 5), t: 2 }")
    assert diverged_or_too_stale(OpTime(t=1, ts=3), first) == "rollback"
    _, _, first = serve_fetch(ops[1:], ["b", "c"], OpTime(t=1, ts=1), 10, oplog_truncated=True)
    assert diverged_or_too_stale(OpTime(t=1, ts=1), first) == "too stale"


def test_a_deposed_primary_with_unreplicated_writes_rolls_back():
    h, p = elected()
    h.advance(h.now + 400)
    h.down = {q for q in range(3) if q != p}
    node = h.nodes[p]
    lost = h.append(p, node.term, {"_id": "lost"})
    node.note_applied(lost, h.now)
    h.down = {p}
    h.advance(h.now + 3000)
    q = h.primary()
    assert q is not None and h.nodes[q].term == 2
    h.down = set()
    h.advance(h.now + 1500)
    effects = h.effects[p]
    assert any(isinstance(e, StateChanged) and e.new == MemberState.ROLLBACK for e in effects)
    assert any(isinstance(e, KillOperations) and e.scope == "all" for e in effects)
    # the lost write is gone, the rollback id moved, and the member caught up with the new primary
    assert all(e["o"] != {"_id": "lost"} for e in h.oplogs[p])
    assert h.durable[p].rbid == 2 and h.nodes[p].state == MemberState.SECONDARY
    assert h.oplogs[p] == h.oplogs[q]



def test_config_validation_and_non_voters():
    for members, msg in [((), "at least one member"),
                         ((MemberConfig(0, "a"), MemberConfig(0, "b")), "same _id"),
                         ((MemberConfig(0, "a", votes=2),), "must be 0 or 1"),
                         ((MemberConfig(0, "a", votes=0),), "priority must be 0"),
                         ((MemberConfig(0, "a", votes=0, priority=0),), "at least one voting")]:
        with pytest.raises(ReplError) as exc:
            ReplSetConfig("rs0", members)
        assert exc.value.code == 93 and msg in exc.value.errmsg
    cfg = ReplSetConfig("rs0", (MemberConfig(0, "a"), MemberConfig(1, "b"),
                                MemberConfig(2, "c", votes=0, priority=0)))
    assert cfg.voter_ids == [0, 1] and cfg.majority_vote_count == 2
    node = ReplNode(cfg, 2, DurableState(), OpTime(t=-1, ts=0), now=0, rng=random.Random(1))
    node.start(0)
    assert node.unelectable_reason(0) == "NotAVoter"
    assert node.hello_fields()["passives"] == ["c"] and node.hello_fields()["hosts"] == ["a", "b"]


def test_a_higher_priority_member_takes_over_once_caught_up():
    h = Harness(priorities=[1, 1, 2])
    h.nodes[2].freeze(0, 3)
    h.advance(2500)
    p = h.primary()
    assert p in (0, 1)
    h.advance(6000)
    assert h.primary() == 2 and h.nodes[2].election_reason == "priorityTakeover"
    assert h.nodes[2].term == h.nodes[p].term and h.nodes[p].state == MemberState.SECONDARY


def test_two_secondaries_syncing_from_each_other_choose_again() -> None:
    """A sync-source cycle: member 1 fetches from secondary 2, which fetches from member 1 and
    is no further: the empty answer makes member 1 choose again (before, the two waited for
    each other forever while the primary moved on: the commit point stood still and every
    ``w: "majority"`` write hung, the failover trials' 120 s stall); a source chaining from
    the primary is kept."""
    from shardsim.core.repl.config import ReplSetConfig
    from shardsim.core.repl.messages import OplogQueryMetadata
    from shardsim.core.repl.node import ReplNode
    from shardsim.core.repl.optime import NULL_OPTIME
    config = ReplSetConfig("rs", tuple(MemberConfig(id=i, host=f"h{i}:1") for i in range(3)))
    here = OpTime(ts=(100 << 32) | 1, t=1)
    for source_of_source, kept in ((1, False), (0, True)):
        node = ReplNode(config, 1, DurableState(), here, now=0, rng=random.Random(1))
        node.start(0)
        node.sync_source, node.sync_source_rbid, node.fetch_deadline = 2, 0, 400
        md = OplogQueryMetadata(1, here, here, 0, source_of_source, 0)
        assert node.on_fetch_reply(FetchReply(2, here, md, (), None, NULL_OPTIME), 10) == ()
        assert (node.sync_source == 2) is kept


def test_a_primary_in_catch_up_that_finds_diverged_oplogs_ends_the_catch_up_instead_of_retrying():
    """bgsync.cpp ``BackgroundSync::_runRollback``: a PRIMARY still catching up never rolls
    back; it aborts the catch-up (kFailedWithError) and goes on to its "new primary" no-op.
    With catchUpTimeoutMillis -1 a retry would leave the set without a writable primary."""
    h, p = elected()
    h.advance(h.now + 600)
    f = next(i for i in range(3) if i != p)
    s = next(i for i in range(3) if i not in (p, f))
    node = h.nodes[f]
    h.down.add(p)
    node._win_election(h.now)               # f won and is catching up, target not fixed yet
    node.poll()
    assert node.catch_up is not None and not node.can_accept_writes()
    node.sync_source = s
    err = ReplError(120, "OplogStartMissing", "Our last optime fetched: x. source's GTE: y")
    md = h.nodes[s].on_fetch_request(FetchRequest(f, node.term, node.applied, 10), h.now)
    got = node.on_fetch_reply(FetchReply(s, node.applied, md, (), err, OpTime(t=-1, ts=0)),
                              h.now)
    assert got == ()
    assert node.catch_up is None and node.state == MemberState.PRIMARY
    _, effects = node.poll()
    assert [type(e) for e in effects if isinstance(e, WriteNoop)] == [WriteNoop]
    assert not any(isinstance(e, StartRollback) for e in effects)
