"""A real ``python -m shardsim.shard`` process driven through pymongo (directConnection): CRUD, DDL,
the oplog as ``local.oplog.rs``, pre-images, transactions, retryable writes and bad input."""

from __future__ import annotations

import datetime
import socket
import struct
import threading
import time
import uuid

import bson
import pymongo
import pytest
from bson import Binary, Decimal128, ObjectId
from bson.codec_options import CodecOptions
from bson.int64 import Int64
from bson.son import SON
from bson.timestamp import Timestamp
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure

from shardsim.core import wire
from shardsim.tools.procs import RoleProcess


@pytest.fixture(scope="module")
def proc():
    p = RoleProcess("shard", ["--port", "0", "--shard-name", "rsA"], name="rsA")
    p.start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def client(proc):
    c = pymongo.MongoClient(f"mongodb://{proc.address}/?directConnection=true",
                            serverSelectionTimeoutMS=5000)
    try:
        yield c
    finally:
        c.close()


def oplog(client, **filt):
    return list(client.local["oplog.rs"].find(filt))


def last_ops(client, ns, n=None):
    entries = [e for e in client.local["oplog.rs"].find({"ns": ns})]
    return entries if n is None else entries[-n:]


def test_hello_is_a_one_member_replica_set_primary(client, proc):
    h = client.admin.command("hello")
    assert h["isWritablePrimary"] is True and h["secondary"] is False
    assert h["setName"] == "rsA" and h["setVersion"] == 1
    assert h["hosts"] == [proc.address] and h["primary"] == proc.address == h["me"]
    assert isinstance(h["electionId"], ObjectId)
    assert set(h["lastWrite"]) == {"opTime", "lastWriteDate", "majorityOpTime", "majorityWriteDate"}
    assert "topologyVersion" not in h
    assert h["maxWireVersion"] == 25


def test_documents_keep_types_and_field_order(client):
    coll = client.types.c
    raw = client.types.get_collection("c", codec_options=CodecOptions(document_class=SON))
    doc = SON([("_id", 1), ("z", 1), ("a", Int64(5)), ("d", Decimal128("1.5")),
               ("when", datetime.datetime(2024, 1, 2, 3, 4, 5, 6000)),
               ("bin", Binary(b"\x01\x02", 0)), ("u", Binary(uuid.uuid4().bytes, 4)),
               ("nested", SON([("y", 1), ("x", [1, "two", 3.0])])), ("f", 2.0)])
    coll.insert_one(doc)
    got = raw.find_one({"_id": 1})
    assert list(got.keys()) == list(doc.keys())
    assert list(got["nested"].keys()) == ["y", "x"]
    assert isinstance(got["a"], Int64) and isinstance(got["f"], float)
    assert got["d"] == Decimal128("1.5") and got["when"] == doc["when"]
    # _id is moved first, like mongod does.
    coll.insert_one(SON([("b", 1), ("_id", 2)]))
    assert list(raw.find_one({"_id": 2}).keys()) == ["_id", "b"]


def test_crud_and_oplog_entries(client):
    db = client.crud
    coll = db.people
    coll.insert_one({"_id": 1, "name": "ann", "tags": ["a"], "addr": {"city": "x", "zip": 1}})
    coll.insert_many([{"_id": i, "n": i} for i in range(2, 6)])
    r = coll.update_one({"_id": 1}, {"$set": {"addr.city": "y", "age": 3}, "$push": {"tags": "b"}})
    assert (r.matched_count, r.modified_count) == (1, 1)
    assert coll.update_one({"_id": 1}, {"$set": {"age": 3}}).modified_count == 0  # no-op
    coll.replace_one({"_id": 2}, {"n": 20})
    assert coll.update_many({"n": {"$gte": 3}}, {"$inc": {"n": 100}}).modified_count == 4
    assert coll.delete_one({"_id": 5}).deleted_count == 1
    r = coll.update_one({"_id": 9}, {"$set": {"u": 1}}, upsert=True)
    assert r.upserted_id == 9
    entries = last_ops(client, "crud.people")
    ops = [e["op"] for e in entries]
    assert ops == ["i"] * 5 + ["u"] * 6 + ["d", "i"]
    upd = entries[5]
    assert upd["o"] == {"$v": 2, "diff": {"i": {"age": 3}, "stags": {"a": True, "u1": "b"},
                                          "saddr": {"u": {"city": "y"}}}}
    assert upd["o2"] == {"_id": 1}
    assert entries[6]["o"] == {"_id": 2, "n": 20}  # replacement logs the full document
    assert entries[7]["o"] == {"$v": 2, "diff": {"u": {"n": 120}}}
    assert entries[11]["o"] == {"_id": 5}
    for e in entries:
        assert e["t"] == 1 and isinstance(e["wall"], datetime.datetime)
        assert isinstance(e["ui"], uuid.UUID) or isinstance(e["ui"], Binary)
    ts = [e["ts"] for e in entries]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    create = oplog(client, ns="crud.$cmd")[0]
    assert create["op"] == "c" and create["o"]["create"] == "people"


