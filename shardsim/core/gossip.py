"""Commands to other cluster members with cluster-time gossip (router -> shards/config server,
config server -> shards).

Every outgoing command carries the sender's ``$clusterTime``; every reply's ``$clusterTime``
advances the sender's clock and its ``operationTime`` is folded into the current operation's
tracker (``VectorClockMetadataHook``/``OperationTimeTracker`` on mongos, see
``server-internals-notes.md`` §7.4), so the router's reply ``operationTime`` is the newest
operation time of the shard replies it consumed.
"""

from __future__ import annotations

import contextvars
from typing import Any

from bson.timestamp import Timestamp

from shardsim.core.client import Pool, remote_error
from shardsim.core.clock import HybridLogicalClock, ts_key
from shardsim.core.node import DUMMY_SIGNATURE

# The max operationTime seen from remotes during the current client command (None = none yet).
OPERATION_TIME: contextvars.ContextVar[list[Timestamp | None] | None] = contextvars.ContextVar(
    "shardsim_operation_time", default=None)


def track_operation_time(ts: Any) -> None:
    """Fold a remote reply's ``operationTime`` into the current operation's tracker."""
    holder = OPERATION_TIME.get()
    if holder is None or not isinstance(ts, Timestamp):
        return
    if holder[0] is None or ts_key(ts) > ts_key(holder[0]):
        holder[0] = ts


def gossip_out(clock: HybridLogicalClock, cmd: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``cmd`` carrying ``clock``'s time as ``$clusterTime`` (none while the clock
    has not started)."""
    body = dict(cmd)
    now = clock.now()
    if now.time or now.inc:
        body["$clusterTime"] = {"clusterTime": now, "signature": DUMMY_SIGNATURE}
    return body


def gossip_in(clock: HybridLogicalClock, reply: Any, check: bool = True) -> Any:
    """Advance ``clock`` to the ``$clusterTime`` of ``reply`` (a dict or RawBSONDocument) and
    note its ``operationTime``; with ``check`` an ``ok: 0`` reply raises
    :class:`~shardsim.core.errors.MongoError` with the remote's code, codeName and labels.
    Returns ``reply``."""
    ct = reply.get("$clusterTime")
    if ct is not None:
        ts = ct.get("clusterTime")
        if isinstance(ts, Timestamp):
            clock.advance(ts)
    track_operation_time(reply.get("operationTime"))
    if check and not reply.get("ok"):
        raise remote_error(reply)
    return reply


async def gossip_command(clock: HybridLogicalClock, pool: Pool, db: str, cmd: dict[str, Any], *,
                         raw: bool = False, check: bool = True,
                         timeout: float | None = None) -> Any:
    """Run ``cmd`` on ``pool`` with ``$clusterTime`` gossip both ways (:func:`gossip_out`,
    :func:`gossip_in`).

    Returns the reply (dict or RawBSONDocument with ``raw``). With ``check`` an ``ok: 0`` reply
    raises :class:`~shardsim.core.errors.MongoError` with the remote's code, codeName and labels;
    network failures raise MongoError 6/89/9001 (from :mod:`shardsim.core.client`).
    """
    reply = await pool.command(db, gossip_out(clock, cmd), raw=raw, check=False, timeout=timeout)
    return gossip_in(clock, reply, check)
