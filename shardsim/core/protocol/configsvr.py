"""Requests the config server answers for a router (the server's ``_configsvr*`` commands,
``src/mongo/s/request_types/*.idl``): the router validates the user's command, then forwards it
as one of these. Handlers: ``configsvr/commands/``. Fields the handler validates itself (with the
user-facing errors of the public command) are typed ``Any`` here; the comment names the type the
handler expects.
"""

from __future__ import annotations

from typing import Any

from shardsim.core.protocol.base import InternalRequest, request

# shardsim's own fields of the ``config.settings`` balancer document: the pause between balancer
# rounds and between auto-merger passes (ms), for tests that cannot wait the server's 10 s / 1 h.
BALANCER_ROUND_INTERVAL_FIELD = "_shardsimRoundIntervalMs"
AUTO_MERGER_INTERVAL_FIELD = "_shardsimAutoMergerIntervalMs"


@request
class AddShard(InternalRequest):
    """``addShard``: ``host`` is ``host:port`` or ``setName/host:port,...``. Reply
    ``{shardAdded}``."""
    NAME = "_configsvrAddShard"
    host: str
    name: str | None = None


@request
class RemoveShard(InternalRequest):
    """``removeShard``: reply ``{state: "started" | "ongoing" | "completed", ...}``."""
    NAME = "_configsvrRemoveShard"
    shard: str


@request
class CreateDatabase(InternalRequest):
    """``enableSharding`` / a router's first write to a database: reply
    ``{databaseVersion, primary}``."""
    NAME = "_configsvrCreateDatabase"
    db: str
    primaryShard: str | None = None


@request
class MovePrimary(InternalRequest):
    """``movePrimary``: clone every unsharded collection of ``db`` to shard ``to``."""
    NAME = "_configsvrMovePrimary"
    db: str
    to: Any = None  # str (the handler answers the public command's errors)


@request
class DropDatabase(InternalRequest):
    """Remove a database's catalog entries (the router drops the data on the shards)."""
    NAME = "_configsvrDropDatabase"
    db: str


@request
class ShardCollection(InternalRequest):
    """``shardCollection`` (``create_collection_coordinator.cpp``)."""
    NAME = "_configsvrShardCollection"
    ns: str
    key: dict
    unique: Any = None  # bool
    numInitialChunks: Any = None  # int
    presplitHashedZones: Any = None  # bool
    collation: Any = None  # object


@request
class DropCollection(InternalRequest):
    """Remove a collection and its chunks from the catalog."""
    NAME = "_configsvrDropCollection"
    ns: str


@request
class RenameCollection(InternalRequest):
    """The catalog entry of ``ns`` under ``to``."""
    NAME = "_configsvrRenameCollection"
    ns: str
    to: str


@request
class GetHistoricalPlacement(InternalRequest):
    """The shards that owned data of ``nss`` (``"db.coll"``, ``"db"``, or ``""`` with
    ``targetWholeCluster``) at cluster time ``at``, from ``config.placementHistory``
    (``configsvr_get_historical_placement_command.cpp``; the v2 change-stream reader's
    ``HistoricalPlacementFetcherImpl::fetch``). Reply ``{historicalPlacement: {shards: [...],
    status: "OK" | "NotAvailable" | "FutureClusterTime"[, anyRemovedShardDetected]}}``. Handler:
    ``configsvr/placement_history.py``."""
    NAME = "_configsvrGetHistoricalPlacement"
    nss: str
    at: Any = None  # Timestamp
    targetWholeCluster: bool = False
    checkIfPointInTimeIsInFuture: bool = False
    ignoreRemovedShards: bool = False


@request
class SplitChunk(InternalRequest):
    """``split``: at ``middle``, or the median of the chunk named by ``find`` / ``bounds``."""
    NAME = "_configsvrSplitChunk"
    ns: str
    middle: Any = None  # object
    find: Any = None  # object
    bounds: Any = None  # array of two objects


@request
class MoveChunk(InternalRequest):
    """``moveChunk``: the chunk named by ``find`` / ``bounds`` to shard ``to``, as a migration
    (``configsvr/migration.py``)."""
    NAME = "_configsvrMoveChunk"
    ns: str
    find: Any = None  # object
    bounds: Any = None  # array of two objects
    to: Any = None  # str


