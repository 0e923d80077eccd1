"""Stage 2: unwind an ``applyOps`` transaction into one entry per operation
(``$_internalChangeStreamUnwindTransaction``, ``document_source_change_stream_unwind_transaction.cpp``).

Each operation inherits the commit entry's ``ts``, ``wall``, ``lsid`` and ``txnNumber`` and gets
``txnOpIndex`` (its position in the transaction, which goes into the resume token so events of one
transaction stay ordered), ``applyOpsIndex`` and ``applyOpsTs`` (the key of its pre-image).
Operations on namespaces the stream does not watch are dropped; their positions still count.
An aborted transaction writes no entry, so it produces nothing.

A prepared transaction (two-phase commit) writes ``{applyOps: [...], prepare: true}`` at
prepare time and ``{commitTransaction: 1, commitTimestamp}`` (with ``prevOpTime`` naming the
prepare entry) at commit: the stage unwinds the prepare entry's operations when it meets the
commit entry, and they take the commit entry's ``ts`` (``TransactionOpIterator``, which
collects the transaction's applyOps entries through ``prevOpTime``); ``applyOpsTs`` stays the
prepare entry's ts (where the pre-images are). A prepared transaction that is aborted
produces nothing (``abortTransaction`` entries are not matched). The operations of a
prepared transaction carry the commit entry's ``commitTimestamp`` (the transform shows it under
``showCommitTimestamp``, or always on the 8.2.0 profile).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator


class UnwindTransaction:
    """The ``$_internalChangeStreamUnwindTransaction`` stage of one stream.

    ``op_ok``: which inner operations the stream watches (:func:`.oplog_match.crud_predicate`).
    ``process(entry)`` yields the entry itself, or for an ``applyOps`` entry the watched inner
    operations, each with the fields described in the module docstring. Raises KeyError for an
    ``applyOps`` entry without ``ts`` (the shard always writes one).
    """

    name = "$_internalChangeStreamUnwindTransaction"
    __slots__ = ("_op_ok", "_lookup")

    def __init__(self, op_ok: Callable[[dict[str, Any]], bool],
                 lookup: Callable[[Any], dict[str, Any] | None] | None = None) -> None:
        self._op_ok = op_ok
        self._lookup = lookup  # Timestamp -> the oplog entry at that ts (prepared txns)

    def process(self, entry: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Yield the entry itself, or for an applyOps entry the watched inner operations."""
        o = entry.get("o")
        if entry.get("op") != "c" or not isinstance(o, dict):
            yield entry
            return
        ops_ts = entry["ts"]
        commit_ts = None
        if "commitTransaction" in o:
            commit_ts = o.get("commitTimestamp")
            prev = (entry.get("prevOpTime") or {}).get("ts")
            prepare = self._lookup(prev) if self._lookup is not None and prev else None
            if prepare is None:
                return
            ops = (prepare.get("o") or {}).get("applyOps") or []
            ops_ts = prepare["ts"]
        elif "applyOps" not in o:
            yield entry
            return
        else:
            ops = o.get("applyOps") or []
        op_ok = self._op_ok
        for index, op in enumerate(ops):
            if not op_ok(op):
                continue
            if op.get("fromMigrate"):
                continue
            out = dict(op)
            out["ts"] = entry["ts"]
            out["wall"] = entry.get("wall")
            if "lsid" in entry:
                out["lsid"] = entry["lsid"]
            if "txnNumber" in entry:
                out["txnNumber"] = entry["txnNumber"]
            out["txnOpIndex"] = index
            out["applyOpsIndex"] = index
            out["applyOpsTs"] = ops_ts
            if commit_ts is not None:  # prepared: the event may show it (showCommitTimestamp)
                out["commitTimestamp"] = commit_ts
            yield out


def unwind(entry: dict[str, Any], op_ok: Callable[[dict[str, Any]], bool]) -> Iterator[dict[str, Any]]:
    """:meth:`UnwindTransaction.process` as a function (the stage without a stream)."""
    return UnwindTransaction(op_ok).process(entry)
