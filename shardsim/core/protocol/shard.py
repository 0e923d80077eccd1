"""Requests a shard (or the config server, itself a mongod) answers for another role.

Each is sent by one role and parsed by the shard's handler named in its docstring; the wire
shape is ``{NAME: <first field>, <fields>...}`` (:mod:`shardsim.core.protocol.base`). Where the
server has the request (``_migrateClone``, ``_transferMods``, ``_shardsvrGetStatsForBalancing``)
the name is the server's; ``_shardsim*`` requests are shardsim's own.
"""

from __future__ import annotations

from typing import Any

from bson.binary import Binary
from bson.timestamp import Timestamp

from shardsim.core.protocol.base import InternalRequest, request


@request
class EnsureCollection(InternalRequest):
    """Create a collection with the catalog's UUID, or record its shard key (sent by the config
    server for shardCollection, migrations, movePrimary, resharding). Handler:
    ``shard/commands/internal.py`` ``ensure_collection``; reply ``{uuid, created}``."""
    NAME = "_shardsimEnsureCollection"
    coll: str
    uuid: Binary | None = None
    shardKey: dict | None = None
    options: dict | None = None
    primary: bool | None = None


@request
class Noop(InternalRequest):
    """Write an ``op: "n"`` oplog entry (DDL notes that change streams read, such as
    ``shardCollection`` or ``migrateChunkToNewShard``). Handler: ``shard/commands/internal.py``
    ``noop``; reply ``{ts}``."""
    NAME = "_shardsimNoop"
    o: dict
    o2: dict | None = None
    ns: str | None = None
    ui: Any = None


@request
class SetClusterKeys(InternalRequest):
    """The config server's HMAC keys (``admin.system.keys`` documents) for signing cluster
    time. Handler: ``shardsim/core/auth/commands.py`` ``set_cluster_keys`` (``__system`` only)."""
    NAME = "_shardsimSetClusterKeys"
    keys: list


@request
class AdvanceClusterTime(InternalRequest):
    """A promise request: the router holds an event at cluster time T and asks an idle shard
    for a high-water mark past it. Handler: ``shard/change_stream/cursor.py``."""
    NAME = "_shardsimAdvanceClusterTime"
    ts: Timestamp
    promises: bool | None = None


@request
class SetFilteringMetadata(InternalRequest):
    """Install a namespace's filtering metadata: ``metadata`` is ``None`` (unsharded here) or
    ``{epoch: ObjectId, timestamp: Timestamp, key: {..}, uuid?: UUID, chunks: [{min, max,
    lastmod: Timestamp, shard}]}`` -- the chunks of the whole collection; the shard keeps the
    ones naming it. Sent by the config server after a migration, a resharding commit or a
    catalog change (``configsvr/migration.py`` ``push_metadata``). Handler:
    ``shard/commands/migration.py``; reply ``{version: {e, t, v}}`` (this shard's new
    placement version)."""
    NAME = "_shardsimSetFilteringMetadata"
    ns: str
    metadata: dict | None = None


@request
class MigrationStart(InternalRequest):
    """The donor starts recording the writes of the range ``[min, max)`` of ``ns`` under the
    shard key pattern ``key`` (``MigrationChunkClonerSource::startClone``)."""
    NAME = "_shardsimMigrationStart"
    ns: str
    sessionId: str
    key: dict
    min: dict
    max: dict
    # with migrationId the donor persists its coordinator document and pending range-deletion
    # task first (``MigrationCoordinator::startMigration``)
    migrationId: Any = None
    uuid: Any = None  # the collection's UUID
    to: str | None = None  # the recipient shard
    # the chunk's version {e, t, v} when the migration began (the coordinator document's
    # ``preMigrationChunkVersion``: a new primary fences the commit off with it)
    preMigrationChunkVersion: dict | None = None


@request
class RecvChunkStart(InternalRequest):
    """On the recipient before the clone: run the range deletions overlapping ``[min, max)``,
    delete what is left there, persist the recipient's pending range-deletion task
    (``MigrationDestinationManager::_migrateDriver``). Reply ``{deleted: n}``."""
    NAME = "_shardsimRecvChunkStart"
    WIRE_NAMES = {"from_": "from"}
    ns: str
    migrationId: Any
    key: dict
    min: dict
    max: dict
    uuid: Any = None
    from_: str | None = None  # the donor shard


@request
class MigrationDecision(InternalRequest):
    """Persist a migration's decision (``committed`` / ``aborted``) in the donor's coordinator
    document (``MigrationCoordinator::setMigrationDecision``). Reply ``{found}``."""
    NAME = "_shardsimMigrationDecision"
    migrationId: Any
    decision: str


@request
class RangeDeletionTask(InternalRequest):
    """``action: "run"``: make the migration's range-deletion task ready and delete its range;
    ``"forget"``: delete the task (``markAsReadyRangeDeletionTaskLocally``,
    ``deleteRangeDeletionTaskLocally``). Reply ``{deleted: n}``."""
    NAME = "_shardsimRangeDeletionTask"
    migrationId: Any
    action: str


