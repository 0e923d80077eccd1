"""Prepare conflicts: a read at a timestamp meets a prepared, undecided transaction.

mongod (``prepare_conflict_tracker.cpp``, ``wiredtiger_prepare_conflict.h``
``handleWTPrepareConflict``): a read whose timestamp is at or after a transaction's
``prepareTimestamp`` that meets one of that transaction's documents cannot know whether the
document is visible (the commit timestamp will be at or after the prepare), so it waits until the
transaction commits or aborts, then reads. A read before the prepare timestamp reads the older
version without waiting. Writers inside transactions that meet a prepared document get
WriteConflict instead (:mod:`shard.sessions`).

shardsim applies this to reads with a timestamp: transaction statements (their snapshot,
``Transaction.read_ts``) and ``readConcern: snapshot`` reads, per collection (any prepared
document of the collection makes the read wait, mongod only waits when the read meets one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

if TYPE_CHECKING:  # pragma: no cover
    from shard.node import ShardNode

#: seconds between two checks while waiting (the decision wakes the waiters earlier)
RECHECK_S = 0.5


def blockers(node: "ShardNode", ns: str, at: Timestamp, own: Any = None) -> list[Any]:
    """The prepared, undecided transactions (other than ``own``) that wrote a document of
    ``ns`` and prepared at or before ``at``."""
    out = []
    for txn in node.sessions.prepared():
        if txn is own or txn.prepare_ts is None or txn.prepare_ts > at:
            continue
        if any(v.overlay and v.coll.ns == ns for v in txn.views.values()):
            out.append(txn)
    return out


def read_namespace(req: Any) -> str | None:
    """``db.coll`` a command reads (its first value when a collection name), else None."""
    arg = req.body.get(req.name)
    return f"{req.db}.{arg}" if isinstance(arg, str) and arg else None


async def wait_for_prepared(node: "ShardNode", ns: str | None, at: Timestamp | None,
                            own: Any = None) -> int:
    """Wait until no prepared transaction conflicts with a read of ``ns`` at ``at`` (see the
    module doc); returns how many times it waited (0: no conflict)."""
    if ns is None or at is None:
        return 0
    waited = 0
    while blockers(node, ns, at, own):
        waited += 1
        await node.sessions.wait_decision(RECHECK_S)
    return waited
