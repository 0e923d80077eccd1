"""Tailable cursors on capped collections (``find`` with ``tailable[, awaitData]``), as mongod
gives them (``find_cmd.cpp``, ``getmore_cmd.cpp``, ``CollectionScan`` with ``tailable`` in
``src/mongo/db/exec/collection_scan.cpp``): the cursor reads the collection in insertion
(RecordId) order and stays open at its end, positioned on the last record it read; each
``getMore`` returns the documents inserted since. Without ``awaitData`` a getMore with nothing new
returns an empty batch at once; with it, it waits up to the getMore's ``maxTimeMS`` (the driver's
``maxAwaitTimeMS``; 1000 ms when absent) for an insert and returns what came (an empty batch if
nothing did). The first ``find`` never waits. If the record the cursor is positioned on was
deleted (evicted by newer inserts, :mod:`shard.capped`) the getMore fails with
CappedPositionLost (136) "CollectionScan died due to position in capped collection being
deleted. Last seen record id: RecordId(<n>)" and the cursor is gone; a dropped collection ends
the cursor.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from shardsim.core import query as q
from shardsim.core.cursors import Batch, Cursor
from shardsim.core.errors import MongoError
from shardsim.shard import capped

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

AWAIT_POLL_S = 0.02
_NO_KEY = object()


class TailableCollectionCursor(Cursor):
    """A tailable cursor over capped collection ``db.name`` with ``filt``/``projection``;
    ``last_rid``/``last_key``: the RecordId and storage key of the last document scanned."""

    tailable = True

    def __init__(self, node: "ShardNode", db: str, name: str, filt: dict[str, Any],
                 projection: dict[str, Any] | None, await_data: bool, skip: int = 0,
                 limit: int = 0) -> None:
        """``skip``: matching documents passed over first; ``limit``: documents returned in
        all before the cursor ends (0: no limit), as a find's ``skip``/``limit``."""
        super().__init__(f"{db}.{name}")
        self.skip_left = max(0, int(skip or 0))
        self.limit_left = int(limit) if limit else None
        self.node = node
        self.db, self.name = db, name
        self.coll = node.storage.get(db, name)
        self.filt = filt
        self.projection = projection
        self.await_data = await_data
        self.last_rid = 0
        self.last_key: Any = _NO_KEY

    def _scan(self, limit: int) -> list[Any] | None:
        """Matching documents after the position (at most ``limit``); None when the collection
        is gone. Raises CappedPositionLost (136)."""
        coll = self.node.storage.get(self.db, self.name)
        if coll is None or coll is not self.coll:
            return None  # dropped (or re-created): the cursor is dead
        capped.sync(coll)
        if self.last_key is not _NO_KEY and coll.record_ids.get(self.last_key) != self.last_rid:
            raise MongoError(136, "CollectionScan died due to position in capped collection being "
                                  f"deleted. Last seen record id: RecordId({self.last_rid})")
        newer: list[tuple[Any, Any]] = []
        rids = coll.record_ids
        for k in reversed(coll.docs):  # newest first, down to the position
            if rids[k] <= self.last_rid:
                break
            newer.append((k, coll.docs[k]))
        out = []
        for k, doc in reversed(newer):
            if len(out) >= limit:
                break
            self.last_rid, self.last_key = rids[k], k
            if q.matches(self.filt, doc):
                if self.skip_left:
                    self.skip_left -= 1
                    continue
                out.append(doc)
        return out

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        limit = batch_size if batch_size else (101 if first else 1 << 62)
        if self.limit_left is not None:
            limit = min(limit, self.limit_left)
        found = self._scan(limit)
        if found is None:
            return Batch([], exhausted=True)
        if not found and self.await_data and not first:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + (max_time_ms if max_time_ms else 1000) / 1000
            oplog = self.node.oplog
            while not found:
                left = deadline - loop.time()
                if left <= 0:
                    break
                if self.db == "local":  # not replicated: no oplog entry to wait for
                    await asyncio.sleep(min(left, AWAIT_POLL_S))
                else:
                    await oplog.wait_for_newer(oplog.latest_key, left)
                found = self._scan(limit)
                if found is None:
                    return Batch([], exhausted=True)
        done = False
        if self.limit_left is not None:
            self.limit_left -= len(found)
            done = self.limit_left <= 0
        return Batch(q.project(found, self.projection) if self.projection else found,
                     exhausted=done)
