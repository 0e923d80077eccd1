"""Shard versioning on the router: the placement version attached to routed requests and the
refresh-and-retry on StaleConfig (mongos' ``StaleShardVersionHelpers`` /
``shardVersionRetry``, ``src/mongo/s/stale_shard_version_helpers.h``, and
``BatchWriteExec``'s stale-error handling).

* :func:`attach` adds ``shardVersion`` (``{e, t, v}``, :mod:`shard.sharding_runtime`) to a CRUD
  or read command for a namespace: the collection's version on that shard from the cached
  routing table, or ``UNSHARDED`` for a collection the router believes unsharded. Change-stream
  aggregates and the ``admin``/``config``/``local`` databases are not versioned.
* :func:`run_with_retries` re-runs a whole command that a shard answered with StaleConfig
  (13388) after refreshing the routing table, up to :data:`MAX_STALE_RETRIES` times (mongos'
  ``kMaxNumStaleVersionRetries`` = 10). Writes retry per child batch instead
  (:mod:`router.writes`), so a statement already applied is never sent twice.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from shardsim.core.protocol.versions import unsharded

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

STALE_CONFIG = 13388
MAX_STALE_RETRIES = 10
UNVERSIONED_DBS = frozenset({"admin", "config", "local"})
_UNVERSIONED_DBS = UNVERSIONED_DBS
# The routing table a read was targeted with (set by router.commands.reads.read_targets), so
# the versions sent are those of the same snapshot even when the cache is reloaded meanwhile.
TARGETED_WITH: contextvars.ContextVar[tuple[str, Any] | None] = contextvars.ContextVar(
    "shardsim_targeted_with", default=None)


def version_for(info: Any, shard: str) -> dict[str, Any]:
    """The ``shardVersion`` for ``shard`` from routing table ``info`` (a
    :class:`router.catalog.CollectionInfo`, or None for an unsharded collection)."""
    if info is None or info.epoch is None:
        return unsharded()
    return info.shard_version(shard)


def attach(router: "RouterNode", shard: str, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
    """``cmd`` with the ``shardVersion`` ``shard`` should have for its namespace (a copy; the
    command itself when it is not versioned or already carries one)."""
    if not cmd or db in _UNVERSIONED_DBS or "shardVersion" in cmd:
        return cmd
    name = next(iter(cmd))
    coll = cmd[name]
    if not router.commands.spec(name).versioned or not isinstance(coll, str):
        return cmd
    if name == "aggregate":
        pipeline = cmd.get("pipeline")
        if isinstance(pipeline, list) and pipeline and isinstance(pipeline[0], dict) and \
                "$changeStream" in pipeline[0]:
            return cmd
    ns = f"{db}.{coll}"
    targeted = TARGETED_WITH.get()
    info = targeted[1] if targeted is not None and targeted[0] == ns \
        else router.catalog.collection(ns)
    out = dict(cmd)
    out["shardVersion"] = version_for(info, shard)
    return out


def is_stale(exc: BaseException) -> bool:
    """True for a StaleConfig (13388) error."""
    return getattr(exc, "code", None) == STALE_CONFIG


async def refresh_after_stale(router: "RouterNode", generation: int, attempt: int) -> None:
    """Refresh the routing table once for every request told StaleConfig against the cache of
    ``generation`` (a reload since then is joined only when it read the config server after
    this StaleConfig arrived: one that read it before, e.g. the periodic reload during a
    commit, may not have the change the shard knows of); from the second attempt on, first
    wait a little (the shard that is behind gets its metadata at the end of a migration
    commit)."""
    told = time.monotonic()
    if attempt:
        await asyncio.sleep(min(0.005 * (2 ** attempt), 0.2))
    await router.catalog.refresh(if_generation=generation, read_after=told)


async def run_with_retries(router: "RouterNode",
                           run: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """Run a command (``run`` returns its reply body); re-run it after a refresh while the reply
    is StaleConfig (13388), at most :data:`MAX_STALE_RETRIES` times; then the reply as is."""
    for attempt in range(MAX_STALE_RETRIES + 1):
        generation = router.catalog.generation
        token = TARGETED_WITH.set(None)  # each attempt targets with the cache of its own
        try:
            reply = await run()
        finally:
            TARGETED_WITH.reset(token)
        if reply.get("code") != STALE_CONFIG or attempt == MAX_STALE_RETRIES:
            return reply
        await refresh_after_stale(router, generation, attempt)
    return reply  # pragma: no cover
