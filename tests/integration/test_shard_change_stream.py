"""Change streams served directly by a real ``python -m shardsim.shard`` process, through pymongo.

Covers event types and their fields, the ``$changeStream`` options, mongod's errors and labels,
invalidation, transactions, pre/post-images, and cursor behaviour (empty first batch,
postBatchResumeToken on every reply, awaitData waits, batch bounds, needsMerge ``$sortKey``).
"""

from __future__ import annotations

import hashlib

import datetime
import threading
import time
from typing import Any, Iterator

import pymongo
import pytest
from bson import Binary, Int64, SON, Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo.errors import OperationFailure

from shardsim.core import resume_token as rt
from shardsim.tools.procs import RoleProcess


@pytest.fixture(scope="module")
def proc() -> Iterator[RoleProcess]:
    p = RoleProcess("shard", ["--port", "0", "--shard-name", "cs0", "--noop-interval-ms", "300"],
                    name="cs0")
    p.start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def client(proc) -> Iterator[pymongo.MongoClient]:
    c = pymongo.MongoClient(f"mongodb://{proc.address}/?directConnection=true",
                            serverSelectionTimeoutMS=5000)
    try:
        yield c
    finally:
        c.close()


_counter = [0]


@pytest.fixture
def db(client):
    _counter[0] += 1
    return client[f"cs_test_{_counter[0]}"]


def ts_of(token: dict[str, Any]) -> Timestamp:
    return rt.decode(token).clusterTime


def next_events(cs, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        ev = cs.try_next()
        if ev is not None:
            out.append(ev)
    assert len(out) == n, out
    return out


def agg(db, target, spec: dict[str, Any] | None = None, pipeline=(), **kw):
    return db.command(SON([("aggregate", target),
                           ("pipeline", [{"$changeStream": spec or {}}, *pipeline]),
                           ("cursor", kw.pop("cursor", {}))] + list(kw.items())))


def get_more(db, cid, coll, **kw):
    return db.command(SON([("getMore", Int64(cid)), ("collection", coll)] + list(kw.items())))


# -- events ------------------------------------------------------------------------------------

def test_crud_events_fields_and_order(db):
    coll = db.c
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=200) as cs:
        coll.insert_one({"_id": 1, "a": 1})
        coll.update_one({"_id": 1}, {"$set": {"b": 2}, "$unset": {"a": ""}})
        coll.replace_one({"_id": 1}, {"x": 1})
        coll.delete_one({"_id": 1})
        ins, upd, rep, dele = next_events(cs, 4)
    assert list(ins) == ["_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns",
                         "documentKey"]
    assert ins["fullDocument"] == {"_id": 1, "a": 1} and ins["documentKey"] == {"_id": 1}
    assert ins["ns"] == {"db": db.name, "coll": "c"}
    assert isinstance(ins["wallTime"], datetime.datetime)
    assert list(upd) == ["_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey",
                         "updateDescription"]
    assert upd["updateDescription"] == {"updatedFields": {"b": 2}, "removedFields": ["a"],
                                        "truncatedArrays": []}
    assert list(rep) == ["_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns",
                         "documentKey"]
    assert rep["fullDocument"] == {"_id": 1, "x": 1}
    assert list(dele) == ["_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey"]
    tokens = [e["_id"] for e in (ins, upd, rep, dele)]
    assert [e["operationType"] for e in (ins, upd, rep, dele)] == ["insert", "update", "replace", "delete"]
    for e in (ins, upd, rep, dele):
        d = rt.decode(e["_id"])
        assert d.clusterTime == e["clusterTime"] and d.version == 2 and d.tokenType == 128
        assert d.eventIdentifier == {"operationType": e["operationType"], "documentKey": e["documentKey"]}
    assert [t["_data"] for t in tokens] == sorted(t["_data"] for t in tokens)


