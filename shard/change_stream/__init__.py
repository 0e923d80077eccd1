"""The shard half of change streams: ``aggregate`` with ``$changeStream`` on a shard.

Pipeline (one module per stage, named like the server's
``document_source_change_stream_*.cpp``), built as one list by :mod:`.pipeline`
(``build_pipeline``, like the server's ``_buildPipeline``): :mod:`.oplog_match` →
:mod:`.unwind_transaction` → :mod:`.transform` → :mod:`.check_invalidate` →
:mod:`.check_resumability` / :mod:`.ensure_resume_token_present` → :mod:`.check_topology_change`
→ :mod:`.add_pre_image` → :mod:`.add_post_image` → the user's stages (:mod:`.user_stages`) →
:mod:`.split_large_event`; :mod:`.fast_crud` is its fused variant for plain CRUD entries;
:mod:`.cursor` runs it, batches the result and keeps the ``postBatchResumeToken``. See
``docs/change-streams-shard.md``.
"""

from __future__ import annotations

from typing import Any

from bson.int64 import Int64

from shardsim.core import resume_token as rt
from shardsim.core.clock import ts_from_key, ts_key
from shardsim.core.errors import MongoError
from shardsim.core import change_stream_spec as spec_mod
from shardsim.shard.change_stream.check_resumability import assert_history_available
from shardsim.shard.change_stream.cursor import ChangeStreamCursor

__all__ = ["aggregate_change_stream", "open_cursor"]


def _batch_size(req: Any) -> int | None:
    cursor_opt = req.body.get("cursor")
    if cursor_opt is None:
        if req.body.get("explain"):
            return None
        raise MongoError(9, "The 'cursor' option is required, except for aggregate with the explain argument")
    if not isinstance(cursor_opt, dict):
        raise MongoError(14, "BSON field 'aggregate.cursor' is the wrong type, expected type 'object'")
    bs = cursor_opt.get("batchSize")
    if bs is None:
        return None
    if isinstance(bs, bool) or not isinstance(bs, (int, float)):
        raise MongoError(14, "BSON field 'cursor.batchSize' is the wrong type, expected type 'long'")
    if bs < 0:
        raise MongoError(51024, f"BatchSize value must be non-negative, but received: {int(bs)}")
    return int(bs)


def open_cursor(node: Any, db: str, target: Any, pipeline: list[Any], *,
                needs_merge: bool = False) -> ChangeStreamCursor:
    """Validate and open a change-stream cursor (not yet registered)."""
    spec = spec_mod.parse(db, target, pipeline, needs_merge=needs_merge,
                          profile=node.profile)
    oplog = node.oplog
    if spec.resume_data is not None:
        data = spec.resume_data
        start_key = ts_key(data.clusterTime)
        if rt.is_high_water_mark(data) and data.version != spec.token_version:
            initial = rt.make_high_water_mark(data.clusterTime, spec.token_version)
        else:
            initial = dict(spec.resume_token)  # type: ignore[arg-type]
    elif spec.start_at is not None:
        start_key = ts_key(spec.start_at)
        initial = rt.make_high_water_mark(spec.start_at, spec.token_version)
    else:
        # getStartTimeForNewStream: one tick past the newest operation.
        now = max(oplog.latest_key, node.clock.now_key())
        if now == 0:
            now = ts_key(node.clock.advance_to_wall())
        start_key = now + 1
        initial = rt.make_high_water_mark(ts_from_key(start_key), spec.token_version)
    assert_history_available(oplog, start_key)
    return ChangeStreamCursor(node, spec, start_key, initial)


async def aggregate_change_stream(node: Any, req: Any) -> dict[str, Any]:
    """Run ``aggregate`` whose ``pipeline[0]`` is ``$changeStream`` on a shard.

    ``req`` is a :class:`shardsim.core.commands.Request` (``db``, ``body`` with ``aggregate``,
    ``pipeline``, ``cursor``, optional ``needsMerge``). Returns the reply body
    ``{"cursor": {firstBatch, postBatchResumeToken, id, ns}}``. Raises MongoError with mongod's
    codes for invalid specifications (see :mod:`shardsim.core.change_stream_spec`), history loss (286),
    missing required images (47).
    """
    body = req.body
    pipeline = body.get("pipeline")
    if body.get("explain"):
        raise MongoError(20, "Explain is not supported for $changeStream by shardsim")
    batch_size = _batch_size(req)
    cursor = open_cursor(node, req.db, body.get("aggregate"), pipeline,
                         needs_merge=bool(body.get("needsMerge", False)))
    if body.get("lsid") is not None:
        cursor.lsid = body.get("lsid")
    try:
        reply = await node.cursors.run_first_batch(cursor, batch_size)
    except BaseException:
        await cursor.close()  # unregisters its oplog listener; the cursor was never registered
        raise
    # (run_first_batch's reply already carries an Int64 id; a batch of events spliced in as
    # bytes (RawBSONParts) is not a dict and is never decoded here)
    if type(reply) is dict and isinstance(reply.get("id"), int) \
            and not isinstance(reply["id"], Int64):
        reply["id"] = Int64(reply["id"])
    return {"cursor": reply}
