"""The config server: the cluster catalog in ordinary collections, and the sharding coordinator.

The config server is a :class:`shard.node.ShardNode` (so it has storage, an oplog and change
streams; ``config.shards`` is watchable like any collection) with the catalog in:

* ``config.shards``      ``{_id: <shard name>, host: "<name>/<host:port>", state: 1, topologyTime}``
* ``config.databases``   ``{_id: <db>, primary: <shard>, version: {uuid, timestamp, lastMod}}``
* ``config.collections`` ``{_id: <ns>, lastmodEpoch, lastmod, timestamp, uuid, key, unique,
  noBalance}``
* ``config.chunks``      ``{_id, uuid, min, max, shard, lastmod: Timestamp(major, minor),
  onCurrentShardSince, history}``

Every catalog change is a normal write to those collections (run through the node's own command
table), so it is in the config server's oplog. The router forwards the sharding commands here
under the server's internal names (``_configsvrAddShard``, ``_configsvrShardCollection``, ...;
``src/mongo/db/s/config/configsvr_*_command.cpp``); one lock serialises them like the DDL
coordinators do. Shards are reached with :func:`shardsim.core.gossip.gossip_command`.

The commands are module-level handlers, one family per module of :mod:`configsvr.commands`
(``shards``, ``databases``, ``collections``, ``chunks``), installed by
:class:`ConfigServerNode`; the catalog access they share is here, the pure helpers in
:mod:`configsvr.catalog`.
"""

from __future__ import annotations

import asyncio
import uuid as uuid_mod
from typing import Any

from bson import Binary

from shardsim.configsvr.balancer import Balancer
from shardsim.configsvr.catalog import shard_host, split_ns
from shardsim.configsvr.commands import FAMILIES
from shardsim.configsvr import placement_history, resharding_recovery
from shardsim.core import server_version
from shardsim.configsvr.migration_recovery import MigrationRecovery
from shardsim.core.gossip import gossip_command
from shardsim.core.shard_key import KeyPattern
from shardsim.shard.node import ShardNode
from shardsim.core.auth.session import SYSTEM_USER, AuthSession
from shardsim.configsvr import keys as cluster_keys
from shardsim.core.client import Pool, remote_error
from shardsim.core.shard_targets import ShardTargets
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError

__all__ = ["CONFIG_SHARD_NAME", "ConfigServerNode", "shard_host", "split_ns"]

CONFIG_SHARD_NAME = "config"
_CATALOG_WRITES = frozenset({"insert", "update", "delete", "findAndModify"})
_INTERNAL_CONN = ConnectionInfo(id=0, peer="internal", auth=AuthSession(users=[SYSTEM_USER]))


