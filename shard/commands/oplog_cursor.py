"""Reading ``local.oplog.rs`` with ``find``: natural order, reverse natural order, or sorted,
and the tailable/awaitData cursor a real capped collection gives (what ``mongodump --oplog``,
replication tools and the oplog tests use)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from shardsim.core.clock import ts_key
from shardsim.core.cursors import Batch, Cursor, ListCursor
from shardsim.core.errors import MongoError
from shardsim.core import query as q

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode


def oplog_cursor(node: ShardNode, ns: str, filt: dict[str, Any], sort: dict[str, Any] | None,
                 skip: int, limit: int, projection: dict[str, Any] | None, tailable: bool,
                 await_data: bool) -> Cursor:
    """The cursor of a ``find`` on ``local.oplog.rs``: ``{$natural: -1}``/``{ts: -1}`` scans
    backwards, another sort sorts the matching entries, no sort gives an :class:`OplogCursor`
    (natural order, seeking to a ``ts`` lower bound, tailable when asked)."""
    if sort and list(sort) in (["$natural"], ["ts"]) and next(iter(sort.values())) == -1:
        docs = (d for d in node.oplog.entries_reversed() if q.matches(filt, d))
        out = []
        for d in docs:
            if skip:
                skip -= 1
                continue
            out.append(d)
            if limit and len(out) >= limit:
                break
        return ListCursor(ns, q.project(out, projection))
    if sort and list(sort) not in (["$natural"], ["ts"]):
        docs = [d for d in node.oplog.entries_from(0) if q.matches(filt, d)]
        docs = q.sort_docs(docs, sort)[skip:]
        return ListCursor(ns, q.project(docs[:limit] if limit else docs, projection))
    return OplogCursor(node, ns, filt, skip, limit, projection, tailable, await_data)


class OplogCursor(Cursor):
    """``find`` on ``local.oplog.rs`` in natural (ts) order; tailable/awaitData as mongod's
    capped-collection cursors: an empty batch keeps the cursor open, awaitData waits up to
    ``maxTimeMS`` (default 1000 ms) for new entries. A lower bound on ``ts`` (``$gt``/``$gte``/
    equality) seeks instead of scanning. A tailable getMore whose position was truncated away
    fails with CappedPositionLost (136)."""

    def __init__(self, node: ShardNode, ns: str, filt: dict[str, Any], skip: int, limit: int,
                 projection: dict[str, Any] | None, tailable: bool, await_data: bool) -> None:
        super().__init__(ns)
        self.node = node
        self.filt = filt
        self.skip = skip
        self.limit = limit
        self.returned = 0
        self.projection = projection
        self.tailable = tailable
        self.await_data = await_data
        self.pos = _ts_lower_bound(filt)
        self.scanned = False

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        """The next batch of matching entries (see the class docstring); 136 when truncated."""
        if not first and self.tailable and self.scanned and \
                self.node.oplog.truncated_through >= self.pos:
            # The entries after our position were truncated away (capped collection semantics).
            raise MongoError(136, "CollectionScan died due to position in capped collection "
                                  "being deleted.")
        limit = batch_size if batch_size else (101 if first else 1 << 62)
        if self.limit:
            limit = min(limit, self.limit - self.returned)
        out = self._scan(limit)
        if not out and self.await_data and not first:
            timeout = (max_time_ms if max_time_ms is not None else 1000) / 1000
            await self.node.oplog.wait_for_newer(self.pos - 1, timeout)
            out = self._scan(limit)
        self.returned += len(out)
        done = self.limit and self.returned >= self.limit
        if self.tailable and not done:
            return Batch(q.project(out, self.projection), exhausted=False)
        if done:
            return Batch(q.project(out, self.projection), exhausted=True)
        return Batch(q.project(out, self.projection), exhausted=self.node.oplog.latest_key < self.pos)

    def _scan(self, limit: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for entry in self.node.oplog.entries_from(self.pos):
            self.pos = ts_key(entry["ts"]) + 1
            self.scanned = True
            if q.matches(self.filt, entry):
                if self.skip:
                    self.skip -= 1
                    continue
                out.append(entry)
                if len(out) >= limit:
                    break
        return out


def _ts_lower_bound(filt: dict[str, Any]) -> int:
    conds = [filt]
    if isinstance(filt.get("$and"), list):
        conds += [c for c in filt["$and"] if isinstance(c, dict)]
    best = 0
    for c in conds:
        v = c.get("ts")
        if isinstance(v, Timestamp):
            best = max(best, ts_key(v))
        elif isinstance(v, dict):
            for op in ("$gte", "$gt", "$eq"):
                t = v.get(op)
                if isinstance(t, Timestamp):
                    best = max(best, ts_key(t) + (1 if op == "$gt" else 0))
    return best
