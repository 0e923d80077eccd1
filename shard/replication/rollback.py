"""Rollback of a member whose oplog diverged from its sync source's.

When the fetcher gets OplogStartMissing and the source's history is there, the core puts the
member in ROLLBACK (user operations killed with 11602) and asks for :func:`run`, which does
what ``RollbackImpl::runRollback`` / rs_rollback.cpp do (``src/mongo/db/repl/rollback_impl.cpp``,
``rs_rollback.cpp``):

1. read the source's oplog from this member's commit point on (committed entries never roll
   back, so the common point is at or after it) and find the common point
   (:func:`shardsim.core.repl.rollback.plan_rollback`: the newest optime both oplogs have);
2. undo the local entries after it (:func:`shard.replication.applier.undo_entries`): truncate
   them from the oplog and set every document they touched to the source's current version
   (refetch, as rs_rollback.cpp ``syncFixUp``), writing what is removed to rollback files;
3. take the new rollback id and rejoin as SECONDARY (:meth:`ReplNode.finish_rollback`).

A rollback whose source cannot be reached is abandoned (the core tries again later).
"""

from __future__ import annotations

import logging
from typing import Any

from bson.timestamp import Timestamp

from shardsim.core.protocol import repl as wire
from shardsim.core.repl.member_state import ReplError
from shardsim.core.repl.optime import NULL_OPTIME
from shardsim.core.repl.rollback import plan_rollback

log = logging.getLogger("shardsim.shard.replication")


async def run(coord: Any, source_id: int) -> None:
    """Roll ``coord``'s member back against member ``source_id`` (see the module docstring)."""
    from shardsim.shard.replication import applier
    core = coord.core
    node = coord.node
    since_op = core.commit_point
    since = None if since_op == NULL_OPTIME else Timestamp(since_op.ts >> 32,
                                                           since_op.ts & 0xFFFFFFFF)
    reply = await coord.member_command(source_id, wire.refetch_command(coord.self_id, since, []))
    if reply is None or not reply.get("ok"):
        core.abort_rollback(coord.now())
        coord.after_core()
        return
    start = 0 if since is None else (since.time << 32) | since.inc
    local = list(node.oplog.entries_from(start))
    try:
        plan = plan_rollback(local, list(reply.get("oplog") or ()),
                             commit_point=core.commit_point, rbid=core.durable.rbid,
                             complete_history=since is None and not node.oplog.truncated_through)
    except ReplError as err:
        log.error("%s: rollback impossible: %s", node.address, err.errmsg)
        core.abort_rollback(coord.now())
        coord.after_core()
        return

    async def refetch(keys: list[tuple[bytes, Any]]) -> dict[tuple[bytes, Any], Any]:
        r = await coord.member_command(source_id, wire.refetch_command(coord.self_id, None, keys))
        if r is None or not r.get("ok"):
            raise ConnectionError("the rollback's sync source went away")
        out: dict[tuple[bytes, Any], Any] = {}
        for d in r.get("docs") or ():
            out[(bytes(d["ui"]), d["_id"])] = d.get("doc")
        return out

    try:
        result = await applier.undo_entries(node, list(plan.undo), refetch)
    except ConnectionError:
        core.abort_rollback(coord.now())
        coord.after_core()
        return
    coord.rollbacks += 1
    coord.last_rollback = result
    log.warning("%s: rolled back %d entries after %s", node.address, len(plan.undo),
                plan.common_point)
    core.finish_rollback(plan, coord.now())
    coord.committed.advance()
    coord.after_core()


def serve_refetch(node: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The sync source's side of ``_shardsimRefetch``: its oplog from ``since`` and the
    current version of each asked document."""
    from shardsim.shard.collection_kinds import storage_key
    out: dict[str, Any] = {}
    since = body.get("since")
    if isinstance(since, Timestamp):
        out["oplog"] = list(node.oplog.entries_from((since.time << 32) | since.inc))
    elif "since" not in body and not body.get("docs"):
        out["oplog"] = list(node.oplog.entries_from(0))
    docs = []
    for d in body.get("docs") or ():
        coll = node.storage.by_uuid.get(bytes(d["ui"]))
        item = {"ui": d["ui"], "_id": d["_id"]}
        if coll is not None:
            doc = coll.docs.get(storage_key(coll, {"_id": d["_id"]}))
            if doc is not None:
                item["doc"] = doc
        docs.append(item)
    out["docs"] = docs
    return out
