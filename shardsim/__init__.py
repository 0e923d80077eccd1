"""shardsim: a small, faithful, fast MongoDB-compatible sharded cluster that serves change streams.

The floors, bottom up (``docs/architecture.md``):

* ``shardsim.core``: the ground floor every role imports (wire codec, server loop, node and
  dispatch, cursors, cluster time, KeyString and resume tokens, errors, the query and update
  language, auth, the internal protocol between roles);
* ``shardsim.shard``, ``shardsim.configsvr``, ``shardsim.router``: the three roles, kept in the
  repository's top-level ``shard/``, ``configsvr/`` and ``router/`` folders and installed under
  this package so that they never collide with a user's own modules;
* ``shardsim.testing``: the in-process test kit (the one place that runs roles in-process);
* ``shardsim.tools``: the ``shardsim`` CLI, launcher, fault CLI, ``top``, spec runner, load
  generator.
"""

__version__ = "0.1.0"
