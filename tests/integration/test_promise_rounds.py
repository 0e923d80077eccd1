"""Promise requests of an unordered write whose statements go to several shards at once
(router/writes.py ``Run.promise_round``, router/change_stream/promise_requests.py
``before_shard_write``): the idle remotes are asked once, for a time past every statement of
the round, so a written shard's own write never lands past that request and every remote is
not asked again after it. Latency and messages only; the merge rule decides what is released,
so every event still arrives once, in order."""

from __future__ import annotations

import time
from typing import Any

import pymongo

from shardsim.router.change_stream.promise_requests import PromiseRequests
from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import read_events


def test_an_unordered_round_over_two_shards_asks_each_idle_remote_once(monkeypatch) -> None:
    with ShardedCluster(3) as cluster, pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("enableSharding", "rnd", primaryShard="shard0")
        client.admin.command("shardCollection", "rnd.c", key={"k": 1})
        client.admin.command("split", "rnd.c", middle={"k": 0})
        client.admin.command("moveChunk", "rnd.c", find={"k": 1}, to="shard1",
                             _waitForDelete=True)
        router = cluster.cluster.router.node
        asked: list[tuple[str, int]] = []
        send = PromiseRequests.send

        def spy(self: PromiseRequests, pool: Any, addr: str, t: int, stream: Any = None) -> None:
            if self is router.promise_requests:
                asked.append((addr, t))
            send(self, pool, addr, t, stream)

        monkeypatch.setattr(PromiseRequests, "send", spy)
        idle = cluster.shard_address("shard2")
        written = {cluster.shard_address("shard0"), cluster.shard_address("shard1")}
        coll = client.rnd.c
        with coll.watch(max_await_time_ms=300) as stream:
            stream.try_next()
            for rnd in range(5):
                time.sleep(0.3)  # every remote back to waiting, nothing asked since
                asked.clear()
                docs = [{"k": -1 - i, "r": rnd} for i in range(40)] + \
                       [{"k": i, "r": rnd} for i in range(1, 61)]
                coll.insert_many(docs, ordered=False)
                got = read_events(stream, 100, 10.0)
                assert sorted(e["fullDocument"]["k"] for e in got) == sorted(d["k"] for d in docs)
                datas = [e["_id"]["_data"] for e in got]
                assert datas == sorted(datas)
                for addr in {a for a, _t in asked} - written:  # shard2 and the config server
                    times = [t for a, t in asked if a == addr]
                    # once; again only when the wall clock's second turned during the round
                    # (a shard then stamps its write in the new second, past any request)
                    assert len(times) == 1 or (len(times) == 2
                                               and times[1] >> 32 > times[0] >> 32), asked
                assert idle in {a for a, _t in asked}, asked
