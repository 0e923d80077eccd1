"""Change-stream stages on synthetic oplog entries (no sockets): oplog match, transaction
unwinding, the transform (fields, updateDescription, expanded and sharding events),
invalidation, resumability, images and the spec validation."""

from __future__ import annotations

import datetime

import pytest
from bson import Binary, Int64, Timestamp

from shardsim.core import resume_token as rt
from shardsim.core.errors import MongoError
from shardsim.shard.change_stream import oplog_match
from shardsim.core import change_stream_spec as spec_mod
from shardsim.shard.change_stream.add_post_image import apply_diff
from shardsim.shard.change_stream.check_invalidate import CheckInvalidate
from shardsim.shard.change_stream.check_resumability import (CheckResumability, assert_history_available)
from shardsim.shard.change_stream.ensure_resume_token_present import EnsureResumeTokenPresent
from shardsim.shard.change_stream.transform import Transform, update_description
from shardsim.shard.change_stream.unwind_transaction import unwind
from shardsim.shard.oplog import Oplog

U1 = Binary(bytes(range(16)), 4)
U2 = Binary(bytes(range(1, 17)), 4)
WALL = datetime.datetime(2026, 1, 1)


def entry(op, ns, o, o2=None, ts=(100, 1), ui=U1, **extra):
    e = {"op": op, "ns": ns, "o": o, "ts": Timestamp(*ts), "wall": WALL}
    if ui is not None:
        e["ui"] = ui
    if o2 is not None:
        e["o2"] = o2
    e.update(extra)
    return e


def parse(target="c", cs=None, rest=(), db="d", needs_merge=False):
    return spec_mod.parse(db, target, [{"$changeStream": cs or {}}, *rest], needs_merge=needs_merge)


# -- oplog match ---------------------------------------------------------------------------------

def test_collection_filter():
    m = oplog_match.build(parse())
    assert m(entry("i", "d.c", {"_id": 1}))
    assert not m(entry("i", "d.other", {"_id": 1}))
    assert not m(entry("i", "d.c", {"_id": 1}, fromMigrate=True))
    assert not m(entry("n", "", {"msg": "periodic noop"}, ui=None))
    assert m(entry("c", "d.$cmd", {"drop": "c"}))
    assert not m(entry("c", "d.$cmd", {"drop": "x"}))
    assert m(entry("c", "d.$cmd", {"renameCollection": "d.x", "to": "d.c"}))
    assert m(entry("c", "d.$cmd", {"dropDatabase": 1}, ui=None))
    assert not m(entry("c", "d.$cmd", {"createIndexes": "c", "v": 2, "key": {"a": 1}, "name": "a_1"}))
    assert not m(entry("c", "d.$cmd", {"drop": "c"}, fromMigrate=True))
    txn = entry("c", "admin.$cmd", {"applyOps": [{"op": "i", "ns": "d.x", "ui": U2, "o": {"_id": 1}},
                                                 {"op": "i", "ns": "d.c", "ui": U1, "o": {"_id": 2}}]},
                ui=None)
    assert m(txn)
    assert not m(entry("c", "admin.$cmd", {"applyOps": [{"op": "i", "ns": "d.x", "o": {}}]}, ui=None))


def test_expanded_and_router_only_entries():
    plain = oplog_match.build(parse())
    expanded = oplog_match.build(parse(cs={"showExpandedEvents": True}))
    merged = oplog_match.build(parse(needs_merge=True))
    ci = entry("c", "d.$cmd", {"createIndexes": "c", "v": 2, "key": {"a": 1}, "name": "a_1"})
    assert expanded(ci) and not plain(ci)
    sc = entry("n", "d.c", {"msg": {"shardCollection": "d.c"}}, {"shardCollection": "d.c", "key": {"a": 1}})
    assert expanded(sc) and not plain(sc)
    nsd = entry("n", "d.c", {"msg": "Migrating chunk"}, {"migrateChunkToNewShard": "d.c",
                                                          "fromShardId": "s0", "toShardId": "s1"})
    assert merged(nsd) and not plain(nsd) and not expanded(nsd)


def test_database_and_cluster_filters():
    dbm = oplog_match.build(parse(target=1))
    assert dbm(entry("i", "d.any", {"_id": 1}))
    assert not dbm(entry("i", "d.system.views", {"_id": 1}))
    assert not dbm(entry("i", "e.any", {"_id": 1}))
    # a rename from another database into this one concerns the database stream
    assert dbm(entry("c", "e.$cmd", {"renameCollection": "e.a", "to": "d.b", "stayTemp": False}))
    assert not dbm(entry("c", "e.$cmd", {"renameCollection": "e.a", "to": "e.b", "stayTemp": False}))
    cl = oplog_match.build(spec_mod.parse("admin", 1, [{"$changeStream": {"allChangesForCluster": True}}]))
    assert cl(entry("i", "e.any", {"_id": 1}))
    for internal in ("admin.x", "config.x", "local.x"):
        assert not cl(entry("i", internal, {"_id": 1}))