def test_update_description_truncated_and_disambiguated(db):
    coll = db.c
    coll.insert_one({"_id": 1, "arr": [1, 2, 3, 4], "a": {"1": 1}, "b": [{"1": 0}]})
    with coll.watch(max_await_time_ms=200) as plain, \
            coll.watch(max_await_time_ms=200, show_expanded_events=True) as expanded:
        coll.update_one({"_id": 1}, [{"$set": {"arr": {"$slice": ["$arr", 2]}}}])
        coll.update_one({"_id": 1}, {"$set": {"a.1": 2, "b.0.1": 5}})
        p1, p2 = next_events(plain, 2)
        e1, e2 = next_events(expanded, 2)
    assert p1["updateDescription"]["truncatedArrays"] == [{"field": "arr", "newSize": 2}]
    assert "disambiguatedPaths" not in p2["updateDescription"]
    assert e1["updateDescription"]["disambiguatedPaths"] == {}
    dis = e2["updateDescription"]["disambiguatedPaths"]
    assert dis == {"a.1": ["a", "1"], "b.0.1": ["b", 0, "1"]}
    assert isinstance(dis["b.0.1"][1], int)
    assert e2["updateDescription"]["updatedFields"] == {"a.1": 2, "b.0.1": 5}


def test_expanded_events(db):
    coll = db.c
    coll.insert_one({"_id": 1})
    with db.watch(max_await_time_ms=200, show_expanded_events=True) as cs, \
            db.watch(max_await_time_ms=200) as classic:
        db.create_collection("v1")
        coll.create_index("x", name="x_1")
        db.command("collMod", "c", validator={})
        coll.drop_index("x_1")
        db.d.insert_one({"_id": 2})
        coll.rename("d", dropTarget=True)
        db.d.drop()
        evs = next_events(cs, 8)
        cl = next_events(classic, 3)
    ops = [e["operationType"] for e in evs]
    assert ops == ["create", "createIndexes", "modify", "dropIndexes", "create", "insert", "rename",
                   "drop"], ops
    evs = evs[:4] + evs[6:]
    cl = cl[1:]
    create = evs[0]
    assert create["nsType"] == "collection" and create["ns"] == {"db": db.name, "coll": "v1"}
    ci = evs[1]
    assert isinstance(ci["collectionUUID"], Binary) and ci["collectionUUID"].subtype == 4
    assert ci["operationDescription"]["indexes"][0]["name"] == "x_1"
    assert evs[3]["operationDescription"]["indexes"][0]["name"] == "x_1"
    ren = evs[4]
    assert ren["to"] == {"db": db.name, "coll": "d"}
    assert ren["operationDescription"]["to"] == {"db": db.name, "coll": "d"}
    assert "dropTarget" in ren["operationDescription"]
    # without showExpandedEvents only the classic events appear, without the expanded fields
    assert [e["operationType"] for e in cl] == ["rename", "drop"]
    assert "operationDescription" not in cl[0] and "collectionUUID" not in cl[0]
    for e in evs:
        d = rt.decode(e["_id"])
        assert d.eventIdentifier["operationType"] == e["operationType"]


def test_create_collection_event_ns_type(db):
    with db.watch(max_await_time_ms=200, show_expanded_events=True) as cs:
        db.create_collection("plain")
        (ev,) = next_events(cs, 1)
    assert ev["operationType"] == "create" and ev["nsType"] == "collection"
    assert "idIndex" in ev["operationDescription"]


# -- invalidation --------------------------------------------------------------------------------

def test_drop_invalidates_collection_stream_and_start_after(db):
    coll = db.c
    coll.insert_one({"_id": 1})
    with coll.watch(max_await_time_ms=200) as cs:
        coll.drop()
        drop, inv = next_events(cs, 2)
        assert not cs.alive
    assert drop["operationType"] == "drop" and drop["ns"] == {"db": db.name, "coll": "c"}
    assert list(inv) == ["_id", "operationType", "clusterTime", "wallTime"]
    assert inv["operationType"] == "invalidate" and inv["clusterTime"] == drop["clusterTime"]
    d = rt.decode(inv["_id"])
    assert d.fromInvalidate and inv["_id"]["_data"] > drop["_id"]["_data"]
    with pytest.raises(OperationFailure) as ei:
        coll.watch(resume_after=inv["_id"])
    assert ei.value.code == 260
    # startAfter the invalidate: the stream continues with the re-created collection
    with coll.watch(start_after=inv["_id"], max_await_time_ms=200) as cs2:
        coll.insert_one({"_id": 2})
        (ev,) = next_events(cs2, 1)
        assert ev["operationType"] == "insert" and ev["documentKey"] == {"_id": 2}
        assert cs2.alive


