"""Stage 2: unwind an ``applyOps`` transaction into one entry per operation
(``$_internalChangeStreamUnwindTransaction``, ``document_source_change_stream_unwind_transaction.cpp``).

Each operation inherits the commit entry's ``ts``, ``wall``, ``lsid`` and ``txnNumber`` and gets
``txnOpIndex`` (its position in the transaction, which goes into the resume token so events of one
transaction stay ordered), ``applyOpsIndex`` and ``applyOpsTs`` (the key of its pre-image).
Operations on namespaces the stream does not watch are dropped; their positions still count.
An aborted transaction writes no entry, so it produces nothing.
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
    __slots__ = ("_op_ok",)

    def __init__(self, op_ok: Callable[[dict[str, Any]], bool]) -> None:
        self._op_ok = op_ok

    def process(self, entry: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Yield the entry itself, or for an applyOps entry the watched inner operations."""
        o = entry.get("o")
        if entry.get("op") != "c" or not isinstance(o, dict) or "applyOps" not in o:
            yield entry
            return
        op_ok = self._op_ok
        ops = o.get("applyOps") or []
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
            out["applyOpsTs"] = entry["ts"]
            yield out


def unwind(entry: dict[str, Any], op_ok: Callable[[dict[str, Any]], bool]) -> Iterator[dict[str, Any]]:
    """:meth:`UnwindTransaction.process` as a function (the stage without a stream)."""
    return UnwindTransaction(op_ok).process(entry)
