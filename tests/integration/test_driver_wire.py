"""What drivers see beyond the spec suites (issue 31), with pymongo against the shared cluster,
through the router and directly on a shard: OP_COMPRESSED with each compressor, ``validate``,
capped collections that evict and tailable/awaitData cursors, exhaust cursors."""

from __future__ import annotations

import uuid
from typing import Iterator

import pymongo
import pytest

from shardsim.core import compression


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["router", "shard"])
def target(request, cluster) -> Iterator[str]:
    """The address of the router or of the first shard (directConnection)."""
    if request.param == "router":
        yield cluster.router_uri
    else:
        yield f"mongodb://{cluster.shards[0].address}/?directConnection=true"


@pytest.mark.parametrize("name,cid", [("zlib", 2), ("snappy", 1), ("zstd", 3)])
def test_compressors_negotiated_and_used(target, name, cid):
    client = pymongo.MongoClient(target, compressors=name, serverSelectionTimeoutMS=10000)
    try:
        coll = client[_name("cmp")]["c"]
        coll.insert_many([{"_id": i, "pad": "x" * 500} for i in range(50)])
        assert sorted(d["_id"] for d in coll.find()) == list(range(50))
        hello = client.admin.command("hello", compression=["lz4", name, "zlib"])
        assert hello["compression"] == [name, "zlib"]
        # The pooled connection negotiated it: pymongo compressed every request after hello.
        pool = next(iter(client._topology._servers.values())).pool  # noqa: SLF001
        conns = list(pool.conns)
        assert conns and all(c.compression_context is not None for c in conns)
        assert {c.compression_context.compressor_id for c in conns} == {cid}
        coll.drop()
    finally:
        client.close()


def test_unsupported_compressor_only_gives_no_compression(target):
    client = pymongo.MongoClient(target, serverSelectionTimeoutMS=10000)
    try:
        hello = client.admin.command("hello", compression=["lz4"])
        assert "compression" not in hello
        assert set(compression.SUPPORTED) == {"snappy", "zlib", "zstd"}
    finally:
        client.close()


# -- validate ----------------------------------------------------------------------------------
_VALIDATE_KEYS = ["ns", "uuid", "nInvalidDocuments", "nNonCompliantDocuments", "nrecords",
                  "nIndexes", "keysPerIndex", "indexDetails", "valid", "repaired", "warnings",
                  "errors", "extraIndexEntries", "missingIndexEntries", "corruptRecords", "ok"]


def _fill(coll) -> None:
    coll.insert_many([{"_id": 1, "tags": ["a", "b"]}, {"_id": 2, "tags": "c", "u": 1},
                      {"_id": 3}])
    coll.create_index("tags")
    coll.create_index("u", unique=True, sparse=True)


def test_validate_on_a_shard(first_shard_client):
    db = first_shard_client[_name("val")]
    _fill(db.c)
    res = db.command("validate", "c")
    assert [k for k in res if not k.startswith("$") and k != "operationTime"] == _VALIDATE_KEYS
    assert res["ns"] == f"{db.name}.c" and res["valid"] is True and res["errors"] == []
    assert res["nrecords"] == 3 and res["nIndexes"] == 3
    assert res["keysPerIndex"] == {"_id_": 3, "tags_1": 4, "u_1": 1}
    assert res["indexDetails"] == {n: {"valid": True} for n in ("_id_", "tags_1", "u_1")}
    assert db.command("validate", "c", full=True)["valid"] is True
    assert "readTimestamp" in db.command("validate", "c", background=True)
    with pytest.raises(pymongo.errors.OperationFailure) as exc:
        db.command("validate", "c", full=True, background=True)
    assert exc.value.code == 72
    with pytest.raises(pymongo.errors.OperationFailure) as exc:
        db.command("validate", "missing")
    assert exc.value.code == 26
    assert exc.value.details["errmsg"] == f"Collection '{db.name}.missing' does not exist to validate."
    first_shard_client.drop_database(db.name)