def test_rename_invalidates_collection_stream_db_stream_survives(db):
    db.a.insert_one({"_id": 1})
    with db.a.watch(max_await_time_ms=200) as cs, db.watch(max_await_time_ms=200) as dbs:
        db.a.rename("b")
        ren, inv = next_events(cs, 2)
        assert ren["operationType"] == "rename" and inv["operationType"] == "invalidate"
        assert not cs.alive
        db.b.insert_one({"_id": 2})
        r2, i2 = next_events(dbs, 2)
        assert r2["operationType"] == "rename" and i2["documentKey"] == {"_id": 2}
        assert dbs.alive


def test_drop_database_invalidates_db_stream(db):
    db.a.insert_one({"_id": 1})
    with db.watch(max_await_time_ms=200) as cs:
        db.client.drop_database(db.name)
        evs = []
        while cs.alive:
            ev = cs.try_next()
            if ev is not None:
                evs.append(ev)
    assert [e["operationType"] for e in evs][-2:] == ["dropDatabase", "invalidate"]
    assert evs[-2]["ns"] == {"db": db.name}


# -- transactions --------------------------------------------------------------------------------

def test_transaction_events_share_cluster_time(db, client):
    coll = db.c
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=200) as cs:
        with client.start_session() as s:
            with s.start_transaction():
                coll.insert_one({"_id": 1}, session=s)
                db.other.insert_one({"_id": 9}, session=s)
                coll.update_one({"_id": 0}, {"$set": {"x": 1}}, session=s)
            lsid = s.session_id
        with client.start_session() as s2:
            s2.start_transaction()
            coll.insert_one({"_id": 5}, session=s2)
            s2.abort_transaction()
        coll.insert_one({"_id": 6})
        evs = next_events(cs, 3)
    a, b, c = evs
    assert a["clusterTime"] == b["clusterTime"]
    # lsid as mongod writes it: {id, uid}; uid = SHA-256 of the (empty, without auth) user name
    assert a["lsid"]["id"] == lsid["id"] and isinstance(a["txnNumber"], int)
    assert bytes(a["lsid"]["uid"]) == hashlib.sha256(b"").digest()
    assert list(a)[:3] == ["txnNumber", "lsid", "_id"]
    ia, ib = rt.decode(a["_id"]).txnOpIndex, rt.decode(b["_id"]).txnOpIndex
    assert ia < ib and a["_id"]["_data"] < b["_id"]["_data"]
    assert c["documentKey"] == {"_id": 6} and "lsid" not in c  # the aborted insert never appears


# -- images --------------------------------------------------------------------------------------

@pytest.mark.parametrize("enabled", [True, False])
def test_pre_and_post_images(db, enabled):
    coll = db.c
    coll.insert_one({"_id": 1})
    db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": enabled})
    with coll.watch(full_document="whenAvailable", full_document_before_change="whenAvailable",
                    max_await_time_ms=200) as cs, \
            coll.watch(full_document="updateLookup", max_await_time_ms=200) as lookup:
        coll.update_one({"_id": 1}, {"$set": {"x": 1}})
        coll.delete_one({"_id": 1})
        upd, dele = next_events(cs, 2)
        lu, _ = next_events(lookup, 2)
    if enabled:
        assert upd["fullDocument"] == {"_id": 1, "x": 1}
        assert upd["fullDocumentBeforeChange"] == {"_id": 1}
        assert dele["fullDocumentBeforeChange"] == {"_id": 1, "x": 1}
    else:
        assert upd["fullDocument"] is None and upd["fullDocumentBeforeChange"] is None
        assert dele["fullDocumentBeforeChange"] is None
    assert "fullDocument" in lu and lu["fullDocument"] is None  # looked up after the delete


@pytest.mark.parametrize("opt", ["full_document", "full_document_before_change"])
def test_required_image_missing_fails(db, opt):
    coll = db.c
    coll.insert_one({"_id": 1})
    with coll.watch(max_await_time_ms=200, **{opt: "required"}) as cs:
        coll.update_one({"_id": 1}, {"$set": {"x": 1}})
        with pytest.raises(OperationFailure) as ei:
            next_events(cs, 1)
    assert ei.value.code == 47