# -- unwind + transform ----------------------------------------------------------------------------

def test_unwind_transaction_keeps_positions_and_session():
    lsid = {"id": Binary(b"\x01" * 16, 4), "uid": Binary(b"\x02" * 32, 0)}
    txn = entry("c", "admin.$cmd", {"applyOps": [
        {"op": "i", "ns": "d.x", "ui": U2, "o": {"_id": 1}},
        {"op": "i", "ns": "d.c", "ui": U1, "o": {"_id": 2}, "o2": {"_id": 2}},
        {"op": "d", "ns": "d.c", "ui": U1, "o": {"_id": 3}}]}, ui=None, ts=(7, 7),
        lsid=lsid, txnNumber=Int64(4))
    spec = parse()
    ops = list(unwind(txn, oplog_match.crud_predicate(spec)))
    assert [o["txnOpIndex"] for o in ops] == [1, 2]
    t = Transform(spec)
    evs = [t(o) for o in ops]
    assert list(evs[0].doc)[:3] == ["txnNumber", "lsid", "_id"]
    assert evs[0].doc["lsid"] == lsid and evs[0].doc["txnNumber"] == Int64(4)
    assert all(e.doc["clusterTime"] == Timestamp(7, 7) for e in evs)
    assert [rt.decode(e.token).txnOpIndex for e in evs] == [1, 2]
    assert evs[0].token["_data"] < evs[1].token["_data"]


def test_transform_crud_events():
    t = Transform(parse())
    ins = t(entry("i", "d.c", {"_id": 1, "a": 1}, {"_id": 1}))
    assert ins.doc == {"_id": ins.token, "operationType": "insert", "clusterTime": Timestamp(100, 1),
                       "wallTime": WALL, "fullDocument": {"_id": 1, "a": 1},
                       "ns": {"db": "d", "coll": "c"}, "documentKey": {"_id": 1}}
    assert rt.decode(ins.token).uuid == bytes(U1)
    upd = t(entry("u", "d.c", {"$v": 2, "diff": {"u": {"a": 2}}}, {"_id": 1}))
    assert "fullDocument" not in upd.doc and upd.doc["updateDescription"]["updatedFields"] == {"a": 2}
    rep = t(entry("u", "d.c", {"_id": 1, "z": 1}, {"_id": 1}))
    assert rep.doc["operationType"] == "replace" and rep.doc["fullDocument"] == {"_id": 1, "z": 1}
    dele = t(entry("d", "d.c", {"_id": 1}))
    assert dele.doc["documentKey"] == {"_id": 1} and "fullDocument" not in dele.doc
    # an insert without o2 falls back to {_id}
    assert t(entry("i", "d.c", {"_id": 9})).doc["documentKey"] == {"_id": 9}


def test_transform_ddl_and_sharding_events():
    t = Transform(parse(target=1, cs={"showExpandedEvents": True}, needs_merge=True))
    view = t(entry("c", "d.$cmd", {"create": "v", "viewOn": "c", "pipeline": []}))
    assert view.doc["nsType"] == "view" and view.doc["operationDescription"] == {"viewOn": "c", "pipeline": []}
    ts_coll = t(entry("c", "d.$cmd", {"create": "w", "viewOn": "system.buckets.w"}))
    assert ts_coll.doc["nsType"] == "timeseries"
    mod = t(entry("c", "d.$cmd", {"collMod": "c", "validator": {}},
                  {"collectionOptions_old": {"validator": {"a": 1}}}))
    assert mod.doc["operationType"] == "modify"
    assert mod.doc["stateBeforeChange"] == {"collectionOptions": {"validator": {"a": 1}}}
    di = t(entry("c", "d.$cmd", {"dropIndexes": "c", "index": "a_1"}, {"v": 2, "key": {"a": 1}, "name": "a_1"}))
    assert di.doc["operationDescription"] == {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]}
    ren = t(entry("c", "d.$cmd", {"renameCollection": "d.a", "to": "e.b", "stayTemp": False,
                                  "dropTarget": False}))
    assert list(ren.doc)[0] == "to" and ren.doc["to"] == {"db": "e", "coll": "b"}
    assert ren.doc["ns"] == {"db": "d", "coll": "a"}
    assert ren.doc["operationDescription"] == {"dropTarget": False, "to": {"db": "e", "coll": "b"}}
    dd = t(entry("c", "d.$cmd", {"dropDatabase": 1}, ui=None))
    assert dd.doc["ns"] == {"db": "d"} and rt.decode(dd.token).uuid is None
    sc = t(entry("n", "d.c", {"msg": {"shardCollection": "d.c"}},
                 {"shardCollection": "d.c", "key": {"a": 1}, "unique": False}))
    assert sc.doc["operationType"] == "shardCollection"
    assert sc.doc["operationDescription"] == {"key": {"a": 1}, "unique": False}
    assert rt.decode(sc.token).eventIdentifier == {"operationType": "shardCollection",
                                                    "operationDescription": {"key": {"a": 1}, "unique": False}}
    nsd = t(entry("n", "d.c", {"msg": "m"}, {"migrateChunkToNewShard": "d.c", "fromShardId": "s0",
                                              "toShardId": "s1"}))
    assert nsd.doc["operationType"] == "migrateChunkToNewShard" and nsd.topology


