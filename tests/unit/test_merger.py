"""Unit tests for the router's change-stream merge (router/change_stream/: the merger in
async_results_merger.py, the stages in merge_cursors.py, handle_topology_change.py and
ensure_resume_token_present.py, byte surgery in raw_events.py): ARM ordering, promises,
high-water marks, the config cursor's eligibility rule, byte surgery on raw events, resume checks
and new-shard detection."""

from __future__ import annotations

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from shardsim.router.change_stream.async_results_merger import Merger
from shardsim.core.resume_token import hwm_data, hwm_token, is_hwm_data
from shardsim.router.change_stream.handle_topology_change import NewShard
from shardsim.router.change_stream.merge_cursors import ChangeStreamMerge
from shardsim.router.change_stream.raw_events import Item, item_from_raw_event, strip_sort_key
from shardsim.core.resume_token import token_key
from shardsim.core.errors import MongoError


def ev(ts: int, tie: int = 0, op: str = "insert") -> Item:
    tok = {"_data": f"82{ts:016X}2B042C0100296E{tie:04X}04"}
    return Item(token_key(tok), tok, f"e{ts}.{tie}", op)


def hwm(ts: int) -> dict:
    return {"_data": hwm_data(ts)}


def test_hwm_token_matches_real_server_vector():
    # shared/specs/resume-token-vectors.json / notes §2.5 vector 1
    ts = (0x69B03187 << 32) | 2
    assert hwm_data(ts) == "8269B03187000000022B0429296E1404"
    assert is_hwm_data(hwm_data(ts))
    assert not is_hwm_data(ev(ts).token["_data"])
    assert hwm_token(ts)["_data"] == "8269B03187000000022B0429296E1404"


def test_token_order_hwm_before_events_at_same_time_and_typebits_after():
    assert token_key(hwm(5)) < ev(5).key < token_key(hwm(6))
    assert token_key({"_data": "AA"}) < token_key({"_data": "AA", "_typeBits": b"\x40"})


def test_release_waits_for_every_promise_including_config():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(1))
    b = m.add_remote("b", "db.c", 1, [], hwm(1))
    cfg = m.add_remote("config", "config.shards", 1, [], hwm(1))
    m.set_initial_high_water_mark()
    m.on_batch(a, [ev(10)], 1, ev(10).token)
    assert not m.ready()  # b and config still promise only 1
    m.on_batch(b, [], 1, hwm(11))
    assert not m.ready()  # config holds it back
    m.on_batch(cfg, [], 1, hwm(10))
    assert not m.ready()  # HWM(10) sorts before the event at 10
    m.on_batch(cfg, [], 1, hwm(11))
    assert m.ready()
    item, remote = m.next_ready()
    assert item.payload == "e10.0" and remote is a
    assert m.hwm_token == ev(10).token


def test_equal_promise_releases_event_itself():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(1))
    b = m.add_remote("b", "db.c", 1, [], hwm(1))
    m.on_batch(a, [ev(7)], 1, ev(7).token)
    m.on_batch(b, [ev(7, 1)], 1, ev(7, 1).token)
    out = []
    while m.ready():
        out.append(m.next_ready()[0].payload)
    assert out == ["e7.0"]  # e7.1 > a's promise (= e7.0)
    m.on_batch(a, [], 1, hwm(8))
    assert m.next_ready()[0].payload == "e7.1"


def test_high_water_mark_advances_to_min_promise_when_idle():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(3))
    b = m.add_remote("b", "db.c", 1, [], hwm(5))
    m.set_initial_high_water_mark()
    assert m.hwm_token == hwm(3)
    m.on_batch(a, [], 1, hwm(9))
    assert m.high_water_mark() == hwm(5)
    m.on_batch(b, [], 1, hwm(12))
    assert m.high_water_mark() == hwm(9)


def test_high_water_mark_does_not_advance_past_ready_event():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(3))
    b = m.add_remote("b", "db.c", 1, [], hwm(3))
    m.set_initial_high_water_mark()
    m.on_batch(a, [ev(4)], 1, hwm(10))
    m.on_batch(b, [], 1, hwm(10))
    assert m.ready()
    assert m.high_water_mark() == hwm(3)  # an event is ready: keep the old mark
    m.next_ready()
    assert m.high_water_mark() == hwm(10)


