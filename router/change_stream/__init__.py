"""The router half of change streams (mongos): ``aggregate`` with ``$changeStream`` on the router.

The path of one event, file by file (each named as the server names it):

- :mod:`.cursor` — the stream: opens a cursor on every shard and on the config server's
  ``config.shards``, schedules the getMores, and serves the client's cursor;
- :mod:`.raw_events` — each shard reply's batch parsed in place (Items, Blocks), the
  ``_id == $sortKey`` check, the ``$sortKey`` cut off the bytes;
- :mod:`.async_results_merger` — the AsyncResultsMerger (:class:`Merger`, :class:`Remote`):
  buffers, promises, the high-water mark, what is ready;
- :mod:`.merge_cursors` — ``$mergeCursors`` and the stages above it (:class:`ChangeStreamMerge`):
  :mod:`.handle_topology_change` (new shards), :mod:`.ensure_resume_token_present` (the resume
  check);
- :mod:`.promise_requests` — shardsim's own protocol asking idle shards for a promise.

See ``docs/change-streams-router.md``; the shard half is ``shard/change_stream/``.
"""

from __future__ import annotations

from typing import Any

from shardsim.router.change_stream.async_results_merger import Merger, Remote
from shardsim.router.change_stream.cursor import RouterChangeStream, RouterChangeStreamCursor
from shardsim.router.change_stream.merge_cursors import ChangeStreamMerge
from shardsim.router.change_stream.promise_requests import PromiseRequests
from shardsim.core import change_stream_spec as shard_spec
from shardsim.core.errors import MongoError

__all__ = ["aggregate_change_stream", "ChangeStreamMerge", "Merger", "PromiseRequests", "Remote",
           "RouterChangeStream", "RouterChangeStreamCursor"]


def _batch_size(cursor_opt: Any) -> int | None:
    """``cursor.batchSize`` of the client's aggregate (None: not given). Raises FailedToParse
    (9) when ``cursor`` is missing, TypeMismatch (14) for a wrong type, 51024 when negative."""
    if cursor_opt is None:
        raise MongoError(9, "The 'cursor' option is required, except for aggregate with the "
                            "explain argument")
    if not isinstance(cursor_opt, dict):
        raise MongoError(14, "BSON field 'aggregate.cursor' is the wrong type, expected type 'object'")
    batch_size = cursor_opt.get("batchSize")
    if batch_size is not None and (isinstance(batch_size, bool)
                                   or not isinstance(batch_size, (int, float))):
        raise MongoError(14, "BSON field 'cursor.batchSize' is the wrong type, expected type 'long'")
    if batch_size is not None and batch_size < 0:
        raise MongoError(51024, f"BatchSize value must be non-negative, but received: {int(batch_size)}")
    return int(batch_size) if batch_size is not None else None


async def aggregate_change_stream(router: Any, req: Any) -> dict[str, Any]:
    """Run ``aggregate`` with a ``$changeStream`` pipeline on the router (called by the router's
    ``aggregate`` when ``pipeline[0]`` is ``$changeStream``).

    ``router`` — the :class:`router.node.RouterNode`; ``req`` — a
    :class:`shardsim.core.commands.Request` (``db``, ``body`` with ``aggregate``, ``pipeline``,
    ``cursor``). Returns the reply body ``{cursor: {firstBatch: [], postBatchResumeToken, id,
    ns}}``. Raises MongoError: the shard parser's validation errors (e.g. 40415/14/2/50865/
    40674/260/73, the same parser as the shards', before any shard is touched), 31123 for
    ``showMigrationEvents`` (``assertIsLegalSpecification``), 72 for a read concern other than
    majority, FailedToParse (9) when ``cursor`` is missing, and the first shard error while
    establishing cursors (labels computed by the router).
    """
    body = req.body
    pipeline = body["pipeline"]
    target = body.get("aggregate")
    db = req.db
    spec_doc = pipeline[0].get("$changeStream") if isinstance(pipeline[0], dict) else None
    shard_spec.parse(db, target, pipeline, profile=router.profile)
    if isinstance(spec_doc, dict) and spec_doc.get("showMigrationEvents"):
        # assertIsLegalSpecification (document_source_change_stream.cpp)
        raise MongoError(31123, "Change streams from mongos may not show migration events")
    rc = body.get("readConcern")
    level = rc.get("level") if isinstance(rc, dict) else None
    if level is not None and level != "majority":
        # DocumentSourceChangeStream::LiteParsed::supportsReadConcern: majority only.
        raise MongoError(72, f"Command aggregate does not support {{ readConcern: {{ level: \"{level}\" }} }}"
                             " :: caused by :: Only read concern level majority is supported")
    batch_size = _batch_size(body.get("cursor"))
    ns = f"{db}.{target}" if isinstance(target, str) else f"{db}.$cmd.aggregate"
    stream = RouterChangeStream(router, db, target, ns, dict(spec_doc), pipeline[1:], body)
    await stream.establish()
    reply = await router.cursors.run_first_batch(stream.cursor, batch_size)
    return {"cursor": reply}
