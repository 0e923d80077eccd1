"""Small helpers for tests of change-stream code against a sharded cluster (the in-process kit,
``shardsim up``, or a real mongos): shard a collection over two shards, read events until a
deadline, ask ``$currentOp`` about a stream. Each takes a pymongo client or change stream.

::

    from shardsim.testing.helpers import read_events, split_over_two_shards

    primary, other = split_over_two_shards(client, "shop.orders")
    with client.shop.orders.watch(max_await_time_ms=100) as stream:
        ...
        events = read_events(stream, 2, timeout=5)
"""

from __future__ import annotations

import time
from typing import Any


def split_over_two_shards(client: Any, ns: str, key: str = "x", middle: Any = 0
                          ) -> tuple[str, str]:
    """Shard ``ns`` (``"db.coll"``) on ``{key: 1}`` with the chunk ``key < middle`` on the
    database's primary shard and ``key >= middle`` on another shard (``enableSharding``,
    ``shardCollection``, ``split``, ``moveChunk``, as a user would). Returns ``(primary,
    other)`` shard names. Raises pymongo's OperationFailure as the commands do (e.g. 20
    IllegalOperation with one shard, or a collection already sharded)."""
    db = ns.split(".")[0]
    client.admin.command("enableSharding", db)
    primary = client.config.databases.find_one({"_id": db})["primary"]
    other = next(s["_id"] for s in client.admin.command("listShards")["shards"]
                 if s["_id"] != primary)
    client.admin.command("shardCollection", ns, key={key: 1})
    client.admin.command("split", ns, middle={key: middle})
    client.admin.command("moveChunk", ns, find={key: middle}, to=other)
    return primary, other


def read_events(stream: Any, want: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    """Up to ``want`` events from a pymongo change stream, waiting at most ``timeout`` seconds
    (``try_next`` in a loop: each call waits up to the stream's ``max_await_time_ms``). Fewer
    events than ``want`` when the deadline passes: ``read_events(stream, 1, 1.0) == []``
    asserts that nothing arrives within a second."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        event = stream.try_next()
        if event is not None:
            out.append(event)
    return out


def change_stream_ops(client: Any, ns: str | None = None,
                      cursor_id: int | None = None) -> list[dict[str, Any]]:
    """The ``$currentOp`` entries (``idleCursors: true``, ``localOps: true``: the router's own
    cursors) of the router's change-stream cursors, those on ``ns`` and/or with
    ``cursor.cursorId == cursor_id`` when given. Each has shardsim's ``changeStream``
    sub-document: per remote its promise, lag and buffered events, and ``waitingFor``
    (docs/change-streams-router.md)."""
    match: dict[str, Any] = {"changeStream": {"$exists": True}}
    if ns is not None:
        match["ns"] = ns
    if cursor_id is not None:
        match["cursor.cursorId"] = cursor_id
    return list(client.admin.aggregate([
        {"$currentOp": {"idleCursors": True, "localOps": True}}, {"$match": match}]))


def waiting_for(client: Any, ns: str) -> list[str]:
    """The remotes (shard names, ``config``) the router's change stream on ``ns`` waits for
    right now (``changeStream.waitingFor`` of its ``$currentOp`` entry); [] without one."""
    entries = change_stream_ops(client, ns)
    return list(entries[0]["changeStream"]["waitingFor"]) if entries else []


def wait_until(predicate: Any, timeout_s: float = 10.0, interval_s: float = 0.02) -> None:
    """Call ``predicate()`` until it is true; AssertionError after ``timeout_s`` seconds (for
    a new primary, a rollback, a member catching up)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s: {predicate}")
        time.sleep(interval_s)


__all__ = ["change_stream_ops", "read_events", "split_over_two_shards", "wait_until",
           "waiting_for"]
