"""Test-only commands of the shard, shardsim's own (installed only with test commands on, as
mongod's ``configureFailPoint`` is; without them they do not exist: CommandNotFound 59).

* ``{_shardsimTruncateOplog: 1, before: <Timestamp>}`` -> ``{removed: <int>, earliestOptime}``:
  drop every oplog entry (and pre-image) older than ``before``, as capped-oplog truncation of
  the oldest entries does (the newest entry is always kept). A change stream resuming before
  the new oldest entry then fails with ChangeStreamHistoryLost (286). ``shardsim fault
  truncate-oplog`` sends it. TypeMismatch (14) when ``before`` is not a Timestamp.

* ``{_shardsimSetClusterTime: <Timestamp T>}`` -> ``{pinned: T}``: the shard's next oplog
  entry gets cluster time exactly T (the test kit's ``same_cluster_time`` pins two shards at
  one T; ``shardsim fault same-cluster-time``); promises stay at or below T until then.
  ``Timestamp(0, 0)`` clears the pin. TypeMismatch (14) when T is not a Timestamp, BadValue
  (2) when T is not after the shard's cluster time and newest oplog entry
  (:mod:`shard.change_stream.promise_faults`).

* ``{_shardsimStorageFull: <bool>}`` -> ``{pageCount, maxPageCount}``: with ``true`` a
  durable shard's SQLite file may not grow any more (``PRAGMA max_page_count`` = its page count
  now), so the next commit that needs a new page fails with SQLITE_FULL, the error a full disk
  gives: the write gets OutOfDiskSpace (14031) and is rolled back
  (:meth:`shard.node.ShardNode.flush`). ``false`` lifts the limit ("space is back").
  IllegalOperation (20) on an in-memory shard, TypeMismatch (14) for a non-bool.

The no-op writer's interval is set with ``setParameter: {periodicNoopIntervalSecs}``
(:meth:`shard.node.ShardNode.set_parameter`).
"""

from __future__ import annotations

from typing import Any


from shardsim.core.clock import ts_key
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import shard as shrq
from shardsim.core.auth import privileges as priv

commands = CommandFamily("testing")


@commands.handler(shrq.TruncateOplog.NAME, privileges=priv.INTERNAL)
async def truncate_oplog(node: Any, req: Request) -> dict[str, Any]:
    """See the module docstring."""
    before = shrq.TruncateOplog.parse(req.body).before
    removed = node.oplog.truncate_before(ts_key(before))  # pre-images follow (node callback)
    node.flush()
    return {"removed": removed, "earliestOptime": node.oplog.first_ts()}


@commands.handler(shrq.SetClusterTime.NAME, privileges=priv.INTERNAL)
async def set_cluster_time(node: Any, req: Request) -> dict[str, Any]:
    """See the module docstring."""
    ts = shrq.SetClusterTime.parse(req.body).ts
    node.cs_promise_faults.set_pin(ts)
    return {"pinned": ts}


@commands.handler(shrq.StorageFull.NAME, privileges=priv.INTERNAL)
async def storage_full(node: Any, req: Request) -> dict[str, Any]:
    """See the module docstring."""
    full = shrq.StorageFull.parse(req.body).full
    if node.durable is None:
        raise MongoError(20, f"{shrq.StorageFull.NAME} needs a durable shard (--dbpath)")
    conn = node.durable.conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    limit = conn.execute(f"PRAGMA max_page_count = {pages if full else 4294967294}").fetchone()[0]
    return {"pageCount": pages, "maxPageCount": limit}