def test_update_diff_shape_for_common_operators(client):
    coll = client.diffs.c
    coll.insert_one({"_id": 1, "a": {"b": 1, "c": 2}, "arr": [1, 2, 3], "x": 1})
    coll.update_one({"_id": 1}, {"$set": {"a.b": 5}, "$unset": {"x": ""}})
    coll.update_one({"_id": 1}, {"$push": {"arr": 4}})
    coll.update_one({"_id": 1}, [{"$set": {"arr": [1, 2]}}])
    e1, e2, e3 = last_ops(client, "diffs.c", 3)
    assert e1["o"] == {"$v": 2, "diff": {"d": {"x": False}, "sa": {"u": {"b": 5}}}}
    assert e2["o"] == {"$v": 2, "diff": {"sarr": {"a": True, "u3": 4}}}
    assert e3["o"] == {"$v": 2, "diff": {"sarr": {"a": True, "l": 2}}}


def test_bulk_writes_errors_and_upserts(client):
    coll = client.bulk.c
    coll.insert_one({"_id": 1})
    with pytest.raises(BulkWriteError) as e:
        coll.insert_many([{"_id": 2}, {"_id": 1}, {"_id": 3}], ordered=True)
    d = e.value.details
    assert d["nInserted"] == 1
    [err] = d["writeErrors"]
    assert err["index"] == 1 and err["code"] == 11000
    assert err["keyPattern"] == {"_id": 1} and err["keyValue"] == {"_id": 1}
    assert "E11000 duplicate key error collection: bulk.c index: _id_ dup key: { _id: 1 }" == err["errmsg"]
    with pytest.raises(BulkWriteError) as e:
        coll.insert_many([{"_id": 1}, {"_id": 4}, {"_id": 2}, {"_id": 5}], ordered=False)
    d = e.value.details
    assert d["nInserted"] == 2 and [w["index"] for w in d["writeErrors"]] == [0, 2]
    res = coll.bulk_write([
        pymongo.UpdateOne({"_id": 10}, {"$set": {"a": 1}}, upsert=True),
        pymongo.UpdateOne({"_id": 1}, {"$set": {"a": 1}}, upsert=True),
        pymongo.ReplaceOne({"_id": 11}, {"r": 1}, upsert=True),
        pymongo.DeleteMany({"_id": {"$in": [4, 5]}}),
    ])
    assert res.upserted_ids == {0: 10, 2: 11}
    assert res.matched_count == 1 and res.modified_count == 1 and res.deleted_count == 2
    assert coll.find_one({"_id": 11}) == {"_id": 11, "r": 1}


def test_unique_index_enforced(client):
    coll = client.uniq.c
    assert coll.create_index([("email", 1)], unique=True) == "email_1"
    coll.insert_one({"email": "a@x"})
    with pytest.raises(DuplicateKeyError) as e:
        coll.insert_one({"email": "a@x"})
    assert e.value.details["keyValue"] == {"email": "a@x"}
    with pytest.raises(DuplicateKeyError):
        coll.insert_one({"_id": 5, "email": "b"}) or coll.update_one({"_id": 5}, {"$set": {"email": "a@x"}})
        coll.update_one({"_id": 5}, {"$set": {"email": "a@x"}})
    names = [i["name"] for i in coll.list_indexes()]
    assert names == ["_id_", "email_1"]
    coll.drop_index("email_1")
    coll.insert_one({"email": "a@x"})
    with pytest.raises(OperationFailure) as e:
        coll.drop_index("nope")
    assert e.value.code == 27


