"""Shard batches as Blocks on the router (router/change_stream/raw_events.py): a run of plain events kept as
offsets into the reply's bytes must give exactly what the per-event path gives (payloads,
keys, tokens), reject every layout the per-event path treats specially, and write the client's
BSON array byte for byte as encoding the payloads would; the merge must order Blocks like
Items (router/change_stream/async_results_merger.py)."""

from __future__ import annotations

import random

import bson
import pytest
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from shardsim.router.change_stream.async_results_merger import Merger
from shardsim.core.resume_token import hwm_data
from shardsim.router.change_stream.merge_cursors import ChangeStreamMerge
from shardsim.core.cursors import element_headers
from shardsim.router.change_stream.raw_events import Block, Item, _fast_item, parse_block, split_cursor
from shardsim.core.resume_token import token_key
from shardsim.core import resume_token as rt
from shardsim.core.cursors import Batch, array_header_bytes, cursor_reply

U = bytes(range(16))


def event(ts: int, doc_id, op: str = "insert", pad: int = 0) -> dict:
    """A shard's event as the router receives it (``$sortKey`` last)."""
    t = Timestamp(ts, 1)
    tok = rt.event_token(t, U, op, {"_id": doc_id})
    doc = {"_id": tok, "operationType": op, "clusterTime": t, "ns": {"db": "d", "coll": "c"},
           "documentKey": {"_id": doc_id}}
    if op == "insert":
        doc["fullDocument"] = {"_id": doc_id, "pad": "x" * pad}
    doc["$sortKey"] = [tok]
    return doc


def reply_cursor(events: list[dict], field: str = "nextBatch") -> bytes:
    return bson.encode({field: events, "id": Int64(7), "ns": "d.c",
                        "postBatchResumeToken": events[-1]["_id"] if events else {"_data": "82"}})


def per_event(raw: bytes) -> list[Item]:
    """The per-event path over the same reply (what a Block must be equivalent to)."""
    arr = bson.decode(raw, bson.CodecOptions(document_class=bson.raw_bson.RawBSONDocument))
    return [_fast_item(e.raw) for e in arr["nextBatch"]]


IDS = [0, 1, 7, -3, 2 ** 40, 5.5, "abc", "", ObjectId("65f000000000000000000001"), {"a": 1},
       Int64(9), True, None, [1, 2]]


@pytest.mark.parametrize("seed", range(20))
def test_block_equals_the_per_event_path(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 2, 11, 120, 1100])
    evs = [event(100 + i, rng.choice(IDS), rng.choice(["insert", "update", "delete", "replace"]),
                 rng.randint(0, 300)) for i in range(n)]
    raw = reply_cursor(evs)
    meta, items = split_cursor(raw, "nextBatch")
    assert meta["id"] == 7 and meta["ns"] == "d.c"
    assert len(items) == 1 and isinstance(items[0], Block)
    blk = items[0]
    ref = per_event(raw)
    assert blk.n == n
    for i, it in enumerate(ref):
        assert blk.key_at(i) == it.key == token_key(evs[i]["_id"])
        assert blk.token_at(i) == dict(it.token)
        got = blk.item_at(i)
        assert (got.payload, got.key, got.op) == (it.payload, it.key, it.op)
    assert blk.key == ref[0].key and blk.last == ref[-1].key
    # the client's array: element headers renumbered from any base, $sortKey cut
    base = rng.randint(0, 20000)
    parts: list[bytes] = []
    assert blk.write(parts, base) == base + n
    want = b"".join(b"\x03%d\x00" % (base + i) + it.payload for i, it in enumerate(ref))
    assert b"".join(parts) == want
    assert blk.payload_bytes(n) == sum(len(it.payload) for it in ref)


