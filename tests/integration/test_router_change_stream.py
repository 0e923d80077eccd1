"""Router change streams with real processes (config server, shards, router) through pymongo.

The issue's "done when": (1) 4 writer threads, 20,000 mixed operations on a collection sharded
over 3 shards, one watcher gets all of them in strictly increasing token order with each
document's changes in order; (2) resuming from 50 random tokens of that stream (event tokens
and postBatchResumeTokens) gives exactly the suffix; (3) a shard added mid-stream, a chunk moved
to it and writes to it: nothing lost or duplicated; (4) with two shards idle a single insert
reaches a watcher in under the no-op interval plus 100 ms. Plus errors, labels, killCursors and
fail points on the router.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure

N_OPS = 20_000
WRITERS = 4


def _drain(stream: Any, want: int, timeout: float, tokens: list | None = None) -> list:
    """Read ``want`` events (or until ``timeout`` s), recording (resume token, events so far)."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        ch = stream.try_next()
        if ch is not None:
            out.append(ch)
        if tokens is not None and stream.resume_token is not None:
            tokens.append((stream.resume_token, len(out)))
    return out


def _writer(uri: str, ns: tuple[str, str], w: int, n: int, log: dict, errors: list) -> None:
    """Mixed inserts/updates/replaces/deletes on this writer's own documents; ``log`` gets each
    document's expected operationType sequence."""
    rng = random.Random(w)
    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000)
    coll = client[ns[0]][ns[1]]
    live: list[str] = []
    seq = 0
    try:
        for _ in range(n):
            r = rng.random()
            if not live or r < 0.4:
                seq += 1
                _id = f"w{w}-{seq}"
                coll.insert_one({"_id": _id, "w": w, "v": 0})
                live.append(_id)
                log.setdefault(_id, []).append("insert")
            elif r < 0.75:
                _id = rng.choice(live)
                coll.update_one({"_id": _id}, {"$inc": {"v": 1}})
                log[_id].append("update")
            elif r < 0.85:
                _id = rng.choice(live)
                coll.replace_one({"_id": _id}, {"w": w, "v": -1})
                log[_id].append("replace")
            else:
                _id = live.pop(rng.randrange(len(live)))
                coll.delete_one({"_id": _id})
                log[_id].append("delete")
    except Exception as exc:  # pragma: no cover - reported by the test
        errors.append(exc)
    finally:
        client.close()


