"""``$currentOp`` through the router (mongos' ``aggregate`` with ``[{$currentOp: {...}}, ...]``
on ``admin``).

As on mongos (``cluster_aggregate.cpp``: ``$currentOp`` is a collectionless stage run on every
shard unless ``localOps: true``; ``DocumentSourceCurrentOp::doGetNext`` adds ``shard`` to each
shard's entry):

* ``localOps: true`` — the router's own operations: its cursors
  (:func:`shardsim.core.current_op.local_operations`). Each router change-stream cursor carries
  shardsim's ``changeStream`` sub-document (why the stream waits:
  :mod:`router.change_stream.current_op`);
* otherwise — every shard answers for itself (``$currentOp`` with ``fromMongos: true``), each
  entry led by ``shard: <name>``; the router's own cursors are not listed (so, as on mongos,
  router change-stream cursors need ``localOps: true``).

The stages after ``$currentOp`` run on the router over the union. Options and errors:
:func:`shardsim.core.current_op.parse`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from shardsim.router.forwarding import BIG_BATCH
from shardsim.core import current_op
from shardsim.core.commands import Request

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode


async def aggregate_current_op(node: "RouterNode", req: Request) -> dict[str, Any]:
    """Answer ``aggregate`` whose pipeline starts with ``$currentOp``; returns ``{cursor:
    {firstBatch, id, ns: "admin.$cmd.aggregate"}}``. Raises MongoError 14/9/73/40602
    (:func:`shardsim.core.current_op.parse`) and a shard's error when one fails."""
    pipeline = req.body["pipeline"]
    options = current_op.parse(req.db, req.arg, pipeline)
    if options["localOps"]:
        docs: list[Any] = current_op.local_operations(node, options)
    else:
        shards = [s[0] for s in node.catalog.shards()]
        body = {"aggregate": 1, "pipeline": [pipeline[0]], "cursor": {"batchSize": BIG_BATCH},
                "fromMongos": True}
        results = await asyncio.gather(*(node.drain(s, "admin", body) for s in shards))
        docs = [{"shard": name, **dict(d)} for name, (_, part) in zip(shards, results)
                for d in part]
    if len(pipeline) > 1:
        from shardsim.core.query import run_pipeline
        docs = run_pipeline(docs, pipeline[1:], None)
    batch_size = (req.get("cursor") or {}).get("batchSize")
    return await node.cursor_reply("admin.$cmd.aggregate", docs, req, batch_size)


__all__ = ["aggregate_current_op"]
