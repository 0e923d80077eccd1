"""The router's change-stream cursor (router/change_stream/cursor.py, promise_requests.py) and
fail points (shardsim/failpoints.py) driven by pymongo, with in-process fake shards.

The fake shards speak the shard side of the contract (``needsMerge`` events with ``$sortKey``
last, ``postBatchResumeToken`` on every reply, clock-mode promises) so these tests pin the
router's behaviour on its own: ordering across shards, raw passthrough, new shards seen on the
config.shards cursor, errors and labels, killCursors, fail points. Real processes are covered by
tests/integration/test_router_change_stream*.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pymongo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest
from bson.int64 import Int64
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from shardsim.core.resume_token import hwm_token
from shardsim.router.change_stream.promise_requests import PromiseRequests
from shardsim.core.resume_token import token_key
from shardsim.core import resume_token as rt
from shardsim.core.client import Pool
from shardsim.core.clock import ts_key
from shardsim.core.commands import Request
from shardsim.core.cursors import Batch, Cursor
from shardsim.core.errors import MongoError
from shardsim.core.node import Node
from shardsim.core.server import Server


UUID = bytes(range(16))


def _token(ts: Timestamp, doc_id: Any, op: str = "insert") -> dict:
    return rt.event_token(ts, UUID, op, {"_id": doc_id})


class FakeShardCursor(Cursor):
    is_change_stream = True
    tailable = await_data = True

    def __init__(self, shard: "FakeShard", ns: str, start: dict, resume: bool) -> None:
        super().__init__(ns)
        self.shard = shard
        self.start_key = token_key(start)
        self.resume = resume
        self.pbrt = start
        self.pos = 0

    def _ready(self) -> list:
        return [e for e in self.shard.events[self.pos:]]

    async def fetch(self, batch_size, max_time_ms, *, first):
        sh = self.shard
        if first and batch_size == 0:
            return Batch([], False, self.pbrt)
        if sh.fail_getmore is not None:
            code, sh.fail_getmore = sh.fail_getmore, None
            raise MongoError(code, f"fake shard {sh.name} failing getMore")
        deadline = time.monotonic() + (max_time_ms or 1000) / 1000
        while True:
            out = []
            while self.pos < len(sh.events) and (not batch_size or len(out) < batch_size):
                tok, doc = sh.events[self.pos]
                self.pos += 1
                if token_key(tok) < self.start_key:
                    continue
                out.append(doc)
            if out:
                self.pbrt = out[-1]["_id"]
                return Batch(out, False, self.pbrt)
            if time.monotonic() >= deadline:
                break
            if sh.requested_key >= token_key(self.pbrt)[0][2:18] and sh.answer_requests:
                break  # a promise past the requested time is wanted: answer now (clock mode)
            sh.changed.clear()
            try:
                await asyncio.wait_for(sh.changed.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                pass
        # clock mode: nothing below the next tick can appear
        cand = hwm_token(max(sh.clock.now_key(), int(time.time()) << 32) + 1)
        if token_key(cand) > token_key(self.pbrt):
            self.pbrt = cand
        return Batch([], False, self.pbrt)


class FakeShard(Node):
    def __init__(self, name: str, idx: int) -> None:
        super().__init__()
        self.name = name
        self.idx = idx
        self.events: list[tuple[dict, dict]] = []
        self.changed = asyncio.Event()
        self.fail_getmore: int | None = None
        self.seq = 0
        self.aggregates: list[dict] = []
        self.killed: list[int] = []
        self.requests: list[Timestamp] = []  # _shardsimAdvanceClusterTime received
        self.requested_key = ""  # hex of the highest requested time (compares like _data)
        self.answer_requests = True

        async def advance(req: Request) -> dict:
            ts = req.body["_shardsimAdvanceClusterTime"]
            self.requests.append(ts)
            self.clock.advance(ts)
            self.requested_key = max(self.requested_key, f"{ts_key(ts):016X}")
            self.changed.set()
            return {}

        self.commands.register("_shardsimAdvanceClusterTime", advance)

        async def aggregate(req: Request) -> dict:
            self.aggregates.append(req.body)
            spec = req.body["pipeline"][0]["$changeStream"]
            tok = spec.get("resumeAfter") or spec.get("startAfter")
            if tok is None:
                tok = hwm_token(ts_key(spec["startAtOperationTime"]))
            ns = f"{req.db}.{req.body['aggregate']}"
            cur = FakeShardCursor(self, ns, dict(tok), tok is not None)
            return {"cursor": await self.cursors.run_first_batch(cur, req.body["cursor"]["batchSize"])}

        self.commands.register("aggregate", aggregate)
        orig_kill = self.cursors.kill

        async def kill(ids):
            self.killed.extend(int(i) for i in ids)
            return await orig_kill(ids)
        self.cursors.kill = kill

    def write(self, doc: dict, *, op: str = "insert", ns: tuple = ("db", "coll"), bad_id: bool = False) -> dict:
        ts = self.clock.tick()
        self.seq += 1
        tok = _token(ts, doc.get("_id"), op)
        ev = {"_id": tok, "operationType": op, "clusterTime": ts,
              "ns": {"db": ns[0], "coll": ns[1]}, "fullDocument": doc}
        if bad_id:
            ev["_id"] = {"_data": "00"}
        ev["$sortKey"] = [tok]
        self.events.append((tok, ev))
        self.changed.set()
        return tok


class FakeCatalog:
    def __init__(self, addrs: dict) -> None:
        self.addrs = addrs

    async def refresh(self) -> None:
        return None

    def shards(self):
        return [(n, h, p) for n, (h, p) in self.addrs.items()]

    def shard_address(self, name):
        return self.addrs.get(name)


class FakeRouter(Node):
    """Just enough of router.node.RouterNode for router/change_stream/ and shardsim/failpoints.py."""

    def __init__(self, shard_addrs: dict, config_addr: tuple, test_commands: bool = True) -> None:
        super().__init__(test_commands=test_commands)
        self.catalog = FakeCatalog(dict(shard_addrs))
        self.config_pool = Pool(*config_addr)
        self._pools: dict = {}
        self.promise_requests = PromiseRequests(self.clock)
        from shardsim.router import change_stream
        from shardsim.core import failpoints

        async def aggregate(req: Request) -> dict:
            return await change_stream.aggregate_change_stream(self, req)

        self.commands.register("aggregate", aggregate)
        failpoints.install(self)

    def pool_for(self, name):
        addr = self.catalog.shard_address(name)
        if addr is None:
            raise MongoError(70, f"Shard {name} not found")
        if name not in self._pools:
            self._pools[name] = Pool(*addr)
        return self._pools[name]

    async def establish_cursor(self, name, db, cmd, *, raw=False, read_preference=None):
        from shardsim.core.gossip import gossip_command
        pool = self.pool_for(name)
        return pool, await gossip_command(self.clock, pool, db, cmd, raw=raw)

    def process_name(self):
        return "mongos"


class Harness:
    """Fake shards + a fake config server + a router, on one background event loop."""

    def __init__(self, n: int = 3, test_commands: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.shards: list[FakeShard] = []
        self.servers: list[Server] = []
        for i in range(n):
            self.shards.append(self.call(self._start_shard, f"shard{i:02d}", i))
        self.config = self.call(self._start_shard, "config", 99)
        addrs = {s.name: ("127.0.0.1", s.port) for s in self.shards}
        self.router = self.call(self._start_router, addrs, ("127.0.0.1", self.config.port), test_commands)
        self.client = pymongo.MongoClient("127.0.0.1", self.router.port, directConnection=True,
                                          serverSelectionTimeoutMS=5000, appname="harness")

    def call(self, fn, *args):
        async def run():
            return await fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def do(self, fn, *args):
        """Run a plain function on the loop thread (the fake shards are not thread-safe)."""
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    async def _start_shard(self, name, idx):
        sh = FakeShard(name, idx)
        sh.changed = asyncio.Event()
        srv = Server(sh, "127.0.0.1", 0)
        await srv.start()
        self.servers.append(srv)
        return sh

    async def _start_router(self, addrs, cfg, tc):
        r = FakeRouter(addrs, cfg, tc)
        srv = Server(r, "127.0.0.1", 0)
        await srv.start()
        self.servers.append(srv)
        self.router_server = srv
        return r

    async def _add_shard(self, name, idx):
        sh = await self._start_shard(name, idx)
        self.shards.append(sh)
        self.router.catalog.addrs[name] = ("127.0.0.1", sh.port)
        return sh

    def add_shard(self, name: str) -> FakeShard:
        sh = self.call(self._add_shard, name, len(self.shards))
        # the config server records it (a config.shards insert) after the shard is known
        tok = self.do(lambda: self.config.write({"_id": name, "host": f"127.0.0.1:{sh.port}"},
                                                op="insert", ns=("config", "shards")))
        # the new shard learns the cluster time before taking writes (gossip via the router)
        self.do(lambda: sh.clock.advance(rt.decode(tok).clusterTime))
        return sh

    def write(self, i: int, doc: dict) -> dict:
        return self.do(self.shards[i].write, doc)

    def close(self):
        self.client.close()

        async def stop():
            for s in self.servers:
                await s.close()
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            self.call(stop)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


@pytest.fixture
def h():
    harness = Harness()
    try:
        yield harness
    finally:
        harness.close()


def _gossip_all(h: Harness) -> None:
    """Make the shards' clocks agree roughly (as cluster-time gossip would)."""
    def sync():
        top = max(s.clock.now_key() for s in h.shards + [h.config])
        for s in h.shards + [h.config]:
            s.clock.advance(Timestamp(top >> 32, top & 0xFFFFFFFF))
    h.do(sync)


