"""A shard member's side of replication: applying the oplog entries fetched from its sync source
(:mod:`shard.replication.applier`; document effects in :mod:`shard.replication.documents`,
command entries in :mod:`shard.replication.apply_commands`, transactions and session records in
:mod:`shard.replication.apply_txn`), and undoing local entries on rollback by refetch
(:mod:`shard.replication.rollback`, :mod:`shard.replication.rollback_fixup`). The replica-set
state machine that decides when to do either is ``shardsim/core/repl`` (docs/replication.md)."""
