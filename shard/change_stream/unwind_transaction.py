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


def unwind(entry: dict[str, Any], op_ok: Callable[[dict[str, Any]], bool]) -> Iterator[dict[str, Any]]:
    """Yield the entry itself, or for an applyOps entry the watched inner operations."""
    o = entry.get("o")
    if entry.get("op") != "c" or not isinstance(o, dict) or "applyOps" not in o:
        yield entry
        return
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