def test_find_options_and_getmore(client):
    coll = client.reads.c
    coll.insert_many([{"_id": i, "v": i % 7, "s": f"k{i:03d}"} for i in range(250)])
    assert coll.count_documents({"v": 3}) == 36
    assert sorted(coll.distinct("v")) == list(range(7))
    got = list(coll.find({"v": {"$in": [1, 2]}}, {"s": 1, "_id": 0}).sort([("v", -1), ("s", 1)])
               .skip(2).limit(5))
    assert got == [{"s": "k016"}, {"s": "k023"}, {"s": "k030"}, {"s": "k037"}, {"s": "k044"}]
    everything = list(coll.find().batch_size(30))
    assert [d["_id"] for d in everything] == list(range(250))
    cur = client.reads.command("find", "c", batchSize=10)
    assert len(cur["cursor"]["firstBatch"]) == 10 and cur["cursor"]["id"] != 0
    more = client.reads.command("getMore", cur["cursor"]["id"], collection="c", batchSize=500)
    assert len(more["cursor"]["nextBatch"]) == 240 and more["cursor"]["id"] == 0
    agg = list(coll.aggregate([{"$match": {"v": {"$lt": 2}}}, {"$group": {"_id": "$v", "n": {"$sum": 1}}},
                               {"$sort": {"_id": 1}}]))
    assert agg == [{"_id": 0, "n": 36}, {"_id": 1, "n": 36}]
    fam = coll.find_one_and_update({"_id": 3}, {"$set": {"x": 1}},
                                   return_document=pymongo.ReturnDocument.AFTER)
    assert fam["x"] == 1
    gone = coll.find_one_and_delete({"_id": 4})
    assert gone["_id"] == 4 and coll.find_one({"_id": 4}) is None


def test_ddl_commands_and_their_oplog_entries(client):
    db = client.ddl
    db.create_collection("a", changeStreamPreAndPostImages={"enabled": True})
    infos = {i["name"]: i for i in db.list_collections()}
    assert isinstance(infos["a"]["info"]["uuid"], (uuid.UUID, Binary))
    assert infos["a"]["options"] == {"changeStreamPreAndPostImages": {"enabled": True}}
    with pytest.raises(OperationFailure) as e:
        db.command("create", "a")  # different options than the existing collection
    assert e.value.code == 48
    db.command("create", "a", changeStreamPreAndPostImages={"enabled": True})  # identical: no-op
    db.a.insert_one({"_id": 1, "v": 1})
    db.a.create_index("v")
    db.command("collMod", "a", changeStreamPreAndPostImages={"enabled": False})
    client.admin.command("renameCollection", "ddl.a", to="ddl.b")
    assert db.list_collection_names() == ["b"]
    assert db.b.find_one() == {"_id": 1, "v": 1}
    db.c.insert_one({})
    client.drop_database("ddl")
    assert "ddl" not in client.list_database_names()
    cmds = [e["o"] for e in oplog(client, ns="ddl.$cmd")]
    kinds = [next(iter(o)) for o in cmds]
    assert kinds == ["create", "createIndexes", "collMod", "renameCollection", "create",
                     "drop", "drop", "dropDatabase"]
    assert cmds[0]["idIndex"] == {"v": 2, "key": {"_id": 1}, "name": "_id_"}
    assert cmds[3] == {"renameCollection": "ddl.a", "to": "ddl.b", "stayTemp": False}
    collmod = oplog(client, ns="ddl.$cmd")[2]
    assert collmod["o2"]["collectionOptions_old"]["changeStreamPreAndPostImages"] == {"enabled": True}
    with pytest.raises(OperationFailure) as e:
        client.admin.command("renameCollection", "ddl.nope", to="ddl.x")
    assert e.value.code == 26