@request
class ForgetMigration(InternalRequest):
    """Delete the donor's coordinator document (``MigrationCoordinator::forgetMigration``)."""
    NAME = "_shardsimForgetMigration"
    migrationId: Any


@request
class MigrateClone(InternalRequest):
    """Every document of the migrating range. Reply ``{objects: [...]}``."""
    NAME = "_migrateClone"
    one: int
    sessionId: str


@request
class TransferMods(InternalRequest):
    """The documents of the range written since the last call
    (``MigrationChunkClonerSource::nextModsBatch``). Reply ``{reload, deleted, size}``."""
    NAME = "_transferMods"
    one: int
    sessionId: str


@request
class MigrationCriticalSection(InternalRequest):
    """Enter (``enter: true``; ``blockReads: true`` also blocks routed reads) or leave a
    namespace's critical section (``ShardingRecoveryService``)."""
    NAME = "_shardsimMigrationCriticalSection"
    ns: str
    enter: bool
    blockReads: bool | None = None
    reason: str | None = None  # what holds it (``reshardCollection``); for logs


@request
class MigrationEnd(InternalRequest):
    """The donor stops recording the migration's writes."""
    NAME = "_shardsimMigrationEnd"
    one: int
    sessionId: str | None = None  # none known: nothing to stop (a recovered migration)


@request
class SessionRecords(InternalRequest):
    """The retryable-write history of a shard (``SessionCatalogMigrationSource``). Reply
    ``{records: [{lsid, txnNumber, stmts: [{i, r}]}]}``."""
    NAME = "_shardsimSessionRecords"
    one: int


@request
class MergeSessionRecords(InternalRequest):
    """Merge session records into the recipient's (``SessionCatalogMigrationDestination``).
    Reply ``{n}``."""
    NAME = "_shardsimMergeSessionRecords"
    one: int
    records: list


@request
class ShardsvrMoveRange(InternalRequest):
    """``_shardsvrMoveRange`` (``src/mongo/s/request_types/move_range_request.idl``): the config
    server (``_configsvrMoveRange`` / moveChunk / the balancer,
    ``configsvr_move_range_command.cpp``, ``balancer_commands_scheduler_impl.cpp``) asks the
    donor's primary to migrate its chunk ``[min, max)`` of ``ns`` to ``toShard`` and waits for
    the reply; the donor runs the whole migration (``MigrationSourceManager``). ``epoch`` /
    ``collectionTimestamp`` are the collection's as the config server saw them (StaleEpoch,
    150, when the donor's refreshed metadata differs). Handler: ``shard/commands/migration.py``
    (:mod:`shard.migration_source`); reply ``{}`` (``ok: 1``), or the migration's error with
    its code."""
    NAME = "_shardsvrMoveRange"
    ns: str
    toShard: str
    min: dict
    max: dict
    fromShard: str | None = None
    epoch: Any = None
    collectionTimestamp: Timestamp | None = None
    waitForDelete: bool | None = None


@request
class GetStatsForBalancing(InternalRequest):
    """Data sizes for the balancer: ``collections: [{ns, UUID}]`` -> ``{stats: [{namespace,
    UUID, collSize}]}`` (the server's ``_shardsvrGetStatsForBalancing``)."""
    NAME = "_shardsvrGetStatsForBalancing"
    one: int
    collections: list
    scaleFactor: int | None = None


# Test commands (installed only with test commands on).

@request
class TruncateOplog(InternalRequest):
    """Drop the oplog entries before ``before`` (history loss, for resume tests). Reply
    ``{removed, earliestOptime}``."""
    NAME = "_shardsimTruncateOplog"
    one: int
    before: Timestamp


@request
class CutLinks(InternalRequest):
    """Cut (``"cut"``) or restore (``"heal"``) this process's links to ``hosts`` (``host:port``
    strings; heal without hosts: every link). Answered by every role with test commands on
    (shard, config server, router). Handler: ``shardsim/core/links.py`` ``cut_links``; reply
    ``{cut: [hosts]}``."""
    NAME = "_shardsimCutLinks"
    verb: str
    hosts: list | None = None


@request
class SetClusterTime(InternalRequest):
    """Pin the cluster time of this shard's next oplog entry (``Timestamp(0, 0)`` unpins).
    Reply ``{pinned}``."""
    NAME = "_shardsimSetClusterTime"
    ts: Timestamp


@request
class StorageFull(InternalRequest):
    """Simulate a full disk on a durable shard: with ``true`` SQLite may not grow its file
    (``max_page_count`` = the current size), so the next commit fails with SQLITE_FULL as on a
    real full disk; ``false`` lifts it. Reply ``{pageCount, maxPageCount}``."""
    NAME = "_shardsimStorageFull"
    full: bool