def test_update_description_parser():
    diff = {"d": {"gone": False}, "u": {"a": 1}, "i": {"new": 2},
            "sobj": {"u": {"x": 1}, "s1": {"u": {"y": 2}}},
            "sarr": {"a": True, "l": 2, "u1": 9, "s0": {"i": {"k.dot": 1}}}}
    ud = update_description(diff, expanded=True)
    assert ud["updatedFields"] == {"a": 1, "new": 2, "obj.x": 1, "obj.1.y": 2, "arr.1": 9,
                                   "arr.0.k.dot": 1}
    assert ud["removedFields"] == ["gone"]
    assert ud["truncatedArrays"] == [{"field": "arr", "newSize": 2}]
    assert ud["disambiguatedPaths"] == {"obj.1.y": ["obj", "1", "y"], "arr.0.k.dot": ["arr", 0, "k.dot"]}
    assert "disambiguatedPaths" not in update_description(diff, expanded=False)


def test_apply_diff_post_image():
    pre = {"_id": 1, "a": 1, "gone": 0, "arr": [1, 2, 3], "o": {"x": 1}}
    post = apply_diff(pre, {"d": {"gone": False}, "u": {"a": 2}, "i": {"n": 1},
                            "sarr": {"a": True, "l": 2, "u1": 7}, "so": {"u": {"y": 2}}})
    assert post == {"_id": 1, "a": 2, "arr": [1, 7], "o": {"x": 1, "y": 2}, "n": 1}
    assert pre["arr"] == [1, 2, 3]  # the stored pre-image is not mutated


# -- invalidate / resume ---------------------------------------------------------------------------

def test_invalidate_rules_per_stream_type():
    drop = entry("c", "d.$cmd", {"drop": "c"})
    for kind_spec, expect in ((parse(), True), (parse(target=1), False)):
        ev = Transform(kind_spec)(drop)
        out = CheckInvalidate(kind_spec).process(ev)
        assert (len(out) == 2) is expect
    dbspec = parse(target=1)
    dd = Transform(dbspec)(entry("c", "d.$cmd", {"dropDatabase": 1}, ui=None))
    out = CheckInvalidate(dbspec).process(dd)
    assert [e.doc["operationType"] for e in out] == ["dropDatabase", "invalidate"]
    inv = out[1]
    assert rt.decode(inv.token).fromInvalidate and inv.token["_data"] > dd.token["_data"]


def test_check_resumability_swallows_through_token():
    spec0 = parse()
    t = Transform(spec0)
    evs = [t(entry("i", "d.c", {"_id": i}, {"_id": i}, ts=(100, i))) for i in range(1, 5)]
    tok = evs[1].token
    spec = parse(cs={"resumeAfter": tok}, needs_merge=True)
    chk = CheckResumability(spec)  # the router's ensure-present stage swallows the token's event
    assert [chk.process(e) is not None for e in evs] == [False, True, True, True]
    assert chk.found
    direct = EnsureResumeTokenPresent(parse(cs={"resumeAfter": tok}))
    assert [direct.process(e) is not None for e in evs] == [False, False, True, True]
    hwm = parse(cs={"resumeAfter": rt.make_high_water_mark(Timestamp(100, 2))})
    chk = CheckResumability(hwm)
    assert [chk.process(e) is not None for e in evs] == [False, True, True, True]
    missing = rt.event_token(Timestamp(100, 2), bytes(U1), "insert", {"_id": 77})
    ens = EnsureResumeTokenPresent(parse(cs={"resumeAfter": missing}))
    assert ens.process(evs[0]) is None
    with pytest.raises(MongoError) as ei:
        ens.process(evs[2])
    assert ei.value.code == 280