def test_initial_aggregate_shape_and_shard_requests(h):
    coll = h.client.db.coll
    reply = h.client.db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})
    cur = reply["cursor"]
    assert cur["firstBatch"] == [] and cur["id"] != 0 and cur["ns"] == "db.coll"
    assert "postBatchResumeToken" in cur and "operationTime" in reply
    for sh in h.shards:
        body = sh.aggregates[-1]
        assert body["needsMerge"] is True and body["fromRouter"] is True
        assert body["cursor"] == {"batchSize": 0}
        assert isinstance(body["pipeline"][0]["$changeStream"]["startAtOperationTime"], Timestamp)
    starts = {str(sh.aggregates[-1]["pipeline"][0]["$changeStream"]["startAtOperationTime"]) for sh in h.shards}
    assert len(starts) == 1  # the same explicit start point on every shard
    cfg = h.config.aggregates[-1]
    assert cfg["aggregate"] == "shards" and cfg["pipeline"][0]["$changeStream"]["allowToRunOnConfigDB"]
    h.client.db.command({"killCursors": "coll", "cursors": [cur["id"]]})
    del coll


def test_merged_order_across_shards_and_raw_passthrough(h):
    coll = h.client.db.coll
    with coll.watch(max_await_time_ms=200) as stream:
        toks = []
        for i in range(30):
            _gossip_all(h) if i % 7 == 0 else None
            toks.append(h.write(i % 3, {"_id": i, "x": "y" * (i % 5)}))
        got = []
        deadline = time.time() + 20
        while len(got) < 30 and time.time() < deadline:
            ch = stream.try_next()
            if ch is not None:
                got.append(ch)
        assert len(got) == 30
        datas = [c["_id"]["_data"] for c in got]
        assert datas == sorted(datas) and len(set(datas)) == 30
        assert sorted(datas) == sorted(t["_data"] for t in toks)
        assert all("$sortKey" not in c for c in got)
        assert {c["fullDocument"]["_id"] for c in got} == set(range(30))


