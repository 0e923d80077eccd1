"""shardsim: a small, faithful, fast MongoDB-compatible sharded cluster that serves change streams.

Roles live in the top-level packages ``shard``, ``configsvr`` and ``router``; this package holds
what they share (wire codec, server loop, cursors, cluster time, resume tokens, errors) and the
tools around them (CLI, launcher, spec-test runner, load generator).
"""

__version__ = "0.1.0"
