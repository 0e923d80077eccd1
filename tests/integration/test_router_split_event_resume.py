"""Resuming through the router from each fragment of a ``$changeStreamSplitLargeEvent`` split
event (issue 16, item 6): ``resumeAfter`` and ``startAfter`` a fragment's token give the
following fragments, then the events after it, as mongos does."""

from __future__ import annotations

from typing import Any

import pymongo
from bson.timestamp import Timestamp

from shardsim.core import resume_token as rt


def _take(stream: Any, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(200):
        if len(out) == n:
            break
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
    return out


def test_resume_from_each_fragment_through_the_router(cluster_factory: Any) -> None:
    cluster = cluster_factory(shards=2)
    client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=10000)
    try:
        admin = client.admin
        admin.command("enableSharding", "split_db", primaryShard="shard0")
        db = client.split_db
        db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
        admin.command("shardCollection", "split_db.c", key={"_id": 1})
        admin.command("split", "split_db.c", middle={"_id": 10})
        admin.command("moveChunk", "split_db.c", find={"_id": 10}, to="shard1")
        big = "y" * (9 * 1024 * 1024)
        with client.start_session() as session:
            db.c.insert_one({"_id": 1, "s": big}, session=session)
            ot = session.operation_time
        start = Timestamp(ot.time, ot.inc + 1)
        db.c.replace_one({"_id": 1}, {"s": big + "z"})  # pre + post image: over 16 MiB
        db.c.insert_one({"_id": 20})  # on the other shard, after the split event
        opts = dict(full_document_before_change="required", max_await_time_ms=100)
        pipeline = [{"$changeStreamSplitLargeEvent": {}}]
        with db.c.watch(pipeline, start_at_operation_time=start, **opts) as stream:
            f1, f2, after = _take(stream, 3)
        assert f1["splitEvent"] == {"fragment": 1, "of": 2}
        assert f2["splitEvent"] == {"fragment": 2, "of": 2}
        assert rt.decode(f1["_id"]).fragmentNum == 0 and rt.decode(f2["_id"]).fragmentNum == 1
        assert after["operationType"] == "insert" and after["documentKey"]["_id"] == 20
        for how in ("resume_after", "start_after"):
            with db.c.watch(pipeline, **{how: f1["_id"]}, **opts) as stream:
                got = _take(stream, 2)
            assert [e["_id"] for e in got] == [f2["_id"], after["_id"]], how
            with db.c.watch(pipeline, **{how: f2["_id"]}, **opts) as stream:
                got = _take(stream, 1)
            assert [e["_id"] for e in got] == [after["_id"]], how
    finally:
        client.close()
