"""The ``clock`` promise mode is safe: an idle batch promises HWM(current cluster time + 1 tick),
which is only correct if no oplog entry below a promised time can be appended later (an event at
exactly the promised time sorts after the high-water mark).

The shard ticks its clock and appends the oplog entry in one synchronous step of its event loop
(no ``await`` in between), and later ticks are always greater. This test runs a shard in-process
under concurrent writers (inserts, updates, deletes, DDL, gossiped cluster times) and checks two
things: (1) at every turn of the event loop the promise the cursor would make is below every
entry appended afterwards, and (2) end to end, every event a change stream returns sorts after
every postBatchResumeToken it returned before.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid

from bson import Binary, Int64, Timestamp

from shardsim.shard.change_stream.cursor import safe_promise_key
from shardsim.shard.node import ShardNode
from shardsim.core.client import Pool
from shardsim.core.clock import ts_key
from shardsim.core.server import Server


async def _scenario() -> tuple[list, list, int, int]:
    node = ShardNode(shard_name="pp0", options={"noop_interval_ms": 30, "promise_mode": "clock"})
    server = Server(node, "127.0.0.1", 0)
    await server.start()
    violations: list = []
    max_promise = [0]
    appended = [0]

    txns = [0]

    def on_append(entry):
        appended[0] += 1
        if "applyOps" in entry.get("o", {}):
            txns[0] += 1
        # A promise HWM(p) is broken by an entry at ts < p (an event at p sorts after HWM(p)).
        if ts_key(entry["ts"]) < max_promise[0]:
            violations.append((entry["ts"], max_promise[0]))

    node.oplog.add_listener(on_append)
    done = asyncio.Event()

    async def monitor():
        while not done.is_set():
            max_promise[0] = max(max_promise[0], safe_promise_key(node))
            await asyncio.sleep(0)

    stream_errors: list = []
    events_seen = [0]

    async def reader():
        pool = Pool("127.0.0.1", server.port)
        try:
            r = await pool.command("pp", {"aggregate": 1, "pipeline": [{"$changeStream": {}}],
                                          "cursor": {"batchSize": 0}})
            cid = r["cursor"]["id"]
            last = r["cursor"]["postBatchResumeToken"]["_data"]
            while not done.is_set():
                g = await pool.command("pp", {"getMore": Int64(cid), "collection": "$cmd.aggregate",
                                              "maxTimeMS": 5})
                for ev in g["cursor"]["nextBatch"]:
                    events_seen[0] += 1
                    if ev["_id"]["_data"] <= last:
                        stream_errors.append((ev["_id"], last))
                    last = ev["_id"]["_data"]
                pb = g["cursor"]["postBatchResumeToken"]["_data"]
                if pb < last:
                    stream_errors.append(("pbrt regressed", pb, last))
                last = pb
        finally:
            pool.close()

    async def writer(i: int):
        rng = random.Random(i)
        pool = Pool("127.0.0.1", server.port)
        try:
            for j in range(120):
                r = rng.random()
                coll = f"c{rng.randrange(3)}"
                body: dict
                if r < 0.5:
                    body = {"insert": coll, "documents": [{"_id": f"{i}-{j}", "v": j}]}
                elif r < 0.7:
                    body = {"update": coll, "updates": [{"q": {"_id": f"{i}-{j - 1}"},
                                                         "u": {"$set": {"w": j}}}]}
                elif r < 0.85:
                    body = {"delete": coll, "deletes": [{"q": {"_id": f"{i}-{j - 2}"}, "limit": 1}]}
                elif r < 0.88:  # a two-statement transaction committed as one applyOps entry
                    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
                    txn = {"lsid": lsid, "txnNumber": Int64(1), "autocommit": False}
                    await pool.command("pp", {"insert": coll, "documents": [{"_id": f"t{i}-{j}"}],
                                              "startTransaction": True, **txn}, check=False)
                    await pool.command("pp", {"insert": coll, "documents": [{"_id": f"u{i}-{j}"}], **txn},
                                       check=False)
                    await pool.command("admin", {"commitTransaction": 1, **txn}, check=False)
                    continue
                elif r < 0.92:
                    body = {"createIndexes": coll, "indexes": [{"key": {f"f{j % 4}": 1},
                                                                "name": f"f{j % 4}_1"}]}
                else:
                    now = node.clock.now()
                    body = {"insert": coll, "documents": [{"_id": f"g{i}-{j}"}],
                            "$clusterTime": {"clusterTime": Timestamp(now.time, now.inc + 50),
                                             "signature": {"hash": b"\0" * 20, "keyId": Int64(0)}}}
                await pool.command("pp", body, check=False)
                if rng.random() < 0.3:
                    await asyncio.sleep(0.001)
        finally:
            pool.close()

    mon = asyncio.get_running_loop().create_task(monitor())
    rd = asyncio.get_running_loop().create_task(reader())
    await asyncio.sleep(0.05)
    await asyncio.gather(*(writer(i) for i in range(6)))
    await asyncio.sleep(0.1)
    done.set()
    await mon
    await rd
    await server.close()
    assert txns[0] >= 5, "the scenario must commit transactions"
    return violations, stream_errors, appended[0], events_seen[0]


def test_clock_promise_never_overtaken_by_an_append():
    violations, stream_errors, appended, seen = asyncio.run(_scenario())
    assert appended >= 300 and seen >= 200
    assert violations == []
    assert stream_errors == []


def _sig() -> dict:
    return {"hash": b"\0" * 20, "keyId": Int64(0)}


@contextlib.asynccontextmanager
async def _idle_stream(db: str, mode: str):
    """A shard in promise ``mode`` (no-op every 400 ms) with one document in ``<db>.c`` and a
    ``needsMerge`` change-stream cursor on it, as the router opens one. Yields (node, pool,
    cursor id, get_more) where ``await get_more(max_ms)`` is (seconds, cursor reply)."""
    node = ShardNode(shard_name=f"{db}0", options={"noop_interval_ms": 400, "promise_mode": mode})
    server = Server(node, "127.0.0.1", 0)
    await server.start()
    pool = Pool("127.0.0.1", server.port)
    loop = asyncio.get_running_loop()
    try:
        await pool.command(db, {"insert": "c", "documents": [{"_id": 0}]})
        r = await pool.command(db, {"aggregate": "c", "pipeline": [{"$changeStream": {}}],
                                    "cursor": {"batchSize": 0}, "needsMerge": True,
                                    "fromRouter": True})
        cid = r["cursor"]["id"]

        async def get_more(max_ms: int) -> tuple[float, dict]:
            t0 = loop.time()
            g = await pool.command(db, {"getMore": Int64(cid), "collection": "c",
                                        "maxTimeMS": max_ms})
            return loop.time() - t0, g["cursor"]

        yield node, pool, cid, get_more
    finally:
        pool.close()
        await server.close()


def _ahead(node: ShardNode, n: int) -> Timestamp:
    """A time ``n`` ticks past the shard's cluster time (another shard's event)."""
    now = node.clock.now()
    return Timestamp(now.time, now.inc + n)


async def _request_scenario(mode: str) -> dict:
    """A change-stream getMore waiting on an idle shard, and the router's promise request."""
    out: dict = {}
    loop = asyncio.get_running_loop()
    async with _idle_stream("pr", mode) as (node, pool, cid, get_more):
        await get_more(1)  # settle the promise
        # Gossip alone (a ping carrying a newer $clusterTime) does not cut a getMore short.
        gm = loop.create_task(get_more(1500))
        await asyncio.sleep(0.1)
        await pool.command("admin", {"ping": 1, "$clusterTime": {"clusterTime": _ahead(node, 5),
                                                                 "signature": _sig()}})
        await asyncio.sleep(0.1)
        out["ping_woke"] = gm.done()
        # The promise request does: T = a time past the shard's clock (another shard's event).
        t = _ahead(node, 7)
        t_req = loop.time()
        await pool.command("admin", {"_shardsimAdvanceClusterTime": t})
        elapsed, cur = await gm
        out["after_request_s"] = loop.time() - t_req
        out["total_s"] = elapsed
        out["batch"] = cur["nextBatch"]
        out["pbrt_ts"] = int(cur["postBatchResumeToken"]["_data"][2:18], 16)
        out["t"] = ts_key(t)
        # Sticky: a request that arrives before the getMore still applies to it.
        t2 = _ahead(node, 3)
        await pool.command("admin", {"_shardsimAdvanceClusterTime": t2})
        elapsed2, cur2 = await get_more(1500)
        out["sticky_s"] = elapsed2
        out["pbrt2_ts"] = int(cur2["postBatchResumeToken"]["_data"][2:18], 16)
        out["t2"] = ts_key(t2)
        # Once past it, the next getMore waits again (no busy loop).
        elapsed3, _ = await get_more(300)
        out["next_wait_s"] = elapsed3
        bad = await pool.command("admin", {"_shardsimAdvanceClusterTime": 1}, check=False)
        out["bad"] = (bad["ok"], bad.get("code"))
    return out


