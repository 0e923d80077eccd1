"""Property test: every event read through the router equals the same event read from its shard.

Issue 26: the router's raw-event path (``router/change_stream/raw_events.py``: events forwarded
as bytes, ``$sortKey`` cut off, ``_id == $sortKey[0]`` checked as mongos'
``RouterStagePipeline::_validateAndConvertToBSON`` does) must not fail on any event a shard can
produce. Hypothesis generates workloads (documents from 0 B to a few MB of many BSON types and
nesting; single writes, bulk inserts, transactions across both shards) and user stages
(``$project``, ``$match``, ``$addFields``, ``$replaceRoot``, ``$changeStreamSplitLargeEvent``);
each example watches the workload's window through the router and directly on each shard with
the same pipeline, and checks that the router's events are, byte for byte, the shards' events
merged in resume-token order. When the stages break the stream (they remove or change ``_id``:
ChangeStreamFatalError 280; an event over 16 MB without the split stage: 10334; ``$replaceRoot``
of a missing document: 40228), the router fails with a code one of the shards failed with,
after a prefix of the merged events.

One in-process cluster (``shardsim.testing.ShardedCluster``) for the module. ``make test`` runs
300 examples, derandomized (the same ones every run; about 60-90 s); the long run sets
``SHARDSIM_CS_PROPERTY_EXAMPLES`` (thousands, random examples, hypothesis prints a blob to
replay a failure): ``SHARDSIM_CS_PROPERTY_EXAMPLES=3000 python -m pytest
tests/integration/test_router_change_stream_property.py``.
"""

from __future__ import annotations

import datetime
import itertools
import os
import time
from typing import Any

import pymongo
import pytest
from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pymongo.errors import OperationFailure

from shardsim.core.resume_token import token_key, token_ts_key
from shardsim.testing import ShardedCluster

LONG_RUN = "SHARDSIM_CS_PROPERTY_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("SHARDSIM_CS_PROPERTY_EXAMPLES", "300"))
DB, COLL = "cs_prop", "events"
READ_TIMEOUT_S = 60.0
_seq = itertools.count()


@pytest.fixture(scope="module")
def env() -> Any:
    """The cluster, a router client and one direct client per shard (raw documents), and the
    collection sharded on ``x``: ``x < 0`` on one shard, ``x >= 0`` on the other, with
    pre-images on (``fullDocumentBeforeChange``)."""
    with ShardedCluster(shards=2, noop_interval_ms=200, seed=26) as cluster:
        client = cluster.client(document_class=RawBSONDocument)
        client.admin.command("enableSharding", DB)
        primary = client.config.databases.find_one({"_id": DB})["primary"]
        other = next(s for s in cluster.shard_names if s != primary)
        client.admin.command("shardCollection", f"{DB}.{COLL}", key={"x": 1})
        client.admin.command("split", f"{DB}.{COLL}", middle={"x": 0})
        client.admin.command("moveChunk", f"{DB}.{COLL}", find={"x": 0}, to=other)
        client[DB].command("collMod", COLL, changeStreamPreAndPostImages={"enabled": True})
        direct = [pymongo.MongoClient(f"mongodb://{cluster.shard_address(s)}/?directConnection=true",
                                      document_class=RawBSONDocument)
                  for s in (primary, other)]
        try:
            yield client, direct
        finally:
            for c in direct:
                c.close()


# -- documents -------------------------------------------------------------------------------

_names = st.sampled_from(["a", "b", "k", "nested", "arr", "é", "long_field_name_" * 3])
_scalars = st.one_of(
    st.integers(-2 ** 31, 2 ** 31 - 1),
    st.integers(-2 ** 63, 2 ** 63 - 1).map(Int64),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20).map(lambda b: Binary(b, 0)),
    st.booleans(),
    st.none(),
    st.just(ObjectId("65f000000000000000000001")),
    st.datetimes(min_value=datetime.datetime(1970, 1, 1), max_value=datetime.datetime(2100, 1, 1))
    .map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)),
    st.sampled_from([Decimal128("1.5"), Decimal128("-0"), Decimal128("NaN"), Regex("^a", "i"),
                     Timestamp(5, 6), MinKey(), MaxKey(), Code("f()"), Binary(b"\x01" * 16, 4)]),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_names, inner, max_size=4)), max_leaves=12)