@request
class CommitChunkMigration(InternalRequest):
    """``_configsvrCommitChunkMigration`` (``src/mongo/db/s/commit_chunk_migration.idl``): the
    donor of a migration commits it on the config server from inside its critical section.
    ``migratedChunk`` is ``{min, max[, lastmod]}`` (``lastmod``: the chunk's version when the
    migration began; a commit whose chunk has a newer one is refused);
    ``fromShardCollectionVersion`` the donor's collection version ``{e, t, v}`` (only its epoch
    ``e`` is checked). Reply
    ``{shardVersion: {e, t, v}}``, the donor's new placement version. Handler:
    ``configsvr/commands/chunks.py`` (:func:`configsvr.migration.commit_chunk_migration`)."""
    NAME = "_configsvrCommitChunkMigration"
    ns: str
    fromShard: str
    toShard: str
    migratedChunk: dict
    fromShardCollectionVersion: dict


@request
class EnsureChunkVersionIsGreaterThan(InternalRequest):
    """``_configsvrEnsureChunkVersionIsGreaterThan``
    (``src/mongo/db/s/config/configsvr_ensure_chunk_version_is_greater_than_command.cpp``): when
    the chunk ``[minKey, maxKey)`` of the collection ``collectionUUID`` still exists with
    ``version`` (``{e, t, v}``) or an older one, its version becomes the collection's major + 1,
    so a migration commit still in flight with the older version is refused. Sent by a new donor
    primary before it reads the outcome of a migration left without a decision
    (``migration_util::recoverMigrationCoordinations``). Reply ``{}``. Handler:
    ``configsvr/commands/chunks.py``."""
    NAME = "_configsvrEnsureChunkVersionIsGreaterThan"
    one: int
    minKey: dict
    maxKey: dict
    version: dict
    collectionUUID: Any = None
    nss: Any = None  # str


@request
class CommitChunksMerge(InternalRequest):
    """``mergeChunks``: the chunks of one shard between ``bounds`` become one."""
    NAME = "_configsvrCommitChunksMerge"
    ns: str
    bounds: Any = None  # array of two objects (required: the handler says so)


@request
class RefineCollectionShardKey(InternalRequest):
    """``refineCollectionShardKey``: the key gets suffix fields."""
    NAME = "_configsvrRefineCollectionShardKey"
    ns: str
    key: Any = None  # object (required: the handler says so)


@request
class SetAllowMigrations(InternalRequest):
    """``setAllowMigrations``."""
    NAME = "_configsvrSetAllowMigrations"
    ns: str
    allowMigrations: Any = None  # bool (required: the handler says so)


@request
class ReshardCollection(InternalRequest):
    """One phase (``clone`` / ``commit`` / ``abort``) of ``reshardCollection``,
    ``moveCollection`` or ``unshardCollection`` (``provenance``)."""
    NAME = "_configsvrReshardCollection"
    ns: str
    provenance: str | None = None
    phase: str | None = None
    key: Any = None  # object
    unique: Any = None  # bool
    numInitialChunks: Any = None  # int
    forceRedistribution: Any = None  # bool
    collation: Any = None  # object
    toShard: Any = None  # str


@request
class CheckMetadataConsistency(InternalRequest):
    """``checkMetadataConsistency`` on database ``db`` (``target``: 1 or a collection name).
    Reply ``{inconsistencies: [{type, description, details}]}``."""
    NAME = "_configsvrCheckMetadataConsistency"
    target: Any
    db: str | None = None


@request
class BalancerStart(InternalRequest):
    """Balancer mode ``full``; a round starts now."""
    NAME = "_configsvrBalancerStart"
    one: int


@request
class BalancerStop(InternalRequest):
    """Balancer mode ``off``; waits for a round in progress."""
    NAME = "_configsvrBalancerStop"
    one: int


@request
class BalancerStatus(InternalRequest):
    """Reply ``{mode, inBalancerRound, numBalancerRounds, term}``."""
    NAME = "_configsvrBalancerStatus"
    one: int


@request
class BalancerCollectionStatus(InternalRequest):
    """Reply ``{balancerCompliant, firstComplianceViolation?}``."""
    NAME = "_configsvrBalancerCollectionStatus"
    ns: str
