"""Prepare conflicts: a read meets a document of a prepared, undecided transaction.

mongod (``src/mongo/db/storage/wiredtiger/wiredtiger_prepare_conflict.h``
``wiredTigerPrepareConflictRetry``, ``prepare_conflict_tracker.cpp``): when a storage cursor
lands on a document whose newest update belongs to a prepared transaction, the reader cannot
know whether it is visible (the commit timestamp is not chosen yet), so under
``PrepareConflictBehavior::kEnforce`` it waits until that transaction commits or aborts, then
reads again (interruptible: maxTimeMS gives MaxTimeMSExpired, 50). A reader with a timestamp
before the ``prepareTimestamp`` reads the older version without a conflict.

Who enforces (``read_concern_mongod.cpp`` ``canIgnorePrepareConflicts`` /
``setPrepareConflictBehaviorForReadConcern``; the commands' ``canIgnorePrepareConflicts()``):
read-only commands (find, count, distinct, aggregate, getMore, dbHash) ask for
``kIgnoreConflicts`` and get it with readConcern ``local``/``majority``/``available`` and no
``afterClusterTime``/``atClusterTime``: such a plain read returns the version from before the
prepare at once (``jstests/replsets/prepare_conflict_read_concern_behavior.js``). Reads in a
transaction, ``snapshot`` and ``linearizable`` reads, reads with ``afterClusterTime`` (every
read of a causally consistent session) and the reads of writes enforce. Change streams read
the oplog, which holds no prepared documents, and never wait.

Which documents a read meets: shardsim has no secondary-index plans, so a filter that pins
``_id`` (equality or ``$in``, :func:`shardsim.core.query.pinned_id_keys`: mongod's IDHACK / ``_id``
index scan) meets those documents only, and any other read is a collection scan that meets
every document of the collection. Writers meeting a prepared document wait the same way
(:mod:`shard.write_conflicts`); writers inside transactions whose snapshot is older than the
prepare get WriteConflict instead (:mod:`shard.sessions`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from shardsim.core import query as q
from shardsim.core.errors import MongoError
from shardsim.core.values import id_key

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

#: seconds between two checks while waiting (the transaction's end wakes the waiters earlier)
RECHECK_S = 0.5
# The commands whose ``readConcern`` decides whether they wait (``canIgnorePrepareConflicts``)
# declare ``reads=True`` (shardsim.core.commands.CommandSpec).


def max_time_expired() -> MongoError:
    """MaxTimeMSExpired (50), an interruption: it fails the whole command."""
    return MongoError(50, "operation exceeded time limit")


def deadline_of(req: Any) -> float | None:
    """The monotonic time the request's ``maxTimeMS`` runs out (None: no limit; 0 is none)."""
    ms = req.body.get("maxTimeMS") if req is not None else None
    if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0:
        return time.monotonic() + ms / 1000.0
    return None


async def wait_for_end(txn: Any, deadline: float | None) -> None:
    """Wait (at most :data:`RECHECK_S`) for ``txn`` to commit or abort; MaxTimeMSExpired (50)
    once ``deadline`` has passed. The caller checks its conflict again afterwards."""
    timeout = RECHECK_S
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise max_time_expired()
        timeout = min(timeout, left)
    await txn.wait_end(timeout)


def prepared_met(coll: Any, keys: list[Any] | None, at: Timestamp | None = None,
                 own: Any = None) -> Any:
    """The first prepared, undecided transaction (other than ``own``, prepared at or before
    ``at`` when given) holding a document of ``coll`` that a read meeting ``keys`` (storage
    keys; None: every document) meets, else None."""
    prepared = coll.prepared
    if not prepared:
        return None
    holders = prepared.values() if keys is None else (prepared.get(k) for k in keys)
    for txn in holders:
        if txn is None or txn is own or txn.state != "prepared":
            continue
        if at is None or txn.prepare_ts is None or txn.prepare_ts <= at:
            return txn
    return None


def _keys_of(filters: list[Any]) -> list[Any] | None:
    out: list[Any] = []
    for filt in filters:
        keys = q.pinned_id_keys(filt) if isinstance(filt, dict) else None
        if keys is None:
            return None
        out.extend(keys)
    return out


def met_keys(req: Any) -> list[Any] | None:
    """The storage keys of the documents the command ``req`` reads (see the module doc), None
    for a collection scan (every document)."""
    body, name = req.body, req.name
    if name == "find":
        return _keys_of([body.get("filter")])
    if name in ("count", "distinct", "findAndModify", "findandmodify"):
        return _keys_of([body.get("query")])
    if name == "update" and isinstance(body.get("updates"), list):
        return _keys_of([s.get("q") if isinstance(s, dict) else None for s in body["updates"]])
    if name == "delete" and isinstance(body.get("deletes"), list):
        return _keys_of([s.get("q") if isinstance(s, dict) else None for s in body["deletes"]])
    if name == "insert" and isinstance(body.get("documents"), list):
        docs = body["documents"]
        if all(isinstance(d, dict) and "_id" in d for d in docs):
            return [id_key(d["_id"]) for d in docs]
    return None


def reads_change_stream(req: Any) -> bool:
    """An ``aggregate`` opening a change stream (it reads the oplog: never a prepare
    conflict)."""
    pipeline = req.body.get("pipeline")
    return req.name == "aggregate" and isinstance(pipeline, list) and bool(pipeline) and \
        isinstance(pipeline[0], dict) and "$changeStream" in pipeline[0]


async def wait_for_prepared(node: "ShardNode", req: Any, at: Timestamp | None,
                            own: Any = None) -> int:
    """Wait until the read of ``req`` (reading as of ``at``; None: the latest data) meets no
    prepared transaction other than ``own`` (see the module doc); returns how many times it
    waited (0: no conflict). MaxTimeMSExpired (50) past the request's ``maxTimeMS``."""
    arg = req.body.get(req.name)
    if not isinstance(arg, str) or not arg:
        return 0
    coll = node.storage.get(req.db, arg)
    if coll is None or not coll.prepared or reads_change_stream(req):
        return 0  # the common path: nothing prepared in the collection
    keys = met_keys(req)
    waited = 0
    deadline = deadline_of(req)
    while True:
        txn = prepared_met(coll, keys, at, own)
        if txn is None:
            return waited
        waited += 1
        await wait_for_end(txn, deadline)
        coll = node.storage.get(req.db, arg)
        if coll is None:
            return waited
