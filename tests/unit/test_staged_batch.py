"""The router's next reply built ahead (router/change_stream/staged_batch.py): encoded array
elements that are exactly what the getMore would have written, and a split that renumbers the
rest and names the last delivered event's token."""

from __future__ import annotations

import bson
from bson.binary import Binary
from bson.timestamp import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.core import resume_token as rt
from shardsim.router.change_stream.staged_batch import StagedBatch

UUID = bytes(range(16))


def _event(i: int, pad: int) -> tuple[bytes, dict]:
    tok = rt.event_token(Timestamp(1000 + i, 1), UUID, "insert", {"_id": i})
    doc = {"_id": tok, "operationType": "insert", "fullDocument": {"_id": i, "p": "x" * pad}}
    return bson.encode(doc), tok


def _array(parts: list[bytes]) -> list[dict]:
    body = b"".join(parts)
    # {a: [<the elements>]}: int32 length, 0x04 "a" NUL, the array (int32 length, elements,
    # NUL), NUL
    return bson.decode((len(body) + 13).to_bytes(4, "little") + b"\x04a\0"
                       + (len(body) + 5).to_bytes(4, "little") + body + b"\0\0")["a"]


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=2, max_size=40), data=st.data())
def test_split_keeps_order_renumbers_the_rest_and_names_the_last_token(sizes, data):
    events = [_event(i, pad) for i, pad in enumerate(sizes)]
    stg = StagedBatch()
    # added in a few takes, as stage_more does when remote batches arrive one after another
    cut = data.draw(st.integers(1, len(events)))
    for chunk in (events[:cut], events[cut:]):
        if chunk:
            size = stg.size + sum(len(raw) + len(str(stg.n + j)) + 2 for j, (raw, _t) in enumerate(chunk))
            stg.add([raw for raw, _t in chunk], chunk[-1][1], size)
    assert stg.n == len(events)
    whole = b"".join(stg.parts)
    assert len(whole) == stg.size  # the 16 MiB accounting counts exactly the bytes written
    assert [d["fullDocument"]["_id"] for d in _array(stg.parts)] == list(range(len(events)))
    k = data.draw(st.integers(1, len(events) - 1))
    if data.draw(st.booleans()):
        stg.compact()
        assert len(stg.parts) == 1
    head, rest = stg.split(k)
    assert (head.n, rest.n) == (k, len(events) - k)
    assert head.parts == [whole[:head.size]]
    assert [d["fullDocument"]["_id"] for d in _array(head.parts)] == list(range(k))
    # the rest starts again at index 0 ("0", "1", ...: the next reply's own array)
    assert b"".join(rest.parts).startswith(b"\x030\x00")
    assert [d["fullDocument"]["_id"] for d in _array(rest.parts)] == list(range(k, len(events)))
    assert rest.size == len(b"".join(rest.parts))
    assert head.last_token == events[k - 1][1]
    assert rest.last_token == events[-1][1]


def test_split_token_keeps_type_bits():
    raw = bson.encode({"_id": {"_data": "8200", "_typeBits": Binary(b"\x01", 0)}, "x": 1})
    raw2 = bson.encode({"_id": {"_data": "8201"}, "x": 2})
    stg = StagedBatch()
    stg.add([raw, raw2], {"_data": "8201"}, len(raw) + len(raw2) + 6)
    head, rest = stg.split(1)
    assert head.last_token == {"_data": "8200", "_typeBits": Binary(b"\x01", 0)}
    assert rest.n == 1 and rest.last_token == {"_data": "8201"}