_sizes = st.one_of(st.sampled_from([0, 0, 10, 3000, 4000, 20_000]),
                   st.integers(0, 70_000), st.sampled_from([600_000, 2_500_000]))
_fields = st.dictionaries(_names, _values, max_size=5)


@st.composite
def _doc(draw: Any) -> dict[str, Any]:
    """A document (no ``_id`` or ``x`` yet) with a pad of 0 B to a few MB."""
    doc = draw(_fields)
    size = draw(_sizes)
    if size:
        doc["pad"] = "p" * size
    return doc


_op = st.one_of(
    st.tuples(st.just("insert"), _doc(), st.booleans()),
    st.tuples(st.just("insert_many"), st.lists(st.tuples(_doc(), st.booleans()), min_size=1, max_size=4)),
    st.tuples(st.just("update"), st.integers(0, 50), _fields),
    st.tuples(st.just("replace"), st.integers(0, 50), _doc()),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("txn"), st.lists(st.tuples(_doc(), st.booleans()), min_size=1, max_size=4),
              st.integers(0, 50)),
)

# -- user stages -----------------------------------------------------------------------------

ONLY_ID_EXCLUSION = {f: 0 for f in ("operationType", "clusterTime", "wallTime", "fullDocument",
                                    "ns", "documentKey", "updateDescription", "txnNumber", "lsid",
                                    "fullDocumentBeforeChange")}
_STAGES = [
    {"$project": {"_id": 1}},
    {"$project": ONLY_ID_EXCLUSION},
    {"$project": {"operationType": 1, "documentKey": 1}},
    {"$project": {"fullDocument": 0}},
    {"$project": {"fullDocument.pad": 0}},
    {"$project": {"_id": 0}},
    {"$match": {"operationType": {"$in": ["insert", "update"]}}},
    {"$match": {"fullDocument.a": {"$exists": True}}},
    {"$match": {"documentKey.x": {"$lt": 0}}},
    {"$addFields": {"extra": "$operationType", "n": {"$literal": 1}}},
    {"$addFields": {"fullDocument.added": True}},
    {"$addFields": {"_id": "$_id"}},
    {"$addFields": {"_id": {"changed": 1}}},
    {"$replaceRoot": {"newRoot": {"_id": "$_id", "op": "$operationType", "key": "$documentKey"}}},
    {"$replaceRoot": {"newRoot": "$fullDocument"}},
    {"$set": {"kind": {"$concat": ["op:", "$operationType"]}}},
    {"$unset": ["wallTime", "clusterTime"]},
]
_pipeline = st.tuples(st.lists(st.sampled_from(_STAGES), max_size=3), st.booleans()).map(
    lambda t: t[0] + ([{"$changeStreamSplitLargeEvent": {}}] if t[1] else []))
_options = st.fixed_dictionaries({
    "full_document": st.sampled_from([None, "updateLookup"]),
    "full_document_before_change": st.sampled_from([None, None, "whenAvailable"]),
})


# -- running an example ----------------------------------------------------------------------

def _run_workload(client: Any, ops: list, tag: str) -> Timestamp:
    """Apply ``ops``; return the cluster time of the last write (the window's end)."""
    coll = client[DB][COLL]
    live: list[tuple[str, int]] = []
    n = itertools.count()

    def new(doc: dict[str, Any], neg: bool) -> dict[str, Any]:
        i = next(n)
        d = {"_id": f"{tag}-{i}", "x": -1 - i if neg else i, **doc}
        live.append((d["_id"], d["x"]))
        return d

    with client.start_session() as s:
        for op in ops:
            kind = op[0]
            if kind == "insert":
                coll.insert_one(new(op[1], op[2]), session=s)
            elif kind == "insert_many":
                coll.insert_many([new(d, neg) for d, neg in op[1]], ordered=True, session=s)
            elif kind in ("update", "replace", "delete") and live:
                _id, x = live[op[1] % len(live)]
                if kind == "update":
                    body = op[2] or {"touched": True}
                    coll.update_one({"_id": _id, "x": x}, {"$set": body}, session=s)
                elif kind == "replace":
                    coll.replace_one({"_id": _id, "x": x}, {"x": x, **op[2]}, session=s)
                else:
                    coll.delete_one({"_id": _id, "x": x}, session=s)
                    live.remove((_id, x))
            elif kind == "txn":
                with s.start_transaction():
                    docs = [new(d, neg) for d, neg in op[1]]
                    for d in docs:
                        coll.insert_one(d, session=s)
                    _id, x = live[op[2] % len(live)]
                    coll.update_one({"_id": _id, "x": x}, {"$set": {"inTxn": True}}, session=s)
        s.client.admin.command("ping", session=s)
        return s.operation_time


