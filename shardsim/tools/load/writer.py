"""What one Spark partition runs: write one shard's share of the plan as bulk writes.

Kept free of Spark and of the rest of the package (only pymongo and the standard library) so
executors on a real Spark cluster need nothing but pymongo and this module.

A :class:`WriteTask` carries the partition's ops in plan order (parallel arrays ``seqs``,
``kinds``, ``colls``, ``ids`` as bytes). :func:`run_task` cuts them into runs of
``batch_size``; each run becomes, per collection, one ordered ``bulk_write`` whose ops are
stably sorted by kind (insert, update, delete: a document's own history is always in that
order, see :func:`shardsim.tools.load.plan.batches`), so pymongo sends at most three commands.
The result records, per run, the wall-clock time the write was acknowledged (for the
write-ack → delivery latency) and the seqs it carried.
"""

from __future__ import annotations

import os
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

INSERT, UPDATE, DELETE = 0, 1, 2


@dataclass
class WriteTask:
    """One partition: ``shard`` it owns, ``uri`` to write through (the router, or the shard
    itself with ``directConnection=true``), ``db``/``coll_names``, ``pad`` string for inserts,
    the op arrays as bytes, ``batch_size`` ops per bulk write and an optional
    ``progress_path`` the task rewrites with its running op count."""

    shard: str
    uri: str
    db: str
    coll_names: list[str]
    pad: str
    seqs: bytes
    kinds: bytes
    colls: bytes
    ids: bytes
    batch_size: int = 1000
    progress_path: str | None = None


@dataclass
class WriteResult:
    """``acks``: list of ``(ack_time_s, seqs_bytes)`` per run; ``ops`` written; ``start``/
    ``end`` wall-clock seconds; ``error`` text if the task failed (the ops after it unsent)."""

    shard: str
    ops: int = 0
    start: float = 0.0
    end: float = 0.0
    acks: list[tuple[float, bytes]] = field(default_factory=list)
    error: str | None = None


def _arrays(task: WriteTask) -> tuple[array, array, array, array]:
    seqs, kinds, colls, ids = array("q"), array("b"), array("h"), array("q")
    seqs.frombytes(task.seqs)
    kinds.frombytes(task.kinds)
    colls.frombytes(task.colls)
    ids.frombytes(task.ids)
    return seqs, kinds, colls, ids


def run_task(task: WriteTask) -> WriteResult:
    """Write the task's ops in order; never raises (errors are returned in the result)."""
    from pymongo import DeleteOne, InsertOne, MongoClient, UpdateOne

    seqs, kinds, colls, ids = _arrays(task)
    res = WriteResult(task.shard, start=time.time())
    client = MongoClient(task.uri, connect=True)
    try:
        dbh = client[task.db]
        handles = [dbh[name] for name in task.coll_names]
        n = len(seqs)
        size = max(1, task.batch_size)
        for start in range(0, n, size):
            run: dict[int, list[int]] = {}
            for k in range(start, min(n, start + size)):
                run.setdefault(colls[k], []).append(k)
            for c, idx in run.items():
                idx.sort(key=kinds.__getitem__)
                reqs: list[Any] = []
                for k in idx:
                    kind = kinds[k]
                    if kind == INSERT:
                        reqs.append(InsertOne({"_id": ids[k], "s": seqs[k], "v": 0, "pad": task.pad}))
                    elif kind == UPDATE:
                        reqs.append(UpdateOne({"_id": ids[k]},
                                              {"$set": {"s": seqs[k]}, "$inc": {"v": 1}}))
                    else:
                        reqs.append(DeleteOne({"_id": ids[k]}))
                handles[c].bulk_write(reqs, ordered=True)
            res.acks.append((time.time(), seqs[start:start + size].tobytes()))
            res.ops = min(n, start + size)
            if task.progress_path:
                _progress(task.progress_path, res.ops)
    except Exception as exc:  # reported by the driver, which names the shard and the op
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
        res.end = time.time()
    return res


def _progress(path: str, count: int) -> None:
    try:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(str(count))
        os.replace(tmp, path)
    except OSError:  # progress files are best effort (a remote executor cannot reach them)
        pass
