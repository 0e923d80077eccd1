"""The config server's catalog commands, one family per module (``CommandFamily``, installed by
``ConfigServerNode.__init__``); the router forwards the sharding commands here under the
server's internal names (``src/mongo/db/s/config/configsvr_*_command.cpp``):

* :mod:`.shards` -- ``_configsvrAddShard``, ``_configsvrRemoveShard``
* :mod:`.databases` -- ``_configsvrCreateDatabase``, ``_configsvrMovePrimary``,
  ``_configsvrDropDatabase``
* :mod:`.collections` -- ``_configsvrShardCollection``, ``_configsvrDropCollection``,
  ``_configsvrRenameCollection``
* :mod:`.chunks` -- ``_configsvrSplitChunk``, ``_configsvrMoveChunk``
* :mod:`.balancer` -- ``_configsvrBalancerStart``/``Stop``/``Status``,
  ``_configsvrBalancerCollectionStatus``
* :mod:`.resharding` -- ``_configsvrReshardCollection`` (reshardCollection, moveCollection,
  unshardCollection)
* :mod:`configsvr.placement_history` -- ``_configsvrGetHistoricalPlacement``
* :mod:`.metadata` -- ``_configsvrRefineCollectionShardKey``, ``_configsvrCommitChunksMerge``,
  ``_configsvrSetAllowMigrations``, ``_configsvrCheckMetadataConsistency``

Each handler is ``async def name(node: ConfigServerNode, req: Request) -> dict``; they share
the node's catalog access (``find_all``, ``insert``, ``on_shard``, ``ensure_database``,
``load_collection``, ...) and its ``ddl_lock``.
"""

from __future__ import annotations

from shardsim.configsvr import placement_history
from shardsim.configsvr.commands import (balancer, chunks, collections, databases, metadata, resharding,
                                shards)

# Installed in this order by ConfigServerNode.__init__ (no two define the same command).
FAMILIES = (shards.commands, databases.commands, collections.commands, chunks.commands,
            balancer.commands, resharding.commands, metadata.commands, placement_history.commands)
