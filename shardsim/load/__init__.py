"""PySpark load generation and end-to-end change-stream verification (``shardsim load``).

Modules: :mod:`~shardsim.load.plan` (deterministic plan), :mod:`~shardsim.load.verify`
(verifier + fault injection), :mod:`~shardsim.load.cluster` (sharding set-up, chunk map),
:mod:`~shardsim.load.spark_job` (the Spark writers), :mod:`~shardsim.load.watch` (watchers and
per-shard samplers), :mod:`~shardsim.load.report` (table, JSON, plot), :mod:`~shardsim.load.cli`.
"""