def test_config_cursor_eligibility_rule():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(5))
    cfg = m.add_remote("config", "config.shards", 1, [], hwm(2))
    m.set_initial_high_water_mark()
    assert not cfg.eligible  # never on the first batch
    assert m.hwm_token == hwm(5)  # initial HWM from the lowest *shard* promise
    m.on_batch(a, [], 1, hwm(20))
    assert m.high_water_mark() == hwm(5)  # config's promise 2 < HWM: ineligible, HWM held
    m.on_batch(cfg, [], 1, hwm(8))
    assert cfg.eligible  # advanced past its previous promise and not below the HWM
    assert m.high_water_mark() == hwm(8)
    shard_added = ev(9, op="insert")
    m.on_batch(cfg, [shard_added], 1, shard_added.token)
    assert not cfg.eligible  # a non-empty config batch is never eligible (SERVER-47810)
    item, r = m.next_ready()
    assert r is cfg and m.hwm_token == hwm(8)  # its token never becomes the HWM


def test_remotes_to_poll_only_empty_live_idle_remotes():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(1))
    b = m.add_remote("b", "db.c", 1, [], hwm(1))
    m.add_remote("c", "db.c", 0, [], hwm(1))
    m.on_batch(a, [ev(5)], 1, ev(5).token)
    assert m.remotes_to_poll() == [b]
    b.in_flight = True
    assert m.remotes_to_poll() == []


def test_remotes_to_poll_prefetches_only_a_backlog_whose_events_are_releasable():
    # A remote whose last batch was full ("more") is read ahead while its buffer drains, but
    # only once its first buffered event is at or below the minimum promise: a shard whose
    # events all wait for another shard's is not read further ahead meanwhile.
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(1))
    b = m.add_remote("b", "db.c", 1, [], hwm(1))
    m.on_batch(a, [ev(2), ev(3)], 1, ev(3).token)
    m.on_batch(b, [ev(20), ev(21)], 1, ev(21).token)
    a.more = b.more = True
    assert m.remotes_to_poll() == [a]  # b's events wait for a's promise (3 < 20)
    assert m.remotes_to_poll(prefetch_only=True) == [a]
    m.on_batch(a, [], 1, hwm(30))  # a promises past b's first event: b is read on
    a.more = False
    assert m.remotes_to_poll() == [b]
    assert m.next_ready()[0].key == ev(2).key and m.next_ready()[0].key == ev(3).key
    # every event is ready (queued): both buffers are empty, polled as usual, not prefetches
    assert m.remotes_to_poll() == [a, b]
    assert m.remotes_to_poll(prefetch_only=True) == []


def test_pbrt_going_backwards_or_events_out_of_order_fail_the_merge():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(5))
    m.on_batch(a, [], 1, hwm(4))
    with pytest.raises(MongoError) as ei:
        m.next_ready()
    assert ei.value.code == 1
    m2 = Merger()
    b = m2.add_remote("b", "db.c", 1, [], hwm(1))
    m2.on_batch(b, [ev(6), ev(5)], 1, ev(6).token)
    assert m2.status is not None


def test_remote_error_wins_and_is_raised():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(1))
    m.on_error(a, MongoError(91, "shutting down"))
    m.on_error(a, MongoError(6, "later"))
    assert m.ready() and m.remotes_to_poll() == []
    with pytest.raises(MongoError) as ei:
        m.next_ready()
    assert ei.value.code == 91


def _merge(*remotes_events, resume=None):
    m = Merger()
    rs = [m.add_remote(f"s{i}", "db.c", 1, [], hwm(1)) for i in range(len(remotes_events))]
    m.set_initial_high_water_mark()
    cs = ChangeStreamMerge(m, resume_token=resume, known_shards=[r.name for r in rs])
    for r, evs in zip(rs, remotes_events):
        m.on_batch(r, evs, 1, hwm(1000))
    return m, cs


def _drain(cs):
    out = []
    while (x := cs.next()) is not None:
        out.append(x)
    return out


def test_resume_token_present_swallowed_once_even_from_several_shards():
    tok = ev(5).token
    m, cs = _merge([ev(5), ev(8)], [ev(5), ev(6)], resume=tok)
    assert [x.payload for x in _drain(cs)] == ["e6.0", "e8.0"]


