"""The shard's side of ``readConcern`` (``read_concern_mongod.cpp`` ``waitForReadConcern``):

* ``afterClusterTime``/``atClusterTime`` beyond the newest oplog entry: the shard writes a
  no-op (``makeNoopWriteIfNeeded``), so its oplog reaches the requested time before the read
  runs and every write at or before it is visible;
* prepare conflicts (:mod:`shard.prepare_conflicts`): ``snapshot``, ``linearizable`` and
  ``afterClusterTime`` reads wait for the prepared transactions whose documents they meet;
  other reads outside transactions ignore them (``canIgnorePrepareConflicts``);
* ``snapshot`` outside a transaction: the read runs on the collection as of ``atClusterTime``
  (given, else the newest oplog entry's ts: the last applied write) through
  :class:`shard.snapshot.SnapshotView`, and the reply carries ``atClusterTime``
  (``cursor.atClusterTime`` for find/aggregate, top level for distinct).

Parsing and the per-command rules are :mod:`shardsim.core.read_concern`'s.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from bson.timestamp import Timestamp

from shardsim.shard.prepare_conflicts import wait_for_prepared
from shardsim.core.commands import Request
from shardsim.core.read_concern import CURSOR_COMMANDS, attach_cluster_time, parse

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

#: the snapshot time of the snapshot read the current command runs (None: latest data)
SNAPSHOT_AT: ContextVar[Timestamp | None] = ContextVar("shardsim_snapshot_at", default=None)

NOOP_NOTE = {"noop write for afterClusterTime read concern": 1}


def reach(node: "ShardNode", ts: Timestamp) -> None:
    """Make the oplog reach ``ts`` (a no-op entry when the newest entry is older)."""
    last = node.oplog.last_ts()
    if last is None or last < ts:
        node.write_noop(dict(NOOP_NOTE))


async def run_with_read_concern(node: "ShardNode", handler: Callable[[Request], Awaitable[dict]],
                                req: Request) -> dict[str, Any]:
    """Run ``handler(req)`` under the request's readConcern (see the module doc). Errors are
    :func:`shardsim.core.read_concern.parse`'s and SnapshotTooOld (239)."""
    name = node.commands.canonical(req.name)
    if name in CURSOR_COMMANDS:  # any readConcern, checked for its shape and ignored
        parse(req.body, name, node.clock.now(), snapshot_ok=True)
        return await handler(req)
    rc = parse(req.body, name, node.clock.now(),
               snapshot_ok=node.commands.spec(req.name).snapshot)
    if rc is None or req.body.get("autocommit") is False:
        return await handler(req)
    target = rc.after or rc.at
    if target is not None:
        reach(node, target)
    if not rc.snapshot:
        if rc.after is not None or rc.level == "linearizable":
            # these reads enforce prepare conflicts (canIgnorePrepareConflicts): they read the
            # latest data, so any prepared document they meet makes them wait
            if node.commands.spec(req.name).reads:
                await wait_for_prepared(node, req, None)
        return await handler(req)
    at = rc.at or node.oplog.last_ts() or node.clock.now()
    await wait_for_prepared(node, req, at)
    token = SNAPSHOT_AT.set(at)
    try:
        reply = await handler(req)
    finally:
        SNAPSHOT_AT.reset(token)
    attach_cluster_time(reply, at)
    return reply