def test_validate_through_the_router(router_client):
    name = _name("valr")
    db = router_client[name]
    _fill(db.c)
    res = db.command("validate", "c")  # unsharded: the primary shard's reply, then raw
    assert res["valid"] is True and res["nrecords"] == 3 and list(res)[:2] == ["ns", "uuid"]
    [(shard, raw)] = res["raw"].items()
    assert raw["keysPerIndex"] == {"_id_": 3, "tags_1": 4, "u_1": 1} and raw["ok"] == 1
    router_client.admin.command("enableSharding", name)
    router_client.admin.command("shardCollection", f"{name}.s", key={"_id": 1})
    router_client.admin.command("split", f"{name}.s", middle={"_id": 10})
    other = next(s["_id"] for s in router_client.admin.command("listShards")["shards"]
                 if s["_id"] != shard)
    router_client.admin.command("moveChunk", f"{name}.s", find={"_id": 10}, to=other)
    db.s.insert_many([{"_id": i} for i in (1, 2, 11)])
    res = db.command("validate", "s")
    assert res["valid"] is True and "nrecords" not in res
    assert {s: r["nrecords"] for s, r in res["raw"].items()} == {shard: 2, other: 1}
    with pytest.raises(pymongo.errors.OperationFailure) as exc:
        db.command("validate", "missing")
    assert exc.value.code == 26
    router_client.drop_database(name)


# -- capped collections and tailable cursors ---------------------------------------------------
def _ids(coll) -> list:
    return [d["_id"] for d in coll.find({}, {"_id": 1})]


def test_capped_evicts_by_count_oldest_first(target):
    client = pymongo.MongoClient(target, serverSelectionTimeoutMS=10000)
    try:
        db = client[_name("cap")]
        db.create_collection("c", capped=True, size=100_000, max=3)
        for i in range(6):
            db.c.insert_one({"_id": i})
        assert _ids(db.c) == [3, 4, 5]
        db.c.insert_many([{"_id": i} for i in (6, 7)])
        assert _ids(db.c) == [5, 6, 7]
        client.drop_database(db.name)
    finally:
        client.close()


def test_capped_evicts_by_size(target):
    client = pymongo.MongoClient(target, serverSelectionTimeoutMS=10000)
    try:
        db = client[_name("caps")]
        db.create_collection("c", capped=True, size=1000)  # not rounded to 256 since 7.0
        pad = "x" * 180  # each document: 204 bytes of BSON
        for i in range(10):
            db.c.insert_one({"_id": i, "pad": pad})
        assert _ids(db.c) == [6, 7, 8, 9]  # 4 * 204 <= 1000 < 5 * 204
        big = "y" * 5000  # larger than the cap: everything older goes, the new one stays
        db.c.insert_one({"_id": 10, "pad": big})
        assert _ids(db.c) == [10]
        client.drop_database(db.name)
    finally:
        client.close()


def test_evictions_are_replicated_deletes_seen_by_change_streams(router_client, cluster):
    name = _name("capcs")
    db = router_client[name]
    db.create_collection("c", capped=True, size=100_000, max=2)
    with db.c.watch(max_await_time_ms=200) as stream:
        for i in range(4):
            db.c.insert_one({"_id": i})
        events = []
        while len(events) < 6:
            change = stream.try_next()
            if change is not None:
                events.append((change["operationType"], change["documentKey"]["_id"]))
    assert events == [("insert", 0), ("insert", 1), ("insert", 2), ("delete", 0),
                      ("insert", 3), ("delete", 1)]
    router_client.drop_database(name)


def test_tailable_cursor_on_a_non_capped_collection(target):
    client = pymongo.MongoClient(target, serverSelectionTimeoutMS=10000)
    try:
        db = client[_name("tnc")]
        db.c.insert_one({"_id": 1})
        with pytest.raises(pymongo.errors.OperationFailure) as exc:
            next(db.c.find(cursor_type=pymongo.CursorType.TAILABLE))
        assert exc.value.code == 2
        assert exc.value.details["errmsg"] == (f"error processing query: ns={db.name}.c "
                                               "tailable cursor requested on non capped collection")
        client.drop_database(db.name)
    finally:
        client.close()


def _wait_for_getmore(client, ns: str) -> None:
    """Until the shard or router reports a getMore on ``ns`` in progress ($currentOp)."""
    import time
    deadline = time.monotonic() + 60  # a bound against a hang, not a synchronisation
    while time.monotonic() < deadline:
        ops = list(client.admin.aggregate([{"$currentOp": {"idleCursors": False, "localOps": True}}]))
        if any(op.get("op") == "getmore" and op.get("ns") == ns for op in ops):
            return
    raise AssertionError(f"no getMore on {ns} in $currentOp: {ops}")


