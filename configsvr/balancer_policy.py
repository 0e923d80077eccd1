"""Which chunks the balancer moves: pure functions over the catalog and the shards' data sizes
(``src/mongo/db/s/balancer/balancer_policy.cpp``, ``BalancerPolicy::balance``), no I/O, so they
are unit-tested directly.

Order of the server's policy (zones are not modelled, every shard is in the one zone ``""``):

1. **Draining shards** (``removeShard``): every chunk on a draining shard moves to the
   non-draining shard with the least data of the collection (``MigrationReason::drain``).
2. **Data size** (``_singleZoneBalanceBasedOnDataSize``): ideal = total / number of shards;
   the shard with the most data (``from``) gives to the one with the least (``to``) only if
   ``from > ideal``, ``to < ideal`` and ``from - to >= 3 * chunk size``; the first chunk of
   ``from`` (in key order) is moved, as ``moveRange`` with only ``min``: the donor cuts the
   range at about one chunk size (``autoSplitVector``). Repeated while shards are free.

Each shard takes part in at most one migration per round (``availableShards``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardsim.core.shard_key import KeyPattern, SortKey

# balancer_policy.cpp: a migration only when the two shards differ by 3 chunk sizes or more
IMBALANCE_CHUNKS = 3


@dataclass
class Migration:
    """One migration of collection ``ns``: the chunk document ``chunk`` from ``donor`` to
    ``to``; ``reason`` is ``"drain"`` or ``"chunksImbalance"`` (``MigrationReason``)."""

    ns: str
    chunk: dict[str, Any]
    donor: str
    to: str
    reason: str


def _first_chunk(pattern: KeyPattern, chunks: list[dict[str, Any]], shard: str
                 ) -> dict[str, Any] | None:
    """The chunk of ``shard`` with the lowest ``min`` (jumbo chunks skipped), or None."""
    own = [c for c in chunks if c["shard"] == shard and not c.get("jumbo")]
    if not own:
        return None
    return min(own, key=lambda c: SortKey(pattern.bound_to_key(c["min"])))


def select_for_collection(ns: str, pattern: KeyPattern, chunks: list[dict[str, Any]],
                          sizes: dict[str, int], shards: list[str], draining: set[str],
                          chunk_size: int, available: set[str]) -> list[Migration]:
    """The migrations of one collection in one round. ``sizes``: shard -> data size (bytes)
    of the collection there; ``shards``: every shard; ``draining``: those being removed;
    ``chunk_size``: bytes; ``available``: shards not yet used this round (updated)."""
    out: list[Migration] = []
    sizes = {s: int(sizes.get(s, 0)) for s in shards}
    takers = [s for s in shards if s not in draining]
    if not takers:
        return out
    for donor in sorted(draining):
        if donor not in available:
            continue
        chunk = _first_chunk(pattern, chunks, donor)
        free = [s for s in takers if s in available]
        if chunk is None or not free:
            continue
        to = min(free, key=lambda s: (sizes[s], s))
        out.append(Migration(ns, chunk, donor, to, "drain"))
        available.discard(donor)
        available.discard(to)
    if not takers or len(takers) < 2:
        return out
    total = sum(sizes[s] for s in takers)
    if total == 0:
        return out
    ideal = total // len(takers)
    while True:
        free = [s for s in takers if s in available]
        if len(free) < 2:
            break
        donor = max(free, key=lambda s: (sizes[s], s))
        to = min(free, key=lambda s: (sizes[s], s))
        if sizes[donor] <= ideal or sizes[to] >= ideal:
            break
        if sizes[donor] - sizes[to] < IMBALANCE_CHUNKS * chunk_size:
            break
        chunk = _first_chunk(pattern, chunks, donor)
        if chunk is None:
            break
        out.append(Migration(ns, chunk, donor, to, "chunksImbalance"))
        available.discard(donor)
        available.discard(to)
    return out


def first_violation(pattern: KeyPattern, chunks: list[dict[str, Any]], sizes: dict[str, int],
                    shards: list[str], draining: set[str], chunk_size: int) -> str | None:
    """``balancerCollectionStatus``' ``firstComplianceViolation`` of one collection:
    ``"draining"``, ``"chunksImbalance"`` or None when compliant
    (``BalancerCommandsScheduler``/``Balancer::getBalancerStatusForNs``)."""
    found = select_for_collection("", pattern, chunks, sizes, shards, draining, chunk_size,
                                  set(shards))
    if not found:
        return None
    return "draining" if found[0].reason == "drain" else found[0].reason