def test_getmore_waits_then_returns_empty_batch_with_pbrt(h):
    db = h.client.db
    reply = db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})
    cid = reply["cursor"]["id"]
    pbrt0 = reply["cursor"]["postBatchResumeToken"]
    t0 = time.monotonic()
    more = db.command({"getMore": cid, "collection": "coll", "maxTimeMS": 300})
    took = time.monotonic() - t0
    assert more["cursor"]["nextBatch"] == [] and more["cursor"]["id"] == cid
    assert 0.25 <= took < 3
    assert more["cursor"]["postBatchResumeToken"]["_data"] >= pbrt0["_data"]
    # An event makes the next getMore return at once.
    h.write(1, {"_id": "a"})
    t0 = time.monotonic()
    got = []
    while not got and time.monotonic() - t0 < 10:
        got = db.command({"getMore": cid, "collection": "coll", "maxTimeMS": 5000})["cursor"]["nextBatch"]
    assert len(got) == 1 and time.monotonic() - t0 < 4
    db.command({"killCursors": "coll", "cursors": [cid]})


def test_new_shard_seen_on_config_cursor(h):
    coll = h.client.db.coll
    with coll.watch(max_await_time_ms=200) as stream:
        h.write(0, {"_id": 1})
        first = stream.try_next()  # may already carry the event (idle remotes answer at once)
        new = h.add_shard("shard09")
        tok = h.do(new.write, {"_id": "on-new-shard"})
        h.write(1, {"_id": 2})
        got = [first] if first is not None else []
        deadline = time.time() + 20
        while len(got) < 3 and time.time() < deadline:
            ch = stream.try_next()
            if ch is not None:
                got.append(ch)
        ids = [c["fullDocument"]["_id"] for c in got]
        assert sorted(map(str, ids)) == sorted(["1", "on-new-shard", "2"])
        assert [c["_id"]["_data"] for c in got] == sorted(c["_id"]["_data"] for c in got)
        # the new shard was opened from HWM(addShard clusterTime + 1), never with startAtOperationTime
        spec = new.aggregates[-1]["pipeline"][0]["$changeStream"]
        assert "startAtOperationTime" not in spec and spec["resumeAfter"]["_data"] < tok["_data"]


def test_remote_error_fails_getmore_with_router_labels_and_kills_other_cursors(h):
    db = h.client.db
    reply = db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})
    cid = reply["cursor"]["id"]
    h.do(setattr, h.shards[1], "fail_getmore", 262)
    with pytest.raises(OperationFailure) as ei:
        for _ in range(5):
            db.command({"getMore": cid, "collection": "coll", "maxTimeMS": 500})
    assert ei.value.code == 262
    assert ei.value.details.get("errorLabels") == ["ResumableChangeStreamError"]
    deadline = time.time() + 5
    while time.time() < deadline and not (h.shards[0].killed and h.shards[2].killed):
        time.sleep(0.05)
    assert h.shards[0].killed and h.shards[2].killed and h.config.killed
    with pytest.raises(OperationFailure) as ei:
        db.command({"getMore": cid, "collection": "coll"})
    assert ei.value.code == 43


def test_non_resumable_remote_error_label(h):
    db = h.client.db
    cid = db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})["cursor"]["id"]
    h.do(setattr, h.shards[0], "fail_getmore", 286)
    with pytest.raises(OperationFailure) as ei:
        for _ in range(5):
            db.command({"getMore": cid, "collection": "coll", "maxTimeMS": 300})
    assert ei.value.code == 286
    assert ei.value.details.get("errorLabels") == ["NonResumableChangeStreamError"]


