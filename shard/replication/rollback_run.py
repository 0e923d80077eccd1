"""Rollback of a member whose oplog diverged from its sync source's: the common point, the
undo, the catch-up and rejoining.

When the fetcher gets OplogStartMissing and the source's history is there, the core puts the
member in ROLLBACK (user operations killed with 11602) and asks for :func:`run`, which does
what rs_rollback.cpp's ``syncRollback`` did (``src/mongo/db/repl/rs_rollback.cpp``; the
server's ``RollbackImpl`` recovers to a stable timestamp instead):

1. read the source's oplog from this member's commit point on (committed entries never roll
   back, so the common point is at or after it) and find the common point
   (:func:`shardsim.core.repl.rollback.plan_rollback`: the newest optime both oplogs have);
2. undo the local entries after it (:func:`shard.replication.rollback.undo_entries`: the oplog
   truncated, every touched document, collection and session record set to the source's
   current version, rollback files written), asking the source over ``_shardsimRefetch``;
3. apply the source's entries after the common point up to its ``minValid`` (its newest entry
   when it answered) idempotently, as the server's recovering mode does: the member is then
   consistent;
4. take the new rollback id and rejoin as SECONDARY (:meth:`ReplNode.finish_rollback`).

A rollback whose source cannot be reached, or that cannot be done, is abandoned (the core
tries again later).
"""

from __future__ import annotations

import logging
from typing import Any

from bson.timestamp import Timestamp

from shardsim.core.protocol import repl as wire
from shardsim.core.repl.member_state import ReplError
from shardsim.core.repl.optime import NULL_OPTIME, optime_of
from shardsim.core.clock import ts_key
from shardsim.core.errors import MongoError
from shardsim.core.repl.rollback import plan_rollback

log = logging.getLogger("shardsim.shard.replication")


async def run(coord: Any, source_id: int) -> None:
    """Roll ``coord``'s member back against member ``source_id`` (see the module docstring)."""
    from shardsim.shard.replication import applier
    from shardsim.shard.replication.rollback import undo_entries
    core = coord.core
    node = coord.node
    since_op = core.commit_point
    since = None if since_op == NULL_OPTIME else Timestamp(since_op.ts >> 32,
                                                           since_op.ts & 0xFFFFFFFF)
    remote = await _source_oplog(coord, source_id, since)
    if remote is None:
        return _abandon(coord, "its sync source cannot be reached")
    start = 0 if since is None else (since.time << 32) | since.inc
    local = list(node.oplog.entries_from(start))
    try:
        plan = plan_rollback(local, remote, commit_point=core.commit_point,
                             rbid=core.durable.rbid,
                             complete_history=since is None and not node.oplog.truncated_through)
    except ReplError as err:
        return _abandon(coord, err.errmsg)

    async def refetch(keys: list[Any]) -> dict[Any, Any]:
        r = await coord.member_command(source_id, wire.refetch_command(coord.self_id, None, keys))
        if r is None or not r.get("ok"):
            raise ConnectionError("the rollback's sync source went away")
        return wire.parse_refetch_answers(r)

    try:
        result = await undo_entries(node, list(plan.undo), refetch)
        catch_up = await _source_oplog(coord, source_id, result.common_point_ts)
        if catch_up is None:
            raise ConnectionError("the rollback's sync source went away")
        top = ts_key(result.min_valid) if result.min_valid is not None else 0
        mine = node.oplog.latest_key
        entries = [e for e in catch_up if mine < ts_key(e["ts"]) <= top]
        if entries:
            coord.applying(True)
            try:
                applier.apply_entries(node, entries, idempotent=True)
            finally:
                coord.applying(False)
    except (ConnectionError, MongoError) as exc:
        return _abandon(coord, str(exc))
    coord.rollbacks += 1
    coord.last_rollback = result
    log.warning("%s: rolled back %d entries after %s (%d rollback file(s))", node.address,
                result.undone, plan.common_point, len(result.files))
    core.finish_rollback(plan, coord.now())
    last = node.oplog.get(node.oplog.latest_key)
    if last is not None:
        core.note_applied(optime_of(last), coord.now())
    coord.committed.advance()
    coord.after_core()


def _abandon(coord: Any, why: str) -> None:
    log.error("%s: rollback abandoned: %s", coord.node.address, why)
    coord.core.abort_rollback(coord.now())
    coord.after_core()


async def _source_oplog(coord: Any, source_id: int, since: Timestamp | None) -> list[Any] | None:
    """The source's oplog entries from ``since`` on (all of it for None), or None when it
    cannot be reached."""
    reply = await coord.member_command(source_id, wire.refetch_command(coord.self_id, since, [],
                                                                       oplog=True))
    if reply is None or not reply.get("ok"):
        return None
    return list(reply.get("oplog") or ())


def serve_refetch(node: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The sync source's side of ``_shardsimRefetch``: its oplog from ``since`` (with
    ``oplog: true``) and its answers for the refetch keys
    (:func:`shard.replication.rollback.answer_refetch`)."""
    from shardsim.shard.replication.rollback import answer_refetch
    out: dict[str, Any] = {}
    if body.get("oplog"):
        since = body.get("since")
        start = (since.time << 32) | since.inc if isinstance(since, Timestamp) else 0
        out["oplog"] = list(node.oplog.entries_from(start))
    keys = wire.parse_refetch_keys(body)
    if keys:
        out["answers"] = wire.refetch_answers(answer_refetch(node, keys))
    return out