def test_update_lookup_finds_current_document(db):
    coll = db.c
    coll.insert_one({"_id": 1})
    with coll.watch(full_document="updateLookup", max_await_time_ms=200) as cs:
        coll.update_one({"_id": 1}, {"$set": {"x": 1}})
        (ev,) = next_events(cs, 1)
    assert ev["fullDocument"] == {"_id": 1, "x": 1}
    assert list(ev).index("fullDocument") < list(ev).index("ns")


# -- user stages ---------------------------------------------------------------------------------

def test_user_stages(db):
    coll = db.c
    pipeline = [{"$match": {"operationType": "insert", "fullDocument.keep": True}},
                {"$addFields": {"extra": 1}}, {"$set": {"extra2": "$fullDocument.keep"}},
                {"$unset": "wallTime"}, {"$project": {"ns": 0}}]
    with coll.watch(pipeline, max_await_time_ms=200) as cs:
        coll.insert_many([{"_id": 1, "keep": False}, {"_id": 2, "keep": True}])
        (ev,) = next_events(cs, 1)
    assert ev["documentKey"] == {"_id": 2} and ev["extra"] == 1 and ev["extra2"] is True
    assert "wallTime" not in ev and "ns" not in ev
    with coll.watch([{"$replaceWith": {"_id": "$_id", "k": "$documentKey"}},
                     {"$redact": "$$KEEP"}], max_await_time_ms=200) as cs:
        coll.insert_one({"_id": 3})
        (ev,) = next_events(cs, 1)
    assert ev == {"_id": ev["_id"], "k": {"_id": 3}}


def test_projecting_out_id_is_fatal(db):
    coll = db.c
    with coll.watch([{"$project": {"_id": 0}}], max_await_time_ms=200) as cs:
        coll.insert_one({"z": 3})
        with pytest.raises(OperationFailure) as ei:
            next_events(cs, 1)
    assert ei.value.code == 280
    assert "NonResumableChangeStreamError" in ei.value.details.get("errorLabels", [])


# -- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("target, spec, pipeline, code", [
    ("c", {"bogus": 1}, [], 40415),
    ("c", {"fullDocument": 1}, [], 14),
    ("c", {"fullDocument": "nope"}, [], 2),
    ("c", {"fullDocumentBeforeChange": "nope"}, [], 2),
    ("c", {"showExpandedEvents": "yes"}, [], 14),
    ("c", {"resumeAfter": {"_data": "8200"}, "startAfter": {"_data": "8200"}}, [], 50865),
    ("c", {"startAtOperationTime": Timestamp(1, 1),
           "resumeAfter": rt.make_high_water_mark(Timestamp(5, 1))}, [], 40674),
    ("c", {"resumeAfter": {"_data": "zz"}}, [], 9),
    ("c", {"resumeAfter": {"_data": 5}}, [], 40647),
    ("c", {}, [{"$group": {"_id": None}}], 20),
    ("c", {}, [{"$unsupported": "foo"}], 40324),
    ("c", {}, [{"$match": {}}, {"$changeStream": {}}], 40602),
    ("c", {}, [{"$changeStreamSplitLargeEvent": {}}, {"$match": {}}], 7182802),
    ("c", {}, [{"$changeStreamSplitLargeEvent": {"x": 1}}], 7182800),
    ("c", {"resumeAfter": rt.event_token(Timestamp(5, 1), bytes(16), "insert", {"_id": 1},
                                         fragment_num=0)}, [], 280),
    (1, {"allChangesForCluster": True}, [], 72),
    ("system.views", {}, [], 73),
])
def test_spec_errors(db, target, spec, pipeline, code):
    with pytest.raises(OperationFailure) as ei:
        agg(db, target, spec, pipeline)
    assert ei.value.code == code, ei.value.details


