"""Write conflicts of writes outside transactions: they wait for the other transaction.

mongod: a write that meets a document another, uncommitted transaction wrote gets a
WriteConflictException from WiredTiger; outside a multi-document transaction the write runs
inside ``writeConflictRetry`` (``src/mongo/db/concurrency/exception_util.h/.cpp``), which
abandons the snapshot, backs off (``logAndBackoff``) and runs the attempt again, for as long as
it takes, so the write in effect waits until the other transaction commits or aborts and then
applies to what it left (maxTimeMS and interrupts still end it: MaxTimeMSExpired 50 fails the
whole command, ``write_ops_exec.cpp`` rethrows interruptions). A multi-update or -delete does
the same per document (``UpdateStage``/``DeleteStage`` retry the document after a yield;
documents done before the conflict stay done). A write meeting a *prepared* document waits in
``wiredTigerPrepareConflictRetry`` (writes always enforce prepare conflicts:
:mod:`shard.prepare_conflicts`). Statements of multi-document transactions never retry: they
fail at once with WriteConflict (112, TransientTransactionError), :mod:`shard.sessions`.

shardsim: the storage layer (:class:`shard.storage.Collection` ``insert``/``replace``/``delete``)
raises :class:`WriteConflictWait` naming the transaction that holds the document
(``Collection.txn_writers``: an open transaction's writes; ``Collection.prepared``: a prepared
one's), before anything of the statement changed; the CRUD handlers
(:mod:`shard.commands.crud`) catch it and run the statement again through
:func:`write_conflict_retry` once that transaction has ended, instead of backing off blindly.
A multi-document statement is checked before it starts (:func:`check_statement`), so it never
stops half way. Code that does not retry (internal writers) sees the 112 it always saw.
"""

from __future__ import annotations

from typing import Any, Callable

from shardsim.core import query as q
from shardsim.core.errors import MongoError
from shardsim.shard.prepare_conflicts import deadline_of, prepared_met, wait_for_end

LIVE = ("in_progress", "prepared")


class WriteConflictWait(MongoError):
    """WriteConflict (112, TransientTransactionError) met by a write outside a transaction:
    ``holder`` (a :class:`shard.sessions.Transaction`) holds the document."""

    def __init__(self, ns: str, holder: Any) -> None:
        what = "prepared" if holder.state == "prepared" else "uncommitted"
        super().__init__(112, f"Write conflict during plan execution and yielding is disabled. "
                              f":: Please retry your operation or multi-document transaction. "
                              f"(a {what} transaction holds a document of {ns})",
                         labels=["TransientTransactionError"])
        self.holder = holder


def holder_of(coll: Any, key: Any) -> Any:
    """The open or prepared transaction holding the document at ``key`` of ``coll``, or None."""
    txn = coll.prepared.get(key)
    if txn is None:
        txn = coll.txn_writers.get(key)
    return txn if txn is not None and txn.state in LIVE else None


def check_held(coll: Any, key: Any) -> None:
    """Raise :class:`WriteConflictWait` when a transaction holds ``key`` (called by the storage
    layer only when ``coll.prepared`` or ``coll.txn_writers`` is non-empty)."""
    txn = holder_of(coll, key)
    if txn is not None:
        raise WriteConflictWait(coll.ns, txn)


def check_statement(coll: Any, filt: Any, multi: bool) -> None:
    """Before a write statement outside a transaction runs on ``coll``: raise
    :class:`WriteConflictWait` when its scan meets a prepared document (a prepare conflict,
    :func:`shard.prepare_conflicts.prepared_met`) or, for a multi-document statement, when a
    transaction holds one of the documents it matches. A cheap no-op when no transaction holds
    anything in the collection."""
    if coll is None or not (coll.prepared or coll.txn_writers):
        return
    if coll.prepared:
        txn = prepared_met(coll, q.pinned_id_keys(filt) if isinstance(filt, dict) else None)
        if txn is not None:
            raise WriteConflictWait(coll.ns, txn)
    if multi and coll.txn_writers:
        for key, _doc in q.select(coll, filt if isinstance(filt, dict) else {}):
            check_held(coll, key)


async def write_conflict_retry(req: Any, exc: WriteConflictWait,
                               attempt: Callable[[], Any],
                               commit: Callable[[], None] | None = None) -> Any:
    """``writeConflictRetry`` for a statement outside a transaction that raised ``exc``: wait
    until the holding transaction ends, then run ``attempt()`` again, as often as needed.
    MaxTimeMSExpired (50) past the request's ``maxTimeMS``. ``commit`` (a durable shard's
    ``ShardNode.flush``) first commits the statements the command already ran, as mongod's
    statements each commit their own unit of work: other commands run during the wait and must
    only see committed writes (a failure raises its MongoError, e.g. OutOfDiskSpace 14031)."""
    if commit is not None:
        commit()
    deadline = deadline_of(req)
    while True:
        while exc.holder.state in LIVE:
            await wait_for_end(exc.holder, deadline)
        try:
            return attempt()
        except WriteConflictWait as again:
            exc = again