def test_split_count_le_and_pop_keep_every_event_once():
    evs = [event(100 + i, i) for i in range(50)]
    blk = split_cursor(reply_cursor(evs), "nextBatch")[1][0]
    bound = token_key(evs[19]["_id"])
    assert blk.count_le(bound) == 20
    assert blk.count_le(token_key({"_data": hwm_data((100 << 32) | 1)})) == 0
    head = blk.split(20)
    assert (head.n, blk.n) == (20, 30)
    assert head.last == bound and blk.key == token_key(evs[20]["_id"])
    it = blk.pop_item()
    assert it.key == token_key(evs[20]["_id"]) and blk.key == token_key(evs[21]["_id"])


@pytest.mark.parametrize("case", ["modified_id", "sortkey_not_last", "invalidate", "new_shard",
                                  "new_shard_v2_name", "missing_sortkey", "odd_array_keys", "id_extra_field",
                                  "non_ascii_token"])
def test_layouts_left_to_the_per_event_path(case):
    evs = [event(100 + i, i) for i in range(5)]
    if case == "modified_id":
        evs[2]["_id"] = {"_data": "82FF"}  # a user stage changed _id: the per-event path raises 280
    elif case == "sortkey_not_last":
        sk = evs[3].pop("$sortKey")
        evs[3] = {"$sortKey": sk, **evs[3]}
    elif case == "invalidate":
        tok = rt.event_token(Timestamp(200, 1), U, "invalidate", None, from_invalidate=True)
        evs.append({"_id": tok, "operationType": "invalidate", "clusterTime": Timestamp(200, 1),
                    "$sortKey": [tok]})
    elif case == "new_shard":
        evs[1]["operationType"] = "kNewShardDetected"
    elif case == "new_shard_v2_name":
        evs[1]["operationType"] = "migrateChunkToNewShard"
    elif case == "missing_sortkey":
        del evs[4]["$sortKey"]
    elif case in ("id_extra_field", "non_ascii_token"):
        tok = dict(evs[2]["_id"])
        if case == "id_extra_field":
            tok["x"] = 1  # even when $sortKey carries the same document
        else:
            tok["_data"] = tok["_data"][:-2] + "é"
        evs[2]["_id"] = tok
        evs[2]["$sortKey"] = [tok]
    raw = reply_cursor(evs)
    if case == "odd_array_keys":
        # array keys are skipped by length (as the per-event path ignores them): a key of
        # another length must not shift the offsets into a wrong Block
        raw = raw.replace(b"\x030\x00", b"\x0300\x00", 1)
    arr_start = raw.index(b"\x04nextBatch\x00") + 11
    size = int.from_bytes(raw[arr_start:arr_start + 4], "little")
    assert parse_block(raw, arr_start + 4, arr_start + size - 1) is None


def test_first_batch_and_empty_batch():
    evs = [event(100 + i, i) for i in range(3)]
    meta, items = split_cursor(reply_cursor(evs, "firstBatch"), "firstBatch")
    assert len(items) == 1 and items[0].n == 3
    meta, items = split_cursor(reply_cursor([]), "nextBatch")
    assert items == [] and meta["id"] == 7


def test_fit_respects_the_byte_budget():
    evs = [event(100 + i, i, pad=1000) for i in range(100)]
    blk = split_cursor(reply_cursor(evs), "nextBatch")[1][0]
    sizes = [len(it.payload) + len(str(i)) + 2 for i, it in enumerate(per_event(reply_cursor(evs)))]
    budget = sum(sizes[:37]) + 5
    assert blk.fit(100, 0, 0, budget) == 37
    assert blk.fit(100, 0, 0, 10 ** 9) == 100
    assert blk.fit(100, 5, budget * 2, budget) == 0  # a batch already over budget takes none
    assert blk.fit(100, 0, 0, 1) == 1  # ...but the first event of a batch always fits


def test_header_bytes_and_element_headers():
    for lo, hi in [(0, 0), (0, 1), (9, 11), (95, 1005), (99999, 100002)]:
        assert array_header_bytes(lo, hi) == sum(len(str(i)) + 2 for i in range(lo, hi))
    assert element_headers(98, 3) == [b"\x0398\x00", b"\x0399\x00", b"\x03100\x00"]