def test_history_lost_check():
    log = Oplog()
    log.append({"ts": Timestamp(10, 1), "op": "n", "ns": "", "o": {"msg": "initiating set"}})
    log.append({"ts": Timestamp(20, 1), "op": "n", "ns": "", "o": {"msg": "periodic noop"}})
    assert_history_available(log, 1)  # before the very first entry of history: fine
    trimmed = Oplog()
    trimmed.append({"ts": Timestamp(20, 1), "op": "n", "ns": "", "o": {"msg": "periodic noop"}})
    assert_history_available(trimmed, (20 << 32) | 1)
    with pytest.raises(MongoError) as ei:
        assert_history_available(trimmed, (19 << 32))
    assert ei.value.code == 286


# -- spec validation -------------------------------------------------------------------------------

@pytest.mark.parametrize("db, target, cs, rest, code", [
    ("d", "c", {"nope": 1}, [], 40415),
    ("d", "c", {"fullDocument": True}, [], 14),
    ("d", "c", {"fullDocument": "x"}, [], 2),
    ("d", "c", {"startAtOperationTime": 5}, [], 14),
    ("admin", 1, {}, [], 73),
    ("admin", "c", {"allChangesForCluster": True}, [], 72),
    ("local", 1, {}, [], 73),
    ("config", 1, {}, [], 73),
    ("d", "system.x", {}, [], 73),
    ("d", "c", {}, [{"$sort": {"a": 1}}], 20),
    ("d", "c", {}, [{"$nope": {}}], 40324),
    ("d", "c", {}, [{"$match": {}, "$project": {}}], 40323),
    ("d", "c", {"resumeAfter": {"_data": "XY"}}, [], 9),
])
def test_spec_errors(db, target, cs, rest, code):
    with pytest.raises(MongoError) as ei:
        spec_mod.parse(db, target, [{"$changeStream": cs}, *rest])
    assert ei.value.code == code


def test_spec_resume_after_invalidate_and_uuidless_tokens():
    data = rt.event_token_data(Timestamp(5, 1), bytes(U1), "drop", operation_description=None)
    data.fromInvalidate = True
    inv = rt.encode(data)
    with pytest.raises(MongoError) as ei:
        spec_mod.parse("d", "c", [{"$changeStream": {"resumeAfter": inv}}])
    assert ei.value.code == 260
    assert spec_mod.parse("d", "c", [{"$changeStream": {"startAfter": inv}}]).start_after
    no_uuid = rt.event_token(Timestamp(5, 1), None, "dropDatabase")
    with pytest.raises(MongoError) as ei:
        spec_mod.parse("d", "c", [{"$changeStream": {"resumeAfter": no_uuid}}])
    assert ei.value.code == 260
    assert spec_mod.parse("d", 1, [{"$changeStream": {"resumeAfter": no_uuid}}]).kind == "database"


def test_user_project_with_dotted_computed_path():
    from shardsim.shard.change_stream.user_stages import compile_stage
    fn = compile_stage("$project", {"_id": 1, "operationType": 1, "ns.viewOn": "db.coll"})
    out = fn({"_id": {"_data": "00"}, "operationType": "insert", "ns": {"db": "a", "coll": "b"}})
    assert out == {"_id": {"_data": "00"}, "operationType": "insert", "ns": {"viewOn": "db.coll"}}
    inc = compile_stage("$project", {"ns.db": 1})
    assert inc({"_id": 1, "ns": {"db": "a", "coll": "b"}}) == {"_id": 1, "ns": {"db": "a"}}


def test_v1_tokens_on_request_and_version_kept_until_resume_point():
    v1 = parse(cs={"$_generateV2ResumeTokens": False})
    ev = Transform(v1)(entry("i", "d.c", {"_id": 1}, {"_id": 1}))
    d = rt.decode(ev.token)
    assert d.version == 1 and d.eventIdentifier == {"_id": 1}
    assert ev.token["_data"].startswith("82") and "2B02" in ev.token["_data"][:24]
    # resuming from that v1 token: events up to the resume point keep v1, later ones are v2
    spec = parse(cs={"resumeAfter": ev.token})
    t = Transform(spec)
    same = t(entry("i", "d.c", {"_id": 1}, {"_id": 1}))
    later = t(entry("i", "d.c", {"_id": 2}, {"_id": 2}, ts=(100, 2)))
    assert same.token == ev.token
    assert rt.decode(later.token).version == 2