def test_pre_images_recorded_only_when_enabled(client):
    db = client.pre
    db.create_collection("on", changeStreamPreAndPostImages={"enabled": True})
    db.on.insert_one({"_id": 1, "v": 1})
    db.on.update_one({"_id": 1}, {"$set": {"v": 2}})
    db.on.delete_one({"_id": 1})
    db.off.insert_one({"_id": 1, "v": 1})
    db.off.update_one({"_id": 1}, {"$set": {"v": 2}})
    uuid_on = next(i for i in db.list_collections() if i["name"] == "on")["info"]["uuid"]
    pre = list(client.config["system.preimages"].find())
    mine = [p for p in pre if p["_id"]["nsUUID"] == uuid_on]
    assert [p["preImage"] for p in mine] == [{"_id": 1, "v": 1}, {"_id": 1, "v": 2}]
    upd = last_ops(client, "pre.on", 2)[0]
    assert mine[0]["_id"]["ts"] == upd["ts"]
    assert len(pre) == 2


def test_tailable_await_data_cursor_on_oplog(client):
    start = client.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()["ts"]
    cursor = client.local["oplog.rs"].find({"ts": {"$gt": start}, "ns": {"$in": ["tail.c", "tail.$cmd"]}},
                                           cursor_type=pymongo.CursorType.TAILABLE_AWAIT)
    cursor.max_await_time_ms(2000)

    def writer():
        time.sleep(0.3)
        w = pymongo.MongoClient(client.address[0], client.address[1], directConnection=True)
        w.tail.c.insert_many([{"_id": 1}, {"_id": 2}])
        w.close()

    t = threading.Thread(target=writer)
    t.start()
    got = []
    deadline = time.time() + 10
    while len(got) < 3 and time.time() < deadline and cursor.alive:
        for e in cursor:
            got.append(e)
            if len(got) >= 3:
                break
    t.join()
    cursor.close()
    assert [e["op"] for e in got][:3] == ["c", "i", "i"]
    assert [e["o"].get("_id") for e in got[1:3]] == [1, 2]


def test_oplog_filters(client):
    client.ofilt.c.insert_many([{"_id": i} for i in range(5)])
    client.ofilt.c.delete_many({"_id": {"$lt": 2}})
    assert len(oplog(client, ns="ofilt.c", op="d")) == 2
    first = oplog(client, ns="ofilt.c")[0]["ts"]
    later = list(client.local["oplog.rs"].find({"ts": {"$gte": first}, "ns": "ofilt.c"}))
    assert len(later) == 7
    assert client.local["oplog.rs"].count_documents({"ns": "ofilt.c", "op": "i"}) == 5
    newest_first = list(client.local["oplog.rs"].find({"ns": "ofilt.c"}).sort("ts", -1).limit(3))
    assert [e["op"] for e in newest_first] == ["d", "d", "i"]
    assert newest_first[0]["ts"] > newest_first[1]["ts"] > newest_first[2]["ts"]


def test_transaction_commit_writes_one_apply_ops_entry(client):
    coll = client.txn.c
    coll.insert_one({"_id": 0})
    with client.start_session() as s:
        with s.start_transaction():
            coll.insert_one({"_id": 1}, session=s)
            coll.update_one({"_id": 0}, {"$set": {"x": 1}}, session=s)
            coll.delete_one({"_id": 0}, session=s)
    entries = oplog(client, ns="admin.$cmd")
    e = entries[-1]
    assert e["op"] == "c" and "lsid" in e and e["txnNumber"] >= 1
    assert e["prevOpTime"] == {"ts": Timestamp(0, 0), "t": -1}
    inner = e["o"]["applyOps"]
    assert [o["op"] for o in inner] == ["i", "u", "d"]
    assert all(o["ns"] == "txn.c" for o in inner)
    assert coll.find_one({"_id": 1}) == {"_id": 1}
    before = len(oplog(client))
    with client.start_session() as s:
        s.start_transaction()
        coll.insert_one({"_id": 2}, session=s)
        s.abort_transaction()
    assert coll.find_one({"_id": 2}) is None
    assert len([x for x in oplog(client) if x["op"] != "n"]) == len([x for x in oplog(client)[:before] if x["op"] != "n"])


