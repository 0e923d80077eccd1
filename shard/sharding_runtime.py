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

Not faithful: the config server pushes the metadata to the shards (``_shardsimSetFilteringMetadata``)
where mongod pulls it from the config server on a refresh. A shard that has no metadata for a
namespace (after a restart) refreshes it from the config server when a routed request names a
sharded version (``onShardVersionMismatch`` -> ``forceShardFilteringMetadataRefresh``,
``shard_filtering_metadata_refresh.cpp``), so orphans stay filtered after a restart; it knows
the config server from the ``shardIdentity`` document (``admin.system.version``, persisted
from the first metadata the config server pushed, as mongod persists it on ``addShard``).
When the config server cannot be reached it accepts any version, as before.
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
    ``version`` (Timestamp(major, minor): this shard's placement version), ``pattern`` and the
    ``chunks`` it owns as ``(min, max)`` key tuples."""

    epoch: ObjectId
    timestamp: Timestamp
    version: Timestamp
    pattern: KeyPattern
    chunks: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = field(default_factory=list)
    uuid: Any = None
    routing: ChunkMap | None = None  # every chunk with its owner (routed look-ups)

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
        self._refreshing: dict[str, asyncio.Future] = {}

    # -- metadata -----------------------------------------------------------------------------
    def set_metadata(self, ns: str, doc: dict[str, Any] | None) -> None:
        """Install the metadata pushed by the config server: None (unsharded) or ``{epoch,
        timestamp, uuid, key, chunks: [{min, max, lastmod, shard}], shards: {name: host}}``
        (every chunk of the collection; this shard's version is the highest ``lastmod`` of its
        own)."""
        if doc is None:
            self.metadata[ns] = None
            return
        if isinstance(doc.get("configsvr"), str):
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
                                               chunks, doc.get("uuid"), routing)

    # -- the shard identity and the refresh after a restart --------------------------------------
    def _note_identity(self, configsvr: str) -> None:
        """Persist ``{_id: "shardIdentity", shardName, configsvrConnectionString}`` in
        ``admin.system.version`` when it changed (``configsvr``: ``host:port`` of a one-node
        config server, ``setName/h1,h2,h3`` of a config server replica set)."""
        if self.config_connection_string() == configsvr:
            return
        if self.node.storage.get(*IDENTITY_NS) is None:  # a system collection: made here
            self.node.create_collection(*IDENTITY_NS)
        self.node.range_deleter.save(IDENTITY_NS, {
            "_id": "shardIdentity", "shardName": self.node.shard_name,
            "configsvrConnectionString": configsvr})

    def config_connection_string(self) -> str | None:
        """The shard identity's ``configsvrConnectionString``, or None."""
        doc = self.node.range_deleter.find(IDENTITY_NS, "shardIdentity")
        if doc is None:
            return None
        return str(doc["configsvrConnectionString"])

    def config_address(self) -> tuple[str, int] | None:
        """The ``(host, port)`` of the config server's first host in the shard identity, or
        None."""
        conn = self.config_connection_string()
        if conn is None:
            return None
        return parse_address(conn.split("/", 1)[-1].split(",")[0])

    async def refresh_if_unknown(self, ns: str, received: dict[str, Any]) -> None:
        """Load ``ns``'s metadata from the config server when this shard has none (a
        restart) and ``received`` is a sharded version; concurrent requests share one
        refresh. A config server replica set is read on its primary, found through a
        replica-set monitor (as mongod's ``ShardRegistry`` reaches the config shard), so a
        refresh after a config failover reads the new primary. A config server that cannot
        be reached (or does not answer within :data:`REFRESH_TIMEOUT_S`) leaves it unknown."""
        if ns in self.metadata or received.get("e") in (None, UNSHARDED_EPOCH):
            return
        conn = self.config_connection_string()
        if conn is None:
            return
        fut = self._refreshing.get(ns)
        if fut is not None:
            await asyncio.shield(fut)
            return
        fut = self._refreshing[ns] = asyncio.get_running_loop().create_future()
        try:
            meta = await asyncio.wait_for(self._fetch(conn, ns), REFRESH_TIMEOUT_S)
            if ns not in self.metadata:  # no push meanwhile (it is newer)
                self.set_metadata(ns, meta)
        except (MongoError, asyncio.TimeoutError) as exc:
            log.warning("filtering metadata of %s not refreshed: %s", ns, exc)
        finally:
            self._refreshing.pop(ns, None)
            fut.set_result(None)

    async def _fetch(self, conn: str, ns: str) -> dict[str, Any] | None:
        """The metadata of ``ns`` as the config server pushes it, read from its catalog
        (``conn``: the shard identity's connection string)."""
        if "/" in conn:
            async def run(cmd: dict[str, Any]) -> dict[str, Any]:
                return await self.targets.command(self.node.clock, conn, "config", cmd)
        else:
            addr = parse_address(conn)
            pool = self._pools.get("$config")
            if pool is None or (pool.host, pool.port) != addr:
                pool = self._pools["$config"] = Pool(*addr)

            async def run(cmd: dict[str, Any]) -> dict[str, Any]:
                return await gossip_command(self.node.clock, pool, "config", cmd)

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
        """Check a routed request's ``shardVersion``; waits out a critical section for a
        write. Returns True when the request is a write now counted in flight (the caller
        must call :meth:`done`). Raises StaleConfig (13388), or 14 for a malformed version."""
        if not isinstance(received, dict):
            raise MongoError(14, "BSON field 'shardVersion' is the wrong type, expected type "
                                 "'object'")
        await self.refresh_if_unknown(ns, received)
        is_write = command in WRITES
        cs = self.critical.get(ns)
        if cs is not None and (is_write or cs.blocks_reads):
            try:
                await asyncio.wait_for(cs.released.wait(), CRITICAL_SECTION_WAIT_S)
            except asyncio.TimeoutError:
                pass
            raise self.stale(ns, received, f"migration commit in progress for {ns}")
        if not self.compatible(ns, received):
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
