"""A router cursor that stays tied to one shard cursor: tailable ``find`` on a capped
collection (capped collections cannot be sharded, so one shard owns it). mongos keeps such a
cursor as a single remote in its ``ClusterClientCursor``; each client ``getMore`` becomes one
shard ``getMore`` (with the client's ``maxTimeMS`` for ``awaitData``), an empty batch keeps the
cursor open, and ``killCursors`` kills the shard cursor too (``cluster_find.cpp``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson.int64 import Int64

from shardsim.router.forwarding import forwardable, namespace
from shardsim.core.commands import Request
from shardsim.core.cursors import Batch, Cursor

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode


class RemoteCursor(Cursor):
    """The client's cursor over shard ``shard``'s cursor ``remote_id`` on ``ns``, opened on
    member ``host`` (its getMores and killCursors go there, as a mongos remote cursor keeps
    its ``HostAndPort``)."""

    def __init__(self, node: "RouterNode", shard: str, ns: str, remote_id: int,
                 first_batch: list[Any], tailable: bool, await_data: bool,
                 host: str | None = None) -> None:
        super().__init__(ns)
        self.node = node
        self.shard = shard
        self.host = host
        self.remote_id = remote_id
        self.pending = list(first_batch)
        self.tailable = tailable
        self.await_data = await_data

    def current_op_extra(self) -> dict[str, Any]:
        """``{remote: {shard, host, state, cursorId}}`` in this cursor's ``$currentOp`` entry
        (``localOps: true``): the shard cursor it is tied to, the member it is on and that
        member's state as the router's monitor sees it (``PRIMARY``, ``SECONDARY``...:
        :meth:`router.shard_registry.ShardRegistry.member_state`). shardsim's own field: a
        mongos ``GenericCursor`` does not list its remotes."""
        host = self.host or ""
        return {"remote": {"shard": self.shard, "host": host,
                           "state": self.node.shards.member_state(self.shard, host)
                           if host else "UNKNOWN",
                           "cursorId": Int64(self.remote_id)}}

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        if first or self.pending:
            docs, self.pending = self.pending, []
            return Batch(docs, exhausted=self.remote_id == 0)
        if self.remote_id == 0:
            return Batch([], exhausted=True)
        db, coll = self.ns.split(".", 1)
        more: dict[str, Any] = {"getMore": Int64(self.remote_id), "collection": coll}
        if batch_size:
            more["batchSize"] = batch_size
        if max_time_ms and self.await_data:
            more["maxTimeMS"] = max_time_ms
        reply = await self.node.shard_command(self.shard, db, more, host=self.host)
        cur = reply["cursor"]
        self.remote_id = int(cur.get("id", 0))
        return Batch(list(cur.get("nextBatch", [])), exhausted=self.remote_id == 0)

    async def close(self) -> None:
        if self.remote_id:
            db, coll = self.ns.split(".", 1)
            remote, self.remote_id = self.remote_id, 0
            await self.node.shard_command(self.shard, db, {"killCursors": coll,
                                                           "cursors": [Int64(remote)]},
                                          check=False, host=self.host)


async def tailable_find(node: "RouterNode", req: Request, shard: str) -> dict[str, Any]:
    """``find`` with ``tailable`` on ``shard`` (the collection's owner): the shard's first
    batch, then a :class:`RemoteCursor` for the getMores. The shard's errors (2: not capped)
    are the reply."""
    db, coll = namespace(req)
    body = forwardable(req.body)
    host, reply = await node.shard_command_at(shard, db, body)
    cur = reply["cursor"]
    cursor = RemoteCursor(node, shard, f"{db}.{coll}", int(cur.get("id", 0)),
                          list(cur.get("firstBatch", [])), True, bool(req.get("awaitData")),
                          host=host)
    return {"cursor": await node.cursors.run_first_batch(cursor, None)}