def _merge_of(batches: list[list[dict]]):
    m = Merger()
    remotes = [m.add_remote(f"s{i}", "d.c", 1, [], {"_data": hwm_data(1 << 32)})
               for i in range(len(batches))]
    m.set_initial_high_water_mark()
    for r, evs in zip(remotes, batches):
        m.on_batch(r, split_cursor(reply_cursor(evs), "nextBatch")[1], 1, {"_data": hwm_data(10 ** 4 << 32)})
    return m, ChangeStreamMerge(m)


@pytest.mark.parametrize("interleaved", [False, True])
def test_take_merges_blocks_in_key_order_and_moves_the_hwm(interleaved):
    if interleaved:  # overlapping runs: unrolled and k-way merged
        batches = [[event(100 + 3 * i + s, i) for i in range(40)] for s in range(3)]
    else:  # a backlog shard by shard: whole blocks concatenated
        batches = [[event(100 + 40 * s + i, i) for i in range(40)] for s in range(3)]
    want = sorted((token_key(e["_id"]) for b in batches for e in b))
    m, cs = _merge_of(batches)
    got: list = []
    while True:
        out, tok, _ = cs.take(17, None, len(got), 0)
        if not out:
            break
        for o in out:
            if isinstance(o, Block):
                got.extend(o.key_at(i) for i in range(o.lo, o.hi))
            else:
                got.append(token_key(bson.decode(o)["_id"]))
        assert token_key(tok) == got[-1] == m.hwm
    assert got == want


def test_cursor_reply_splices_raw_elements_like_encoding_the_docs():
    docs = [{"_id": i, "x": "y" * i} for i in range(12)]
    elements = b"".join(b"\x03%d\x00" % i + bson.encode(d) for i, d in enumerate(docs))
    pbrt = {"_data": "8200"}
    for field, reply in (("nextBatch", {"id": Int64(5), "ns": "d.c", "nextBatch": None,
                                        "postBatchResumeToken": pbrt}),
                         ("firstBatch", {"firstBatch": None, "postBatchResumeToken": pbrt,
                                         "id": Int64(0), "ns": "d.c"})):
        raw = cursor_reply(dict(reply), field, Batch([], False, pbrt, raw_docs=elements))
        plain = cursor_reply(dict(reply), field, Batch(docs, False, pbrt))
        assert raw.raw == bson.encode(plain)
        assert bson.encode({"cursor": raw, "ok": 1.0}) == bson.encode({"cursor": plain, "ok": 1.0})


def test_server_frames_a_spliced_cursor_reply_like_the_encoded_document():
    from shardsim.core import wire
    from shardsim.core.server import encode_reply_parts

    docs = [{"_id": i, "pad": "z" * (i * 7)} for i in range(50)]
    elements = [b"\x03%d\x00" % i + bson.encode(d) for i, d in enumerate(docs)]
    inner = {"id": Int64(9), "ns": "d.c", "nextBatch": None, "postBatchResumeToken": {"_data": "82"}}
    cur = cursor_reply(dict(inner), "nextBatch", Batch([], False, None, raw_docs=elements))
    reply = {"cursor": cur, "ok": 1.0, "operationTime": Timestamp(5, 1)}
    parts = encode_reply_parts(reply)
    assert isinstance(parts, list)
    want = bson.encode({"cursor": {**inner, "nextBatch": docs}, "ok": 1.0,
                        "operationTime": Timestamp(5, 1)})
    assert b"".join(parts) == want
    msg = wire.encode_op_msg(parts, response_to=3, request_id=4)
    assert msg == wire.encode_op_msg(want, response_to=3, request_id=4)
    assert encode_reply_parts({"ok": 1.0}) == bson.encode({"ok": 1.0})


