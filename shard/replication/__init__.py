"""Replica-set members: the replication coordinator that drives the core
(:mod:`shardsim.core.repl`) in a shard process, the committed-oplog view change streams read,
the command hook and commands of a member, applying fetched entries and rollback."""
