"""Cluster-time gossip from outside cannot take down or poison a process (issue 17, item 1).

A durable cluster (config server, two shards, router, each with ``--dbpath``): a ``ping``
gossiping ``$clusterTime`` Timestamp(2**31, 1), Timestamp(2**32-1, 2**32-1) or a time two years
ahead, sent directly to each role and through the router, is refused with
ClusterTimeFailsRateLimiter (205, ``VectorClock::_ensurePassesRateLimiter``); a malformed
``$clusterTime`` gets the IDL's error; every process stays up, keeps accepting writes, and no
oplog carries a time beyond the wall clock.
"""

from __future__ import annotations

import time

import pymongo
from bson import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

SIG = {"hash": Binary(b"\x00" * 20, 0), "keyId": Int64(0)}
TWO_YEARS = 2 * 366 * 24 * 3600
BAD_TIMES = [Timestamp(2**31, 1), Timestamp(2**32 - 1, 2**32 - 1)]


def _client(port: int) -> pymongo.MongoClient:
    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                               serverSelectionTimeoutMS=10000)


def _raw_ping(client: pymongo.MongoClient, ct: object) -> dict:
    """Send ``ping`` with our own ``$clusterTime`` over a raw socket (pymongo gossips its own)."""
    import socket
    import struct

    import bson

    host, port = client.address
    body = bson.encode({"ping": 1, "$db": "admin", "$clusterTime": ct})
    payload = struct.pack("<I", 0) + b"\x00" + body
    header = struct.pack("<iiii", 16 + len(payload), 1, 0, 2013)
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(header + payload)
        head = b""
        while len(head) < 16:
            head += s.recv(16 - len(head))
        length = struct.unpack("<i", head[:4])[0]
        rest = b""
        while len(rest) < length - 16:
            rest += s.recv(length - 16 - len(rest))
    return bson.decode(rest[5:])


def _newest_oplog_secs(client: pymongo.MongoClient) -> int:
    entry = client.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()
    return entry["ts"].time


def test_bad_gossip_is_refused_at_every_role_and_nothing_breaks(cluster_factory):
    cluster = cluster_factory(shards=2, durable=True)
    ports = {p.name: p.port for p in cluster.processes}
    clients = {name: _client(port) for name, port in ports.items()}
    try:
        router = clients["router"]
        router.app.items.insert_one({"_id": 0})
        far = Timestamp(int(time.time()) + TWO_YEARS, 1)
        for name, client in clients.items():
            for ts in BAD_TIMES + [far]:
                reply = _raw_ping(client, {"clusterTime": ts, "signature": SIG})
                assert reply["ok"] == 0, (name, ts, reply)
                assert reply["code"] == 205 and reply["codeName"] == "ClusterTimeFailsRateLimiter"
                assert "too far from this node's wall clock time" in reply["errmsg"]
                # The reply still gossips out a sane cluster time.
                assert reply["$clusterTime"]["clusterTime"].time <= time.time() + 5
            # No signature is fine (a dummy proof); a bad shape gets the IDL's error.
            ok = _raw_ping(client, {"clusterTime": Timestamp(int(time.time()) - 10, 1)})
            assert ok["ok"] == 1, (name, ok)
            bad = _raw_ping(client, {"clusterTime": 5})
            assert bad["code"] == 14 and "'VectorClockComponents.$clusterTime.clusterTime'" \
                in bad["errmsg"]
            bad = _raw_ping(client, {"signature": SIG})
            assert bad["code"] == 40414
            bad = _raw_ping(client, {"clusterTime": Timestamp(1, 1),
                                     "signature": {"hash": Binary(b"x", 0), "keyId": Int64(0)}})
            assert bad["code"] == 140, bad
            bad = _raw_ping(client, {"clusterTime": Timestamp(1, 1),
                                     "signature": {"hash": Binary(b"\x00" * 20, 4),
                                                   "keyId": Int64(0)}})
            assert bad["code"] == 14, bad
            bad = _raw_ping(client, {"clusterTime": Timestamp(1, 1),
                                     "signature": {"hash": Binary(b"\x00" * 20, 0), "keyId": "k"}})
            assert bad["code"] == 14, bad
        time.sleep(2.5)  # the old failure: the config server exited within 2 s
        for proc in cluster.processes:
            assert proc.alive(), f"{proc.name} exited"
        # Every process keeps accepting writes, through the router and directly.
        router.app.items.insert_many([{"_id": i} for i in range(1, 50)])
        assert router.app.items.count_documents({}) == 50
        for name, client in clients.items():
            if name != "router":
                client.direct.probe.insert_one({"at": name})
                assert _newest_oplog_secs(client) <= time.time() + 5, name
        with router.app.items.watch(max_await_time_ms=500) as stream:
            router.app.items.insert_one({"_id": 99})
            event = None
            for _ in range(20):
                event = stream.try_next()
                if event is not None:
                    break
            assert event is not None and event["documentKey"] == {"_id": 99}
    finally:
        for c in clients.values():
            c.close()