def _read(client: Any, pipeline: list, options: dict, start: Timestamp,
          end: Timestamp) -> tuple[list[bytes], list[Any], Any]:
    """Events of ``start .. end`` on ``client``'s stream: (raw bytes, tokens, the error or
    None)."""
    events: list[bytes] = []
    tokens: list[Any] = []
    end_key = end.time << 32 | end.inc
    kwargs = {k: v for k, v in options.items() if v is not None}
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        with client[DB][COLL].watch(pipeline, start_at_operation_time=start,
                                    max_await_time_ms=50, **kwargs) as stream:
            while True:
                ev = stream.try_next()
                if ev is not None:
                    events.append(ev.raw)
                    tokens.append(ev["_id"])
                    continue
                tok = stream.resume_token
                if tok is not None and (token_ts_key(tok["_data"]) or 0) > end_key:
                    return events, tokens, None
                assert time.monotonic() < deadline, "the stream did not pass the window's end"
    except OperationFailure as exc:
        return events, tokens, exc


def _check(env: Any, ops: list, pipeline: list, options: dict) -> None:
    client, direct = env
    tag = f"e{next(_seq)}"
    start = client[DB].command("ping")["$clusterTime"]["clusterTime"]
    start = Timestamp(start.time, start.inc + 1)
    end = _run_workload(client, ops, tag)
    got, _, err = _read(client, pipeline, options, start, end)
    per_shard = [_read(c, pipeline, options, start, end) for c in direct]
    merged = sorted(((token_key(t), e) for evs, toks, _ in per_shard for e, t in zip(evs, toks)),
                    key=lambda kv: kv[0])
    want = [e for _, e in merged]
    codes = {e.code for _, _, e in per_shard if e is not None}
    if not codes:
        assert err is None, f"the router failed where no shard did: {err and err.details}"
        assert got == want, "the router's events are not its shards' events in token order"
    else:
        assert err is not None and err.code in codes, \
            f"the router answered {err and err.details}, the shards {codes}"
        assert got == want[:len(got)]


def _big_update_ops() -> list:
    """An update whose event (updateDescription + looked-up document) is over 16 MB."""
    big = "q" * 9_000_000
    return [("insert", {}, False), ("update", 0, {"big": big})]


@pytest.mark.timeout(max(300, EXAMPLES))  # about 0.25 s an example; the long run needs more
@settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG_RUN, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=1, max_size=6), pipeline=_pipeline, options=_options)
@example(ops=[("txn", [({"pad": "t" * 4000}, False)], 0)], pipeline=[],
         options={"full_document": None, "full_document_before_change": None})
@example(ops=[("insert", {}, True), ("insert", {}, False), ("insert_many", [({}, True), ({}, False)])],
         pipeline=[{"$project": {"_id": 1}}],
         options={"full_document": None, "full_document_before_change": None})
@example(ops=[("insert", {"a": 1}, False)], pipeline=[{"$project": ONLY_ID_EXCLUSION}],
         options={"full_document": None, "full_document_before_change": None})
@example(ops=_big_update_ops(), pipeline=[{"$changeStreamSplitLargeEvent": {}}],
         options={"full_document": "updateLookup", "full_document_before_change": None})
@example(ops=_big_update_ops(), pipeline=[],
         options={"full_document": "updateLookup", "full_document_before_change": None})
def test_router_events_are_the_shards_events_in_token_order(env, ops, pipeline, options):
    _check(env, ops, pipeline, options)

