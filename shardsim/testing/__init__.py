"""The test kit: a sharded cluster inside the test process, with faults on demand.

* :class:`ShardedCluster` (blocking API, its event loop on a background thread) and
  :class:`AsyncShardedCluster` (``async with``, on the caller's loop): the config server, the
  shards and the router of the role processes, on real loopback sockets, so pymongo or any
  driver connects to ``cluster.uri``.
* Faults: ``pause_shard`` / ``resume_shard``, ``kill_shard`` / ``restart_shard``,
  ``add_shard`` / ``remove_shard``, ``set_noop_interval``, ``truncate_oplog``, the promise
  faults, ``configure_fail_point``: one record each in :mod:`shardsim.testing.faults` (the same
  records ``shardsim fault`` offers).
* :mod:`shardsim.testing.invariants`: no lost or doubled write, no lost, duplicate or
  reordered event, no event of a rolled-back write. :mod:`shardsim.testing.helpers`:
  ``split_over_two_shards``, ``read_events``, ``change_stream_ops``, ``waiting_for``.
* The pytest plugin (:mod:`shardsim.testing.pytest_plugin`, a ``pytest11`` entry point):
  fixtures ``sharded_cluster`` and ``clean_sharded_cluster``.

See docs/testing.md.
"""

from shardsim.testing.cluster import AsyncShardedCluster, ClusterNotRunning
from shardsim.testing.replica_sets import AsyncReplicaSet
from shardsim.testing.sync import ReplicaSet, ShardedCluster

__all__ = ["AsyncReplicaSet", "AsyncShardedCluster", "ClusterNotRunning", "ReplicaSet", "ShardedCluster"]
