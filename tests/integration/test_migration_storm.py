"""Chunk migrations under load through two routers (issue 16): shard versioning (StaleConfig
and the router's refresh-and-retry) and 8.0's migration phases (clone, transfer mods, critical
section, commit, range deletion) keep every acknowledged write exactly once, in the data and in
the change stream."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

SEED = 16
WRITERS = 4
MIN_MIGRATIONS = 10
NS_DB, NS_COLL = "storm", "docs"


def _chunks(client: pymongo.MongoClient) -> list[dict[str, Any]]:
    uuid = client.config.collections.find_one({"_id": f"{NS_DB}.{NS_COLL}"})["uuid"]
    return list(client.config.chunks.find({"uuid": uuid}))


def test_migration_storm_two_routers(cluster_factory: Any) -> None:
    """Seeded: four writers (inserts and updates, retryable) through two routers, a watcher
    with updateLookup, moveChunk in a loop through both routers. At the end no acknowledged
    write is lost or doubled, every write is in the stream exactly once, tokens strictly
    increase, updateLookup never gives null (nothing is deleted), and no orphan is left."""
    rnd = random.Random(SEED)
    cluster = cluster_factory(shards=3, routers=2)
    clients = [pymongo.MongoClient(u, serverSelectionTimeoutMS=10000, retryWrites=True)
               for u in cluster.router_uris]
    try:
        admin = clients[0].admin
        admin.command("enableSharding", NS_DB, primaryShard="shard0")
        admin.command("shardCollection", f"{NS_DB}.{NS_COLL}", key={"_id": 1})
        for mid in (200, 400, 600, 800, 1000):
            admin.command("split", f"{NS_DB}.{NS_COLL}", middle={"_id": mid})
        events: list[dict[str, Any]] = []
        watch_ready = threading.Event()
        stop_watch = threading.Event()

        def watcher() -> None:
            with clients[0][NS_DB][NS_COLL].watch(full_document="updateLookup",
                                                  max_await_time_ms=200) as stream:
                watch_ready.set()
                while not stop_watch.is_set():
                    ev = stream.try_next()
                    if ev is not None:
                        events.append(ev)

        tw = threading.Thread(target=watcher)
        tw.start()
        assert watch_ready.wait(20)
        acked_inserts: dict[int, int] = {}
        acked_updates: dict[int, int] = {}
        failures: list[BaseException] = []
        stop = threading.Event()
        ids = list(range(1200))
        rnd.shuffle(ids)
        shares = [ids[w::WRITERS] for w in range(WRITERS)]

        def writer(w: int) -> None:
            coll = clients[w % 2][NS_DB][NS_COLL]
            wr = random.Random(SEED * 100 + w)
            mine: list[int] = []
            try:
                for _id in shares[w]:
                    if stop.is_set():
                        break
                    coll.insert_one({"_id": _id, "w": w, "v": 0})
                    acked_inserts[_id] = 1
                    mine.append(_id)
                    if wr.random() < 0.5:
                        target = wr.choice(mine)
                        res = coll.update_one({"_id": target}, {"$inc": {"v": 1}})
                        assert res.matched_count == 1, target
                        acked_updates[target] = acked_updates.get(target, 0) + 1
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
        for t in threads:
            t.start()
        migrations = 0
        deadline = time.monotonic() + 40
        while (migrations < MIN_MIGRATIONS or any(t.is_alive() for t in threads)) and \
                time.monotonic() < deadline and not failures:
            chunk = rnd.choice(_chunks(clients[0]))
            to = rnd.choice([s for s in ("shard0", "shard1", "shard2") if s != chunk["shard"]])
            clients[migrations % 2].admin.command(
                "moveChunk", f"{NS_DB}.{NS_COLL}", bounds=[chunk["min"], chunk["max"]], to=to)
            migrations += 1
            if migrations >= MIN_MIGRATIONS and all(not t.is_alive() for t in threads):
                break
        stop.set()
        for t in threads:
            t.join(60)
        assert not failures, failures[:3]
        assert migrations >= MIN_MIGRATIONS
        expected_events = len(acked_inserts) + sum(acked_updates.values())
        wait_until = time.monotonic() + 30
        while len(events) < expected_events and time.monotonic() < wait_until:
            time.sleep(0.1)
        time.sleep(0.5)  # anything doubled would arrive now
        stop_watch.set()
        tw.join(30)

        # The data: every acknowledged insert once, with every acknowledged update.
        docs = {d["_id"]: d for d in clients[1][NS_DB][NS_COLL].find()}
        assert set(docs) == set(acked_inserts)
        assert len(acked_inserts) == 1200  # the writers finished within the time bound
        for _id, n in acked_updates.items():
            assert docs[_id]["v"] == n, _id
        total = sum(clients[0][NS_DB][NS_COLL].count_documents({}) for _ in range(1))
        assert total == len(acked_inserts)
        # No orphan left behind: every document on the shard its chunk names.
        for name in ("shard0", "shard1", "shard2"):
            proc = cluster.shard(name)
            direct = pymongo.MongoClient(f"mongodb://127.0.0.1:{proc.port}/",
                                         directConnection=True)
            try:
                for d in direct[NS_DB][NS_COLL].find({}, {"_id": 1}):
                    owner = next(c["shard"] for c in _chunks(clients[0])
                                 if _le(c["min"]["_id"], d["_id"]) and _lt(d["_id"], c["max"]["_id"]))
                    assert owner == name, (d["_id"], owner, name)
            finally:
                direct.close()

        # The stream: each write exactly once, in token order, no migration event.
        inserts = [e for e in events if e["operationType"] == "insert"]
        updates = [e for e in events if e["operationType"] == "update"]
        assert {e["operationType"] for e in events} <= {"insert", "update"}
        assert sorted(e["documentKey"]["_id"] for e in inserts) == sorted(acked_inserts)
        per_doc: dict[int, int] = {}
        for e in updates:
            per_doc[e["documentKey"]["_id"]] = per_doc.get(e["documentKey"]["_id"], 0) + 1
        assert per_doc == acked_updates
        tokens = [e["_id"]["_data"] for e in events]
        assert all(a < b for a, b in zip(tokens, tokens[1:]))
        times = [e["clusterTime"] for e in events]
        assert all(isinstance(t, Timestamp) for t in times)
        lost_lookups = [e["documentKey"]["_id"] for e in updates if e.get("fullDocument") is None]
        print(f"migrations={migrations} inserts={len(inserts)} updates={len(updates)} "
              f"null updateLookups={len(lost_lookups)}")
        # Nothing is ever deleted: every look-up finds its document wherever it lives now.
        assert lost_lookups == []
        for e in updates:
            assert e["fullDocument"]["_id"] == e["documentKey"]["_id"]
    finally:
        for c in clients:
            c.close()


def _le(a: Any, b: Any) -> bool:
    from bson import MinKey
    return isinstance(a, MinKey) or (not _is_max(a) and a <= b)


def _lt(a: Any, b: Any) -> bool:
    return _is_max(b) or a < b


def _is_max(v: Any) -> bool:
    from bson import MaxKey
    return isinstance(v, MaxKey)


def test_stale_router_is_told_and_retries(cluster_factory: Any) -> None:
    """A shard answers a routed request carrying an older placement version with StaleConfig
    (13388, ``vReceived``/``vWanted``/``shardId``); the second router, which did not run the
    moveChunk, still writes to the new owner."""
    cluster = cluster_factory(shards=2, routers=2)
    a, b = (pymongo.MongoClient(u, serverSelectionTimeoutMS=10000) for u in cluster.router_uris)
    try:
        a.admin.command("enableSharding", "sv", primaryShard="shard0")
        a.admin.command("shardCollection", "sv.c", key={"x": 1})
        b.sv.c.insert_one({"x": 1})  # router b has loaded the routing table
        a.admin.command("moveChunk", "sv.c", find={"x": 1}, to="shard1")
        b.sv.c.insert_one({"x": 2})  # b's cached table is stale: StaleConfig, refresh, retry
        assert sorted(d["x"] for d in b.sv.c.find()) == [1, 2]
        s0 = pymongo.MongoClient(f"mongodb://127.0.0.1:{cluster.shard('shard0').port}/",
                                 directConnection=True)
        s1 = pymongo.MongoClient(f"mongodb://127.0.0.1:{cluster.shard('shard1').port}/",
                                 directConnection=True)
        try:
            assert s0.sv.c.count_documents({}) == 0
            assert s1.sv.c.count_documents({}) == 2
            epoch = a.config.collections.find_one({"_id": "sv.c"})["lastmodEpoch"]
            ts = a.config.collections.find_one({"_id": "sv.c"})["timestamp"]
            old = {"e": epoch, "t": ts, "v": Timestamp(1, 0)}
            with pytest.raises(OperationFailure) as info:
                s1.sv.command({"insert": "c", "documents": [{"x": 3}], "shardVersion": old})
            assert info.value.code == 13388
            details = info.value.details
            assert details["codeName"] == "StaleConfig"
            assert details["ns"] == "sv.c" and details["shardId"] == "shard1"
            assert details["vReceived"]["v"] == Timestamp(1, 0)
            assert details["vWanted"]["v"] == Timestamp(2, 0)
            assert s1.sv.c.count_documents({}) == 2
        finally:
            s0.close()
            s1.close()
    finally:
        a.close()
        b.close()


def test_routed_reads_skip_orphans(cluster_factory: Any) -> None:
    """A routed (versioned) read does not return a shard's orphans (documents of a chunk the
    shard does not own, as a migration leaves them between clone and range deletion); a direct
    read of the shard still sees them."""
    cluster = cluster_factory(shards=2)
    client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=10000)
    direct = pymongo.MongoClient(f"mongodb://127.0.0.1:{cluster.shard('shard1').port}/",
                                 directConnection=True)
    try:
        client.admin.command("enableSharding", "orph", primaryShard="shard0")
        client.admin.command("shardCollection", "orph.c", key={"x": 1})
        client.admin.command("split", "orph.c", middle={"x": 0})
        client.admin.command("moveChunk", "orph.c", find={"x": 0}, to="shard1")
        client.orph.c.insert_many([{"_id": i, "x": i} for i in range(-3, 3)])
        direct.orph.c.insert_one({"_id": 100, "x": -100})  # an orphan on shard1
        assert direct.orph.c.count_documents({}) == 4
        coll = client.orph.c
        assert sorted(d["_id"] for d in coll.find()) == list(range(-3, 3))
        assert coll.count_documents({}) == 6
        assert sorted(coll.distinct("x")) == list(range(-3, 3))
        assert len(list(coll.aggregate([{"$match": {}}]))) == 6
    finally:
        direct.close()
        client.close()
