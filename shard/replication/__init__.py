"""A shard member's side of replication: applying the oplog entries fetched from its sync source
(:mod:`shard.replication.applier`, with the command entries in
:mod:`shard.replication.apply_commands` and transactions and session records in
:mod:`shard.replication.apply_txn`), and undoing local entries on rollback
(:mod:`shard.replication.rollback`). The replica-set state machine that decides when to do
either is ``shardsim/core/repl`` (docs/replication.md)."""
