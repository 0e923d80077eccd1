"""Shared pieces of the cross-shard transaction tests (issue 15): a collection split at
``x: 0`` over two shards, and reading a number of change events with a deadline."""

from __future__ import annotations

import threading
import time
from typing import Any

import pymongo
from pymongo.errors import PyMongoError


def two_shard_collection(client: pymongo.MongoClient, ns: str) -> tuple[str, str]:
    """Shard ``ns`` on ``{x: 1}`` with the chunk ``x < 0`` on the database's primary shard and
    ``x >= 0`` on another; returns ``(primary, other)`` shard names."""
    db, _coll = ns.split(".")
    client.admin.command("enableSharding", db)
    primary = client.config.databases.find_one({"_id": db})["primary"]
    other = next(s["_id"] for s in client.admin.command("listShards")["shards"]
                 if s["_id"] != primary)
    client.admin.command("shardCollection", ns, key={"x": 1})
    client.admin.command("split", ns, middle={"x": 0})
    client.admin.command("moveChunk", ns, find={"x": 0}, to=other)
    return primary, other


def read_events(stream: Any, want: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    """Up to ``want`` events from a pymongo change stream, waiting at most ``timeout`` s."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
    return out


def commit_in_background(session: Any) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``session.commit_transaction()`` on a thread (it may block in two-phase commit);
    returns the started thread and the list that receives its PyMongoError, if any."""
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            session.commit_transaction()
        except PyMongoError as exc:
            errors.append(exc)
    t = threading.Thread(target=commit)
    t.start()
    return t, errors


def hold_prepared(c: Any, client: pymongo.MongoClient, extra: tuple[dict[str, Any], ...] = ()
                  ) -> tuple[Any, str, threading.Thread, Any]:
    """In an in-process cluster ``c``: ``p.c`` split over two shards holding ``{_id: -1}`` and
    ``{_id: 1}`` (``v: 0``) plus ``extra`` documents, and a cross-shard transaction setting
    ``v: 1`` on both, held prepared after its commit decision (the coordinator's fail point
    ``hangBeforeWaitingForDecisionWriteConcern``, left on). Returns (collection, coordinating
    shard, the thread committing it, the newest prepare timestamp)."""
    primary, other = two_shard_collection(client, "p.c")
    coll = client.p.c
    coll.insert_many([{"_id": -1, "x": -1, "v": 0}, {"_id": 1, "x": 1, "v": 0}, *extra])
    c.configure_fail_point(primary, "hangBeforeWaitingForDecisionWriteConcern", "alwaysOn")
    s = client.start_session()
    s.start_transaction()
    coll.update_one({"_id": -1, "x": -1}, {"$set": {"v": 1}}, session=s)
    coll.update_one({"_id": 1, "x": 1}, {"$set": {"v": 1}}, session=s)
    t = threading.Thread(target=s.commit_transaction)
    t.start()
    deadline = time.monotonic() + 10
    while not any(d.get("decision") for d in c.cluster.node(primary).coordinators.documents()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    at = max(txn.prepare_ts for name in (primary, other)
             for txn in c.cluster.node(name).sessions.prepared())
    return coll, primary, t, at