def test_modified_id_is_280_without_resumable_label(h):
    db = h.client.db
    cid = db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})["cursor"]["id"]
    h.do(lambda: h.shards[0].write({"_id": 1}, bad_id=True))
    _gossip_all(h)
    with pytest.raises(OperationFailure) as ei:
        for _ in range(10):
            db.command({"getMore": cid, "collection": "coll", "maxTimeMS": 300})
    assert ei.value.code == 280
    assert "ResumableChangeStreamError" not in (ei.value.details.get("errorLabels") or [])


def test_kill_cursors_kills_remote_cursors(h):
    db = h.client.db
    cid = db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})["cursor"]["id"]
    res = db.command({"killCursors": "coll", "cursors": [cid]})
    assert res["cursorsKilled"] == [cid]
    deadline = time.time() + 5
    while time.time() < deadline and not all(s.killed for s in h.shards + [h.config]):
        time.sleep(0.05)
    assert all(len(s.killed) == 1 for s in h.shards + [h.config])


def test_shard_that_disappears_gives_resumable_network_error(h):
    db = h.client.db
    cid = db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})["cursor"]["id"]
    srv = h.servers[1]

    async def stop():
        srv._server.close()
        for w in list(srv._conns):
            w.close()
    h.call(stop)
    with pytest.raises(OperationFailure) as ei:
        for _ in range(10):
            db.command({"getMore": cid, "collection": "coll", "maxTimeMS": 300})
    assert ei.value.code in (6, 9001, 89)
    assert ei.value.details.get("errorLabels") == ["ResumableChangeStreamError"]


def test_resume_from_event_token_and_missing_token(h):
    coll = h.client.db.coll
    with coll.watch(max_await_time_ms=200) as stream:
        for i in range(6):
            h.write(i % 3, {"_id": i})
            _gossip_all(h)
        got = []
        deadline = time.time() + 20
        while len(got) < 6 and time.time() < deadline:
            ch = stream.try_next()
            if ch is not None:
                got.append(ch)
    assert len(got) == 6
    with coll.watch(resume_after=got[2]["_id"], max_await_time_ms=200) as s2:
        rest = []
        deadline = time.time() + 20
        while len(rest) < 3 and time.time() < deadline:
            ch = s2.try_next()
            if ch is not None:
                rest.append(ch)
    assert [c["_id"] for c in rest] == [c["_id"] for c in got[3:]]
    # A token no shard has: the first later event proves it is missing -> 280, already on the
    # aggregate (its first batch waits for that proof, as a connector expects).
    bogus = _token(got[2]["clusterTime"], "no-such-document")
    with pytest.raises(OperationFailure) as ei:
        h.client.db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {"resumeAfter": bogus}}],
                             "cursor": {}})
    assert ei.value.code == 280
    assert ei.value.details.get("errorLabels") == ["NonResumableChangeStreamError"]
    assert "the resume token was not found" in str(ei.value)


def test_fail_command_fail_point(h):
    db = h.client.admin
    db.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                "data": {"failCommands": ["getMore"], "errorCode": 6}})
    cid = h.client.db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})["cursor"]["id"]
    with pytest.raises(OperationFailure) as ei:
        h.client.db.command({"getMore": cid, "collection": "coll", "maxTimeMS": 100})
    assert ei.value.code == 6 and ei.value.details["errmsg"] == "Failing command via 'failCommand' failpoint"
    assert "errorLabels" not in ei.value.details  # only the labels the fail point was given
    # times: 1 is used up; the cursor still works
    more = h.client.db.command({"getMore": cid, "collection": "coll", "maxTimeMS": 100})
    assert more["cursor"]["id"] == cid
    db.command({"configureFailPoint": "failCommand", "mode": "alwaysOn",
                "data": {"failCommands": ["ping"], "errorCode": 91, "appName": "other-app",
                         "errorLabels": ["ResumableChangeStreamError"]}})
    h.client.admin.command("ping")  # appName does not match
    db.command({"configureFailPoint": "failCommand", "mode": {"skip": 1},
                "data": {"failCommands": ["ping"], "errorCode": 262,
                         "errorLabels": ["ResumableChangeStreamError"]}})
    h.client.admin.command("ping")  # skipped once
    with pytest.raises(OperationFailure) as ei:
        h.client.admin.command("ping")
    assert ei.value.code == 262 and ei.value.details["errorLabels"] == ["ResumableChangeStreamError"]
    db.command({"configureFailPoint": "failCommand", "mode": "off"})
    h.client.admin.command("ping")


def test_fail_command_close_connection(h):
    h.client.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                            "data": {"failCommands": ["ping"], "closeConnection": True}})
    with pytest.raises(pymongo.errors.AutoReconnect):
        h.client.admin.command("ping")
    h.client.admin.command("ping")


def test_fail_getmore_after_cursor_checkout(h):
    db = h.client.db
    for code, labels in ((262, ["ResumableChangeStreamError"]), (9, None)):
        cid = db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})["cursor"]["id"]
        h.client.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout",
                                "mode": {"times": 1}, "data": {"errorCode": code}})
        with pytest.raises(OperationFailure) as ei:
            db.command({"getMore": cid, "collection": "coll", "maxTimeMS": 100})
        assert ei.value.code == code
        assert ei.value.details.get("errorLabels") == labels
    with pytest.raises(OperationFailure) as ei:
        db.command({"getMore": Int64(12345), "collection": "coll"})
    assert ei.value.code == 43