def test_resume_token_not_found_is_fatal_280():
    m, cs = _merge([ev(8)], [ev(6)], resume=ev(5, 3).token)
    with pytest.raises(MongoError) as ei:
        cs.next()
    assert ei.value.code == 280
    assert ei.value.errmsg.startswith("cannot resume stream; the resume token was not found.")


def test_hwm_resume_token_skips_the_check():
    m, cs = _merge([ev(8)], [ev(6)], resume=hwm(5))
    assert [x.payload for x in _drain(cs)] == ["e6.0", "e8.0"]


def test_identical_tokens_from_two_shards_return_once_and_invalidate_is_flagged():
    inv = ev(9, op="invalidate")
    inv2 = ev(9, op="invalidate")
    m, cs = _merge([ev(3), inv], [inv2])
    out = _drain(cs)
    assert [x.payload for x in out] == ["e3.0", "e9.0"]
    assert cs.invalidated


def test_config_shards_insert_asks_for_a_new_shard_cursor():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(1))
    cfg = m.add_remote("config", "config.shards", 1, [], hwm(1))
    cs = ChangeStreamMerge(m, known_shards=["a"])
    added = ev(7)
    added.meta = {"is_shard_insert": True, "shard": "b", "cluster_time": 7}
    m.on_batch(cfg, [added], 1, added.token)
    m.on_batch(a, [ev(9)], 1, hwm(20))
    x = cs.next()
    assert isinstance(x, NewShard) and x.shard == "b"
    assert x.start_token == {"_data": hwm_data(8)}  # clusterTime + 1 tick
    b = m.add_remote("b", "db.c", 1, [], x.start_token)
    assert cs.next() is None  # the new shard's promise (HWM(8)) holds e9 back
    m.on_batch(b, [ev(8, 2)], 1, hwm(30))
    m.on_batch(cfg, [], 1, hwm(30))
    assert [y.payload for y in _drain(cs)] == ["e8.2", "e9.0"]


def _raw_event(doc: dict) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


def test_strip_sort_key_is_byte_exact():
    tok = {"_data": "8200"}
    doc = {"_id": tok, "operationType": "insert", "fullDocument": {"x": 1}}
    raw = bson.encode({**doc, "$sortKey": [tok]})
    rd = RawBSONDocument(raw)
    stripped = strip_sort_key(raw, rd["_id"].raw)
    assert stripped == bson.encode(doc)
    item = item_from_raw_event(rd)
    assert item.payload == bson.encode(doc) and item.op == "insert" and dict(item.token) == tok


def test_modified_id_is_change_stream_fatal_error():
    tok = {"_data": "8200"}
    with pytest.raises(MongoError) as ei:
        item_from_raw_event(_raw_event({"operationType": "insert", "$sortKey": [tok]}))
    assert ei.value.code == 280
    assert "was modified by the pipeline" in ei.value.errmsg
    with pytest.raises(MongoError) as ei:
        item_from_raw_event(_raw_event({"_id": {"_data": "99"}, "$sortKey": [tok]}))
    assert ei.value.code == 280


def test_missing_sort_key_is_internal_error():
    with pytest.raises(MongoError) as ei:
        item_from_raw_event(_raw_event({"_id": {"_data": "8200"}}))
    assert ei.value.code == 1 and "$sortKey" in ei.value.errmsg


def test_config_event_metadata():
    tok = {"_data": "8200"}
    rd = _raw_event({"_id": tok, "operationType": "insert", "clusterTime": Timestamp(10, 3),
                     "ns": {"db": "config", "coll": "shards"},
                     "fullDocument": {"_id": "shard03", "host": "127.0.0.1:1"}, "$sortKey": [tok]})
    item = item_from_raw_event(rd, is_config=True)
    assert item.meta["is_shard_insert"] and item.meta["shard"] == "shard03"
    assert item.meta["cluster_time"] == (10 << 32) | 3