def test_internal_databases_and_cluster_stream(client):
    for name in ("admin", "local", "config"):
        with pytest.raises(OperationFailure) as ei:
            client[name].command({"aggregate": 1, "pipeline": [{"$changeStream": {}}], "cursor": {}})
        assert ei.value.code == 73
    with pytest.raises(OperationFailure) as ei:
        client.admin.command({"aggregate": "c", "pipeline": [{"$changeStream": {"allChangesForCluster": True}}],
                              "cursor": {}})
    assert ei.value.code == 72
    with client.watch(max_await_time_ms=200) as cs:
        client.cl_a.x.insert_one({"_id": 1})
        client.cl_b.y.insert_one({"_id": 2})
        evs = next_events(cs, 2)
    assert [e["ns"] for e in evs] == [{"db": "cl_a", "coll": "x"}, {"db": "cl_b", "coll": "y"}]
    assert evs[0]["_id"]["_data"] < evs[1]["_id"]["_data"]


def test_resume_event_token_not_found_is_fatal(db):
    coll = db.c
    coll.insert_one({"_id": 1})
    st = db.client.admin.command("ping")["operationTime"]
    missing = rt.event_token(st, bytes(16), "insert", {"_id": 12345})
    coll.insert_one({"_id": 2})
    with pytest.raises(OperationFailure) as ei:  # the first batch already passes the token
        with coll.watch(resume_after=missing, max_await_time_ms=200) as cs:
            next_events(cs, 1)
    assert ei.value.code == 280
    assert "resume token was not found" in str(ei.value)
    assert "NonResumableChangeStreamError" in ei.value.details.get("errorLabels", [])


# -- cursor behaviour ----------------------------------------------------------------------------

def test_first_batch_empty_live_cursor_and_pbrt_everywhere(db):
    db.c.insert_one({"_id": 0})
    r = agg(db, "c", cursor={"batchSize": 0})
    cur = r["cursor"]
    assert cur["firstBatch"] == [] and cur["id"] != 0 and cur["ns"] == f"{db.name}.c"
    pbrts = [cur["postBatchResumeToken"]]
    assert rt.is_high_water_mark(rt.decode(pbrts[0]))
    g = get_more(db, cur["id"], "c", maxTimeMS=50)["cursor"]
    assert g["nextBatch"] == [] and g["id"] == cur["id"]
    pbrts.append(g["postBatchResumeToken"])
    db.c.insert_many([{"_id": i} for i in range(1, 6)])
    g = get_more(db, cur["id"], "c", batchSize=2, maxTimeMS=50)["cursor"]
    assert len(g["nextBatch"]) == 2
    assert g["postBatchResumeToken"] == g["nextBatch"][-1]["_id"]
    pbrts.append(g["postBatchResumeToken"])
    g = get_more(db, cur["id"], "c", maxTimeMS=50)["cursor"]
    assert [e["documentKey"]["_id"] for e in g["nextBatch"]] == [3, 4, 5]
    pbrts.append(g["postBatchResumeToken"])
    g = get_more(db, cur["id"], "c", maxTimeMS=50)["cursor"]
    pbrts.append(g["postBatchResumeToken"])
    keys = [p["_data"] for p in pbrts]
    assert keys == sorted(keys)  # never regresses
    db.command("killCursors", "c", cursors=[cur["id"]])


def test_get_more_waits_and_returns_early_on_matching_write(db):
    db.c.insert_one({"_id": 0})
    cur = agg(db, "c", cursor={"batchSize": 0})["cursor"]
    t0 = time.monotonic()
    g = get_more(db, cur["id"], "c", maxTimeMS=400)["cursor"]
    waited = time.monotonic() - t0
    assert g["nextBatch"] == [] and waited >= 0.35
    # unrelated writes do not end the wait; a matching one does
    client = db.client

    def writer():
        time.sleep(0.2)
        client[db.name].other.insert_one({"_id": 1})
        time.sleep(0.3)
        client[db.name].c.insert_one({"_id": 2})

    th = threading.Thread(target=writer)
    t0 = time.monotonic()
    th.start()
    g = get_more(db, cur["id"], "c", maxTimeMS=5000)["cursor"]
    waited = time.monotonic() - t0
    th.join()
    assert [e["documentKey"] for e in g["nextBatch"]] == [{"_id": 2}]
    assert 0.45 <= waited < 4.0


