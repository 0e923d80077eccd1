"""The router's commands (what a mongos answers; see
``shared/reference/router-command-surface.md``), one module per command family, like the
server's ``src/mongo/s/commands/cluster_*_cmd.cpp``:

================  ===========================================================================
module            commands
================  ===========================================================================
``crud``          insert, update, delete, findAndModify (targeting in :mod:`router.writes`)
``bulk_write``    bulkWrite (8.0's client bulk write across namespaces, on that targeting)
``reads``         find, count, distinct, aggregate (``$changeStream``:
                  :mod:`router.change_stream`), and the re-run of reads of views over sharded
                  collections
``ddl``           create, drop, renameCollection, dropDatabase, createIndexes, dropIndexes,
                  collMod, listDatabases, listCollections, listIndexes
``sharding``      addShard, listShards, removeShard, enableSharding, shardCollection, split,
                  moveChunk, movePrimary, flushRouterConfig, balancerStatus/Start/Stop,
                  balancerCollectionStatus
``sharding_ddl``  reshardCollection, moveCollection, unshardCollection,
                  refineCollectionShardKey, mergeChunks, setAllowMigrations,
                  checkMetadataConsistency
``transactions``  commitTransaction, abortTransaction (state: :mod:`router.transactions`)
``users``         createUser, usersInfo, ... forwarded to the config server (user cache)
``consistency``   checkMetadataConsistency (always an empty cursor)
``explain``       explain in mongos' shape (SINGLE_SHARD / SHARD_MERGE / SHARD_WRITE, per-shard
                  plans; aggregate: splitPipeline and shards)
``stats``         collStats, dbStats, dataSize aggregated across the shards
``admin``         isdbgrid, validate; the passthrough of the
                  ``config``/``admin`` databases to the config server
================  ===========================================================================

Each module declares ``commands = CommandFamily(...)`` and module-level handlers
``async def insert(node, req) -> dict``; :class:`router.node.RouterNode` installs
:data:`FAMILIES` after the commands every node answers (:mod:`shardsim.core.node`), so a test can
also call ``await crud.insert(node, request)`` directly.
"""

from __future__ import annotations

from shardsim.router.commands import (admin, bulk_write, crud, ddl, explain, reads, sharding,
                             sharding_ddl, stats, transactions, users)

FAMILIES = (transactions.commands, crud.commands, bulk_write.commands, reads.commands,
            ddl.commands, admin.commands, sharding.commands, sharding_ddl.commands,
            users.commands, explain.commands, stats.commands)

__all__ = ["FAMILIES", "admin", "bulk_write", "crud", "ddl", "explain", "reads", "sharding", "sharding_ddl",
           "stats", "transactions", "users"]
