"""The shard's sharding state per collection: its filtering metadata (placement version and
owned chunks), the migration critical section, shard-version checks of routed requests and the
donor's record of the writes made to a collection while one of its chunks migrates.

Like mongod's ``CollectionShardingRuntime`` (``src/mongo/db/s/collection_sharding_runtime.cpp``,
``checkShardVersionOrThrow`` / ``_checkShardVersionOk``) and ``MigrationChunkClonerSource``'s
transfer-mods bookkeeping (``migration_chunk_cloner_source.cpp``, ``onInsertOp``/``onUpdateOp``/
``onDeleteOp``).

Versions are mongod's ``ShardVersion`` documents ``{e: epoch ObjectId, t: Timestamp, v:
Timestamp(major, minor)}``; ``UNSHARDED`` is ``{e: ObjectId('000000000000000000000000'), t:
Timestamp(0, 0), v: Timestamp(0, 0)}`` (``ShardVersion::UNSHARDED()``). A shard's placement
version for a collection is the highest ``lastmod`` among the chunks it owns (``{major: 0,
minor: 0}`` with the collection's epoch when it owns none); a request is accepted when its epoch
and timestamp are the shard's and its major version equals the shard's
(``ChunkVersion::isWriteCompatibleWith``); otherwise the shard answers StaleConfig (13388) with
``ns``, ``vReceived``, ``vWanted`` and ``shardId`` (``StaleConfigInfo::serialize``).

A shard owns its metadata as 8.0 shards do: a routed request whose version is not compatible
makes the shard refresh its metadata of the namespace from the config server and wait for it
when the shard's own may be behind -- nothing known, unsharded here while the router says
sharded, a higher major version of the same incarnation, or a newer incarnation (the
service entry point's ``ExecCommandDatabase::_refreshIfNeeded`` in
``service_entry_point_shard_role.cpp``; ``onCollectionPlacementVersionMismatch`` ->
``recoverRefreshCollectionPlacementVersion`` / ``forceGetCurrentMetadata`` in
``shard_filtering_metadata_refresh.cpp``); then the request is checked again, and only a
request still stale (the router is behind) gets StaleConfig, which makes the router refresh
and retry. A request older than the shard's version gets StaleConfig at once. One refresh per
namespace is in flight (the others join it), and a refresh first waits for the namespace's
critical section. A new primary forgets its metadata (``ShardNode.on_became_writable_primary``)
and recovers it by refresh; secondaries serving routed reads refresh the same way. The config
server is found in the ``shardIdentity`` document (``admin.system.version``), written and
logged (so replicated) by the primary from the first metadata the config server sent, as
mongod persists it on ``addShard``.

The config server still sends the shards the new metadata after each change
(``_shardsimSetFilteringMetadata``, ``configsvr/migration.py`` ``push_metadata``): in mongod the
participants of a migration or DDL refresh at its end (``_flushRoutingTableCacheUpdates``);
here the config server's message carries the metadata to install. It is an optimisation the
shard no longer depends on: a shard that missed it (down, a new primary) refreshes when a
request tells it so. A migration's donor also refreshes itself after the commit, from inside
its critical section (:meth:`ShardingRuntime.force_refresh`, as ``MigrationSourceManager``
does).

Not faithful: a shard that knows nothing of a namespace accepts an UNSHARDED version without a
refresh (mongod refreshes to learn whether it is sharded), and a shard that cannot refresh (no
shard identity, config server unreachable) accepts any version for a namespace it knows
nothing of. UNSHARDED received for a namespace known sharded is refreshed before StaleConfig
(mongod answers at once; the refresh only costs time, and it recovers a shard that missed an
``unshardCollection``'s message). A secondary's refresh reads the config server directly (a
mongod secondary refreshes through its primary and waits for the replicated
``config.cache.*``), so its metadata may be ahead of the data it has applied; and a
secondary's metadata is not cleared when its primary's changes (mongod's secondaries follow
the primary's persisted cache): a secondary only refreshes when a router sends it a newer
version. The critical section lives in the memory of the primary that entered it (mongod's
recoverable critical section is persisted and replicated): a primary elected during a
migration's commit does not hold it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson import ObjectId
from bson.timestamp import Timestamp

from shardsim.core.client import Pool, parse_address
from shardsim.core.errors import MongoError
from shardsim.core.gossip import gossip_command
from shardsim.core.shard_targets import ShardTargets
from shardsim.core.shard_key import Chunk, ChunkMap, KeyPattern, compare_keys
from shardsim.core.values import id_key
from shardsim.core.protocol.versions import UNSHARDED_EPOCH, unsharded

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

log = logging.getLogger("shardsim.sharding")
IDENTITY_NS = ("admin", "system.version")
WRITES = frozenset({"insert", "update", "delete", "findAndModify", "findandmodify"})
# How long a write waits for a critical section before it fails (mongod:
# migrationLockAcquisitionMaxWaitMS / the critical section signal's wait), seconds.
CRITICAL_SECTION_WAIT_S = 30.0
# How long a refresh of the filtering metadata from the config server may take, seconds.
REFRESH_TIMEOUT_S = 10.0
# Attempts of a post-image look-up (mongod's kMaxNumStaleVersionRetries).
MAX_LOOKUP_ATTEMPTS = 10


@dataclass
class CollectionMetadata:
    """What this shard knows of a sharded collection: ``epoch`` (ObjectId), ``timestamp``,
    ``version`` (Timestamp(major, minor): this shard's placement version), ``pattern``, the
    ``chunks`` it owns as ``(min, max)`` key tuples and their versions (``lastmods``, the same
    order: each chunk's ``lastmod`` Timestamp(major, minor))."""

    epoch: ObjectId
    timestamp: Timestamp
    version: Timestamp
    pattern: KeyPattern
    chunks: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = field(default_factory=list)
    uuid: Any = None
    routing: ChunkMap | None = None  # every chunk with its owner (routed look-ups)
    # the collection's version: (timestamp, major, minor) of the highest chunk lastmod
    collection_version: tuple[int, int, int, int] = (0, 0, 0, 0)
    lastmods: list[Timestamp] = field(default_factory=list)

    def shard_version(self) -> dict[str, Any]:
        """``{e, t, v}``."""
        return {"e": self.epoch, "t": self.timestamp, "v": self.version}

    def owns(self, doc: dict[str, Any]) -> bool:
        """True when ``doc``'s shard key falls in a chunk this shard owns."""
        try:
            key = self.pattern.key_of_doc(doc)
        except MongoError:
            return True
        return any(compare_keys(lo, key) <= 0 and compare_keys(key, hi) < 0
                   for lo, hi in self.chunks)


def _collection_version(doc: dict[str, Any]) -> tuple[int, int, int, int]:
    """The collection version of metadata ``doc`` (as :meth:`ShardingRuntime.set_metadata`
    takes it): ``(timestamp.time, timestamp.inc, major, minor)`` of its highest chunk
    ``lastmod`` (``ChunkManager::getVersion``; versions of two incarnations order by their
    timestamps, as ``ChunkVersion`` compares them)."""
    ts = doc.get("timestamp")
    t = (ts.time, ts.inc) if isinstance(ts, Timestamp) else (0, 0)
    top = (0, 0)
    for c in doc.get("chunks") or []:
        lm = c.get("lastmod")
        if isinstance(lm, Timestamp) and (lm.time, lm.inc) > top:
            top = (lm.time, lm.inc)
    return t + top


class _FilteredDocs:
    """A collection's ``docs`` map (``id_key -> document``) restricted, lazily, to the
    documents of the chunks this shard owns: a point look-up checks one document, a scan
    checks each document it reaches."""

    __slots__ = ("_docs", "_owns")

    def __init__(self, docs: dict[Any, dict[str, Any]], meta: CollectionMetadata) -> None:
        self._docs = docs
        self._owns = meta.owns

    def get(self, k: Any, default: Any = None) -> Any:
        doc = self._docs.get(k)
        return doc if doc is not None and self._owns(doc) else default

    def __contains__(self, k: Any) -> bool:
        return self.get(k) is not None

    def __getitem__(self, k: Any) -> dict[str, Any]:
        doc = self.get(k)
        if doc is None:
            raise KeyError(k)
        return doc

    def items(self) -> Any:
        owns = self._owns
        return [(k, d) for k, d in self._docs.items() if owns(d)]

    def keys(self) -> Any:
        return [k for k, _ in self.items()]

    def values(self) -> Any:
        return [d for _, d in self.items()]

    def __iter__(self) -> Any:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.items())


class _OwnedDocs:
    """A collection seen through the shard filter: ``docs`` holds the owned documents."""

    __slots__ = ("coll", "docs")

    def __init__(self, coll: Any, meta: CollectionMetadata) -> None:
        self.coll = coll
        self.docs = _FilteredDocs(coll.docs, meta)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.coll, name)