def test_a_mark_without_sizes_is_not_trusted_the_batch_is_checked_in_full():
    from shardsim.core.cursors import SORT_KEY_LAYOUT_FIELD
    evs = [event(100 + i, IDS[i % len(IDS)], pad=i) for i in range(60)]
    plain = bson.encode({"nextBatch": evs, "id": Int64(7), "ns": "d.c"})
    vouched = bson.encode({"nextBatch": evs, "id": Int64(7), "ns": "d.c", SORT_KEY_LAYOUT_FIELD: True})
    meta_a, (a,) = split_cursor(plain, "nextBatch")
    meta_b, (b,) = split_cursor(vouched, "nextBatch")
    assert meta_a == meta_b == {"id": 7, "ns": "d.c"}  # the mark is not a cursor field for anyone
    pa, pb = [], []
    a.write(pa, 0)
    b.write(pb, 0)
    assert b"".join(pa) == b"".join(pb)
    assert [a.key_at(i) for i in range(60)] == [b.key_at(i) for i in range(60)]
    # A marked batch whose $sortKey is not last is still refused as a Block, and as Items
    # (the caller then takes the general path, which reports what is wrong).
    evs[5] = {k: v for k, v in evs[5].items() if k != "$sortKey"} | {"$sortKey": [evs[5]["_id"]], "z": 1}
    broken = bson.encode({"nextBatch": evs, "id": Int64(7), "ns": "d.c", SORT_KEY_LAYOUT_FIELD: True})
    arr = broken.index(b"\x04nextBatch\x00") + 11
    size = int.from_bytes(broken[arr:arr + 4], "little")
    assert parse_block(broken, arr + 4, arr + size - 1) is None
    assert split_cursor(broken, "nextBatch") is None


@pytest.mark.parametrize("count", [130, 12])  # the numpy check, and the one for small batches
def test_a_batch_with_the_shards_sizes_is_located_without_a_walk_and_checked_against_the_bytes(count):
    import struct

    from shardsim.router.change_stream.raw_events import NUMPY_MIN_EVENTS, block_from_sizes
    from shardsim.core.cursors import SORT_KEY_LAYOUT_FIELD, SORT_KEY_SIZES_FIELD
    assert (count >= NUMPY_MIN_EVENTS) == (count == 130)
    evs = [event(100 + i, IDS[i % len(IDS)], pad=i * 3) for i in range(count)]
    docs = [bson.encode(e) for e in evs]
    sizes = struct.pack(f"<{2 * len(docs)}i", *map(len, docs),
                        *(len(bson.encode(e["_id"])) for e in evs))
    raw = bson.encode({"nextBatch": evs, "id": Int64(7), "ns": "d.c", SORT_KEY_LAYOUT_FIELD: True,
                       SORT_KEY_SIZES_FIELD: bson.Binary(sizes, 0)})
    meta, (blk,) = split_cursor(raw, "nextBatch")
    assert meta == {"id": 7, "ns": "d.c"}
    walked = bson.encode({"nextBatch": evs, "id": Int64(7), "ns": "d.c"})  # same array offsets
    ref = split_cursor(walked, "nextBatch")[1][0]  # found by walking the elements
    assert (blk.starts, blk.cuts) == (ref.starts, ref.cuts)
    pa, pb = [], []
    blk.write(pa, 3)
    ref.write(pb, 3)
    assert b"".join(pa) == b"".join(pb)
    arr = raw.index(b"\x04nextBatch\x00") + 11
    a, stop = arr + 4, arr + int.from_bytes(raw[arr:arr + 4], "little") - 1
    assert block_from_sizes(raw, a, stop, sizes) is not None
    # sizes that disagree with the bytes are not used (two swapped, one short, truncated)
    lens = list(struct.unpack(f"<{2 * len(docs)}i", sizes))
    for bad in (lens[1:2] + lens[0:1] + lens[2:], [lens[0] - 1] + lens[1:]):
        assert block_from_sizes(raw, a, stop, struct.pack(f"<{len(bad)}i", *bad)) is None
    assert block_from_sizes(raw, a, stop, sizes[:-4]) is None
    assert block_from_sizes(raw, a, stop, b"") is None
    # sizes that would put an offset outside the array (negative, or an _id as big as the
    # event) are refused before any byte is read
    n = len(docs)
    for bad in ([-lens[0]] + lens[1:], lens[:n] + [lens[0]] + lens[n + 1:],
                lens[:n] + [-3] + lens[n + 1:]):
        assert block_from_sizes(raw, a, stop, struct.pack(f"<{len(bad)}i", *bad)) is None
    assert block_from_sizes(raw, a, len(raw) + 1, sizes) is None
    # consistent sizes, but the last element of one event is not $sortKey
    renamed = raw.replace(b"\x04$sortKey\x00", b"\x04$sortKez\x00", 1)
    assert block_from_sizes(renamed, a, stop, sizes) is None


