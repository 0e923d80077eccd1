"""The replication messages on the wire (shardsim/core/protocol/repl.py), topologyVersion and
the awaitable hello (shardsim/core/topology_version.py), and the committed-oplog view change
streams read on a member (shard/replication/committed_oplog.py)."""

from __future__ import annotations

import asyncio

import bson
import pytest
from bson.timestamp import Timestamp
from hypothesis import given, strategies as st

from shardsim.core.errors import MongoError
from shardsim.core.protocol import repl as wire
from shardsim.core.repl.member_state import MemberState, ReplError
from shardsim.core.repl.messages import (FetchRequest, Heartbeat, HeartbeatResponse,
                                         MemberPosition, OplogQueryMetadata, RequestVotes,
                                         UpdatePosition, VoteResponse)
from shardsim.core.repl.optime import NULL_OPTIME, OpTime
from shardsim.core.topology_version import TopologyVersion
from shardsim.shard.oplog import Oplog
from shardsim.shard.replication.committed_oplog import CommittedOplog

optimes = st.builds(lambda t, s, i: OpTime(t=t, ts=(s << 32) | i),
                    st.integers(0, 2**31), st.integers(1, 2**31), st.integers(0, 2**31))
ids = st.integers(0, 6)


def over_the_wire(doc: dict) -> dict:
    return bson.decode(bson.encode(doc))


@given(optimes)
def test_an_optime_survives_bson(op: OpTime) -> None:
    assert wire.parse_optime(over_the_wire({"o": wire.optime_doc(op)})["o"]) == op


def test_the_null_optime_is_the_servers() -> None:
    assert wire.optime_doc(NULL_OPTIME) == {"ts": Timestamp(0, 0), "t": -1}
    assert wire.parse_optime(None) == NULL_OPTIME


@given(st.text(min_size=1), ids, st.integers(0, 99), st.integers(1, 5), st.integers(0, 9))
def test_heartbeats_round_trip(name: str, sender: int, term: int, cfg: int, seq: int) -> None:
    hb = Heartbeat(name, sender, term, cfg, seq)
    assert wire.parse_heartbeat(over_the_wire(wire.heartbeat_command(hb))) == hb


@given(ids, st.integers(0, 99), st.sampled_from(list(MemberState)), optimes, optimes, optimes,
       st.one_of(st.none(), ids), st.one_of(st.none(), ids))
def test_heartbeat_replies_round_trip(sender, term, state, a, d, cp, prim, src) -> None:
    r = HeartbeatResponse(sender, term, state, a, d, cp, prim, src, 1, 3)
    assert wire.parse_heartbeat_reply(over_the_wire(wire.heartbeat_reply(r))) == r


@given(ids, st.integers(0, 99), optimes, st.booleans(), st.booleans(), st.text())
def test_votes_round_trip(cand, term, last, dry, granted, reason) -> None:
    req = RequestVotes("rs0", 1, term, cand, last, dry)
    assert wire.parse_request_votes(over_the_wire(wire.request_votes_command(req))) == req
    resp = VoteResponse(cand, term, granted, reason, dry, term)
    assert wire.parse_vote_reply(over_the_wire(wire.vote_reply(resp))) == resp


@given(ids, st.integers(0, 99), st.lists(st.tuples(ids, optimes, optimes), max_size=4))
def test_positions_round_trip(sender, term, pos) -> None:
    msg = UpdatePosition(sender, term, tuple(MemberPosition(*p) for p in pos))
    assert wire.parse_update_position(over_the_wire(wire.update_position_command(msg))) == msg


@given(ids, st.integers(0, 99), optimes, optimes, optimes, st.one_of(st.none(), ids),
       st.booleans())