class Raw:
    """Commands over a plain socket (pymongo would replace a hand-made ``lsid``)."""

    def __init__(self, proc):
        self.sock = socket.create_connection((proc.host, proc.port), timeout=10)

    def __call__(self, db, body):
        return _raw_command(self.sock, {**body, "$db": db})

    def close(self):
        self.sock.close()


@pytest.fixture
def raw(proc):
    r = Raw(proc)
    try:
        yield r
    finally:
        r.close()


def test_transaction_errors(raw, client):
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
    tx = {"lsid": lsid, "autocommit": False}
    r = raw("txn2", {"insert": "c", "documents": [{"_id": 1}], "txnNumber": Int64(5), **tx})
    assert r["code"] == 251 and r["codeName"] == "NoSuchTransaction"
    assert r["errorLabels"] == ["TransientTransactionError"]
    r = raw("txn2", {"insert": "c", "documents": [{"_id": 1}], "txnNumber": Int64(6),
                     "startTransaction": True, **tx})
    assert r["ok"] == 1.0 and r["n"] == 1
    assert raw("admin", {"commitTransaction": 1, "txnNumber": Int64(6), **tx})["ok"] == 1.0
    # Retrying the commit is fine; aborting a committed transaction is not.
    assert raw("admin", {"commitTransaction": 1, "txnNumber": Int64(6), **tx})["ok"] == 1.0
    r = raw("admin", {"abortTransaction": 1, "txnNumber": Int64(6), **tx})
    assert r["code"] == 256
    # A duplicate key inside a transaction aborts it.
    r = raw("txn2", {"insert": "c", "documents": [{"_id": 2}], "txnNumber": Int64(7),
                     "startTransaction": True, **tx})
    assert r["ok"] == 1.0
    r = raw("txn2", {"insert": "c", "documents": [{"_id": 1}], "txnNumber": Int64(7), **tx})
    assert r["code"] == 11000
    r = raw("admin", {"commitTransaction": 1, "txnNumber": Int64(7), **tx})
    assert r["code"] == 251 and "TransientTransactionError" in r["errorLabels"]
    assert client.txn2.c.find_one({"_id": 2}) is None
    assert client.txn2.c.find_one({"_id": 1}) == {"_id": 1}
    r = raw("txn2", {"insert": "c", "documents": [{"_id": 3}], "txnNumber": Int64(3),
                     "startTransaction": True, **tx})
    assert r["code"] == 225