def test_configure_fail_point_needs_test_commands():
    harness = Harness(n=1, test_commands=False)
    try:
        with pytest.raises(OperationFailure) as ei:
            harness.client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        assert ei.value.code == 59
    finally:
        harness.close()


def test_pymongo_resumes_after_resumable_error(h):
    coll = h.client.db.coll
    with coll.watch(max_await_time_ms=200) as stream:
        h.write(0, {"_id": "before"})
        _gossip_all(h)
        first = None
        deadline = time.time() + 10
        while first is None and time.time() < deadline:
            first = stream.try_next()
        h.client.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout",
                                "mode": {"times": 1}, "data": {"errorCode": 91}})
        h.write(1, {"_id": "after"})
        _gossip_all(h)
        second = None
        deadline = time.time() + 10
        while second is None and time.time() < deadline:
            second = stream.try_next()
    assert first["fullDocument"]["_id"] == "before" and second["fullDocument"]["_id"] == "after"


def test_fail_command_block_connection_and_write_concern_error(h):
    admin = h.client.admin
    admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                   "data": {"failCommands": ["ping"], "blockConnection": True, "blockTimeMS": 300}})
    t0 = time.monotonic()
    admin.command("ping")
    assert time.monotonic() - t0 >= 0.28
    admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                   "data": {"failCommands": ["ping"],
                            "writeConcernError": {"code": 91, "errmsg": "Replication is being shut down"}}})
    reply = admin.command("ping")  # the command runs; the reply carries the injected error
    assert reply["writeConcernError"]["code"] == 91
    with pytest.raises(OperationFailure) as ei:
        admin.command({"configureFailPoint": "noSuchFailPoint", "mode": "off"})
    assert ei.value.code == 2
    with pytest.raises(OperationFailure) as ei:
        admin.command({"configureFailPoint": "failCommand", "mode": "sometimes"})
    assert ei.value.code == 2


def test_fail_aggregate_is_not_resumed_by_pymongo(h):
    h.client.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                            "data": {"failCommands": ["aggregate"], "errorCode": 2}})
    with pytest.raises(OperationFailure) as ei:
        h.client.db.coll.watch()
    assert ei.value.code == 2
    with h.client.db.coll.watch() as stream:  # times: 1 was used up
        assert stream.alive


def test_router_rejects_non_majority_read_concern_and_migration_events(h):
    from pymongo.read_concern import ReadConcern
    with pytest.raises(OperationFailure) as ei:
        h.client.db.get_collection("coll", read_concern=ReadConcern("local")).watch()
    assert ei.value.code == 72
    with h.client.db.get_collection("coll", read_concern=ReadConcern("majority")).watch() as s:
        assert s.alive
    with pytest.raises(OperationFailure) as ei:
        h.client.db.command({"aggregate": "coll", "cursor": {},
                             "pipeline": [{"$changeStream": {"showMigrationEvents": True}}]})
    assert ei.value.code == 31123
    assert all(not sh.aggregates or "showMigrationEvents" not in
               sh.aggregates[-1]["pipeline"][0]["$changeStream"] for sh in h.shards)


