"""Shared pieces of the cross-shard transaction tests (issue 15). A collection split at ``x: 0``
over two shards and reading events with a deadline are :mod:`shardsim.testing.helpers`'
``split_over_two_shards`` and ``read_events``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pymongo
from pymongo.errors import PyMongoError

from shardsim.testing.helpers import split_over_two_shards


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
    primary, other = split_over_two_shards(client, "p.c")
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