def test_retryable_write_is_applied_once(raw, client):
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
    cmd = {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}, "upsert": True}],
           "lsid": lsid, "txnNumber": Int64(1)}
    r1 = raw("retry", cmd)
    r2 = raw("retry", cmd)
    assert r1["n"] == r2["n"] == 1 and r1["upserted"] == r2["upserted"]
    assert "retriedStmtIds" not in r1 and r2["retriedStmtIds"] == [0]
    assert client.retry.c.find_one({"_id": 1})["n"] == 1
    [entry] = last_ops(client, "retry.c", 1)
    assert entry["lsid"]["id"] == lsid["id"] and entry["txnNumber"] == 1 and entry["stmtId"] == 0
    raw("retry", {**cmd, "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}], "txnNumber": Int64(2)})
    r = raw("retry", cmd)
    assert r["code"] == 225
    assert client.retry.c.find_one({"_id": 1})["n"] == 2
    # A partly failed ordered insert: the retry skips what ran and runs the rest.
    client.retry.d.insert_one({"_id": 3})
    ins = {"insert": "d", "documents": [{"_id": 1}, {"_id": 2}, {"_id": 3}, {"_id": 4}],
           "lsid": lsid, "txnNumber": Int64(3)}
    r = raw("retry", ins)
    assert r["n"] == 2 and r["writeErrors"][0]["index"] == 2
    client.retry.d.delete_one({"_id": 3})
    r = raw("retry", ins)
    assert r["n"] == 4 and r["retriedStmtIds"] == [0, 1] and "writeErrors" not in r
    assert sorted(d["_id"] for d in client.retry.d.find()) == [1, 2, 3, 4]
    fam = {"findAndModify": "d", "query": {"_id": 4}, "update": {"$inc": {"k": 1}}, "new": True,
           "lsid": lsid, "txnNumber": Int64(4)}
    a, b = raw("retry", fam), raw("retry", fam)
    assert a["value"] == b["value"] == {"_id": 4, "k": 1} and b["retriedStmtId"] == 0
    assert client.retry.d.find_one({"_id": 4}) == {"_id": 4, "k": 1}


def test_internal_commands_and_from_migrate(client):
    u = Binary(uuid.uuid4().bytes, 4)
    r = client.intl.command({"_shardsimEnsureCollection": "c", "uuid": u, "shardKey": {"sk": 1}})
    assert r["created"] is True and r["uuid"] == u
    r = client.intl.command({"_shardsimEnsureCollection": "c", "uuid": u, "shardKey": {"sk": 1}})
    assert r["created"] is False
    info = next(client.intl.list_collections())
    assert info["info"]["uuid"] == u
    create = oplog(client, ns="intl.$cmd")[0]
    assert create["fromMigrate"] is True and create["ui"] == u
    client.intl.command({"insert": "c", "documents": [{"_id": 1, "sk": 7}], "fromMigrate": True})
    client.intl.c.insert_one({"_id": 2, "sk": 8})
    e1, e2 = last_ops(client, "intl.c", 2)
    assert e1["fromMigrate"] is True and "fromMigrate" not in e2
    assert e2["o2"] == {"sk": 8, "_id": 2}
    r = client.admin.command({"_shardsimNoop": {"msg": "hello"}, "o2": {"k": 1}})
    [n] = [e for e in oplog(client, op="n") if e["o"] == {"msg": "hello"}]
    assert n["o2"] == {"k": 1} and n["ts"] == r["ts"]


def test_bad_input_gets_mongod_errors(client, raw):
    with pytest.raises(OperationFailure) as e:
        client.bad.command("noSuchCommand")
    assert e.value.code == 59 and e.value.details["codeName"] == "CommandNotFound"
    with pytest.raises(OperationFailure) as e:
        client.bad.command({"find": "c", "filter": 5})
    assert e.value.code == 14
    r = raw("bad", {"insert": "c", "documents": "x"})
    assert r["code"] == 14 and r["codeName"] == "TypeMismatch"
    r = raw("bad", {"insert": "c"})
    assert r["code"] == 40414
    r = raw("bad", {"find": "c", "filtr": {}})
    assert r["code"] == 40415 and r["errmsg"] == "BSON field 'find.filtr' is an unknown field."
    r = raw("bad", {"update": "c", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "multi": "yes"}]})
    assert r["writeErrors"][0]["code"] == 14
    r = raw("bad", {"delete": "c", "deletes": [{"q": {}, "limit": 5}]})
    assert r["writeErrors"][0]["code"] == 9
    r = raw("bad", {"insert": "c", "documents": [{"_id": [1, 2]}]})
    assert r["writeErrors"][0]["code"] == 2
    with pytest.raises(OperationFailure) as e:
        client.bad.command({"find": "c", "filter": {"a": {"$bogus": 1}}})
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        client.bad.c.update_one({}, {"$bogus": {"a": 1}})
    assert e.value.code == 9
    client.bad.c.insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as e:
        client.bad.c.update_one({"_id": 1}, {"$set": {"_id": 2}})
    assert e.value.code == 66
    assert client.admin.command("ping")["ok"] == 1.0