def test_tailable_await_data_waits_for_the_next_insert(target):
    import threading
    client = pymongo.MongoClient(target, serverSelectionTimeoutMS=10000)
    try:
        db = client[_name("tail")]
        db.create_collection("c", capped=True, size=100_000)
        db.c.insert_many([{"_id": 1}, {"_id": 2}])
        cursor = db.c.find(cursor_type=pymongo.CursorType.TAILABLE_AWAIT).max_await_time_ms(60_000)
        assert [next(cursor)["_id"], next(cursor)["_id"]] == [1, 2]
        got: list = []
        t = threading.Thread(target=lambda: got.append(next(cursor)["_id"]))
        t.start()  # a getMore that waits: nothing newer yet
        _wait_for_getmore(client, f"{db.name}.c")
        assert got == []
        db.c.insert_one({"_id": 3})
        t.join(60)
        assert got == [3] and cursor.alive
        cursor.close()
        client.drop_database(db.name)
    finally:
        client.close()


def test_tailable_without_await_data_returns_an_empty_batch_and_stays_open(first_shard_client):
    db = first_shard_client[_name("tailn")]
    db.create_collection("c", capped=True, size=100_000)
    db.c.insert_one({"_id": 1})
    first = db.command("find", "c", tailable=True)
    cid = first["cursor"]["id"]
    assert [d["_id"] for d in first["cursor"]["firstBatch"]] == [1] and cid
    more = db.command("getMore", cid, collection="c")
    assert more["cursor"]["nextBatch"] == [] and more["cursor"]["id"] == cid
    db.c.insert_one({"_id": 2})
    more = db.command("getMore", cid, collection="c")
    assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [2]
    # The record the cursor is positioned on is evicted: CappedPositionLost.
    db.command("collMod", "c", cappedMax=1)
    db.c.insert_many([{"_id": 3}, {"_id": 4}])
    with pytest.raises(pymongo.errors.OperationFailure) as exc:
        db.command("getMore", cid, collection="c")
    assert exc.value.code == 136
    first_shard_client.drop_database(db.name)


def test_tailable_await_data_on_the_oplog(first_shard_client):
    import threading
    oplog = first_shard_client.local["oplog.rs"]
    last = oplog.find().sort("$natural", -1).limit(1).next()["ts"]
    cursor = oplog.find({"ts": {"$gt": last}},
                        cursor_type=pymongo.CursorType.TAILABLE_AWAIT).max_await_time_ms(60_000)
    name = _name("tailop")
    got: list = []

    def read() -> None:
        while cursor.alive:  # an empty first batch: pymongo's next() stops, the cursor lives
            for entry in cursor:
                if entry.get("ns") == f"{name}.c" and entry["op"] == "i":
                    got.append(entry["o"]["_id"])
                    return
    t = threading.Thread(target=read)
    t.start()
    _wait_for_getmore(first_shard_client, "local.oplog.rs")
    first_shard_client[name].c.insert_one({"_id": "x"})
    t.join(60)
    assert got == ["x"]
    cursor.close()
    first_shard_client.drop_database(name)


# -- exhaust cursors -----------------------------------------------------------------------------
def _host_port(target: str) -> tuple[str, int]:
    hostport = target.split("//", 1)[-1].split("/", 1)[0].split(",")[0]
    host, port = hostport.rsplit(":", 1)
    return host, int(port)


def _recv(sock) -> tuple[int, int, int, dict]:
    """One OP_MSG reply: (requestID, responseTo, flags, body)."""
    import struct

    import bson

    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return buf
    header = exactly(16)
    length, rid, response_to, op = struct.unpack("<iiii", header)
    payload = exactly(length - 16)
    assert op == 2013
    flags = struct.unpack_from("<I", payload)[0]
    return rid, response_to, flags, bson.decode(payload[5:])


def test_exhaust_getmore_streams_every_batch(target, cluster):
    import socket

    import bson

    from shardsim.core import wire
    client = pymongo.MongoClient(target, serverSelectionTimeoutMS=10000)
    name = _name("exh")
    client[name].c.insert_many([{"_id": i} for i in range(7)])
    try:
        with socket.create_connection(_host_port(target), timeout=30) as sock:
            sock.sendall(wire.encode_op_msg(bson.encode(
                {"find": "c", "batchSize": 2, "sort": {"_id": 1}, "$db": name}), request_id=1))
            _rid, _to, flags, reply = _recv(sock)
            cid = reply["cursor"]["id"]
            got = [d["_id"] for d in reply["cursor"]["firstBatch"]]
            sock.sendall(wire.encode_op_msg(bson.encode(
                {"getMore": cid, "collection": "c", "batchSize": 2, "$db": name}),
                request_id=2, flags=wire.FLAG_EXHAUST_ALLOWED))
            previous, chain = 2, []
            while True:  # no further request is sent: the server streams
                rid, response_to, flags, reply = _recv(sock)
                chain.append((response_to == previous, bool(flags & wire.FLAG_MORE_TO_COME)))
                got += [d["_id"] for d in reply["cursor"]["nextBatch"]]
                previous = rid
                if not flags & wire.FLAG_MORE_TO_COME:
                    break
        assert got == list(range(7))
        assert chain == [(True, True), (True, True), (True, False)]
        assert reply["cursor"]["id"] == 0
    finally:
        client.drop_database(name)
        client.close()