def test_needs_merge_sort_key_last(db):
    db.c.insert_one({"_id": 0})
    cur = agg(db, "c", {}, needsMerge=True, fromRouter=True, cursor={"batchSize": 0})["cursor"]
    assert "postBatchResumeToken" in cur
    db.c.insert_one({"_id": 1})
    raw = db.command(SON([("getMore", Int64(cur["id"])), ("collection", "c"), ("maxTimeMS", 500)]),
                     codec_options=db.codec_options.with_options(document_class=RawBSONDocument))
    ev = raw["cursor"]["nextBatch"][0]
    keys = list(ev.keys())
    assert keys[-1] == "$sortKey" and ev["$sortKey"] == [ev["_id"]]
    db.command("killCursors", "c", cursors=[cur["id"]])


def test_batch_bytes_bound(db):
    big = "x" * (3 * 1024 * 1024)
    cur = agg(db, "c", cursor={"batchSize": 0})["cursor"]
    db.c.insert_many([{"_id": i, "s": big} for i in range(7)])
    sizes = []
    got = 0
    while got < 7:
        g = get_more(db, cur["id"], "c", maxTimeMS=200)["cursor"]
        n = len(g["nextBatch"])
        sizes.append(n)
        got += n
    assert max(sizes) <= 5 and len(sizes) >= 2  # 7 x 3 MiB never fit one 16 MiB batch
    db.command("killCursors", "c", cursors=[cur["id"]])


def test_start_at_operation_time_and_resume_from_pbrt(db):
    db.c.insert_one({"_id": 0})
    t0 = db.client.admin.command("ping")["operationTime"]
    t = Timestamp(t0.time, t0.inc + 1)
    db.c.insert_one({"_id": 1})
    with db.c.watch(start_at_operation_time=t, max_await_time_ms=200) as cs:
        (ev,) = next_events(cs, 1)
        assert ev["documentKey"] == {"_id": 1}
        cs.try_next()
        pbrt = cs.resume_token
    db.c.insert_one({"_id": 2})
    with db.c.watch(resume_after=pbrt, max_await_time_ms=200) as cs:
        (ev,) = next_events(cs, 1)
        assert ev["documentKey"] == {"_id": 2}


def test_split_large_event(db):
    coll = db.c
    db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
    big = "y" * (9 * 1024 * 1024)
    coll.insert_one({"_id": 1, "s": big})
    t0 = db.client.admin.command("ping")["operationTime"]
    t = Timestamp(t0.time, t0.inc + 1)
    coll.replace_one({"_id": 1}, {"s": big + "z"})
    with pytest.raises(OperationFailure) as ei:
        with coll.watch(full_document_before_change="required", start_at_operation_time=t,
                        max_await_time_ms=200) as cs:
            next_events(cs, 1)
    assert ei.value.code == 10334
    with coll.watch([{"$changeStreamSplitLargeEvent": {}}], full_document_before_change="required",
                    start_at_operation_time=t, max_await_time_ms=200) as cs:
        f1, f2 = next_events(cs, 2)
    assert f1["splitEvent"] == {"fragment": 1, "of": 2} and f2["splitEvent"] == {"fragment": 2, "of": 2}
    assert rt.decode(f1["_id"]).fragmentNum == 0 and rt.decode(f2["_id"]).fragmentNum == 1
    assert f1["operationType"] == "replace"
    merged = {**{k: v for k, v in f1.items()}, **{k: v for k, v in f2.items()}}
    assert merged["fullDocument"]["s"] == big + "z" and merged["fullDocumentBeforeChange"]["s"] == big
    with coll.watch([{"$changeStreamSplitLargeEvent": {}}], full_document_before_change="required",
                    resume_after=f1["_id"], max_await_time_ms=200) as cs:
        (again,) = next_events(cs, 1)
    assert again["_id"] == f2["_id"]


def test_driver_resumes_after_cursor_killed_without_loss(db, client):
    coll = db.c
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=100, batch_size=3) as cs:
        coll.insert_many([{"_id": i} for i in range(1, 8)])
        got = [e["documentKey"]["_id"] for e in next_events(cs, 3)]
        # kill the server cursor behind pymongo's back: getMore fails with CursorNotFound (43),
        # the driver resumes from its cached postBatchResumeToken
        cid = cs._cursor.cursor_id
        client[db.name].command("killCursors", "c", cursors=[cid])
        coll.insert_one({"_id": 8})
        got += [e["documentKey"]["_id"] for e in next_events(cs, 5)]
    assert got == list(range(1, 9))
