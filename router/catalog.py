"""The router's cached copy of the catalog (mongos' ``CatalogCache`` + ``ShardRegistry``).

Loaded from the config server's ``config.shards``, ``config.databases``, ``config.collections``
and ``config.chunks`` with ordinary ``find`` commands; :meth:`CatalogCache.refresh` reloads
everything (after every sharding/DDL command the router runs, on a short timer, and when a
namespace is not known yet).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from bson import Binary
from bson.timestamp import Timestamp

from shardsim.core.gossip import gossip_command
from shardsim.core.shard_key import Chunk, ChunkMap, KeyPattern
from shardsim.core.client import Pool, parse_address
from shardsim.core.clock import HybridLogicalClock

log = logging.getLogger("shardsim.router")
# Reads again of a catalog caught half-way through a collection's chunk rewrite.
TORN_READ_RETRIES = 5


@dataclass
class CollectionInfo:
    """A sharded collection: ``ns``, ``uuid`` (Binary subtype 4), ``key`` (the pattern
    document), ``unique``, ``pattern`` and ``chunks`` (:class:`ChunkMap`)."""

    ns: str
    uuid: Binary
    key: dict[str, Any]
    unique: bool
    pattern: KeyPattern
    chunks: ChunkMap
    epoch: Any = None
    timestamp: Any = None
    versions: dict[str, Timestamp] = field(default_factory=dict)

    def shard_version(self, shard: str) -> dict[str, Any]:
        """The ``shardVersion`` the router sends ``shard`` (``{e, t, v}``: mongos'
        ``ChunkManager::getVersion(shardId)``: the highest ``lastmod`` of the shard's chunks,
        ``Timestamp(0, 0)`` when it owns none)."""
        return {"e": self.epoch, "t": self.timestamp,
                "v": self.versions.get(shard, Timestamp(0, 0))}


def _host_of(entry: dict[str, Any]) -> tuple[str, int]:
    return parse_address(entry["host"].split("/", 1)[-1].split(",")[0])


class CatalogCache:
    """What the router knows about the cluster. ``config_pool`` reaches the config server."""

    def __init__(self, config_pool: Pool, clock: HybridLogicalClock) -> None:
        self.config_pool = config_pool
        self.clock = clock
        self._shards: dict[str, tuple[str, int]] = {}
        self._conn_strings: dict[str, str] = {}
        # set by the router: shard name -> its primary's (host, port) as its replica-set
        # monitor knows it, or None (router/shard_registry.py)
        self.primary_resolver: Callable[[str], tuple[str, int] | None] | None = None
        self._shard_docs: list[dict[str, Any]] = []
        self._databases: dict[str, dict[str, Any]] = {}
        self._collections: dict[str, CollectionInfo] = {}
        self._lock = asyncio.Lock()
        self.loaded_at = 0.0
        self.read_started_at = 0.0  # when the read of the current catalog began (monotonic)
        self.generation = 0

    # -- reading the config server ----------------------------------------------------------
    async def _find_all(self, coll: str) -> list[dict[str, Any]]:
        reply = await gossip_command(self.clock, self.config_pool, "config",
                                     {"find": coll, "filter": {}, "batchSize": 1 << 30},
                                     timeout=10)
        cur = reply["cursor"]
        docs = list(cur["firstBatch"])
        while cur["id"]:
            reply = await gossip_command(self.clock, self.config_pool, "config",
                                         {"getMore": cur["id"], "collection": coll}, timeout=10)
            cur = reply["cursor"]
            docs.extend(cur["nextBatch"])
        return docs

    async def refresh(self, if_generation: int | None = None,
                      read_after: float | None = None) -> None:
        """Reload the whole catalog from the config server (MongoError 6/9001 if it is down).
        With ``if_generation``: only when nothing was reloaded since that generation (many
        requests told StaleConfig at once cause one reload, as mongos' CatalogCache joins
        refreshes in flight); with ``read_after`` too (a ``time.monotonic()``), a reload since
        then counts only when its read of the config server began at or after that time (a
        reload that read the catalog before the shard answered StaleConfig may predate the
        change the shard knows of: mongos refreshes until it reaches the version the shard
        wants). A read that caught the config server between writes of one
        collection's entry and chunks (a resharding's commit swaps them) leaves a chunk map
        with gaps: it is read again, up to :data:`TORN_READ_RETRIES` times, as mongos refuses
        such a routing table and refreshes again."""
        async with self._lock:
            gen = self.generation
            if if_generation is not None and gen != if_generation and \
                    (read_after is None or self.read_started_at >= read_after):
                return
            for attempt in range(TORN_READ_RETRIES + 1):
                started = time.monotonic()
                shards, dbs, collections = await self._read_all()
                torn = [ns for ns, info in collections.items()
                        if not info.chunks.covers_key_space()]
                if not torn:
                    break
                log.debug("catalog read with gaps in %s (attempt %d)", torn, attempt + 1)
                await asyncio.sleep(0.02)
            if gen != self.generation:  # someone refreshed meanwhile
                return
            shards.sort(key=lambda s: s["_id"])
            self._shard_docs = shards
            self._shards = {s["_id"]: _host_of(s) for s in shards}
            self._conn_strings = {s["_id"]: s["host"] for s in shards}
            self._databases = {d["_id"]: d for d in dbs}
            self._collections = collections
            self.loaded_at = time.monotonic()
            self.read_started_at = started
            self.generation += 1

    async def _read_all(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                       dict[str, "CollectionInfo"]]:
        """``config.shards``, ``config.databases``, and every tracked collection's
        :class:`CollectionInfo` (routing table and placement versions) from the config server."""
        shards = await self._find_all("shards")
        dbs = await self._find_all("databases")
        colls = await self._find_all("collections")
        chunks = await self._find_all("chunks")
        by_uuid: dict[bytes, list[dict[str, Any]]] = {}
        for c in chunks:
            by_uuid.setdefault(bytes(c["uuid"]), []).append(c)
        collections: dict[str, CollectionInfo] = {}
        for entry in colls:
            pattern = KeyPattern(dict(entry["key"]))
            cmap = ChunkMap(pattern, [
                Chunk(pattern.bound_to_key(d["min"]), pattern.bound_to_key(d["max"]), d["shard"])
                for d in by_uuid.get(bytes(entry["uuid"]), [])])
            versions: dict[str, Timestamp] = {}
            for d in by_uuid.get(bytes(entry["uuid"]), []):
                lm, cur = d["lastmod"], versions.get(d["shard"])
                if cur is None or (lm.time, lm.inc) > (cur.time, cur.inc):
                    versions[d["shard"]] = lm
            collections[entry["_id"]] = CollectionInfo(
                entry["_id"], entry["uuid"], dict(entry["key"]), bool(entry.get("unique")),
                pattern, cmap, entry.get("lastmodEpoch"), entry.get("timestamp"), versions)
        return shards, dbs, collections

    # -- look-ups ---------------------------------------------------------------------------
    def has_shards(self) -> bool:
        """Whether the cached catalog knows any shard (checked on every command: no list)."""
        return bool(self._shards)

    def shards(self) -> list[tuple[str, str, int]]:
        """``[(name, host, port), ...]`` sorted by name."""
        return [(n, h, p) for n, (h, p) in sorted(self._shards.items())]

    def shard_docs(self) -> list[dict[str, Any]]:
        """The ``config.shards`` documents as last loaded."""
        return list(self._shard_docs)

    def shard_address(self, name: str) -> tuple[str, int] | None:
        """``(host, port)`` commands to shard ``name`` go to: its primary as the router's
        monitor of the shard knows it (:attr:`primary_resolver`), else the first host of its
        connection string; None for a shard the catalog does not list."""
        addr = self._shards.get(name)
        if addr is None or self.primary_resolver is None:
            return addr
        return self.primary_resolver(name) or addr

    def shard_connection_string(self, name: str) -> str | None:
        """The shard's ``config.shards.host`` (``setName/host1,host2,...``), or None."""
        return self._conn_strings.get(name)

    def collection(self, ns: str) -> CollectionInfo | None:
        """The sharded collection ``ns``, or None when unsharded/unknown."""
        return self._collections.get(ns)

    def collections(self) -> dict[str, CollectionInfo]:
        return dict(self._collections)

    def database(self, db: str) -> dict[str, Any] | None:
        return self._databases.get(db)

    def databases(self) -> list[str]:
        return sorted(self._databases)

    def primary_shard(self, db: str) -> str | None:
        """The database's primary shard name, or None if the database has no entry."""
        entry = self._databases.get(db)
        return entry["primary"] if entry else None

    def shards_for_ns(self, ns: str) -> list[str]:
        """Shards that own data of ``ns``: the primary shard, plus every chunk owner when
        sharded (primary first)."""
        db = ns.split(".", 1)[0]
        out: list[str] = []
        primary = self.primary_shard(db)
        if primary:
            out.append(primary)
        info = self._collections.get(ns)
        if info is not None:
            for s in info.chunks.shards():
                if s not in out:
                    out.append(s)
        return out

    def shards_for_db(self, db: str) -> list[str]:
        """Shards holding any collection of ``db`` (primary first)."""
        out: list[str] = []
        primary = self.primary_shard(db)
        if primary:
            out.append(primary)
        for ns, info in self._collections.items():
            if ns.split(".", 1)[0] == db:
                for s in info.chunks.shards():
                    if s not in out:
                        out.append(s)
        return out
