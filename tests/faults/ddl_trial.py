"""DDL interrupted by a shard kill (issue 28, item 4): ``shard-createindexes`` and
``shard-dropdatabase``, run inside a kill trial of :mod:`.harness` (the mixed workload and the
change stream on ``faults.t<seed>`` go on meanwhile, and all their checkers run too).

One trial, its schedule drawn from its seed:

* the victim, one of the shards; the mode: ``blocked`` (a ``failCommand`` fail point on the
  victim holds the router's command there for 3 s, the victim dies 0.1 to 0.4 s after the
  command was sent, before it ran it) or ``timed`` (no fail point: the victim dies 0 to 50 ms
  after the command was sent, before, during or after its own part);
* ``createIndexes`` of two indexes on the trial collection, or ``dropDatabase`` of a database
  ``fdrop<seed>`` (prepared before the writers start: a sharded collection on hashed ``_id``
  with chunks on the shards, an unsharded one on its primary shard, documents in both), sent
  through the router by the client, which retries it after an error until it succeeds (60 s
  deadline), as an application would;
* ``kill -9`` of the victim, ``down_for`` seconds down, restart;
* then the :data:`.checkers.DDL_CHECKERS`: the retry succeeded, ``checkMetadataConsistency``
  through the router is clean, every shard owning chunks of the collection has both indexes
  (``listIndexes`` on each shard directly); the dropped database is gone from the config
  server's catalog (``config.databases``, ``config.collections``, ``config.chunks``), from
  every shard (``listDatabases`` directly) and from the router's ``listDatabases``.

Real mongos/mongod run these as DDL coordinators on the primary shard
(``src/mongo/db/s/drop_database_coordinator.cpp``, ``sharding_ddl_coordinator.cpp``): a
coordinator survives its shard's restart; what the client sees is that its retry succeeds and
the cluster ends consistent, which is what these checkers ask.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

import pymongo
from pymongo.errors import PyMongoError

from shardsim.tools.launcher import Cluster

from .checkers import DdlObserved, check_ddl
from .harness import DB, _retrying

INDEXES = [{"key": {"seq": 1}, "name": "seq_1"}, {"key": {"n": 1, "seq": -1}, "name": "n_seq"}]
WANTED = [tuple(ix["key"].items()) for ix in INDEXES]


def _direct(proc: Any) -> pymongo.MongoClient:
    return pymongo.MongoClient(proc.host, proc.port, directConnection=True,
                               serverSelectionTimeoutMS=30000, socketTimeoutMS=30000)


class _DdlScenario:
    """A DDL command through the router with a shard killed around it (module docstring).
    Subclasses name the ``command`` and add :meth:`prepare` and :meth:`observe`."""

    command = ""

    def __init__(self, cluster: Cluster, seed: int, name: str, victim: Any,
                 rng: random.Random, notes: list[str]) -> None:
        self.cluster, self.seed, self.name, self.victim = cluster, seed, name, victim
        self.notes = notes
        self.mode = rng.choice(("blocked", "timed"))
        self.kill_after = rng.uniform(0.1, 0.4) if self.mode == "blocked" else \
            rng.uniform(0.0, 0.05)
        self.error: str | None = None
        self.attempts = 0
        notes.append(f"{self.mode} {self.kill_after:.2f}s")

    def prepare(self) -> None:
        """Before the writers start (nothing by default)."""

    def send(self, client: pymongo.MongoClient) -> Any:
        raise NotImplementedError

    def _client(self) -> None:
        """The client: send the command, retry it after any error until it succeeds."""
        end = time.time() + 60
        with pymongo.MongoClient(self.cluster.router_uri, serverSelectionTimeoutMS=20000,
                                 socketTimeoutMS=30000) as c:
            while True:
                self.attempts += 1
                try:
                    self.send(c)
                    self.error = None
                    return
                except PyMongoError as exc:
                    self.error = f"{type(exc).__name__}: {exc}"
                    if time.time() > end:
                        return
                    time.sleep(0.2)

    def run_with_kill(self, down_for: float) -> None:
        """Send the command (the client thread) and kill -9 the victim during it, restart it;
        returns once the client's retries are over."""
        if self.mode == "blocked":
            with _direct(self.victim) as d:
                d.admin.command("configureFailPoint", "failCommand", mode={"times": 1}, data={
                    "failCommands": [self.command], "blockConnection": True,
                    "blockTimeMS": 3000, "failInternalCommands": True})
        t = threading.Thread(target=self._client, daemon=True)
        t.start()
        time.sleep(self.kill_after)  # the fault schedule, not a synchronisation
        self.victim.kill()
        time.sleep(down_for)
        self.cluster.restart(self.victim)
        t.join(90)
        self.notes.append(f"{self.command} attempts {self.attempts}")

    def observe(self) -> DdlObserved:
        raise NotImplementedError

    def check(self) -> dict[str, list[str]]:
        """The DDL checkers' violations (after the writers finished)."""
        return check_ddl(self.observe())

    def _inconsistencies(self, db: str, arg: Any = 1) -> list[dict[str, Any]]:
        with pymongo.MongoClient(self.cluster.router_uri, serverSelectionTimeoutMS=30000) as c:
            reply = _retrying(lambda: c[db].command("checkMetadataConsistency", arg))
        return list(reply["cursor"]["firstBatch"])