def test_fetches_round_trip(mid, term, after, cp, last, prim, failed) -> None:
    req = FetchRequest(mid, term, after, 100)
    assert wire.parse_fetch(over_the_wire(wire.fetch_command(req))) == req
    md = OplogQueryMetadata(term, cp, last, prim, None, 3)
    err = ReplError(120, "OplogStartMissing", "Our last optime fetched: x") if failed else None
    entries = [] if failed else [{"ts": Timestamp(5, 1), "t": term, "op": "n", "o": {}}]
    reply = wire.parse_fetch_reply(after, over_the_wire(wire.fetch_reply(mid, md, entries, err,
                                                                         last)))
    assert reply.metadata == md and reply.error == err and list(reply.entries) == entries
    assert reply.source_first == last and reply.after == after


def test_a_plain_hello_does_not_wait_and_bad_arguments_fail_as_mongod() -> None:
    async def go() -> None:
        tv = TopologyVersion()
        await tv.wait({"hello": 1})
        cases = [({"topologyVersion": tv.doc()}, 31368,
                  "A request with a 'topologyVersion' must include 'maxAwaitTimeMS'"),
                 ({"maxAwaitTimeMS": 5}, 31368,
                  "A request with 'maxAwaitTimeMS' must include a 'topologyVersion'"),
                 ({"topologyVersion": tv.doc(), "maxAwaitTimeMS": -1}, 51024, None),
                 ({"topologyVersion": {"processId": tv.process_id, "counter": -1},
                   "maxAwaitTimeMS": 5}, 31372, "topologyVersion must have a non-negative counter"),
                 ({"topologyVersion": {"processId": tv.process_id, "counter": 7},
                   "maxAwaitTimeMS": 5}, 31382, None)]
        for body, code, msg in cases:
            with pytest.raises(MongoError) as e:
                await tv.wait(body)
            assert e.value.code == code
            if msg:
                assert e.value.errmsg == msg
    asyncio.run(go())


def test_an_awaitable_hello_answers_on_a_bump_or_after_max_await() -> None:
    async def go() -> None:
        tv = TopologyVersion()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await tv.wait({"topologyVersion": tv.doc(), "maxAwaitTimeMS": 50})
        assert loop.time() - t0 >= 0.045
        waiters = [asyncio.ensure_future(tv.wait({"topologyVersion": tv.doc(),
                                                   "maxAwaitTimeMS": 10000})) for _ in range(3)]
        await asyncio.sleep(0.01)
        t1 = loop.time()
        tv.bump()
        await asyncio.gather(*waiters)
        assert loop.time() - t1 < 1
        # an older counter or another process: at once
        old = {"processId": tv.process_id, "counter": 0}
        await asyncio.wait_for(tv.wait({"topologyVersion": old, "maxAwaitTimeMS": 10000}), 1)
        other = {"processId": TopologyVersion().process_id, "counter": 1}
        await asyncio.wait_for(tv.wait({"topologyVersion": other, "maxAwaitTimeMS": 10000}), 1)
    asyncio.run(go())


def _entry(secs: int, ns: str = "d.c", op: str = "i") -> dict:
    return {"op": op, "ns": ns, "ts": Timestamp(secs, 1), "t": 1, "o": {"_id": secs}}


@given(st.lists(st.integers(0, 30), min_size=1, max_size=8))
def test_the_committed_oplog_shows_and_announces_only_what_the_point_passed(points) -> None:
    oplog = Oplog()
    for s in range(1, 21):
        oplog.append(_entry(s, "d.c" if s % 2 else "d.other"))
    limit = [0]
    view = CommittedOplog(oplog, lambda: limit[0])
    heard: list[int] = []
    view.add_listener(lambda e: heard.append(e["ts"].time), ns="d.c")
    top = 0
    for p in sorted(points):
        limit[0] = (p << 32) | 1 if p else 0  # an entry's key, or 0: nothing committed
        view.advance()
        top = min(p, 20)
        keys, entries = view.scoped_batch(0, 100, ns="d.c")
        assert [e["ts"].time for e in entries] == [s for s in range(1, top + 1) if s % 2]
        assert view.latest_key == (((top << 32) | 1) if top else 0)
        assert view.get((top + 1 << 32) | 1) is None
    assert heard == [s for s in range(1, top + 1) if s % 2]
