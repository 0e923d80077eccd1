"""The shard's commands, one family per module, each a :class:`shardsim.core.commands.CommandFamily`
of module-level handlers ``async def insert(node, req) -> dict`` (``node``: the
:class:`shard.node.ShardNode`):

========================  ===================================================================
``crud``                  insert, update, delete, findAndModify
``reads``                 find, count, distinct, aggregate (``$changeStream`` is handed to
                          :mod:`shard.change_stream`); ``oplog_cursor``: reads of the oplog
``ddl``                   create, drop, dropDatabase, renameCollection, createIndexes,
                          dropIndexes, collMod; ``views``: view definitions in system.views
``catalog``               listDatabases, listCollections, listIndexes, collStats, dbStats
``transactions``          commitTransaction, abortTransaction, endSessions, killSessions,
                          killAllSessions
``internal``              _shardsimEnsureCollection, _shardsimNoop (shardsim's own)
``balancing``             _shardsvrGetStatsForBalancing, autoSplitVector (for the balancer)
``split_vector``          splitVector, dataSize (range statistics for snapshot splitters)
``explain``               explain (plans of :mod:`shard.explain`)
``validate``              validate (documents, index keys, unique-index maps)
``testing``               _shardsimTruncateOplog (shardsim's own; with test commands only,
                          installed by ``ShardNode.__init__``, not in :data:`FAMILIES`)
``migration``             the shard's half of chunk migrations and shard versioning
                          (_migrateClone, _transferMods, critical section, metadata)
========================  ===================================================================

``helpers`` holds what several families share (namespace checks, the write context of a batch,
reads through views and transactions). ``ShardNode.__init__`` installs :data:`FAMILIES` after
the common commands (:mod:`shardsim.core.node_commands`), so the shard's session commands override
the common no-ops.
"""

from __future__ import annotations

from shardsim.shard.commands import (balancing, catalog, crud, ddl, explain, internal, migration,
                                     oplog, reads, split_vector, testing,
                                     transactions, validate)

FAMILIES = (crud.commands, reads.commands, ddl.commands, catalog.commands, oplog.commands,
            transactions.commands, internal.commands, balancing.commands, explain.commands,
            migration.commands, split_vector.commands, validate.commands)

# ``testing`` is installed only with test commands on (ShardNode.__init__).
__all__ = ["FAMILIES", "testing"]