class CreateIndexes(_DdlScenario):
    """``shard-createindexes``: ``createIndexes`` of :data:`INDEXES` on the trial collection."""

    command = "createIndexes"

    def send(self, client: pymongo.MongoClient) -> Any:
        return client[DB].command("createIndexes", self.name, indexes=INDEXES)

    def observe(self) -> DdlObserved:
        o = DdlObserved(error=self.error, wanted=WANTED,
                        inconsistencies=self._inconsistencies(DB, self.name))
        with _direct(self.cluster.config) as c:
            uuid = c.config.collections.find_one({"_id": f"{DB}.{self.name}"})["uuid"]
            o.owners = {ch["shard"] for ch in c.config.chunks.find({"uuid": uuid})}
        for proc in self.cluster.shards:
            with _direct(proc) as d:
                o.indexes[proc.name] = [tuple(ix["key"].items())
                                        for ix in d[DB][self.name].list_indexes()]
        return o


class DropDatabase(_DdlScenario):
    """``shard-dropdatabase``: ``dropDatabase`` of ``fdrop<seed>`` (a sharded and an unsharded
    collection with documents)."""

    command = "dropDatabase"

    def prepare(self) -> None:
        self.db = f"fdrop{self.seed}"
        with pymongo.MongoClient(self.cluster.router_uri, serverSelectionTimeoutMS=30000) as c:
            _retrying(lambda: c.drop_database(self.db))
            _retrying(lambda: c.admin.command("enableSharding", self.db))
            _retrying(lambda: c.admin.command("shardCollection", f"{self.db}.s",
                                              key={"_id": "hashed"}))
            c[self.db].s.insert_many([{"_id": i} for i in range(20)])
            c[self.db].u.insert_many([{"_id": i} for i in range(10)])
            c[self.db].u.create_index("x")
            self.uuids = [e["uuid"] for e in c.config.collections.find(
                {"_id": {"$regex": f"^{self.db}\\."}})]
            owners = {ch["shard"] for ch in c.config.chunks.find({"uuid": {"$in": self.uuids}})}
        self.notes.append(f"{self.db} on {len(owners)} shards")

    def send(self, client: pymongo.MongoClient) -> Any:
        return client[self.db].command("dropDatabase")

    def observe(self) -> DdlObserved:
        o = DdlObserved(error=self.error, inconsistencies=self._inconsistencies("admin"))
        with _direct(self.cluster.config) as c:
            where: list[tuple[str, Callable[[], Any]]] = [
                ("config.databases", lambda: c.config.databases.find_one({"_id": self.db})),
                ("config.collections", lambda: c.config.collections.find_one(
                    {"_id": {"$regex": f"^{self.db}\\."}})),
                ("config.chunks", lambda: c.config.chunks.find_one(
                    {"uuid": {"$in": self.uuids}}))]
            o.left += [f"{what}: {doc}" for what, fn in where if (doc := fn()) is not None]
        for proc in self.cluster.shards:
            with _direct(proc) as d:
                if self.db in d.list_database_names():
                    o.left.append(f"{proc.name}: {self.db} with "
                                  f"{sorted(d[self.db].list_collection_names())}")
        with pymongo.MongoClient(self.cluster.router_uri, serverSelectionTimeoutMS=30000) as c:
            if self.db in _retrying(c.list_database_names):
                o.left.append(f"the router lists {self.db}")
        return o


DDL_SCENARIOS: dict[str, type[_DdlScenario]] = {
    "shard-createindexes": CreateIndexes,
    "shard-dropdatabase": DropDatabase,
}