def _vouched_reply(evs: list[dict]) -> bytes:
    """A reply as a shard sends it: layout mark and the events' and ``_id``'s sizes."""
    import struct

    from shardsim.core.cursors import SORT_KEY_LAYOUT_FIELD, SORT_KEY_SIZES_FIELD
    docs = [bson.encode(e) for e in evs]
    sizes = struct.pack(f"<{2 * len(docs)}i", *map(len, docs),
                        *(len(bson.encode(e["_id"])) for e in evs))
    return bson.encode({"nextBatch": evs, "id": Int64(7), "ns": "d.c", SORT_KEY_LAYOUT_FIELD: True,
                        SORT_KEY_SIZES_FIELD: bson.Binary(sizes, 0)})


@pytest.mark.parametrize("vouched", [True, False])
def test_events_projected_to_their_id_alone_are_items_and_blocks(vouched):
    """Issue 26 (2): ``$project: {_id: 1}`` leaves ``{_id, $sortKey}``; the Block's per-event
    view (``item_at``, used when an event waits for idle shards) used to fail an assertion.
    mongos forwards ``{_id: <token>}`` (``RouterStagePipeline::_validateAndConvertToBSON``)."""
    evs = []
    for i in range(5):
        tok = event(100 + i, i)["_id"]
        evs.append({"_id": tok, "$sortKey": [tok]})
    raw = _vouched_reply(evs) if vouched else reply_cursor(evs)
    meta, (blk,) = split_cursor(raw, "nextBatch")
    assert isinstance(blk, Block) and blk.n == 5
    for i in range(5):
        it = blk.item_at(i)
        assert bson.decode(it.payload) == {"_id": evs[i]["_id"]}
        assert it.key == token_key(evs[i]["_id"]) and it.op is None
    parts: list = []
    blk.write(parts, 0)
    body = b"".join(bytes(p) for p in parts)
    array = (len(body) + 5).to_bytes(4, "little") + body + b"\x00"
    outer = b"\x04a\x00" + array
    doc = bson.decode((len(outer) + 5).to_bytes(4, "little") + outer + b"\x00")
    assert doc == {"a": [{"_id": e["_id"]} for e in evs]}
    assert _fast_item(bson.encode(evs[0])).payload == bson.encode({"_id": evs[0]["_id"]})


def test_a_raw_event_over_a_memoryview_takes_the_general_path():
    """Issue 26 (1): a transaction's event puts ``txnNumber``/``lsid`` before ``_id`` (not the
    fast layout); in a large reply the driver's RawBSONDocument holds a memoryview of the wire
    message, and the general path called ``bytes`` methods on it (AttributeError, code 1)."""
    from bson.raw_bson import RawBSONDocument

    from shardsim.router.change_stream.raw_events import item_from_raw_event
    from shardsim.core.client import RAW_CODEC
    ev = event(100, 1, pad=5000)
    tok = ev["_id"]
    ev = {"txnNumber": Int64(1), "lsid": {"id": bson.Binary(U, 4)}, **ev}
    reply = bson.encode({"nextBatch": [ev]})
    cur = RawBSONDocument(memoryview(reply), RAW_CODEC)
    (raw_ev,) = cur["nextBatch"]
    assert type(raw_ev.raw) is memoryview
    it = item_from_raw_event(raw_ev)
    want = dict(ev)
    del want["$sortKey"]
    son = bson.CodecOptions(document_class=bson.SON)
    assert list(bson.decode(it.payload, son).items()) == list(want.items())  # order kept
    assert it.key == token_key(tok) and it.op == "insert"
    assert _fast_item(raw_ev.raw) is None  # a memoryview, not the fast layout: no exception
