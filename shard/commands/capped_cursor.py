"""Tailable cursors on capped collections (``find`` with ``tailable[, awaitData]``), as mongod
gives them (``find_cmd.cpp``, ``CollectionScan`` with ``tailable``): the cursor reads the
collection in insertion (natural) order and stays open at its end; each ``getMore`` returns the
documents inserted since, an empty batch when there are none (``awaitData``: after waiting up to
the getMore's ``maxTimeMS``, default 1 s). If the collection goes away the cursor ends.
shardsim does not evict the oldest documents of a capped collection (no ``size``/``max``
enforcement), so a tailable cursor never loses its position.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from shardsim.core import query as q
from shardsim.core.cursors import Batch, Cursor

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

AWAIT_POLL_S = 0.02


class TailableCollectionCursor(Cursor):
    """A tailable cursor over capped collection ``db.name`` with ``filt``/``projection``;
    ``position`` counts the documents (in insertion order) already scanned."""

    tailable = True

    def __init__(self, node: "ShardNode", db: str, name: str, filt: dict[str, Any],
                 projection: dict[str, Any] | None, await_data: bool) -> None:
        super().__init__(f"{db}.{name}")
        self.node = node
        self.db, self.name = db, name
        self.coll = node.storage.get(db, name)
        self.filt = filt
        self.projection = projection
        self.await_data = await_data
        self.position = 0

    def _scan(self, limit: int) -> list[Any] | None:
        coll = self.node.storage.get(self.db, self.name)
        if coll is None or coll is not self.coll:
            return None  # dropped (or re-created): the cursor is dead
        docs = list(coll.docs.values())[self.position:]
        out = []
        for doc in docs:
            if len(out) >= limit:
                break
            self.position += 1
            if q.matches(self.filt, doc):
                out.append(doc)
        return out

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        limit = batch_size if batch_size else (101 if first else 1 << 62)
        found = self._scan(limit)
        if found is None:
            return Batch([], exhausted=True)
        if not found and self.await_data and not first:
            deadline = asyncio.get_running_loop().time() + (max_time_ms or 1000) / 1000
            while not found and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(AWAIT_POLL_S)
                found = self._scan(limit)
                if found is None:
                    return Batch([], exhausted=True)
        return Batch(q.project(found, self.projection) if self.projection else found,
                     exhausted=False)
