"""PySpark load generation and end-to-end change-stream verification (``shardsim load``).

Modules: :mod:`~shardsim.tools.load.plan` (deterministic plan), :mod:`~shardsim.tools.load.verify`
(verifier + fault injection), :mod:`~shardsim.tools.load.cluster` (sharding set-up, chunk map),
:mod:`~shardsim.tools.load.spark_job` (the Spark writers), :mod:`~shardsim.tools.load.watch` (watchers and
per-shard samplers), :mod:`~shardsim.tools.load.report` (table, JSON, plot), :mod:`~shardsim.tools.load.cli`.
"""