def test_promise_request_clock_mode_answers_a_waiting_getmore_at_once():
    out = asyncio.run(_request_scenario("clock"))
    assert out["ping_woke"] is False  # plain gossip wakes nothing (as mongod)
    assert out["batch"] == []
    assert out["after_request_s"] < 0.3 and out["total_s"] < 1.0
    assert out["pbrt_ts"] > out["t"]  # HWM(> T): passes an event at T
    assert out["sticky_s"] < 0.3 and out["pbrt2_ts"] > out["t2"]
    assert out["next_wait_s"] >= 0.25
    assert out["bad"] == (0.0, 14)


def test_promise_request_mongod_mode_waits_for_an_oplog_entry_past_it():
    out = asyncio.run(_request_scenario("mongod"))
    assert out["ping_woke"] is False
    assert out["batch"] == []
    # The promise is still the newest oplog time: the periodic no-op (every 400 ms) passes T.
    assert out["pbrt_ts"] > out["t"]
    assert out["total_s"] < 1.4  # answered by the no-op, not by the 1.5 s await
    assert out["pbrt2_ts"] > out["t2"] and out["sticky_s"] < 1.4
    assert out["next_wait_s"] >= 0.25
    assert out["bad"] == (0.0, 14)


async def _promise_reply_scenario(mode: str) -> dict:
    """``{_shardsimAdvanceClusterTime: T, promises: true}`` (shard/change_stream/cursor.py
    ``register``): the router's form of the request, answered with the waiting cursors'
    promises while their getMores keep waiting."""
    out: dict = {}
    loop = asyncio.get_running_loop()
    async with _idle_stream("pq", mode) as (node, pool, cid, get_more):
        await get_more(1)  # the cursor has now sent 2 replies (first batch + this one)
        gm = loop.create_task(get_more(1500))
        await asyncio.sleep(0.1)
        t = _ahead(node, 7)
        reply = await pool.command("admin", {"_shardsimAdvanceClusterTime": t, "promises": True})
        out["promises"] = reply["promises"]
        out["t"] = ts_key(t)
        out["cid"] = cid
        await asyncio.sleep(0.1)
        out["still_waiting"] = not gm.done()
        # A write ends the waiting getMore: its event sorts after the promise just given.
        await pool.command("pq", {"insert": "c", "documents": [{"_id": 1}]})
        _, cur = await gm
        out["events"] = [e["_id"]["_data"] for e in cur["nextBatch"]]
        out["pbrt"] = cur["postBatchResumeToken"]["_data"]
        # No getMore waiting: nothing to promise in the reply, but the request is sticky.
        t2 = _ahead(node, 3)
        reply2 = await pool.command("admin", {"_shardsimAdvanceClusterTime": t2, "promises": True})
        out["promises2"] = reply2["promises"]
        out["sticky_s"], cur2 = await get_more(1500)
        out["pbrt2_ts"] = int(cur2["postBatchResumeToken"]["_data"][2:18], 16)
        out["t2"] = ts_key(t2)
    return out


def test_promise_reply_clock_mode_promises_and_leaves_the_getmore_waiting():
    out = asyncio.run(_promise_reply_scenario("clock"))
    [p] = out["promises"]
    assert p["id"] == out["cid"] and p["batches"] == 2
    promised = p["postBatchResumeToken"]["_data"]
    assert int(promised[2:18], 16) > out["t"]  # HWM(> T): passes an event at T
    assert out["still_waiting"] is True
    assert len(out["events"]) == 1 and out["events"][0] > promised  # resume-token order
    assert out["pbrt"] >= out["events"][0]
    assert out["promises2"] == []
    assert out["sticky_s"] < 0.3 and out["pbrt2_ts"] > out["t2"]


def test_promise_reply_mongod_mode_has_no_promises():
    # mongod mode can promise only its newest oplog time: the getMore still ends at the next
    # entry past T (the periodic no-op), as with the one-way form.
    out = asyncio.run(_promise_reply_scenario("mongod"))
    assert out["promises"] == []
    assert int(out["pbrt"][2:18], 16) > out["t"]
    assert out["sticky_s"] < 1.4 and out["pbrt2_ts"] > out["t2"]
