"""``$changeStreamSplitLargeEvent`` packs fields by size as mongod 8.0 does
(``change_stream_split_event::splitChangeEvent`` in ``change_stream_split_event_helpers.cpp``:
the fields but ``_id`` in a map ordered by (element size, name), filled greedily), so the
fragment boundaries and counts match a real server's."""

from __future__ import annotations

import bson
import pytest
from bson.timestamp import Timestamp

from shardsim.core import resume_token as rt
from shardsim.core.errors import MongoError
from shardsim.shard.change_stream import split_large_event as sle

MB = 1024 * 1024
TOKEN = rt.event_token(Timestamp(1700000000, 1), b"\x01" * 16, "insert", {"_id": 1})


def _event(**fields):
    return {"_id": TOKEN, "operationType": "insert", **fields}


def test_fields_are_ordered_by_size_then_packed_greedily():
    # In document order (a 9 MB, b, c 8 MB) a first-fit-in-order split gives {a, b} + {c};
    # mongod sorts by size: b, operationType, c (8 MB) fit the first fragment, a (9 MB) goes
    # to the second.
    ev = _event(a="x" * (9 * MB), b="small", c="y" * (8 * MB))
    frags = sle.split_event(ev, TOKEN)
    assert [f["splitEvent"] for f, _ in frags] == [{"fragment": 1, "of": 2},
                                                    {"fragment": 2, "of": 2}]
    first, second = frags[0][0], frags[1][0]
    assert list(first) == ["_id", "splitEvent", "b", "operationType", "c"]
    assert list(second) == ["_id", "splitEvent", "a"]
    assert [rt.decode(t).fragmentNum for _, t in frags] == [0, 1]
    limit = sle.MAX_CHANGE_EVENT_BYTES - len(bson.encode(TOKEN))
    for frag, tok in frags:
        assert len(bson.encode({**frag, "$sortKey": [tok]})) <= limit


def test_three_fragments_and_skip_through():
    ev = _event(a="x" * (7 * MB), b="y" * (7 * MB), c="z" * (7 * MB))
    frags = sle.split_event(ev, TOKEN)
    assert len(frags) == 2  # a + b (14 MB) fit one fragment, c the next
    ev = _event(a="x" * (9 * MB), b="y" * (9 * MB), c="z" * (9 * MB))
    frags = sle.split_event(ev, TOKEN)
    assert [f["splitEvent"]["of"] for f, _ in frags] == [3, 3, 3]
    rest = sle.split_event(ev, TOKEN, skip_through=0)
    assert [f["splitEvent"]["fragment"] for f, _ in rest] == [2, 3]


def test_event_size_thresholds_follow_the_server():
    assert sle.MAX_CHANGE_EVENT_BYTES == 16793600 - 8 * 1024  # kBSONObjMaxChangeEventSize
    err = sle.too_large(17000000, TOKEN)
    assert err.code == 10334
    assert str(err).startswith("BSONObj size: 17000000 (0x1036640) is invalid. Size must be "
                               "between 0 and 16793600(16MB) First element: _id: { _data: \"")


def test_only_id_cannot_split():
    with pytest.raises(MongoError) as ei:
        sle.split_event({"_id": TOKEN}, TOKEN)
    assert ei.value.code == 7182502