class ConfigServerNode(ShardNode):
    """``python -m shardsim.configsvr``: a ShardNode named ``config`` with the catalog commands
    (:mod:`configsvr.commands`). ``ddl_lock`` serialises the catalog commands (the server's
    DDL coordinators); ``chunk_op_lock`` a migration's commit and its fencing by a new donor
    primary (mongod's ``_kChunkOpLock``: the commit runs while the moveChunk holds the DDL
    lock); ``shard_pools`` holds a connection pool per shard name; ``balancer``
    is the :class:`configsvr.balancer.Balancer` (started with the node)."""

    role = "configsvr"

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("shard_name", CONFIG_SHARD_NAME)
        super().__init__(**kw)
        self.ddl_lock = asyncio.Lock()
        self.chunk_op_lock = asyncio.Lock()
        self.shard_pools: dict[str, str] = {}  # shard name -> its connection string
        self.shard_targets = ShardTargets()  # a replica-set monitor per shard
        self.balancer = Balancer(self)
        self.reshardings: dict[str, Any] = {}  # ns -> configsvr.resharding.ReshardOp
        # the resharding coordinator's fail points (chunk migrations: the donor's)
        self.migration_recovery = MigrationRecovery(self)
        self.migration_recovery.install_fail_points()
        self.commands.install(self, *FAMILIES)
        # the jobs only a primary runs (balancer, recoveries, keys): a replica-set member
        # starts them on step-up and stops them on step-down; primary_jobs says they run
        self.primary_jobs = False
        self._jobs_gen = 0
        self._jobs_lock = asyncio.Lock()
        self._job_tasks: set[asyncio.Task] = set()

    async def startup(self) -> None:
        """As a shard; then the primary-only jobs (:meth:`_start_primary_jobs`): at once on a
        one-member config server, on each step-up on a member of a config server replica set
        (:meth:`on_became_writable_primary`)."""
        await super().startup()
        if self.repl is None:
            await self._start_primary_jobs()

    @property
    def connection_string(self) -> str:
        """How shards and routers reach this config server: ``setName/h1,h2,h3`` for a
        replica set (every member, the ``configsvrConnectionString`` of a shard's
        ``shardIdentity`` and mongos' ``--configdb``), else ``host:port``."""
        hosts = self.options.get("repl_hosts")
        if self.repl is not None and hosts:
            return f"{self.set_name}/" + ",".join(hosts)
        return self.address

    def on_became_writable_primary(self) -> None:
        """As a shard's new primary; a member of a config server replica set then starts the
        jobs only the primary runs, as mongod's ``ShardingCatalogManager`` /
        ``Balancer::onStepUpComplete`` / ``KeysCollectionManager`` / ``ReshardingCoordinator``
        services do on step-up (``ReplicationCoordinatorExternalStateImpl::
        onTransitionToPrimary`` -> ``ShardingInitializationMongoD``, ``PrimaryOnlyService``):
        the interrupted reshardings are recovered as after a restart (the donor shards
        complete their chunk migrations themselves)."""
        super().on_became_writable_primary()
        if self.repl is not None:
            self._jobs_gen += 1
            self._spawn_job(self._start_primary_jobs(self._jobs_gen))

    def on_lost_writable_primary(self) -> None:
        """A member of a config server replica set that stops being primary stops the balancer,
        the recoveries and the key hand-out (``Balancer::onStepDownFromPrimary``,
        ``PrimaryOnlyServiceRegistry::onStepDown``); the new primary takes them over. Its
        two-phase commits are interrupted as a shard's."""
        super().on_lost_writable_primary()
        self._jobs_gen += 1
        self._spawn_job(self._stop_primary_jobs())

    def _spawn_job(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._job_tasks.add(task)
        task.add_done_callback(self._job_tasks.discard)

    async def _start_primary_jobs(self, gen: int | None = None) -> None:
        """The HMAC keys (made when missing, handed out: :mod:`configsvr.keys`), the
        reshardings an earlier primary (or a restart) interrupted, the
        balancer (with the auto-merger and the drains). ``gen``: skipped when the member
        stepped down since it was asked."""
        async with self._jobs_lock:
            if gen is not None and (gen != self._jobs_gen or self.repl is None
                                    or not self.repl.writable):
                return
            await cluster_keys.start(self)
            resharding_recovery.start(self)  # the reshardings a restart or failover interrupted
            self.balancer.start()
            self.primary_jobs = True

    async def _stop_primary_jobs(self) -> None:
        """Stop what :meth:`_start_primary_jobs` started (stepdown, shutdown)."""
        async with self._jobs_lock:
            cluster_keys.stop(self)
            await self.balancer.stop()
            await resharding_recovery.stop(self)
            self.shard_pools.clear()  # the next primary reads config.shards again
            self.primary_jobs = False

    async def on_fcv_change(self, old: str, new: str) -> None:
        """After ``setFeatureCompatibilityVersion`` (shardsim/core/fcv.py): a downgrade clears
        ``config.placementHistory`` (the v2 change-stream reader then falls back to v1 for
        times before the next upgrade, which starts a new history;
        ``change_stream_db_present_state_event_handler.cpp``)."""
        if server_version.fcv_key(new) < server_version.fcv_key(old):
            await placement_history.clear(self)
            # tell the v2 readers (the server writes one namespacePlacementChanged with an empty
            # namespace; shardsim one per database, which every scoped shard scan reads)
            shards = {s["_id"] for s in await self.shards()}
            now = self.clock.now()
            for d in await self.find_all("databases"):
                await placement_history.notify(self, d["_id"], shards, now)

    def crash(self) -> None:
        """``kill -9``: as a shard (:meth:`ShardNode.crash`), and the pools to the shards
        closed."""
        super().crash()
        self._jobs_gen += 1
        for task in list(self._job_tasks):
            task.cancel()
        cluster_keys.stop(self)
        if self.balancer._task is not None:
            self.balancer._task.cancel()
        self.shard_targets.close()

    async def shutdown(self) -> None:
        """Stop handing out keys, stop as a shard does, then close the pools to the shards."""
        self._jobs_gen += 1
        for task in list(self._job_tasks):
            task.cancel()
        cluster_keys.stop(self)
        await self.balancer.stop()
        await resharding_recovery.stop(self)
        await super().shutdown()
        self.shard_targets.close()
        self.shard_pools.clear()

    # -- local catalog access (through our own command table, so writes hit the oplog) ----
    async def local(self, name: str, db: str, body: dict[str, Any]) -> dict[str, Any]:
        """Run a command on this node; raises the MongoError of an ``ok: 0`` reply. On a
        member of a config server replica set a catalog write (insert/update/delete/
        findAndModify) goes with ``w: "majority"`` and its ``writeConcernError`` is raised
        too, as ``ShardingCatalogManager`` writes with
        ``ShardingCatalogClient::kMajorityWriteConcern`` and fails on a write-concern error
        (``src/mongo/db/s/config/sharding_catalog_manager.cpp``,
        ``src/mongo/s/catalog/sharding_catalog_client_impl.cpp``): a catalog change a
        failover could roll back is never acknowledged."""
        body = dict(body)
        body["$db"] = db
        majority = self.repl is not None and name in _CATALOG_WRITES
        if majority:
            body.setdefault("writeConcern", {"w": "majority", "wtimeout": 0})
        reply = await self.run_command(Request(name, db, body, _INTERNAL_CONN))
        if not reply.get("ok"):
            raise remote_error(reply)
        if majority and isinstance(reply.get("writeConcernError"), dict):
            wce = reply["writeConcernError"]
            raise MongoError(int(wce.get("code", 64)), str(wce.get("errmsg", "")))
        return reply

    async def find_all(self, coll: str, filt: dict[str, Any] | None = None,
                       sort: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every document of ``config.<coll>`` matching ``filt``."""
        body: dict[str, Any] = {"find": coll, "filter": filt or {}, "batchSize": 1 << 30}
        if sort:
            body["sort"] = sort
        reply = await self.local("find", "config", body)
        cur = reply["cursor"]
        docs = list(cur["firstBatch"])
        while cur["id"]:
            reply = await self.local("getMore", "config", {"getMore": cur["id"], "collection": coll})
            cur = reply["cursor"]
            docs.extend(cur["nextBatch"])
        return docs

    async def insert(self, coll: str, docs: list[dict[str, Any]]) -> None:
        """Insert ``docs`` into ``config.<coll>`` (ordered; nothing for an empty list)."""
        if docs:
            await self.local("insert", "config", {"insert": coll, "documents": docs, "ordered": True})

    async def update(self, coll: str, q: dict[str, Any], u: dict[str, Any], multi: bool = False) -> None:
        """Update ``config.<coll>`` documents matching ``q`` with ``u``."""
        await self.local("update", "config", {"update": coll, "updates": [
            {"q": q, "u": u, "multi": multi}]})

    async def delete(self, coll: str, q: dict[str, Any]) -> None:
        """Delete every ``config.<coll>`` document matching ``q``."""
        await self.local("delete", "config", {"delete": coll, "deletes": [{"q": q, "limit": 0}]})

    # -- shards ---------------------------------------------------------------------------
    async def shards(self) -> list[dict[str, Any]]:
        """``config.shards`` entries sorted by name."""
        return await self.find_all("shards", sort={"_id": 1})

    async def shard_connection_string(self, name: str) -> str:
        """Shard ``name``'s ``config.shards`` host (``set/h1,h2,...`` or ``host:port``);
        ShardNotFound (70) if it is not there."""
        conn = self.shard_pools.get(name)
        if conn is None:
            docs = await self.find_all("shards", {"_id": name})
            if not docs:
                raise MongoError(70, f"Shard {name} not found")
            conn = self.shard_pools[name] = str(docs[0]["host"])
        return conn

    def forget_shard(self, name: str) -> None:
        """Forget shard ``name``'s connection string (removeShard, a re-added shard)."""
        self.shard_pools.pop(name, None)

    async def on_shard(self, shard: str, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """Run ``cmd`` on shard ``shard``'s primary with our ``$clusterTime``; raises its error
        reply (:class:`shardsim.core.shard_targets.ShardTargets`: the primary found through a
        replica-set monitor, a "not primary" refusal retried on the new one)."""
        return await self.shard_targets.command(self.clock, await self.shard_connection_string(shard),
                                                db, cmd)

    async def shard_find_all(self, shard: str, db: str, coll: str) -> list[dict[str, Any]]:
        """Every document of ``db.coll`` on shard ``shard``."""
        reply = await self.on_shard(shard, db, {"find": coll, "filter": {}, "batchSize": 1 << 30})
        cur = reply["cursor"]
        docs = list(cur["firstBatch"])
        while cur["id"]:
            reply = await self.on_shard(shard, db, {"getMore": cur["id"], "collection": coll})
            cur = reply["cursor"]
            docs.extend(cur["nextBatch"])
        return docs

    # -- catalog entries the command families share ----------------------------------------
    async def ensure_database(self, db: str, primary: str | None = None) -> dict[str, Any]:
        """The ``config.databases`` entry of ``db``, created with the shard holding the fewest
        databases as primary (or ``primary``) when missing. ShardNotFound (70) without shards."""
        found = await self.find_all("databases", {"_id": db})
        if found:
            return found[0]
        shards = [s for s in await self.shards() if not s.get("draining")]
        if not shards:
            raise MongoError(70, "No shards found")
        names = [s["_id"] for s in shards]
        if primary is not None:
            if primary not in names:
                raise MongoError(70, f"Shard {primary} not found")
        else:
            counts = {n: 0 for n in names}
            for d in await self.find_all("databases"):
                if d.get("primary") in counts:
                    counts[d["primary"]] += 1
            primary = min(names, key=lambda n: (counts[n], n))
        entry = {"_id": db, "primary": primary,
                 "version": {"uuid": Binary(uuid_mod.uuid4().bytes, 4),
                             "timestamp": self.clock.now(), "lastMod": 1}}
        await self.insert("databases", [entry])
        await placement_history.record(self, db, [primary])
        return entry

    async def load_collection(self, ns: str) -> tuple[dict[str, Any], KeyPattern, list[dict[str, Any]]]:
        """(config.collections entry, pattern, chunk docs) of a sharded ``ns``;
        NamespaceNotSharded (118) otherwise."""
        found = await self.find_all("collections", {"_id": ns})
        if not found:
            raise MongoError(118, f"Collection {ns} is not sharded.")
        entry = found[0]
        pattern = KeyPattern(entry["key"])
        chunks = await self.find_all("chunks", {"uuid": entry["uuid"]})
        return entry, pattern, chunks

    # -- identity -------------------------------------------------------------------------
    def hello(self, req: Request) -> dict[str, Any]:
        reply = super().hello(req)
        reply["configsvr"] = 2
        return reply

    def parsed_options(self) -> dict[str, Any]:
        opts = dict(super().parsed_options())
        opts["sharding"] = {"clusterRole": "configsvr"}
        return opts