def test_kill_cursors_while_a_getmore_waits(h):
    db = h.client.db
    cid = db.command({"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})["cursor"]["id"]
    result: dict = {}

    def waiter():
        try:
            result["reply"] = db.command({"getMore": cid, "collection": "coll", "maxTimeMS": 3000})
        except OperationFailure as exc:
            result["error"] = exc

    t = threading.Thread(target=waiter)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.3)
    other = pymongo.MongoClient("127.0.0.1", h.router.port, directConnection=True)
    try:
        killed = other.db.command({"killCursors": "coll", "cursors": [cid]})
    finally:
        other.close()
    t.join(10)
    assert killed["cursorsKilled"] == [cid]
    assert time.monotonic() - t0 < 2.5  # the waiting getMore returned early
    assert "reply" in result or result["error"].code in (43, 237)
    with pytest.raises(OperationFailure) as ei:
        db.command({"getMore": cid, "collection": "coll"})
    assert ei.value.code == 43


def _watch_and_time_one_insert(h: Harness, await_ms: int = 1000) -> tuple[float, dict, dict]:
    """Open a stream, let every remote settle into a long-await getMore, write one event on
    shard00 and time how long the watcher takes to get it."""
    coll = h.client.db.coll
    _gossip_all(h)
    with coll.watch(max_await_time_ms=await_ms) as stream:
        stream.try_next()
        time.sleep(0.3 * await_ms / 1000)  # the remotes' getMores are now waiting
        t0 = time.monotonic()
        tok = h.write(0, {"_id": 1})
        ch = None
        while ch is None and time.monotonic() - t0 < 5:
            ch = stream.try_next()
        return time.monotonic() - t0, tok, ch


def test_event_held_by_idle_remotes_triggers_promise_requests(h):
    took, tok, ch = _watch_and_time_one_insert(h)
    assert ch is not None and ch["_id"] == tok
    t = rt.decode(tok).clusterTime
    # The idle remotes (and the config server) were asked for a promise past the event...
    for sh in h.shards[1:] + [h.config]:
        assert sh.requests and max(sh.requests) >= t, sh.name
    assert h.shards[0].requests == [] or max(h.shards[0].requests) < t  # not the one holding it
    # ...so the event did not wait for their 1 s await periods.
    assert took < 0.6, took


def test_promise_request_ignored_still_bounded_by_await_and_order_kept(h):
    for sh in h.shards + [h.config]:
        sh.answer_requests = False  # e.g. a shard that does not know the request
    took, tok, ch = _watch_and_time_one_insert(h, await_ms=300)
    assert ch is not None and ch["_id"] == tok  # released only once every remote promised
    assert took < 2.0


def test_router_prefetches_a_remote_backlog_while_the_client_reads(h):
    # A full shard batch (REMOTE_BATCH_SIZE events) means a backlog: the router asks for the
    # next one at once instead of when its buffer is empty, so the shards keep reading.
    from shardsim.router.change_stream.cursor import REMOTE_BATCH_SIZE
    coll = h.client.db.coll
    with coll.watch(max_await_time_ms=200, batch_size=10) as stream:
        for i in range(2 * REMOTE_BATCH_SIZE + 100):
            h.write(0, {"_id": i})
        _gossip_all(h)
        assert stream.next()["fullDocument"]["_id"] == 0
        cur = h.do(lambda: next(c for c in h.shards[0].cursors.all()))
        deadline = time.time() + 10
        while cur.pos < len(h.shards[0].events) and time.time() < deadline:
            time.sleep(0.05)
        # the whole backlog left the shard although the client took only one small batch
        assert cur.pos == len(h.shards[0].events)
        got = [stream.next()["fullDocument"]["_id"] for _ in range(2 * REMOTE_BATCH_SIZE + 99)]
        assert got == list(range(1, 2 * REMOTE_BATCH_SIZE + 100))


def test_promise_requests_one_at_a_time_coalesced_and_survive_a_closed_channel(h):
    """router/change_stream/promise_requests.py ``PromiseRequests.send``: requests go out on one
    kept connection per shard, one at a time; what is wanted while one is out is coalesced into
    the newest time, sent when its reply is in; a channel the shard closed is replaced by a new
    connection."""
    state = h.router.promise_requests
    sh = h.shards[1]
    pool = Pool("127.0.0.1", sh.port)
    addr = pool.address

    async def burst(keys):
        for k in keys:
            state.send(pool, addr, k)
        await asyncio.sleep(0.2)  # connect + the shard answering them

    base = ts_key(Timestamp(2_000_000_000, 1))
    h.call(burst, [base, base + 1, base + 2, base + 3])
    got = h.do(lambda: [ts_key(t) for t in sh.requests])
    # The first goes out at once; of the rest, only the newest wanted once its reply is in.
    assert got == [base, base + 3], got
    conn = state.channels[addr]
    assert state.pending == {} and state.want == {}

    h.call(burst, [base + 4, base + 5, base + 6])
    got = h.do(lambda: [ts_key(t) for t in sh.requests])
    assert got == [base, base + 3, base + 4, base + 6], got

    h.call(burst, [base + 5])  # not newer than what was asked: nothing sent
    assert h.do(lambda: len(sh.requests)) == 4

    # The shard closes the channel (e.g. it restarted): the next request opens a new one.
    async def close_server_side():
        srv = next(s for s in h.servers if s.node is sh)
        for w in list(srv._conns):
            w.close()
        await asyncio.sleep(0.05)
    h.call(close_server_side)
    h.call(burst, [base + 7])
    got = h.do(lambda: [ts_key(t) for t in sh.requests])
    assert got[-1] == base + 7, got
    assert state.channels[addr] is not conn
    h.do(state.close)
    assert state.channels == {}




def test_promise_requests_sent_before_a_write_is_forwarded(h):
    """router/change_stream/promise_requests.py ``PromiseRequests.before_shard_write``: before
    a write on a watched namespace goes to its shard, the stream's other remotes with a getMore
    out (the idle shards and the config server) are asked for a promise past the time the
    router's clock would tick to + statements + EARLY_TICKS; the written shard is not asked, a
    namespace no stream watches asks nobody, and asking again for no newer time sends
    nothing."""
    from shardsim.router.change_stream.promise_requests import EARLY_TICKS
    coll = h.client.db.coll
    _gossip_all(h)
    names = [sh.name for sh in h.shards + [h.config]]

    def counts():
        return h.do(lambda: {sh.name: len(sh.requests) for sh in h.shards + [h.config]})

    with coll.watch(max_await_time_ms=3000) as stream:
        stream.try_next()
        waiter = threading.Thread(target=stream.try_next)  # a client getMore waiting: the
        waiter.start()                                     # remotes have getMores out
        try:
            time.sleep(0.5)
            state = h.router.promise_requests
            before = counts()

            async def early(ns, statements):
                now = h.router.clock.next_tick_key()
                state.before_shard_write([h.shards[0].name], ns, statements)
                await asyncio.sleep(0.3)  # the requests reach the shards and are answered
                return now

            h.call(early, "other.coll", 1)  # no stream sees it
            assert counts() == before
            now = h.call(early, "db.coll", 3)
            want = now + 3 + EARLY_TICKS
            for sh in h.shards[1:] + [h.config]:
                got = h.do(lambda: [ts_key(t) for t in sh.requests])
                assert len(got) == before[sh.name] + 1 and got[-1] == want, (sh.name, got, want)
            assert counts()[h.shards[0].name] == before[h.shards[0].name]
            after = counts()
            h.call(_noop_write, state, h)
            assert counts() == after  # nothing newer to ask for: nothing sent
            assert set(after) == set(names)
        finally:
            waiter.join(10)


async def _noop_write(state, h) -> None:
    """``before_shard_write`` for a write of no statements whose time was already asked for."""
    state.sent = {k: v + (1 << 40) for k, v in state.sent.items()}  # asked for far later already
    state.before_shard_write([h.shards[0].name], "db.coll", 0)
    await asyncio.sleep(0.2)


def test_write_schedules_the_getmores_of_remotes_with_none_out(h):
    """router/change_stream/promise_requests.py ``PromiseRequests.ask_watchers``: when a write
    on a watched namespace comes while remotes have no getMore out (their last one ended with
    nothing while the client was between getMores), the stream's remote getMores are scheduled
    at once (as the client's next getMore would) and the idle remotes are asked for a promise,
    instead of waiting for the client's next getMore and a round trip after it."""
    coll = h.client.db.coll
    _gossip_all(h)
    with coll.watch(max_await_time_ms=200) as stream:
        stream.try_next()
        state = h.router.promise_requests
        st = next(iter(state.streams))
        deadline = time.time() + 5
        while any(r.in_flight for r in st.merger.remotes) and time.time() < deadline:
            time.sleep(0.05)  # the remotes' 200 ms getMores end; no client getMore is waiting
        before = h.do(lambda: {r.rid: r.batches for r in st.merger.remotes})
        asked = h.do(lambda: {sh.name: len(sh.requests) for sh in h.shards + [h.config]})
        assert not any(r.in_flight for r in st.merger.remotes)

        async def write_comes():
            state.before_shard_write([h.shards[0].name], "db.coll", 1)
            flying = [r.in_flight for r in st.merger.remotes]
            await asyncio.sleep(0.15)
            return flying

        assert all(h.call(write_comes))  # every remote's getMore was scheduled at once
        after = h.do(lambda: {r.rid: r.batches for r in st.merger.remotes})
        for sh in h.shards[1:] + [h.config]:  # the idle ones were asked and answered at once
            assert len(sh.requests) == asked[sh.name] + 1, sh.name
        idle = [r for r in st.merger.remotes if r.name != h.shards[0].name]
        assert all(after[r.rid] == before[r.rid] + 1 for r in idle), (before, after)



def test_remote_getmores_written_when_scheduled_and_backlog_batches_grow(h, monkeypatch):
    """router/change_stream/cursor.py ``RouterChangeStream.schedule_getmores``: a remote getMore
    is written to its shard when it is scheduled (``Pool.write_now`` on a kept connection),
    before the task that reads its reply first runs; before, that task wrote it, i.e. only once
    the scheduling task yielded the loop (e.g. after a client reply was built and sent). A
    remote's batches start at ``REMOTE_FIRST_BATCH_SIZE`` and double while they come back full,
    up to ``REMOTE_BATCH_SIZE``; one that is not full starts them small again. The events
    still arrive whole and in order."""
    import bson as _bson
    from shardsim.core.client import Connection
    from shardsim.router.change_stream import cursor as cs
    order: list[tuple[str, int]] = []  # ("write" | "task", remote cursor id), as they happen
    sizes: list[tuple[int, int]] = []  # (remote cursor id, batchSize) of each getMore written
    orig_write, orig_task = Connection.write_request, cs.RouterChangeStream._remote_getmore

    def write_request(self, body):
        doc = _bson.decode(body)
        if "getMore" in doc:
            order.append(("write", int(doc["getMore"])))
            sizes.append((int(doc["getMore"]), doc["batchSize"]))
        return orig_write(self, body)

    async def remote_getmore(self, r, db, cmd, pool, conn):
        if conn is not None:  # (None: no kept connection yet, the task sends it)
            order.append(("task", int(cmd["getMore"])))
        return await orig_task(self, r, db, cmd, pool, conn)

    monkeypatch.setattr(Connection, "write_request", write_request)
    monkeypatch.setattr(cs.RouterChangeStream, "_remote_getmore", remote_getmore)
    first = cs.REMOTE_FIRST_BATCH_SIZE
    n = 7 * first + 1  # a backlog of full batches of 1x, 2x and 4x, then one event
    _gossip_all(h)
    start = h.do(lambda: h.shards[0].clock.now())
    for i in range(n):
        h.write(0, {"_id": i})
    _gossip_all(h)
    with h.client.db.coll.watch(max_await_time_ms=200, batch_size=1000,
                                start_at_operation_time=start) as stream:
        got = [stream.next()["fullDocument"]["_id"] for _ in range(n)]
        assert got == list(range(n))
        st = next(iter(h.router.promise_requests.streams))
        shard0 = next(r.cursor_id for r in st.merger.remotes if r.name == h.shards[0].name)
        deadline = time.time() + 5
        while len([s for c, s in sizes if c == shard0]) < 5 and time.time() < deadline:
            time.sleep(0.05)
    # every getMore read by a task was on the wire before that task first ran
    assert order, "no getMore written when scheduled"
    written: dict[int, int] = {}
    for what, cid in order:
        if what == "write":
            written[cid] = written.get(cid, 0) + 1
        else:
            assert written.get(cid, 0) > 0, order
            written[cid] -= 1
    grown = [s for c, s in sizes if c == shard0]
    assert grown[:5] == [first, 2 * first, min(4 * first, cs.REMOTE_BATCH_SIZE),
                         min(8 * first, cs.REMOTE_BATCH_SIZE), first], grown



def _read_backlog(h: "Harness", order: list[int], pad: int, sizes: list[int],
                  pauses: list[bool]) -> tuple[list, list]:
    """Write one event of ``pad`` bytes per entry of ``order`` (its shard), then read them with
    raw getMores whose batchSize cycles through ``sizes`` (0: none), pausing 20 ms before those
    ``pauses`` marks; returns (events, [(events before the reply, its count, its
    postBatchResumeToken's _data)])."""
    _gossip_all(h)  # (the harness lives across examples: start after everything written so far)
    now = h.do(lambda: h.shards[0].clock.now())
    start = Timestamp(now.time, now.inc + 1)
    for k, i in enumerate(order):
        h.write(i, {"_id": k, "p": "x" * pad})
    _gossip_all(h)
    db = h.client.db
    cid = db.command({"aggregate": "coll", "cursor": {"batchSize": 0},
                      "pipeline": [{"$changeStream": {"startAtOperationTime": start}}]})["cursor"]["id"]
    got: list = []
    replies: list = []
    deadline = time.time() + 30
    k = 0
    try:
        while len(got) < len(order) and time.time() < deadline:
            if pauses[k % len(pauses)]:
                time.sleep(0.02)  # let the router stage the next reply
            size = sizes[k % len(sizes)]
            cmd = {"getMore": cid, "collection": "coll", "maxTimeMS": 200}
            if size:
                cmd["batchSize"] = size
            cur = db.command(cmd)["cursor"]
            batch = cur["nextBatch"]
            assert not size or len(batch) <= size
            replies.append((len(got), len(batch), cur["postBatchResumeToken"]["_data"]))
            got += batch
            k += 1
    finally:
        db.command({"killCursors": "coll", "cursors": [cid]})
    return got, replies


def _check_backlog(got: list, replies: list, n: int) -> None:
    """Every event once, in token order; every postBatchResumeToken at or past its batch's last
    event and before the next event returned."""
    ids = [e["fullDocument"]["_id"] for e in got]
    assert sorted(ids) == list(range(n)) and len(ids) == n
    datas = [e["_id"]["_data"] for e in got]
    assert datas == sorted(datas) and len(set(datas)) == len(datas)
    for at, k, pbrt in replies:
        if k:
            assert pbrt >= datas[at + k - 1]
        if at + k < len(datas):
            assert pbrt < datas[at + k], "the token would skip an event not yet returned"


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_catch_up_with_varying_batch_sizes_and_staged_replies(h, data):
    """A backlog of large events read with getMores of varying batchSize, some after a pause
    (after a reply of >= 256 KiB the router stages the next one, router/change_stream/
    staged_batch.py; a smaller getMore splits what is staged): see _check_backlog."""
    counts = data.draw(st.lists(st.integers(0, 150), min_size=3, max_size=3), label="events per shard")
    pad = data.draw(st.integers(1500, 3000), label="payload bytes")
    sizes = data.draw(st.lists(st.sampled_from([0, 1, 7, 40, 120, 300]), min_size=1, max_size=6),
                      label="getMore batchSizes (0: none)")
    pauses = data.draw(st.lists(st.booleans(), min_size=1, max_size=4), label="pause before")
    order = [i for i, c in enumerate(counts) for _ in range(c)]
    order = data.draw(st.permutations(order), label="write order") if order else []
    got, replies = _read_backlog(h, order, pad, sizes, pauses)
    _check_backlog(got, replies, len(order))


def test_staged_reply_split_by_a_smaller_getmore(h, monkeypatch):
    """The case the property test may not draw: a staged reply split by a small getMore."""
    from shardsim.router.change_stream import staged_batch
    splits: list[int] = []
    split = staged_batch.StagedBatch.split

    def spy(self, k):
        splits.append(k)
        return split(self, k)

    monkeypatch.setattr(staged_batch.StagedBatch, "split", spy)
    order = [i % 3 for i in range(450)]
    got, replies = _read_backlog(h, order, 3000, [300, 7, 300, 1, 0], [True])
    _check_backlog(got, replies, len(order))
    assert splits, "no staged reply was split"
