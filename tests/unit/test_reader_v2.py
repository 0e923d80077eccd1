"""The v2 reader's router stage without sockets (router/change_stream/reader_v2.py): control
events -> retargeting actions, the high-water-mark rule for control events
(``NextHighWaterMarkDeterminingStrategy``, "recognizeControlEvents"), faked control events."""

from __future__ import annotations

from typing import Any

import bson
import pytest
from bson import Timestamp

from shardsim.core import resume_token as rt
from shardsim.core.clock import ts_key
from shardsim.core.errors import MongoError
from shardsim.router.change_stream.async_results_merger import Merger
from shardsim.router.change_stream.raw_events import Item
from shardsim.router.change_stream.reader_v2 import HandleTopologyChangeV2, Retarget


def item(op: str, ts: Timestamp, **fields: Any) -> Item:
    tok = rt.event_token(ts, None, op, None, fields.get("operationDescription") or {"x": 1})
    doc = {"_id": tok, "operationType": op, "clusterTime": ts, **fields}
    return Item(rt.token_key(tok), tok, bson.encode(doc), op)


def move(ts: Timestamp, donor: str, recipient: str, last: bool) -> Item:
    return item("moveChunk", ts, operationDescription={
        "donor": donor, "recipient": recipient, "allCollectionChunksMigratedFromDonor": last})


def test_move_chunk_opens_recipient_and_closes_emptied_donor() -> None:
    st = HandleTopologyChangeV2({"s0"}, False)
    act = st.process(move(Timestamp(10, 1), "s0", "s1", False), False)
    assert act == Retarget(ts_key(Timestamp(10, 2)), open=["s1"])
    st.targeted.add("s1")
    assert st.process(move(Timestamp(11, 1), "s0", "s1", False), False) is None  # nothing to do
    act = st.process(move(Timestamp(12, 1), "s0", "s1", True), False)
    assert act == Retarget(ts_key(Timestamp(12, 2)), close=["s0"])


def test_placement_changes_refresh() -> None:
    st = HandleTopologyChangeV2({"s0"}, False)
    act = st.process(item("namespacePlacementChanged", Timestamp(5, 3), ns={"db": "d"}), False)
    assert act == Retarget(ts_key(Timestamp(5, 4)), refresh_at=ts_key(Timestamp(5, 3)))
    cfg = item("insert", Timestamp(6, 1), ns={"db": "config", "coll": "databases"},
               fullDocument={"_id": "d"})
    act = st.process(cfg, True)
    assert act is not None and act.close_config and act.refresh_at == ts_key(Timestamp(6, 1))


def test_faked_control_event_is_bad_value() -> None:
    st = HandleTopologyChangeV2({"s0"}, False)
    with pytest.raises(MongoError) as exc:
        st.process(item("moveChunk", Timestamp(1, 1), operationDescription={"donor": 1}), False)
    assert exc.value.code == 2


def test_hwm_rule_for_control_events() -> None:
    m = Merger()
    prev_tok = rt.event_token(Timestamp(10, 1), None, "insert", {"_id": 1})
    prev = rt.token_key(prev_tok)
    ctl = move(Timestamp(10, 5), "s0", "s1", False)
    m.hwm, m.hwm_token = ctl.key, ctl.token  # what next_ready did
    HandleTopologyChangeV2.fix_hwm(m, prev, prev_tok, ctl)
    assert m.hwm_token == rt.hwm_token(ts_key(Timestamp(10, 5)))  # a later clusterTime: HWM(ct)
    m2 = Merger()
    same = move(Timestamp(10, 1), "s0", "s1", False)
    m2.hwm, m2.hwm_token = same.key, same.token
    HandleTopologyChangeV2.fix_hwm(m2, prev, prev_tok, same)
    assert m2.hwm_token == prev_tok  # the same clusterTime: unchanged