def test_twenty_thousand_ops_four_writers_then_resume_from_fifty_tokens(cluster, router_client):
    db_name, coll_name = "rcs_load", "events"
    router_client.drop_database(db_name)
    router_client.admin.command({"shardCollection": f"{db_name}.{coll_name}", "key": {"_id": "hashed"}})
    coll = router_client[db_name][coll_name]
    logs: list[dict] = [{} for _ in range(WRITERS)]
    errors: list = []
    with coll.watch(batch_size=5000, max_await_time_ms=500) as stream:
        threads = [threading.Thread(target=_writer, args=(cluster.router_uri, (db_name, coll_name), w,
                                                          N_OPS // WRITERS, logs[w], errors))
                   for w in range(WRITERS)]
        for t in threads:
            t.start()
        tokens: list = []
        t0 = time.monotonic()
        events = _drain(stream, N_OPS, 150, tokens)
        for t in threads:
            t.join(60)
        print(f"\n{len(events)} events in {time.monotonic() - t0:.1f} s (writes and watch)")
    assert not errors
    per_doc: dict[str, list[str]] = {}
    for e in events:
        per_doc.setdefault(e["documentKey"]["_id"], []).append(e["operationType"])
    expected = {k: v for log in logs for k, v in log.items()}
    wrong = [(k, v, per_doc.get(k)) for k, v in expected.items() if per_doc.get(k) != v]
    assert not wrong and len(per_doc) == len(expected), \
        f"{len(events)} events; {len(wrong)} documents differ, e.g. {wrong[:3]}"
    assert len(events) == N_OPS
    datas = [e["_id"]["_data"] for e in events]
    assert all(a < b for a, b in zip(datas, datas[1:])), "tokens must be strictly increasing"
    # Every shard took part (the collection really is spread over 3 shards).
    shards_seen = set()
    for proc in cluster.shards:
        c = pymongo.MongoClient(f"mongodb://{proc.address}/", directConnection=True)
        try:
            if c[db_name][coll_name].estimated_document_count() or c[db_name][coll_name].find_one():
                shards_seen.add(proc.name)
        finally:
            c.close()
    assert len(shards_seen) == 3

    # (2) Resume from 50 random tokens: event tokens and postBatchResumeTokens. The suffix is
    # every event whose token sorts after the resume token; 3 are read to the end, the others
    # for their first 300 events (the rest of the suffix is the same merge, already checked).
    t0 = time.monotonic()
    rng = random.Random(5)
    candidates = [(e["_id"], i + 1) for i, e in enumerate(events)] + tokens
    picks = rng.sample(candidates, 50)
    for n, (tok, _) in enumerate(picks):
        suffix = [d for d in datas if d > tok["_data"]]
        want = len(suffix) if n < 3 else min(300, len(suffix))
        with coll.watch(resume_after=tok, batch_size=5000, max_await_time_ms=200) as s2:
            got = _drain(s2, want, 60)
        assert [g["_id"]["_data"] for g in got] == suffix[:want]
    print(f"50 resumes checked in {time.monotonic() - t0:.1f} s")


def test_shard_added_mid_stream_chunk_moved_and_written(cluster_factory):
    c = cluster_factory(shards=2)
    client = pymongo.MongoClient(c.router_uri, serverSelectionTimeoutMS=10000)
    try:
        client.admin.command({"shardCollection": "grow.c", "key": {"k": 1}})
        client.admin.command({"split": "grow.c", "middle": {"k": 1000}})
        coll = client.grow.c
        with coll.watch(batch_size=1000, max_await_time_ms=300) as stream:
            expected = []
            for i in range(100):
                coll.insert_one({"_id": i, "k": i * 20})
                expected.append(i)
            new_shard = c.add_shard()
            for i in range(100, 150):
                coll.insert_one({"_id": i, "k": i * 20})
                expected.append(i)
            client.admin.command({"moveChunk": "grow.c", "find": {"k": 1500}, "to": new_shard})
            for i in range(150, 250):
                coll.insert_one({"_id": i, "k": i * 20})  # k >= 1000 now lands on the new shard
                expected.append(i)
            for i in range(60, 120):
                coll.update_one({"_id": i}, {"$set": {"u": 1}})
            events = _drain(stream, len(expected) + 60, 60)
            extra = _drain(stream, 1, 1.5)
        assert extra == []
        datas = [e["_id"]["_data"] for e in events]
        assert all(a < b for a, b in zip(datas, datas[1:]))
        inserts = [e["documentKey"]["_id"] for e in events if e["operationType"] == "insert"]
        assert inserts == expected  # nothing lost, nothing duplicated (migration is silent)
        updates = [e["documentKey"]["_id"] for e in events if e["operationType"] == "update"]
        assert updates == list(range(60, 120))
        # The new shard really holds the moved documents.
        proc = c.shard(new_shard)
        direct = pymongo.MongoClient(f"mongodb://{proc.address}/", directConnection=True)
        try:
            assert direct.grow.c.count_documents({"k": {"$gte": 1000}}) >= 150
        finally:
            direct.close()
    finally:
        client.close()


@pytest.mark.serial  # a latency bound: run alone (make test)
@pytest.mark.parametrize("mode,noop_ms,samples", [("clock", 1000, 4), ("mongod", 500, 3)])
def test_single_insert_with_two_idle_shards_is_fast(cluster_factory, mode, noop_ms, samples):
    """Issue 5 (4): with two shards idle a single insert reaches a watcher in under the no-op
    interval + 100 ms, in both promise modes. The router asks the idle shards for a promise past
    the held event (``_shardsimAdvanceClusterTime``): in ``clock`` mode they answer at once (a
    few ms), in ``mongod`` mode with their next periodic no-op (at most one interval)."""
    c = cluster_factory(shards=3, shard_args=["--noop-interval-ms", str(noop_ms),
                                              "--promise-mode", mode])
    client = pymongo.MongoClient(c.router_uri, serverSelectionTimeoutMS=10000)
    try:
        client.admin.command({"shardCollection": "lat.c", "key": {"k": 1}})
        coll = client.lat.c
        coll.insert_one({"_id": 0, "k": 0})
        lat = []
        with coll.watch(max_await_time_ms=1000) as stream:
            stream.try_next()
            for i in range(1, samples + 1):
                # insert at different points of the shards' await and no-op cycles
                time.sleep(0.37 * i % 1 * noop_ms / 1000)
                t0 = time.monotonic()
                coll.insert_one({"_id": i, "k": 0})  # always the same shard: the others stay idle
                ch = None
                while ch is None and time.monotonic() - t0 < 10:
                    ch = stream.try_next()
                lat.append(time.monotonic() - t0)
                assert ch is not None and ch["documentKey"]["_id"] == i
        print(f"{mode} insert-to-event latency (s):", [round(x, 3) for x in lat])
        assert max(lat) < (noop_ms + 100) / 1000, lat
    finally:
        client.close()


def test_remote_failure_and_router_errors(cluster, router_client):
    db = router_client.rcs_err
    db.c.insert_one({"_id": 1})
    # killCursors on the router cursor: further getMores fail with 43.
    reply = db.command({"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}})
    cur = reply["cursor"]
    assert cur["firstBatch"] == [] and cur["id"] != 0 and "postBatchResumeToken" in cur
    assert "operationTime" in reply
    killed = db.command({"killCursors": "c", "cursors": [cur["id"]]})
    assert killed["cursorsKilled"] == [cur["id"]]
    with pytest.raises(OperationFailure) as ei:
        db.command({"getMore": cur["id"], "collection": "c"})
    assert ei.value.code == 43
    # A user stage that removes _id: 280 with NonResumableChangeStreamError.
    reply = db.command({"aggregate": "c", "pipeline": [{"$changeStream": {}}, {"$project": {"_id": 0}}],
                        "cursor": {}})
    cid = reply["cursor"]["id"]
    db.c.insert_one({"_id": 2})
    with pytest.raises(OperationFailure) as ei:
        for _ in range(10):
            db.command({"getMore": cid, "collection": "c", "maxTimeMS": 500})
    assert ei.value.code == 280
    assert ei.value.details.get("errorLabels") == ["NonResumableChangeStreamError"]
    # failGetMoreAfterCursorCheckout: resumable code gets the label; pymongo resumes.
    with db.c.watch(max_await_time_ms=300) as stream:
        router_client.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout",
                                     "mode": {"times": 1}, "data": {"errorCode": 262}})
        db.c.insert_one({"_id": 3})
        got = _drain(stream, 1, 10)
        assert [g["documentKey"]["_id"] for g in got] == [3]
    router_client.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout", "mode": "off"})


def test_shard_killed_gives_resumable_error(cluster_factory):
    c = cluster_factory(shards=2)
    client = pymongo.MongoClient(c.router_uri, serverSelectionTimeoutMS=10000)
    try:
        client.admin.command({"shardCollection": "dead.c", "key": {"_id": "hashed"}})
        db = client.dead
        cid = db.command({"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}})["cursor"]["id"]
        c.shards[1].kill()
        with pytest.raises(OperationFailure) as ei:
            for _ in range(20):
                db.command({"getMore": cid, "collection": "c", "maxTimeMS": 300})
        assert ei.value.code in (6, 89, 9001)
        assert ei.value.details.get("errorLabels") == ["ResumableChangeStreamError"]
    finally:
        client.close()


def _drain_until_closed(stream: Any, timeout: float) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and stream.alive:
        ch = stream.try_next()
        if ch is not None:
            out.append(ch)
    return out


def test_drop_and_drop_database_once_for_the_cluster(cluster, router_client):
    db_name = "rcs_ddl"
    router_client.drop_database(db_name)
    router_client.admin.command({"shardCollection": f"{db_name}.c", "key": {"_id": "hashed"}})
    db = router_client[db_name]
    db.c.insert_many([{"_id": i} for i in range(30)])  # documents on every shard
    db.u.insert_one({"_id": 1})
    coll_stream = db.c.watch(max_await_time_ms=200)
    db_stream = db.watch(max_await_time_ms=200)
    cluster_stream = router_client.watch(max_await_time_ms=200)
    try:
        db.c.insert_one({"_id": 100})
        db.c.drop()
        got = _drain_until_closed(coll_stream, 10)
        assert [e["operationType"] for e in got] == ["insert", "drop", "invalidate"]
        assert not coll_stream.alive
        router_client.drop_database(db_name)
        got = _drain_until_closed(db_stream, 10)
        ops = [(e["operationType"], e.get("ns", {}).get("coll")) for e in got]
        assert ops == [("insert", "c"), ("drop", "c"), ("drop", "u"), ("dropDatabase", None),
                       ("invalidate", None)]
        got = []
        deadline = time.monotonic() + 5
        while len(got) < 4 and time.monotonic() < deadline:
            ch = cluster_stream.try_next()
            if ch is not None and ch.get("ns", {}).get("db") == db_name:
                got.append(ch)
        assert [e["operationType"] for e in got] == ["insert", "drop", "drop", "dropDatabase"]
        assert cluster_stream.alive  # cluster-wide streams never invalidate
    finally:
        for s in (coll_stream, db_stream, cluster_stream):
            s.close()



class _StagedCatchUp:
    """A raw change-stream cursor on the router over a backlog of ``n`` ~600-byte insert
    events spread over 3 shards, read with getMores of 1,000 until the router has staged
    events for the next reply (a reply of >= 256 KiB starts the staging); ``events`` and
    ``last_token`` are what the client received so far."""

    def __init__(self, router_client: Any, db_name: str, n: int = 4000) -> None:
        from shardsim.testing.helpers import change_stream_ops

        router_client.drop_database(db_name)
        router_client.admin.command({"shardCollection": f"{db_name}.c", "key": {"_id": "hashed"}})
        self.coll = router_client[db_name].c
        self.db = router_client[db_name]
        self.n = n
        start = router_client.admin.command("ping")["operationTime"]
        self.coll.insert_many([{"_id": i, "pad": "x" * 400} for i in range(n)])
        self.cid = self.db.command({"aggregate": "c", "cursor": {"batchSize": 0}, "pipeline": [
            {"$changeStream": {"startAtOperationTime": start}}]})["cursor"]["id"]
        self.events: list = []
        self.last_token: Any = None
        self.deadline = time.monotonic() + 30
        while len(self.get_more(1000)["nextBatch"]) < 1000:
            assert time.monotonic() < self.deadline, f"no full batch: {len(self.events)} events"
        staged = 0
        while staged < 8 and time.monotonic() < self.deadline:
            ops = change_stream_ops(router_client, cursor_id=self.cid)
            staged = ops[0]["changeStream"]["stagedEvents"] if ops else 0
            time.sleep(0.01)
        assert staged >= 8, "the router staged no events for the next reply"

    def get_more(self, batch_size: int) -> dict:
        cur = self.db.command({"getMore": self.cid, "collection": "c", "batchSize": batch_size,
                               "maxTimeMS": 500})["cursor"]
        self.events.extend(cur["nextBatch"])
        self.last_token = cur["postBatchResumeToken"]
        return cur

    def resume_and_check(self, token: Any, index: int) -> None:
        """Every event once, in order; resuming from ``token`` (received with the first
        ``index`` events) gives exactly the events after them."""
        ids = [e["documentKey"]["_id"] for e in self.events]
        assert len(ids) == self.n and sorted(ids) == list(range(self.n)), (len(ids), len(set(ids)))
        datas = [e["_id"]["_data"] for e in self.events]
        assert all(a < b for a, b in zip(datas, datas[1:])), "tokens must be strictly increasing"
        with self.coll.watch(resume_after=token, batch_size=1000, max_await_time_ms=200) as s2:
            rest = _drain(s2, self.n - index, 30)
        assert [e["_id"]["_data"] for e in rest] == datas[index:]


def test_catch_up_reply_built_ahead_and_a_smaller_getmore_after_it(cluster, router_client):
    """During a catch-up the router builds the client's next reply while the client is busy
    with the last one (router/change_stream/staged_batch.py). A getMore asking for fewer events
    than are staged gets the first ones, with the last of them as its postBatchResumeToken;
    nothing is lost, doubled or reordered, and resuming from that token gives exactly what
    followed."""
    cu = _StagedCatchUp(router_client, "rcs_staged")
    try:
        assert len(cu.events) >= 1000
        small = cu.get_more(7)
        assert len(small["nextBatch"]) == 7
        assert small["postBatchResumeToken"] == small["nextBatch"][-1]["_id"]
        resume_at, resume_index = small["postBatchResumeToken"], len(cu.events)
        while len(cu.events) < cu.n and time.monotonic() < cu.deadline:
            cu.get_more(1000)
    finally:
        cu.db.command({"killCursors": "c", "cursors": [cu.cid]})
    cu.resume_and_check(resume_at, resume_index)


def test_remote_failure_while_the_next_reply_is_staged_loses_nothing(cluster, router_client):
    """A shard's getMore fails while the router holds events merged ahead for the client's next
    reply: that getMore fails with a resumable error, and resuming from the last token the
    client received gives every event once, in order (the staged events were never delivered:
    they come again)."""
    cu = _StagedCatchUp(router_client, "rcs_staged_fail")
    shard_clients = [pymongo.MongoClient(f"mongodb://{p.address}/?directConnection=true")
                     for p in cluster.shards]
    try:
        for c in shard_clients:  # the router's next remote getMore, on any shard, fails
            c.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                             "data": {"failCommands": ["getMore"], "errorCode": 91,
                                      "failInternalCommands": True}})
        # (91 ShutdownInProgress: pymongo raises it as NotPrimaryError)
        with pytest.raises(pymongo.errors.PyMongoError) as err:
            while time.monotonic() < cu.deadline:
                cu.get_more(1000)
        details = getattr(err.value, "details", None) or {}
        assert details.get("code") == 91, err.value
        assert "ResumableChangeStreamError" in details.get("errorLabels", [])
    finally:
        for c in shard_clients:
            c.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
            c.close()
    received, token = len(cu.events), cu.last_token
    with cu.coll.watch(resume_after=token, batch_size=1000, max_await_time_ms=200) as s2:
        cu.events += _drain(s2, cu.n - received, 30)
    cu.resume_and_check(token, received)
