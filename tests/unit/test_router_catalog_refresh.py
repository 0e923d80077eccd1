"""The router's reload after StaleConfig (router/catalog.py ``CatalogCache.refresh`` with
``read_after``, router/shard_versioning.py ``refresh_after_stale``): requests told StaleConfig
together share one reload, but a reload whose read of the config server began before the
StaleConfig arrived (e.g. the periodic reload during a commit) is not joined: it may not have
the change the shard knows of."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from shardsim.core.clock import HybridLogicalClock
from shardsim.router.catalog import CatalogCache


def _cache() -> tuple[CatalogCache, list[float]]:
    cache = CatalogCache(None, HybridLogicalClock())  # type: ignore[arg-type]
    reads: list[float] = []

    async def read_all() -> tuple[list[Any], list[Any], dict[str, Any]]:
        reads.append(time.monotonic())
        await asyncio.sleep(0.01)
        return [], [], {}
    cache._read_all = read_all  # type: ignore[method-assign]
    return cache, reads


def test_a_reload_read_before_the_stale_answer_is_not_joined() -> None:
    async def main() -> None:
        cache, reads = _cache()
        gen = cache.generation
        await cache.refresh()  # e.g. the periodic reload, read before the shard's answer
        told = time.monotonic()
        await cache.refresh(if_generation=gen, read_after=told)
        assert len(reads) == 2 and cache.read_started_at >= told

    asyncio.run(main())


def test_requests_told_stale_together_share_one_reload() -> None:
    async def main() -> None:
        cache, reads = _cache()
        gen = cache.generation
        told = time.monotonic()
        await asyncio.gather(*(cache.refresh(if_generation=gen, read_after=told)
                               for _ in range(5)))
        assert len(reads) == 1 and cache.generation == gen + 1
        # without read_after, any reload since the generation is joined (the old rule)
        await cache.refresh(if_generation=gen)
        assert len(reads) == 1

    asyncio.run(main())