def _raw_command(sock: socket.socket, body: dict, sequences=None) -> dict:
    sock.sendall(wire.encode_op_msg(bson.encode(body), sequences=sequences))
    header = _recv(sock, 16)
    length = struct.unpack("<i", header[:4])[0]
    payload = _recv(sock, length - 16)
    msg = wire.parse_op_msg(0, payload)
    return bson.decode(msg.body)


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def test_oversized_document_and_malformed_messages_keep_serving(proc, client):
    with socket.create_connection((proc.host, proc.port), timeout=10) as sock:
        big = bson.encode({"_id": 1, "pad": "x" * (16 * 1024 * 1024)})
        reply = _raw_command(sock, {"insert": "c", "$db": "big"}, sequences={"documents": [big]})
        assert reply["ok"] == 1.0 and reply["n"] == 0
        [err] = reply["writeErrors"]
        assert err["code"] == 2 and "object to insert too large" in err["errmsg"]
        # A malformed message (bad section kind) gets an error reply; the connection stays open.
        bad = struct.pack("<I", 0) + b"\x09" + bson.encode({"ping": 1})
        sock.sendall(struct.pack("<iiii", 16 + len(bad), 99, 0, wire.OP_MSG) + bad)
        header = _recv(sock, 16)
        payload = _recv(sock, struct.unpack("<i", header[:4])[0] - 16)
        reply = bson.decode(wire.parse_op_msg(0, payload).body)
        assert reply["ok"] == 0.0 and reply["code"] == 40432
        assert _raw_command(sock, {"ping": 1, "$db": "admin"})["ok"] == 1.0
    # A lying length closes only that connection.
    with socket.create_connection((proc.host, proc.port), timeout=10) as sock:
        sock.sendall(struct.pack("<iiii", 5, 1, 0, wire.OP_MSG))
        sock.settimeout(5)
        assert sock.recv(10) == b""
    assert client.big.c.count_documents({}) == 0
    assert client.admin.command("ping")["ok"] == 1.0


def test_transaction_may_start_with_a_read(client):
    coll = client.txn3.c
    coll.insert_one({"_id": 0, "n": 1})
    with client.start_session() as s:
        with s.start_transaction():
            assert coll.find_one({"_id": 0}, session=s) == {"_id": 0, "n": 1}
            coll.update_one({"_id": 0}, {"$inc": {"n": 1}}, session=s)
    assert coll.find_one({"_id": 0})["n"] == 2
    e = client.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()
    assert e["o"]["applyOps"][0]["o"] == {"$v": 2, "diff": {"u": {"n": 2}}}


def test_abandoned_transaction_is_rolled_back(raw, client):
    client.admin.command("setParameter", 1, transactionLifetimeLimitSeconds=1)
    try:
        lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
        r = raw("txn4", {"insert": "c", "documents": [{"_id": 1}], "lsid": lsid,
                         "txnNumber": Int64(1), "autocommit": False, "startTransaction": True})
        assert r["ok"] == 1.0
        time.sleep(2.5)  # lifetime 1 s + the reaper's 1 s period
        r = raw("admin", {"commitTransaction": 1, "lsid": lsid, "txnNumber": Int64(1),
                          "autocommit": False})
        assert r["code"] == 251
        assert client.txn4.c.find_one({"_id": 1}) is None
        # endSessions aborts an open transaction too.
        lsid2 = {"id": Binary(uuid.uuid4().bytes, 4)}
        client.admin.command("setParameter", 1, transactionLifetimeLimitSeconds=60)
        raw("txn4", {"insert": "c", "documents": [{"_id": 2}], "lsid": lsid2,
                     "txnNumber": Int64(1), "autocommit": False, "startTransaction": True})
        assert raw("admin", {"endSessions": [lsid2]})["ok"] == 1.0
        assert client.txn4.c.find_one({"_id": 2}) is None
    finally:
        client.admin.command("setParameter", 1, transactionLifetimeLimitSeconds=60)


def test_small_oplog_truncates_and_tailing_past_it_fails(shard_process, shard_client):
    p = shard_process("tiny", None, "--oplog-size-mb", "0.02")
    c = shard_client(p)
    c.t.c.insert_one({"_id": 0})
    first_batch = c.local.command("find", "oplog.rs", tailable=True, awaitData=True, batchSize=1)
    cid = first_batch["cursor"]["id"]
    assert cid and len(first_batch["cursor"]["firstBatch"]) == 1
    c.t.c.insert_many([{"_id": i, "pad": "x" * 200} for i in range(1, 400)])
    status = c.admin.command("serverStatus")["oplog"]
    assert status["sizeBytes"] <= 0.02 * 1024 * 1024
    first = c.local["oplog.rs"].find().limit(1).next()
    assert first["o"].get("_id", 0) > 1  # the oldest entries are gone
    with pytest.raises(OperationFailure) as e:  # (pymongo's cursor would swallow 136)
        c.local.command("getMore", cid, collection="oplog.rs", maxTimeMS=100)
    assert e.value.code == 136 and e.value.details["codeName"] == "CappedPositionLost"
    with pytest.raises(OperationFailure) as e:
        c["T"].c.insert_one({})
    assert e.value.code == 13297


