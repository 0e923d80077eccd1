"""Replica-set members of a shard (docs/replication.md): the replication coordinator that drives
the core (``shardsim/core/repl``) in the process (:mod:`shard.replication.coordinator`), the
committed-oplog view change streams read (:mod:`shard.replication.committed_oplog`), what a
member runs in its state (:mod:`shard.replication.hook`) and its commands
(:mod:`shard.replication.commands`); applying the oplog entries fetched from the sync source
(:mod:`shard.replication.applier`; document effects in :mod:`shard.replication.documents`,
command entries in :mod:`shard.replication.apply_commands`, transactions and session records in
:mod:`shard.replication.apply_txn`); and rollback: finding the common point and rejoining
(:mod:`shard.replication.rollback_run`), undoing local entries by refetch
(:mod:`shard.replication.rollback`, :mod:`shard.replication.rollback_fixup`)."""
