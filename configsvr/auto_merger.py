"""The auto-merger: contiguous chunks of a collection on one shard become one chunk
(``src/mongo/db/s/balancer/auto_merger_policy.cpp``, ``_shardsvrMergeAllChunksOnShard``).

As in 8.0 it is on unless the balancer document says ``enableAutoMerge: false``, runs every
``autoMergerIntervalSecs`` (3600 s) and only merges chunks that have been on their shard for
longer than the snapshot history window (``minSnapshotHistoryWindowInSeconds``, 300 s), so a
recent migration's chunk stays as it is. shardsim's ``_shardsimAutoMergerIntervalMs`` in the
balancer document sets both the interval and that age (tests use a short one).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from shardsim.core.errors import MongoError
from shardsim.core.shard_key import KeyPattern, SortKey
from shardsim.core.protocol import configsvr as csrq

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.balancer")

DEFAULT_INTERVAL = 3600.0
DEFAULT_MIN_AGE = 300.0


def mergeable_runs(pattern: KeyPattern, chunks: list[dict[str, Any]], now_secs: int,
                   min_age: float) -> list[list[dict[str, Any]]]:
    """Runs (2 or more) of contiguous chunks on one shard, each on its shard for ``min_age``
    seconds or longer at ``now_secs`` (cluster time seconds), in key order."""
    ordered = sorted(chunks, key=lambda c: SortKey(pattern.bound_to_key(c["min"])))
    runs: list[list[dict[str, Any]]] = []
    run: list[dict[str, Any]] = []
    for c in ordered:
        since = c.get("onCurrentShardSince")
        old = since is None or now_secs - since.time >= min_age
        if run and old and c["shard"] == run[-1]["shard"] and c["min"] == run[-1]["max"]:
            run.append(c)
            continue
        if len(run) > 1:
            runs.append(run)
        run = [c] if old else []
    if len(run) > 1:
        runs.append(run)
    return runs


async def merge_round(node: ConfigServerNode, min_age: float) -> int:
    """Merge every mergeable run of every balanced collection; returns the number of merges."""
    merged = 0
    now = node.clock.now().time
    for c in await node.find_all("collections"):
        if c.get("unsplittable") or c.get("permitMigrations") is False or \
                c["_id"] in node.reshardings:
            continue
        pattern = KeyPattern(c["key"])
        chunks = await node.find_all("chunks", {"uuid": c["uuid"]})
        for run in mergeable_runs(pattern, chunks, now, min_age):
            try:
                merge = csrq.CommitChunksMerge(c["_id"], bounds=[run[0]["min"], run[-1]["max"]])
                await node.local(merge.NAME, "admin", merge.to_command())
                merged += 1
            except MongoError as exc:  # the chunks changed meanwhile: next time
                log.info("auto-merge of %s failed: %s", c["_id"], exc)
    return merged
