"""Stopping the in-process kit while clients are still connected is quiet: no asyncio
"Exception in callback ... CancelledError" traceback for the connection tasks it cancels
(``shardsim/core/server.py``: a connection task cancelled before its first step used to reach
``StreamReaderProtocol``'s done-callback, whose ``task.exception()`` raised)."""

from __future__ import annotations

import logging

import pymongo
import pytest

from shardsim.testing import ShardedCluster


def test_stop_with_connected_clients_logs_no_callback_error(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncio")
    clients = []
    with ShardedCluster(shards=2) as kit:
        for _ in range(3):
            c = pymongo.MongoClient(kit.uri, maxPoolSize=4)
            c.admin.command("ping")
            c.app.things.insert_one({})
            with c.app.things.watch(max_await_time_ms=10) as stream:
                stream.try_next()
            clients.append(c)
        for name in kit.shard_names:  # clients straight to the shards too
            d = pymongo.MongoClient(kit.shard_address(name), directConnection=True)
            d.admin.command("ping")
            clients.append(d)
    try:
        bad = [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
        assert bad == [], [r.getMessage() for r in bad]
    finally:
        for c in clients:
            c.close()
