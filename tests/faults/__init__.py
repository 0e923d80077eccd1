"""Fault trials: seeded, bounded runs that ``kill -9`` a shard, the router or the config server
of a durable cluster during writes and a change stream, restart it, and check the invariants
(:mod:`tests.faults.checkers`). ``python -m tests.faults --help``."""