def test_exhaust_getmore_on_a_change_stream_streams_its_events(target, cluster):
    """A change stream's batches are spliced in as encoded bytes (router and shard alike): an
    exhaust getMore still streams them with moreToCome, and the first empty batch (nothing new
    within maxTimeMS) ends the chain."""
    import socket

    import bson

    from shardsim.core import wire
    client = pymongo.MongoClient(target, serverSelectionTimeoutMS=10000)
    name = _name("exhcs")
    client[name].create_collection("c")
    try:
        with socket.create_connection(_host_port(target), timeout=30) as sock:
            sock.sendall(wire.encode_op_msg(bson.encode(
                {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {},
                 "$db": name}), request_id=1))
            _rid, _to, _flags, reply = _recv(sock)
            cid = reply["cursor"]["id"]
            assert cid and reply["cursor"]["firstBatch"] == []
            client[name].c.insert_many([{"_id": i} for i in range(5)])
            got: list = []
            chain = []
            previous = 2
            deadline = 20
            sock.sendall(wire.encode_op_msg(bson.encode(
                {"getMore": cid, "collection": "c", "batchSize": 2, "maxTimeMS": 300,
                 "$db": name}), request_id=2, flags=wire.FLAG_EXHAUST_ALLOWED))
            while deadline:
                deadline -= 1
                rid, response_to, flags, reply = _recv(sock)
                batch = reply["cursor"]["nextBatch"]
                chain.append((response_to == previous, len(batch),
                              bool(flags & wire.FLAG_MORE_TO_COME)))
                got += [ev["documentKey"]["_id"] for ev in batch]
                previous = rid
                if not flags & wire.FLAG_MORE_TO_COME:
                    break
        assert got == list(range(5)), chain
        assert all(linked for linked, _n, _more in chain), chain
        # every non-empty batch continued the chain; it ended with an empty one
        assert [more for _l, n, more in chain] == [n > 0 for _l, n, _m in chain], chain
        assert chain[-1][1] == 0 and reply["cursor"]["id"] == cid
    finally:
        client.drop_database(name)
        client.close()


@pytest.mark.parametrize("compressor", [None, "zstd"])
def test_pymongo_exhaust_cursor_receives_every_document(target, compressor):
    kwargs = {"compressors": compressor} if compressor else {}
    client = pymongo.MongoClient(target, serverSelectionTimeoutMS=10000, **kwargs)
    name = _name("exhp")
    try:
        client[name].c.insert_many([{"_id": i, "v": "x" * 100} for i in range(250)])
        docs = list(client[name].c.find(cursor_type=pymongo.CursorType.EXHAUST,
                                        batch_size=7).sort("_id", 1))
        assert [d["_id"] for d in docs] == list(range(250))
        # The connection is back in the pool and usable.
        assert client[name].c.count_documents({}) == 250
    finally:
        client.drop_database(name)
        client.close()


def test_tailable_cursor_with_skip_and_limit(target):
    """A tailable find honours ``skip`` and ``limit`` (pymongo's ``cursor[1:2]`` on a capped
    collection), and a limit reached ends the cursor."""
    client = pymongo.MongoClient(target, serverSelectionTimeoutMS=10000)
    db = client[_name("tailskip")]
    db.create_collection("c", capped=True, size=4096, max=10)
    db.c.insert_many([{"x": i} for i in range(4, 7)])
    for kind in (pymongo.CursorType.TAILABLE, pymongo.CursorType.TAILABLE_AWAIT):
        assert [d["x"] for d in db.c.find(cursor_type=kind)[1:2]] == [5]
        assert [d["x"] for d in db.c.find(cursor_type=kind)[2:3]] == [6]
        cursor = db.c.find(cursor_type=kind, skip=1, limit=1)
        assert [d["x"] for d in cursor] == [5] and not cursor.alive
    client.drop_database(db.name)
    client.close()