class ModsTracker:
    """The ``_id``s of the documents of one namespace written (not ``fromMigrate``) since a
    migration started: the donor's transfer mods (``MigrationChunkClonerSource``'s
    ``_reload``/``_deleted`` lists, here one set of ``_id``s whose current state is read when
    the recipient asks)."""

    def __init__(self) -> None:
        self.ids: dict[Any, Any] = {}

    def note(self, _id: Any) -> None:
        self.ids[id_key(_id)] = _id

    def take(self) -> list[Any]:
        """The ``_id``s recorded since the last call."""
        out = list(self.ids.values())
        self.ids.clear()
        return out


class CriticalSection:
    """A namespace's migration critical section (``ShardingMigrationCriticalSection``):
    writes that arrive while it is held wait for its release, then fail with StaleConfig; the
    writes already running are waited for when it is entered. Once promoted to block reads
    too (``blocks_reads``: the commit phase, ``enterCommitPhase`` /
    ``promoteRecoverableCriticalSectionToBlockAlsoReads``) routed reads and post-image look-ups
    wait as well."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.blocks_reads = False


class ShardingRuntime:
    """``node.sharding``: metadata per namespace (``metadata``), critical sections
    (``critical``), transfer-mods trackers (``trackers``), the donor's active migrations by
    session id (``migrations``: ``(ns, tracker, key pattern, min key, max key)``) and versioned
    writes in flight."""

    def __init__(self, node: "ShardNode") -> None:
        self.node = node
        self.metadata: dict[str, CollectionMetadata | None] = {}
        self.critical: dict[str, CriticalSection] = {}
        self.trackers: dict[str, list[ModsTracker]] = {}
        self.migrations: dict[str, tuple[str, ModsTracker, Any, tuple[Any, ...], tuple[Any, ...]]] = {}
        self.in_flight: dict[str, int] = {}
        self._idle: dict[str, asyncio.Event] = {}
        self.hosts: dict[str, str] = {}  # other shards' connection strings (set/h1,h2 or h:p)
        self.targets = ShardTargets()  # their primaries, through replica-set monitors
        self._pools: dict[str, Pool] = {}
        self._refreshing: dict[str, asyncio.Task] = {}
        self._generation: dict[str, int] = {}  # bumped at every install or clear of a ns
        self.refreshes = 0  # refreshes from the config server run (joined ones not counted)
        self.refreshes_joined = 0  # callers that joined a refresh already in flight
        self.stale_config_errors = 0  # StaleConfig answers (ShardingStatistics' count)

    # -- metadata -----------------------------------------------------------------------------
    def set_metadata(self, ns: str, doc: dict[str, Any] | None, *, pushed: bool = True) -> None:
        """Install metadata of ``ns``: None (unsharded) or ``{epoch, timestamp, uuid, key,
        chunks: [{min, max, lastmod, shard}], shards: {name: host}, configsvr?}`` (every chunk
        of the collection; this shard's version is the highest ``lastmod`` of its own).
        ``pushed``: sent by the config server (``_shardsimSetFilteringMetadata``, whose
        ``configsvr`` address becomes the shard identity) rather than read by a refresh."""
        self._generation[ns] = self._generation.get(ns, 0) + 1
        if doc is None:
            self.metadata[ns] = None
            return
        if pushed and isinstance(doc.get("configsvr"), str):
            self._note_identity(doc["configsvr"])
        pattern = KeyPattern(dict(doc["key"]))
        me = self.node.shard_name
        mine = [c for c in doc.get("chunks", []) if c.get("shard", me) == me]
        chunks = [(pattern.bound_to_key(c["min"]), pattern.bound_to_key(c["max"]))
                  for c in mine]
        routing = ChunkMap(pattern, [Chunk(pattern.bound_to_key(c["min"]),
                                           pattern.bound_to_key(c["max"]), c["shard"])
                                     for c in doc.get("chunks", []) if "shard" in c])
        for name, host in (doc.get("shards") or {}).items():
            self.hosts[name] = str(host)
        version = Timestamp(0, 0)
        for c in mine:
            lm = c["lastmod"]
            if (lm.time, lm.inc) > (version.time, version.inc):
                version = lm
        self.metadata[ns] = CollectionMetadata(doc["epoch"], doc["timestamp"], version, pattern,
                                               chunks, doc.get("uuid"), routing,
                                               _collection_version(doc),
                                               [c["lastmod"] for c in mine])

    # -- the shard identity and the refresh after a restart --------------------------------------
    def _note_identity(self, configsvr: str) -> None:
        """Persist ``{_id: "shardIdentity", shardName, configsvrConnectionString}`` in
        ``admin.system.version`` when it changed (``configsvr``: ``host:port`` of a one-node
        config server, ``setName/h1,h2,h3`` of a config server replica set), logged (a
        replica-set shard's secondaries and later primaries know the config server too, as
        mongod's ``shardIdentity`` insert replicates). Only a writable primary writes it."""
        if self.config_connection_string() == configsvr:
            return
        repl = self.node.repl
        if repl is not None and not repl.writable:
            return
        coll = self.node.storage.get(*IDENTITY_NS)
        if coll is None:  # a system collection: made here
            coll = self.node.create_collection(*IDENTITY_NS)
        self.node.put_logged(coll, {"_id": "shardIdentity", "shardName": self.node.shard_name,
                                    "configsvrConnectionString": configsvr})

    def config_connection_string(self) -> str | None:
        """The shard identity's ``configsvrConnectionString``, or None."""
        doc = self.node.range_deleter.find(IDENTITY_NS, "shardIdentity")
        if doc is None:
            return None
        return str(doc["configsvrConnectionString"])

    # -- the refresh (onCollectionPlacementVersionMismatch) ---------------------------------------
    def should_refresh(self, ns: str, received: dict[str, Any]) -> bool:
        """True when a routed request's ``received`` version tells this shard that its own
        metadata of ``ns`` may be behind, so it must refresh before it answers (mongod:
        ``ExecCommandDatabase::_refreshIfNeeded``, ``service_entry_point_shard_role.cpp``):
        nothing is known of ``ns`` and ``received`` is sharded; ``ns`` is unsharded here and
        ``received`` is sharded; or ``received`` is not older than this shard's version (same
        epoch and timestamp with a higher major version, or another incarnation with a
        timestamp that is not older). A ``received`` of the same incarnation with a lower
        major version, or of an older incarnation, means the router is behind: no refresh
        ("the shard is recovered and the router is staler than the shard"). UNSHARDED received
        for a collection known sharded refreshes too (see the module doc). False when the
        config server is not known (no ``shardIdentity``)."""
        if self.config_connection_string() is None:
            return False
        sharded = received.get("e") not in (None, UNSHARDED_EPOCH)
        if ns not in self.metadata or self.metadata[ns] is None:
            return sharded
        meta = self.metadata[ns]
        if not sharded:
            return True
        rt, rv = received.get("t"), received.get("v")
        if not isinstance(rt, Timestamp) or not isinstance(rv, Timestamp):
            return False
        if received.get("e") == meta.epoch and rt == meta.timestamp:
            return rv.time > meta.version.time
        return (rt.time, rt.inc) >= (meta.timestamp.time, meta.timestamp.inc)

    async def refresh(self, ns: str) -> bool:
        """Refresh ``ns``'s filtering metadata from the config server and wait for it
        (``onCollectionPlacementVersionMismatch`` -> ``recoverRefreshCollectionPlacementVersion``
        / ``forceGetCurrentMetadata``, ``shard_filtering_metadata_refresh.cpp``). One refresh
        per namespace is in flight: a caller arriving meanwhile joins it
        (``joinCollectionPlacementVersionOperation``); the refresh first waits for the
        namespace's critical section, as mongod's joins it. The waiters being cancelled does
        not cancel the refresh. True when metadata was installed; False when the config server
        is unknown, cannot be reached or does not answer within :data:`REFRESH_TIMEOUT_S`
        (the metadata stays as it was)."""
        task = self._refreshing.get(ns)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._refresh(ns))
            self._refreshing[ns] = task

            def forget(t: asyncio.Task, ns: str = ns) -> None:
                if self._refreshing.get(ns) is t:
                    del self._refreshing[ns]
            task.add_done_callback(forget)
        else:
            self.refreshes_joined += 1
        return await asyncio.shield(task)

    async def _refresh(self, ns: str) -> bool:
        cs = self.critical.get(ns)
        if cs is not None:  # the metadata changes at the end of the critical section
            try:
                await asyncio.wait_for(cs.released.wait(), CRITICAL_SECTION_WAIT_S)
            except asyncio.TimeoutError:
                pass
        conn = self.config_connection_string()
        if conn is None:
            return False
        self.refreshes += 1
        generation = self._generation.get(ns, 0)
        try:
            # a config server replica set is read on its primary through a monitor, so a
            # refresh after a config failover reads the new primary (_fetch)
            doc = await asyncio.wait_for(self._fetch(conn, ns), REFRESH_TIMEOUT_S)
        except (MongoError, OSError, asyncio.TimeoutError) as exc:
            log.warning("filtering metadata of %s not refreshed: %s", ns, exc)
            return False
        if self._generation.get(ns, 0) != generation and ns in self.metadata:
            # installed meanwhile (a push): keep it unless what was read is newer
            # (forceShardFilteringMetadataRefresh keeps a metadata that is not older)
            current = self.metadata[ns]
            if current is None or doc is None or \
                    _collection_version(doc) <= current.collection_version:
                return True
        self.set_metadata(ns, doc, pushed=False)
        return True

    def clear_metadata(self, ns: str | None = None) -> None:
        """Forget the filtering metadata of ``ns`` (every namespace when None): the next
        routed request naming a sharded version refreshes it from the config server
        (``CollectionShardingRuntime::clearFilteringMetadata``). Done by a new primary
        (:meth:`shard.node.ShardNode.on_became_writable_primary`)."""
        for key in ([ns] if ns is not None else list(self.metadata)):
            self.metadata.pop(key, None)
            self._generation[key] = self._generation.get(key, 0) + 1

    async def config_command(self, db: str, cmd: dict[str, Any], conn: str | None = None,
                             timeout: float | None = None) -> dict[str, Any]:
        """Run ``cmd`` on the config server's primary (``conn``, by default the shard
        identity's connection string) with ``$clusterTime`` gossip, as a shard's
        ``ShardRegistry::getConfigShard()`` does; raises its error reply, a network error, or
        ShardNotFound (70) when this shard knows no config server."""
        conn = conn or self.config_connection_string()
        if conn is None:
            raise MongoError(70, "this shard does not know its config server yet")
        if "/" in conn:  # a replica set: its primary through a monitor (failovers)
            return await self.targets.command(self.node.clock, conn, db, cmd, timeout=timeout)
        addr = parse_address(conn)
        pool = self._pools.get("$config")
        if pool is None or (pool.host, pool.port) != addr:
            pool = self._pools["$config"] = Pool(*addr)
        return await gossip_command(self.node.clock, pool, db, cmd, timeout=timeout)

    async def force_refresh(self, ns: str) -> CollectionMetadata | None:
        """Read ``ns``'s metadata from the config server and install it, without waiting for
        the namespace's critical section (the donor refreshes from inside its own:
        ``forceShardFilteringMetadataRefresh`` in ``MigrationSourceManager``). Returns the
        installed metadata (None: not sharded). Raises what the config server's read raised."""
        conn = self.config_connection_string()
        if conn is None:
            raise MongoError(70, "this shard does not know its config server yet")
        self.refreshes += 1
        doc = await asyncio.wait_for(self._fetch(conn, ns), REFRESH_TIMEOUT_S)
        self.set_metadata(ns, doc, pushed=False)
        return self.metadata.get(ns)

    async def _fetch(self, conn: str, ns: str) -> dict[str, Any] | None:
        """The metadata of ``ns`` as the config server pushes it, read from its catalog
        (``conn``: the shard identity's connection string)."""
        async def run(cmd: dict[str, Any]) -> dict[str, Any]:
            return await self.config_command("config", cmd, conn)

        async def find(coll: str, filt: dict[str, Any]) -> list[dict[str, Any]]:
            reply = await run({"find": coll, "filter": filt, "batchSize": 1 << 30,
                               "singleBatch": True})
            return [dict(d) for d in reply["cursor"]["firstBatch"]]
        found = await find("collections", {"_id": ns})
        if not found:
            return None
        entry = found[0]
        chunks = await find("chunks", {"uuid": entry["uuid"]})
        shards = await find("shards", {})
        return {"epoch": entry["lastmodEpoch"], "timestamp": entry["timestamp"],
                "uuid": entry["uuid"], "key": entry["key"],
                "chunks": [{"min": d["min"], "max": d["max"], "lastmod": d["lastmod"],
                            "shard": d["shard"]} for d in chunks],
                "shards": {d["_id"]: d["host"] for d in shards}}

    def wanted(self, ns: str) -> dict[str, Any]:
        """This shard's version of ``ns`` (UNSHARDED when it is not sharded)."""
        meta = self.metadata.get(ns)
        return meta.shard_version() if meta is not None else unsharded()

    def stale(self, ns: str, received: Any, msg: str | None = None) -> MongoError:
        """StaleConfig (13388) as mongod builds it (``StaleConfigInfo``)."""
        wanted = self.wanted(ns)
        return MongoError(13388, msg or f"shard version not ok: version mismatch detected for "
                                        f"{ns}", ns=ns, vReceived=received, vWanted=wanted,
                          shardId=self.node.shard_name)

    def compatible(self, ns: str, received: dict[str, Any]) -> bool:
        """``ChunkVersion::isWriteCompatibleWith``: same epoch and timestamp, same major."""
        if ns not in self.metadata:
            return True  # nothing known (restart): accepted (not faithful, see module doc)
        meta = self.metadata[ns]
        if meta is not None and meta.uuid is not None:
            db, _, name = ns.partition(".")
            coll = self.node.storage.get(db, name)
            if coll is None or coll.uuid != bytes(meta.uuid):
                if self._outdated_epoch(meta, received):
                    return False  # e.g. resharded away from this shard: the router refreshes
                self.metadata.pop(ns, None)  # dropped or recreated since: the metadata is gone
                return True
        wanted = self.wanted(ns)
        rv, wv = received.get("v"), wanted["v"]
        if not isinstance(rv, Timestamp):
            return False
        return received.get("e") == wanted["e"] and received.get("t") == wanted["t"] and \
            rv.time == wv.time

    @staticmethod
    def _outdated_epoch(meta: CollectionMetadata, received: dict[str, Any]) -> bool:
        """True when ``received`` is a sharded version of an older incarnation than ``meta``
        while this shard owns no chunk of it (a resharding moved everything away and dropped
        the local collection): such a request must be told StaleConfig, not create the
        collection again."""
        e = received.get("e")
        return meta.version == Timestamp(0, 0) and isinstance(e, ObjectId) and \
            e != UNSHARDED_EPOCH and e != meta.epoch

    # -- the check of a routed request ----------------------------------------------------------
    async def check(self, ns: str, command: str, received: Any) -> bool:
        """Check a routed request's ``shardVersion``, as mongod's service entry point does
        with ``checkShardVersionOrThrow`` and ``_refreshIfNeeded`` / ``canRetryCommand``
        (``service_entry_point_shard_role.cpp``): a write (or, once promoted, any request)
        meeting the namespace's critical section waits for its release, then gets StaleConfig
        (no local retry), the shard refreshing first when :meth:`should_refresh`; a version
        that is not compatible makes the shard refresh from the config server and wait for it
        when :meth:`should_refresh` says its own may be behind (:meth:`refresh`), then check
        again (twice at most: a joined refresh may have started before the version the router
        has was committed); only a request still stale after that (the router is behind) gets
        StaleConfig. Returns True when the request is a write now counted in flight (the caller
        must call :meth:`done`). Raises StaleConfig (13388), or 14 for a malformed version."""
        if not isinstance(received, dict):
            raise MongoError(14, "BSON field 'shardVersion' is the wrong type, expected type "
                                 "'object'")
        is_write = command in WRITES
        cs = self.critical.get(ns)
        if cs is not None and (is_write or cs.blocks_reads):
            try:
                await asyncio.wait_for(cs.released.wait(), CRITICAL_SECTION_WAIT_S)
            except asyncio.TimeoutError:
                pass
            if not self.compatible(ns, received) and self.should_refresh(ns, received):
                await self.refresh(ns)
            self.stale_config_errors += 1
            raise self.stale(ns, received, f"migration commit in progress for {ns}")
        for _ in range(2):
            if ns in self.metadata and self.compatible(ns, received) or \
                    not self.should_refresh(ns, received):
                break
            await self.refresh(ns)
        if not self.compatible(ns, received):
            self.stale_config_errors += 1
            raise self.stale(ns, received)
        if is_write:
            self.in_flight[ns] = self.in_flight.get(ns, 0) + 1
        return is_write

    def done(self, ns: str) -> None:
        """A versioned write of ``ns`` ended."""
        n = self.in_flight.get(ns, 0) - 1
        if n <= 0:
            self.in_flight.pop(ns, None)
            ev = self._idle.pop(ns, None)
            if ev is not None:
                ev.set()
        else:
            self.in_flight[ns] = n

    async def enter_critical_section(self, ns: str) -> None:
        """Block new writes to ``ns`` and wait for those running
        (``MigrationSourceManager::enterCriticalSection``)."""
        if ns not in self.critical:
            self.critical[ns] = CriticalSection()
        while self.in_flight.get(ns):
            ev = self._idle.setdefault(ns, asyncio.Event())
            await ev.wait()

    def hold_critical_section(self, ns: str, block_reads: bool) -> None:
        """Hold ``ns``'s critical section at once (a new primary recovering a persisted one:
        no write of its own is running yet), blocking reads too when ``block_reads``."""
        cs = self.critical.setdefault(ns, CriticalSection())
        if block_reads:
            cs.blocks_reads = True

    def block_reads(self, ns: str) -> None:
        """Promote ``ns``'s critical section (entered) to block routed reads too."""
        cs = self.critical.get(ns)
        if cs is not None:
            cs.blocks_reads = True

    def reads_blocked(self, ns: str) -> bool:
        """True while ``ns``'s critical section blocks reads."""
        cs = self.critical.get(ns)
        return cs is not None and cs.blocks_reads

    async def wait_for_reads(self, ns: str) -> None:
        """Wait (at most :data:`CRITICAL_SECTION_WAIT_S`) until ``ns``'s critical section no
        longer blocks reads (``OperationShardingState::waitForCriticalSectionToComplete``)."""
        cs = self.critical.get(ns)
        if cs is None or not cs.blocks_reads:
            return
        try:
            await asyncio.wait_for(cs.released.wait(), CRITICAL_SECTION_WAIT_S)
        except asyncio.TimeoutError:
            pass

    def exit_critical_section(self, ns: str) -> None:
        """Release ``ns``'s critical section: the waiting writes fail with StaleConfig and the
        router retries them with its refreshed routing table."""
        cs = self.critical.pop(ns, None)
        if cs is not None:
            cs.released.set()

    # -- orphan filtering -----------------------------------------------------------------------
    def owned_view(self, req: Any, coll: Any) -> Any:
        """``coll`` as a routed read of it sees it: for a request carrying a (sharded)
        ``shardVersion`` on a collection of which this shard does not own every chunk, an
        object whose ``docs`` holds only the documents of the chunks this shard owns (mongod's
        ``ShardFilterer``: orphans left by a migration, cloned or not yet range-deleted, are not
        returned); otherwise ``coll`` itself."""
        received = req.body.get("shardVersion")
        if coll is None or not isinstance(received, dict) or received.get("e") == UNSHARDED_EPOCH:
            return coll
        meta = self.metadata.get(f"{req.db}.{req.arg}")
        if meta is None or meta.routing is None or \
                all(c.shard == self.node.shard_name for c in meta.routing.chunks):
            return coll
        return _OwnedDocs(coll, meta)

    # -- routed look-ups (ShardServerProcessInterface::lookupSingleDocument) ----------------
    def owner_of(self, ns: str, document_key: dict[str, Any]) -> str | None:
        """The shard owning ``document_key``'s chunk of ``ns`` by this shard's routing
        information, or None when ``ns`` is not known as sharded here."""
        meta = self.metadata.get(ns)
        if meta is None or meta.routing is None or not meta.routing.chunks:
            return None
        try:
            return meta.routing.find(meta.pattern.key_of_doc(document_key)).shard
        except MongoError:
            return None

    async def lookup_remote(self, ns: str, owner: str | None, document_key: dict[str, Any]
                            ) -> dict[str, Any] | None:
        """The current document of ``ns`` matching ``document_key``, looked up where this
        shard's routing table puts it (``owner``, a hint: re-targeted on each attempt), or None
        when it is not there. Like ``ShardServerProcessInterface::lookupSingleDocument`` (a
        routed ``$match`` by documentKey, retried after StaleConfig: ``shardVersionRetry``,
        ``kMaxNumStaleVersionRetries``): while this shard's critical section of ``ns`` blocks
        reads (a resharding's commit, whose renames and drops make the old routing table
        wrong) the look-up waits for its release and then targets by the new routing table; a
        miss while the routing information changed or the critical section began meanwhile is
        retried the same way. The look-up on another shard is an unversioned ``find`` with
        ``limit: 1``. Raises MongoError (6/9001) when the owner cannot be reached."""
        db, _, coll = ns.partition(".")
        if ns not in self.metadata and self.config_connection_string() is not None:
            await self.refresh(ns)  # e.g. a new primary: its metadata was cleared
        for _ in range(MAX_LOOKUP_ATTEMPTS):
            await self.wait_for_reads(ns)
            meta = self.metadata.get(ns)
            owner = self.owner_of(ns, document_key)
            if owner is None or owner == self.node.shard_name:
                doc = self.node.find_document(ns, document_key)
            else:
                doc = await self._find_on(owner, db, coll, document_key)
            if doc is not None:
                return doc
            if not self.reads_blocked(ns) and self.metadata.get(ns) is meta:
                return None  # nothing moved meanwhile: the document is gone
        return None

    async def _find_on(self, shard: str, db: str, coll: str, document_key: dict[str, Any]
                       ) -> dict[str, Any] | None:
        """``find`` of ``document_key`` on ``shard`` (None when its address is unknown)."""
        conn = self.hosts.get(shard)
        if conn is None:
            return None
        reply = await self.targets.command(self.node.clock, conn, db, {
            "find": coll, "filter": document_key, "limit": 1, "singleBatch": True})
        batch = reply["cursor"]["firstBatch"]
        return dict(batch[0]) if batch else None

    def close(self) -> None:
        """Close the pools to the other shards."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self.targets.close()

    # -- transfer mods ------------------------------------------------------------------------
    def on_write(self, ns: str, op: str, o: dict[str, Any], o2: dict[str, Any] | None) -> None:
        """Called for every logged CRUD operation not marked fromMigrate (``ShardNode.log_op``)."""
        trackers = self.trackers.get(ns)
        if not trackers:
            return
        src = o2 if op == "u" and o2 is not None else o
        if "_id" in src:
            for t in trackers:
                t.note(src["_id"])
