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