def test_token_helpers_agree_with_the_shared_codec():
    from shardsim.core.resume_token import is_invalidate_data, token_ts_key
    from shardsim.core import resume_token as rt
    ts = Timestamp(1234, 5)
    inv = rt.event_token(ts, bytes(16), "invalidate", None, from_invalidate=True)
    ins = rt.event_token(ts, bytes(16), "insert", {"_id": 1})
    assert is_invalidate_data(inv["_data"]) and not is_invalidate_data(ins["_data"])
    assert token_ts_key(ins["_data"]) == (1234 << 32) | 5
    assert hwm_data((1234 << 32) | 5) == rt.make_high_water_mark(ts)["_data"]
    assert is_hwm_data(rt.make_high_water_mark(ts, 1)["_data"])


def test_invalidate_resume_token_is_not_required_to_be_seen():
    from shardsim.core import resume_token as rt
    inv_tok = rt.event_token(Timestamp(0, 5), bytes(16), "invalidate", None, from_invalidate=True)
    m, cs = _merge([ev(8)], [ev(9)], resume=inv_tok)
    assert [x.payload for x in _drain(cs)] == ["e8.0", "e9.0"]


def test_event_below_an_earlier_promise_fails_instead_of_reordering():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [], hwm(1))
    m.on_batch(a, [], 1, hwm(10))
    m.on_batch(a, [ev(5)], 1, ev(5).token)
    assert m.status is not None and m.status.code == 1


@pytest.mark.parametrize("doc_id", [5, 5.5, "abc", {"a": 1}])
def test_fast_event_parsing_matches_the_generic_path(doc_id):
    from shardsim.router.change_stream.raw_events import _fast_item
    from shardsim.core import resume_token as rt
    tok = rt.event_token(Timestamp(1, 1), bytes(16), "update", {"_id": doc_id})
    ev = {"_id": tok, "operationType": "update", "clusterTime": Timestamp(1, 1),
          "ns": {"db": "a", "coll": "b"}, "documentKey": {"_id": doc_id}}
    raw = bson.encode({**ev, "$sortKey": [tok]})
    fast = _fast_item(raw)
    assert fast is not None
    assert fast.payload == bson.encode(ev) and fast.op == "update"
    assert fast.key == token_key(tok) and fast.token == tok
    if isinstance(doc_id, float):
        assert "_typeBits" in tok  # the double _id exercises the _typeBits branch
    # a layout it does not know falls back to the generic path
    from bson import _dict_to_bson
    from bson.codec_options import DEFAULT_CODEC_OPTIONS
    odd = _dict_to_bson({"operationType": "x", "_id": tok, "$sortKey": [tok]}, False,
                        DEFAULT_CODEC_OPTIONS, False)  # keeps field order: _id not first
    assert _fast_item(odd) is None
    slow = item_from_raw_event(RawBSONDocument(odd))
    assert slow.key == token_key(tok) and slow.op == "x"


def test_blocking_remotes_names_the_remotes_whose_promise_holds_the_head_back():
    m = Merger()
    a = m.add_remote("a", "db.c", 1, [ev(10)], ev(10).token)
    b = m.add_remote("b", "db.c", 2, [], hwm(7))
    c = m.add_remote("c", "db.c", 3, [], hwm(12))
    cfg = m.add_remote("config", "config.shards", 4, [], hwm(5), is_config=True)
    item, blockers = m.blocking_remotes()
    assert item is not None and item.key == ev(10).key
    assert {r.name for r in blockers} == {"b", "config"}  # c promised past it; a holds it
    # HWM(10) does not pass an event at 10; HWM(11) does.
    m.on_batch(b, [], 2, hwm(10))
    assert {r.name for r in m.blocking_remotes()[1]} == {"b", "config"}
    m.on_batch(b, [], 2, hwm(11))
    m.on_batch(cfg, [], 4, hwm(11))
    assert m.blocking_remotes() == (None, [])  # ready now: nothing to ask for
    assert m.ready()
    assert m.next_ready()[0].key == ev(10).key
    assert m.blocking_remotes() == (None, [])  # nothing buffered
    _ = (a, c)


def test_blocking_remotes_none_on_error():
    m = Merger()
    m.add_remote("a", "db.c", 1, [ev(10)], ev(10).token)
    b = m.add_remote("b", "db.c", 2, [], hwm(7))
    assert m.blocking_remotes()[1] == [b]
    m.on_error(b, MongoError(6, "down"))
    assert m.blocking_remotes() == (None, [])
