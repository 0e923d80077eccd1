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

The no-op writer's interval is set with ``setParameter: {periodicNoopIntervalSecs}``
(:meth:`shard.node.ShardNode.set_parameter`).
"""

from __future__ import annotations

from typing import Any


from shardsim.core.clock import ts_key
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.protocol import shard as shrq

commands = CommandFamily("testing")


@commands.handler(shrq.TruncateOplog.NAME)
async def truncate_oplog(node: Any, req: Request) -> dict[str, Any]:
    """See the module docstring."""
    before = shrq.TruncateOplog.parse(req.body).before
    removed = node.oplog.truncate_before(ts_key(before))  # pre-images follow (node callback)
    node.flush()
    return {"removed": removed, "earliestOptime": node.oplog.first_ts()}


@commands.handler(shrq.SetClusterTime.NAME)
async def set_cluster_time(node: Any, req: Request) -> dict[str, Any]:
    """See the module docstring."""
    ts = shrq.SetClusterTime.parse(req.body).ts
    node.cs_promise_faults.set_pin(ts)
    return {"pinned": ts}
