"""Resume, history and promises on real shard processes: 10,000 mixed operations with strictly
increasing tokens, resuming from every 100th token, a ``--dbpath`` shard killed with SIGKILL,
ChangeStreamHistoryLost, the periodic no-op writer and the two promise modes."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Iterator

import pymongo
import pytest
from bson import Int64, SON, Timestamp
from pymongo import DeleteOne, InsertOne, ReplaceOne, UpdateOne
from pymongo.errors import OperationFailure

from shardsim.core import resume_token as rt
from shardsim.core.client import Pool
from shardsim.core.clock import ts_key
from shardsim.tools.procs import RoleProcess


class _Procs:
    def __init__(self) -> None:
        self.started: list[RoleProcess] = []
        self.clients: list[pymongo.MongoClient] = []

    def start(self, name: str, *args: str) -> RoleProcess:
        p = RoleProcess("shard", ["--port", "0", "--shard-name", name, *args], name=name)
        self.started.append(p)
        return p.start()

    def client(self, p: RoleProcess) -> pymongo.MongoClient:
        c = pymongo.MongoClient(f"mongodb://{p.address}/?directConnection=true",
                                serverSelectionTimeoutMS=5000)
        self.clients.append(c)
        return c

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for p in self.started:
            p.stop()


@pytest.fixture
def procs() -> Iterator[_Procs]:
    ps = _Procs()
    try:
        yield ps
    finally:
        ps.close()


def _agg(db, coll, spec, batch_size):
    return db.command(SON([("aggregate", coll), ("pipeline", [{"$changeStream": spec}]),
                           ("cursor", {"batchSize": batch_size})]))


def _read_all(db, coll: str, spec: dict[str, Any], expect: int) -> list[dict[str, Any]]:
    r = _agg(db, coll, spec, 1000)["cursor"]
    out = list(r["firstBatch"])
    cid = r["id"]
    while len(out) < expect:
        g = db.command(SON([("getMore", Int64(cid)), ("collection", coll), ("batchSize", 5000),
                            ("maxTimeMS", 200)]))["cursor"]
        out.extend(g["nextBatch"])
        if not g["nextBatch"] and g["id"] == 0:
            break
    db.command("killCursors", coll, cursors=[cid])
    return out


def test_ten_thousand_mixed_ops_tokens_and_resume_suffixes(procs):
    p = procs.start("big0")
    c = procs.client(p)
    db = c.big
    coll = db.c
    coll.insert_one({"_id": -1})
    t0 = c.admin.command("ping")["operationTime"]
    start = Timestamp(t0.time, t0.inc + 1)
    rng = random.Random(7)
    live: list[int] = []
    ops: list[Any] = []
    next_id = 0
    for _ in range(10_000):
        r = rng.random()
        if r < 0.5 or len(live) < 10:
            ops.append(InsertOne({"_id": next_id, "v": 0, "s": "x" * rng.randrange(20)}))
            live.append(next_id)
            next_id += 1
        elif r < 0.75:
            ops.append(UpdateOne({"_id": rng.choice(live)}, {"$inc": {"v": 1}, "$set": {"t": r}}))
        elif r < 0.9:
            ops.append(ReplaceOne({"_id": rng.choice(live)}, {"v": -1}))
        else:
            victim = live.pop(rng.randrange(len(live)))
            ops.append(DeleteOne({"_id": victim}))
    for i in range(0, len(ops), 1000):
        coll.bulk_write(ops[i:i + 1000], ordered=True)
    events = _read_all(db, "c", {"startAtOperationTime": start}, 10_000)
    assert len(events) == 10_000
    kinds = {e["operationType"] for e in events}
    assert kinds == {"insert", "update", "replace", "delete"}
    prev = ""
    for e in events:
        d = rt.decode(e["_id"])
        assert d.clusterTime == e["clusterTime"]
        assert e["_id"]["_data"] > prev
        prev = e["_id"]["_data"]
    ids = [e["_id"]["_data"] for e in events]
    full_checks = {99, 4999, 9899}
    for i in range(99, 10_000, 100):
        token = events[i]["_id"]
        if i in full_checks:
            got = [e["_id"]["_data"] for e in _read_all(db, "c", {"resumeAfter": token}, 9_999 - i)]
            assert got == ids[i + 1:]
        else:
            first = _agg(db, "c", {"resumeAfter": token}, 150)["cursor"]
            assert [e["_id"]["_data"] for e in first["firstBatch"]] == ids[i + 1:i + 151]
            db.command("killCursors", "c", cursors=[first["id"]])


def test_durable_shard_sigkill_resume(procs, tmp_path):
    dbpath = tmp_path / "shard"
    p = procs.start("dur0", "--dbpath", str(dbpath))
    c = procs.client(p)
    coll = c.d.c
    coll.insert_one({"_id": -1})
    with coll.watch(max_await_time_ms=200) as cs:
        for i in range(30):
            coll.insert_one({"_id": i})
        coll.update_one({"_id": 3}, {"$set": {"x": 1}})
        seen = []
        while len(seen) < 31:
            ev = cs.try_next()
            if ev is not None:
                seen.append(ev)
    token = seen[10]["_id"]
    expected_before_kill = [e["_id"]["_data"] for e in seen[11:]]
    c.close()  # (a client of a dead server would wait out server selection at close)
    p.kill()
    p2 = procs.start("dur0", "--dbpath", str(dbpath))
    c2 = procs.client(p2)
    coll2 = c2.d.c
    for i in range(30, 35):
        coll2.insert_one({"_id": i})
    with coll2.watch(resume_after=token, max_await_time_ms=200) as cs:
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 25 and time.monotonic() < deadline:
            ev = cs.try_next()
            if ev is not None:
                got.append(ev)
        assert cs.try_next() is None
    assert [e["_id"]["_data"] for e in got[:20]] == expected_before_kill
    assert [e["documentKey"]["_id"] for e in got[20:]] == list(range(30, 35))
    assert len({e["_id"]["_data"] for e in got}) == len(got) == 25


def test_history_lost(procs):
    p = procs.start("hist0", "--oplog-max-age-s", "1")
    c = procs.client(p)
    coll = c.h.c
    coll.insert_one({"_id": 1})
    early = c.admin.command("ping")["operationTime"]
    time.sleep(2.2)
    coll.insert_one({"_id": 2})  # truncates everything older than 1 s
    with pytest.raises(OperationFailure) as ei:
        coll.watch(start_at_operation_time=early)
    assert ei.value.code == 286
    assert ei.value.details["codeName"] == "ChangeStreamHistoryLost"
    assert ei.value.details.get("errorLabels") == ["NonResumableChangeStreamError"]
    # a stream starting now is fine
    with coll.watch(max_await_time_ms=100) as cs:
        coll.insert_one({"_id": 3})
        deadline = time.monotonic() + 5
        ev = None
        while ev is None and time.monotonic() < deadline:
            ev = cs.try_next()
        assert ev["documentKey"] == {"_id": 3}


def _oplog_tail(c) -> dict[str, Any]:
    return c.local["oplog.rs"].find_one(sort=[("$natural", -1)])


def test_periodic_noop_writer(procs):
    p = procs.start("noop0", "--noop-interval-ms", "150")
    c = procs.client(p)
    first = c.local["oplog.rs"].find_one(sort=[("$natural", 1)])
    assert first["op"] == "n" and first["o"] == {"msg": "initiating set"} and first["ns"] == ""
    time.sleep(0.8)
    noops = list(c.local["oplog.rs"].find({"op": "n", "o.msg": "periodic noop"}))
    assert len(noops) >= 2
    assert all(n["ns"] == "" for n in noops)


def test_promise_mode_mongod_advances_only_by_oplog(procs):
    p = procs.start("pm0", "--promise-mode", "mongod", "--noop-interval-ms", "300")
    c = procs.client(p)
    db = c.p
    db.c.insert_one({"_id": 1})
    cur = _agg(db, "c", {}, 0)["cursor"]
    pbrt0 = rt.decode(cur["postBatchResumeToken"]).clusterTime
    time.sleep(0.05)
    g = db.command(SON([("getMore", Int64(cur["id"])), ("collection", "c"), ("maxTimeMS", 50)]))
    tail = _oplog_tail(c)["ts"]
    p1 = rt.decode(g["cursor"]["postBatchResumeToken"])
    assert rt.is_high_water_mark(p1)
    # mongod mode: the promise is an oplog time (the start point or a scanned entry), never ahead
    assert p1.clusterTime <= max(tail, pbrt0)
    time.sleep(0.9)  # idle: the no-op writer writes; the promise follows the oplog
    g = db.command(SON([("getMore", Int64(cur["id"])), ("collection", "c"), ("maxTimeMS", 50)]))
    p2 = rt.decode(g["cursor"]["postBatchResumeToken"]).clusterTime
    tail2 = _oplog_tail(c)
    assert p2 > p1.clusterTime
    assert tail2["o"] == {"msg": "periodic noop"} and p2 == tail2["ts"]


def test_promise_mode_clock_uses_cluster_time(procs):
    p = procs.start("pc0", "--noop-interval-ms", "100000")
    c = procs.client(p)
    db = c.p
    db.c.insert_one({"_id": 1})
    cur = _agg(db, "c", {}, 0)["cursor"]
    c.other.x.insert_one({"_id": 1})  # an unrelated write moves the shard's clock and oplog
    g = db.command(SON([("getMore", Int64(cur["id"])), ("collection", "c"), ("maxTimeMS", 50)]))
    p1 = rt.decode(g["cursor"]["postBatchResumeToken"])
    assert rt.is_high_water_mark(p1)
    assert p1.clusterTime >= _oplog_tail(c)["ts"]
    # HWM(cluster time + 1 tick): every later entry is at or after it (shard/change_stream/cursor.py)
    assert ts_key(p1.clusterTime) <= ts_key(g["$clusterTime"]["clusterTime"]) + 1
    # gossip moves the shard's cluster time forward; an idle batch promises it
    ahead = Timestamp(g["$clusterTime"]["clusterTime"].time + 5, 1)
    # (pymongo replaces $clusterTime with its own, so gossip through the project's client)
    host, port = p.address.rsplit(":", 1)

    async def gossip_get_more():
        pool = Pool(host, int(port))
        try:
            return await pool.command("p", {"getMore": Int64(cur["id"]), "collection": "c",
                                            "maxTimeMS": 50,
                                            "$clusterTime": {"clusterTime": ahead,
                                                             "signature": g["$clusterTime"]["signature"]}})
        finally:
            pool.close()

    g2 = asyncio.run(gossip_get_more())
    p2 = rt.decode(g2["cursor"]["postBatchResumeToken"]).clusterTime
    assert p2 >= ahead
    db.c.insert_one({"_id": 2})
    g3 = db.command(SON([("getMore", Int64(cur["id"])), ("collection", "c"), ("maxTimeMS", 500)]))
    ev = g3["cursor"]["nextBatch"][0]
    # nothing is ever appended below a promise; an event at the promised time sorts after it
    assert ev["clusterTime"] >= p2
    assert ev["_id"]["_data"] > g2["cursor"]["postBatchResumeToken"]["_data"]
