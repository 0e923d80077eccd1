"""The Spark side of a load run: one partition per shard, each writing that shard's chunk
ranges' operations (see :mod:`shardsim.tools.load.writer`) in parallel.

``local[*]`` by default (executors are Python workers on this machine); a
``spark://HOST:7077`` master works too if its workers have pymongo and shardsim importable and
can reach the router (or the shards with ``--direct``). Spark is told to bind to loopback in
local mode. The JVM start costs ~5-10 s, which the result reports separately
(``spark_startup_s``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from array import array
from typing import Callable

from shardsim.tools.load.plan import ChunkMap, Plan, partition_by_shard
from shardsim.tools.load.writer import WriteResult, WriteTask, run_task


def build_tasks(plan: Plan, chunks: ChunkMap, router_uri: str, shard_hosts: dict[str, str],
                *, direct: bool, batch_size: int, progress_dir: str | None) -> list[WriteTask]:
    """One :class:`WriteTask` per shard owning chunks of the plan's collections.

    ``direct`` writes to ``mongodb://<shard host>/?directConnection=true`` instead of the
    router. Raises KeyError when a chunk names a shard missing from ``shard_hosts``.
    """
    tasks = []
    pad = plan.pad
    for shard, seqs in sorted(partition_by_shard(plan, chunks).items()):
        kinds, colls, ids = array("b"), array("h"), array("q")
        for s in seqs:
            kinds.append(plan.kinds[s])
            colls.append(plan.colls[s])
            ids.append(plan.ids[s])
        uri = f"mongodb://{shard_hosts[shard]}/?directConnection=true" if direct else router_uri
        tasks.append(WriteTask(
            shard, uri, plan.spec.db, plan.spec.collection_names, pad, seqs.tobytes(),
            kinds.tobytes(), colls.tobytes(), ids.tobytes(), batch_size,
            os.path.join(progress_dir, f"{shard}.progress") if progress_dir else None))
    return tasks


class SparkRunner:
    """Owns a SparkContext for one run: ``start()`` (JVM start-up), ``run(tasks)``, ``stop()``."""

    def __init__(self, master: str = "local[*]") -> None:
        self.master = master
        self.sc = None
        self.startup_s = 0.0

    def start(self) -> "SparkRunner":
        t0 = time.time()
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        local = self.master.startswith("local")
        if local:
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark import SparkConf, SparkContext

        conf = (SparkConf().setMaster(self.master).setAppName("shardsim-load")
                .set("spark.ui.enabled", "false")
                .set("spark.ui.showConsoleProgress", "false")
                .set("spark.python.worker.reuse", "true"))
        if local:
            conf = conf.set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
        self.sc = SparkContext(conf=conf)
        self.sc.setLogLevel("ERROR")
        self.startup_s = time.time() - t0
        return self

    def run(self, tasks: list[WriteTask]) -> list[WriteResult]:
        """Run every task as its own partition; returns results in task order."""
        assert self.sc is not None, "start() first"
        if not tasks:
            return []
        rdd = self.sc.parallelize(tasks, len(tasks))
        return rdd.map(run_task).collect()

    def stop(self) -> None:
        if self.sc is not None:
            self.sc.stop()
            self.sc = None


def run_in_background(runner: SparkRunner, tasks: list[WriteTask],
                      on_done: Callable[[], None] | None = None) -> tuple[threading.Thread, dict]:
    """Run ``runner.run(tasks)`` in a thread; the returned dict gets ``results`` or ``error``."""
    box: dict = {}

    def body() -> None:
        try:
            box["results"] = runner.run(tasks)
        except BaseException as exc:  # noqa: BLE001 - shown to the user by the CLI
            box["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            if on_done:
                on_done()

    t = threading.Thread(target=body, name="spark-job", daemon=True)
    t.start()
    return t, box
