"""The periodic no-op writer (``src/mongo/db/repl/noop_writer.cpp``).

Every ``--noop-interval-ms`` milliseconds (default 1000; mongod: ``periodicNoopIntervalSecs``,
default 10 s, 1 s in test suites) the shard checks whether anything was written to its oplog since
the last check; if not (and the ``writePeriodicNoops`` parameter is not false) it writes
``{op: "n", ns: "", o: {msg: "periodic noop"}}``. Such entries never become events but advance
the oplog scan position, hence every change-stream cursor's high-water mark, so an idle shard
does not hold back the router's merge (server-internals-notes §5).

On a brand-new (empty) oplog, :func:`start` first writes mongod's ``{msg: "initiating set"}``
no-op: the history-loss check accepts a start point older than the oldest entry only when that
oldest entry is the start of the shard's history.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("shardsim.shard.noop_writer")

PERIODIC_NOOP = {"msg": "periodic noop"}
INITIATING_SET = {"msg": "initiating set"}


def interval_ms(node: Any) -> int:
    """The configured interval in milliseconds (``noop_interval_ms`` option, default 1000)."""
    v = node.options.get("noop_interval_ms")
    return 1000 if v in (None, 0) else max(1, int(v))


def _enabled(node: Any) -> bool:
    try:
        return node.parameters().get("writePeriodicNoops", True) is not False
    except Exception:  # parameters() may not know the name
        return True


def _pinned(node: Any) -> bool:
    """A test pinned the time of the shard's next oplog entry (``_shardsimSetClusterTime``):
    a no-op now would take it."""
    faults = node.cs_promise_faults
    return faults is not None and faults.pin != 0


async def run(node: Any, interval_s: float) -> None:
    """Loop forever: write a periodic no-op when the oplog did not move for ``interval_s``."""
    last_seen = node.oplog.latest_key
    while True:
        await asyncio.sleep(interval_s)
        try:
            # (not while a test pinned the next entry's time: promise_faults.py)
            if node.oplog.latest_key == last_seen and _enabled(node) \
                    and not _pinned(node) and (node.repl is None or node.repl.writable):
                node.write_noop(dict(PERIODIC_NOOP))
        except Exception:  # never let the writer die with the process still serving
            log.exception("periodic noop failed")
        last_seen = node.oplog.latest_key


def start(node: Any) -> asyncio.Task:
    """Start the writer for ``node`` (call from ``ShardNode.startup`` inside the event loop).

    Writes the "initiating set" no-op first when the oplog is empty. Returns the task (also kept
    in ``node.noop_writer_task``, which the node declares; cancel it on shutdown).
    """
    if len(node.oplog) == 0 and (node.repl is None or node.options.get("repl_initiate")):
        # a set is initiated once, on one member (replSetInitiate); the others, and a member
        # restarted empty, get the entry by replication
        node.write_noop(dict(INITIATING_SET))
    task = asyncio.get_running_loop().create_task(run(node, interval_ms(node) / 1000.0))
    node.noop_writer_task = task
    return task


def stop(node: Any) -> None:
    """Cancel the writer task if running."""
    task = node.noop_writer_task
    if task is not None:
        task.cancel()