def test_array_filters_and_positional_updates(client):
    coll = client.arrf.c
    coll.insert_one({"_id": 1, "grades": [{"g": 80, "n": 1}, {"g": 95, "n": 2}, {"g": 97, "n": 3}]})
    r = coll.update_one({"_id": 1}, {"$set": {"grades.$[hi].top": True}},
                        array_filters=[{"hi.g": {"$gte": 95}}])
    assert r.modified_count == 1
    coll.update_one({"_id": 1, "grades.n": 1}, {"$inc": {"grades.$.g": 5}})
    doc = coll.find_one({"_id": 1})
    assert [x.get("top") for x in doc["grades"]] == [None, True, True]
    assert doc["grades"][0]["g"] == 85
    e1, e2 = last_ops(client, "arrf.c", 2)
    assert e1["o"]["diff"] == {"sgrades": {"a": True, "s1": {"i": {"top": True}},
                                           "s2": {"i": {"top": True}}}}
    assert e2["o"]["diff"] == {"sgrades": {"a": True, "s0": {"u": {"g": 85}}}}


def test_legacy_op_query_handshake(proc):
    with socket.create_connection((proc.host, proc.port), timeout=10) as sock:
        sock.sendall(wire.encode_op_query("admin.$cmd", bson.encode({"isMaster": 1}), request_id=42))
        header = _recv(sock, 16)
        length, _rid, response_to, op = struct.unpack("<iiii", header)
        assert op == wire.OP_REPLY and response_to == 42
        [doc] = wire.parse_op_reply(_recv(sock, length - 16))
        reply = bson.decode(doc)
        assert reply["ismaster"] is True and reply["setName"] == "rsA" and reply["ok"] == 1.0


def test_transaction_writes_are_isolated_until_commit(raw, client):
    client.iso.c.insert_one({"_id": 0, "n": 0})
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
    tx = {"lsid": lsid, "txnNumber": Int64(1), "autocommit": False}
    raw("iso", {"insert": "c", "documents": [{"_id": 1}], "startTransaction": True, **tx})
    raw("iso", {"update": "c", "updates": [{"q": {"_id": 0}, "u": {"$inc": {"n": 1}}}], **tx})
    raw("iso", {"delete": "c", "deletes": [{"q": {"_id": 1}, "limit": 1}], **tx})
    raw("iso", {"insert": "c", "documents": [{"_id": 2}], **tx})
    inside = raw("iso", {"find": "c", "filter": {}, **tx})["cursor"]["firstBatch"]
    assert inside == [{"_id": 0, "n": 1}, {"_id": 2}]
    assert list(client.iso.c.find()) == [{"_id": 0, "n": 0}]  # outside: nothing yet
    # A unique-key clash with the transaction's own writes is seen inside it.
    r = raw("iso", {"insert": "c", "documents": [{"_id": 2}], **tx})
    assert r["code"] == 11000
    # ...and it aborted the transaction: nothing was applied.
    assert raw("admin", {"commitTransaction": 1, **tx})["code"] == 251
    assert list(client.iso.c.find()) == [{"_id": 0, "n": 0}]
    tx2 = {**tx, "txnNumber": Int64(2)}
    raw("iso", {"insert": "c", "documents": [{"_id": 5}], "startTransaction": True, **tx2})
    # A concurrent writer of the same key waits for the transaction (writeConflictRetry),
    # then finds the key taken.
    outcome: list[Exception] = []

    def outside() -> None:
        try:
            client.iso.c.insert_one({"_id": 5, "outside": True})
        except Exception as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    t = threading.Thread(target=outside)
    t.start()
    time.sleep(0.5)
    assert t.is_alive()
    r = raw("admin", {"commitTransaction": 1, **tx2})
    assert r["ok"] == 1.0, r
    t.join(10)
    assert [type(e) for e in outcome] == [DuplicateKeyError]
    assert client.iso.c.find_one({"_id": 5}) == {"_id": 5}
