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
coordinators do. Shards are reached with :func:`shardsim.gossip.gossip_command`.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
import uuid as uuid_mod
from typing import Any

from bson import Binary, MaxKey, MinKey, ObjectId
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.gossip import gossip_command
from shardsim.shard_key import (Chunk, ChunkMap, KeyPattern, SortKey, compare_keys,
                              hashed_split_points)
from shardsim.errors import view_error
from shard.node import ShardNode
from shardsim.auth.session import SYSTEM_USER, AuthSession
from configsvr import keys as cluster_keys
from shardsim.client import Pool, parse_address, remote_error
from shardsim.commands import ConnectionInfo, Request
from shardsim.errors import MongoError

log = logging.getLogger("shardsim.configsvr")

CONFIG_SHARD_NAME = "config"
_INTERNAL_CONN = ConnectionInfo(id=0, peer="internal", auth=AuthSession(users=[SYSTEM_USER]))
_UNSHARDABLE_DBS = ("admin", "local", "config")


def shard_host(entry: dict[str, Any]) -> tuple[str, int]:
    """``(host, port)`` of a ``config.shards`` entry (``"name/host:port"`` or ``"host:port"``)."""
    host = entry["host"].split("/", 1)[-1].split(",")[0]
    return parse_address(host)


def split_ns(ns: Any, cmd: str = "shardCollection") -> tuple[str, str]:
    """``"db.coll"`` -> ``("db", "coll")``; InvalidNamespace (73) otherwise."""
    if not isinstance(ns, str) or "." not in ns or ns.startswith(".") or ns.endswith("."):
        raise MongoError(73, f"Invalid namespace specified '{ns}'")
    db, coll = ns.split(".", 1)
    return db, coll


class ConfigServerNode(ShardNode):
    """``python -m configsvr``: a ShardNode named ``config`` with the catalog commands."""

    role = "configsvr"

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("shard_name", CONFIG_SHARD_NAME)
        super().__init__(**kw)
        self._ddl_lock = asyncio.Lock()
        self._pools: dict[str, Pool] = {}
        self._register_catalog_commands()

    async def startup(self) -> None:
        """As a shard; with authentication on, also make and hand out the HMAC keys
        (:mod:`configsvr.keys`)."""
        await super().startup()
        await cluster_keys.start(self)

    async def shutdown(self) -> None:
        """Stop handing out keys, then as a shard."""
        cluster_keys.stop(self)
        await super().shutdown()

    # -- local catalog access (through our own command table, so writes hit the oplog) ----
    async def local(self, name: str, db: str, body: dict[str, Any]) -> dict[str, Any]:
        """Run a command on this node; raises the MongoError of an ``ok: 0`` reply."""
        body = dict(body)
        body["$db"] = db
        reply = await self.run_command(Request(name, db, body, _INTERNAL_CONN))
        if not reply.get("ok"):
            raise remote_error(reply)
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
        if docs:
            await self.local("insert", "config", {"insert": coll, "documents": docs, "ordered": True})

    async def update(self, coll: str, q: dict[str, Any], u: dict[str, Any], multi: bool = False) -> None:
        await self.local("update", "config", {"update": coll, "updates": [
            {"q": q, "u": u, "multi": multi}]})

    async def delete(self, coll: str, q: dict[str, Any]) -> None:
        await self.local("delete", "config", {"delete": coll, "deletes": [{"q": q, "limit": 0}]})

    # -- shards ---------------------------------------------------------------------------
    async def shards(self) -> list[dict[str, Any]]:
        """``config.shards`` entries sorted by name."""
        return await self.find_all("shards", sort={"_id": 1})

    async def shard_pool(self, name: str) -> Pool:
        """A pool to shard ``name``; ShardNotFound (70) if it is not in ``config.shards``."""
        pool = self._pools.get(name)
        if pool is None:
            docs = await self.find_all("shards", {"_id": name})
            if not docs:
                raise MongoError(70, f"Shard {name} not found")
            host, port = shard_host(docs[0])
            pool = self._pools[name] = Pool(host, port)
        return pool

    async def on_shard(self, shard: str, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        return await gossip_command(self.clock, await self.shard_pool(shard), db, cmd)

    async def shard_find_all(self, shard: str, db: str, coll: str) -> list[dict[str, Any]]:
        reply = await self.on_shard(shard, db, {"find": coll, "filter": {}, "batchSize": 1 << 30})
        cur = reply["cursor"]
        docs = list(cur["firstBatch"])
        while cur["id"]:
            reply = await self.on_shard(shard, db, {"getMore": cur["id"], "collection": coll})
            cur = reply["cursor"]
            docs.extend(cur["nextBatch"])
        return docs

    # -- command registration ---------------------------------------------------------------
    def _register_catalog_commands(self) -> None:
        c = self.commands
        c.register("_configsvrAddShard", self._add_shard)
        c.register("_configsvrRemoveShard", self._remove_shard)
        c.register("_configsvrCreateDatabase", self._create_database)
        c.register("_configsvrShardCollection", self._shard_collection)
        c.register("_configsvrSplitChunk", self._split_chunk)
        c.register("_configsvrMoveChunk", self._move_chunk)
        c.register("_configsvrMovePrimary", self._move_primary)
        c.register("_configsvrDropCollection", self._drop_collection_meta)
        c.register("_configsvrRenameCollection", self._rename_collection_meta)
        c.register("_configsvrDropDatabase", self._drop_database_meta)

    # -- addShard / removeShard -------------------------------------------------------------
    async def _add_shard(self, req: Request) -> dict[str, Any]:
        """addShard (``configsvr_add_shard_command.cpp``/``ShardingCatalogManager::addShard``)."""
        target = req.arg
        if not isinstance(target, str) or not target:
            raise MongoError(2, "Invalid connection string")
        conn_str = target.split("/", 1)[-1]
        host, port = parse_address(conn_str.split(",")[0])
        async with self._ddl_lock:
            pool = Pool(host, port)
            try:
                hello = await gossip_command(self.clock, pool, "admin", {"hello": 1}, timeout=10)
            except MongoError as exc:
                pool.close()
                raise MongoError(exc.code, f"failed to run command {{ hello: 1 }} when attempting "
                                           f"to add shard {target} :: caused by :: {exc.errmsg}")
            if hello.get("msg") == "isdbgrid":
                pool.close()
                raise MongoError(96, "can't add a mongos process as a shard")
            existing = await self.shards()
            address = f"{host}:{port}"
            name = req.get("name") or hello.get("setName")
            for e in existing:
                if "%s:%s" % shard_host(e) == address:
                    if name in (None, e["_id"]):
                        pool.close()
                        return {"shardAdded": e["_id"]}
                    raise MongoError(96, f"'{address}' is already a member of the existing "
                                         f"shard '{e['host']}' ({e['_id']}).")
            if not name:
                n = len(existing)
                taken = {e["_id"] for e in existing}
                while f"shard{n:04d}" in taken:
                    n += 1
                name = f"shard{n:04d}"
            if any(e["_id"] == name for e in existing):
                raise MongoError(96, f"A shard already exists with the name: '{name}'")
            self._pools[name] = pool
            entry = {"_id": name, "host": f"{name}/{address}", "state": 1,
                     "topologyTime": self.clock.now()}
            await self.insert("shards", [entry])
            log.info("added shard %s at %s", name, address)
            return {"shardAdded": name}

    async def _remove_shard(self, req: Request) -> dict[str, Any]:
        """removeShard without a balancer: ``started``/``ongoing`` while the shard still owns
        chunks or is a database primary (the caller moves them), ``completed`` once empty."""
        name = req.arg
        async with self._ddl_lock:
            shards = await self.shards()
            entry = next((s for s in shards if s["_id"] == name), None)
            if entry is None:
                raise MongoError(70, f"Shard {name} not found")
            if len(shards) == 1:
                raise MongoError(20, "Operation not allowed because it would remove the last shard")
            chunks = await self.find_all("chunks", {"shard": name})
            dbs = [d["_id"] for d in await self.find_all("databases", {"primary": name})]
            if chunks or dbs:
                note = ("you need to call moveCollection for collectionsToMove and afterwards "
                        "movePrimary for the dbsToMove")
                if not entry.get("draining"):
                    await self.update("shards", {"_id": name}, {"$set": {"draining": True}})
                    return {"msg": "draining started successfully", "state": "started",
                            "shard": name, "note": note, "dbsToMove": dbs, "collectionsToMove": []}
                return {"msg": "draining ongoing", "state": "ongoing",
                        "remaining": {"chunks": Int64(len(chunks)), "dbs": Int64(len(dbs)),
                                      "jumboChunks": Int64(0)},
                        "note": note, "dbsToMove": dbs, "collectionsToMove": []}
            await self.delete("shards", {"_id": name})
            pool = self._pools.pop(name, None)
            if pool:
                pool.close()
            return {"msg": "removeshard completed successfully", "state": "completed", "shard": name}

    # -- databases --------------------------------------------------------------------------
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
        return entry

    async def _create_database(self, req: Request) -> dict[str, Any]:
        db = req.arg
        if not isinstance(db, str) or not db or "." in db:
            raise MongoError(73, f"invalid database name '{db}'")
        if db in ("admin", "local"):
            raise MongoError(73, f"Cannot create database '{db}'")
        async with self._ddl_lock:
            entry = await self.ensure_database(db, req.get("primaryShard"))
        return {"databaseVersion": entry["version"], "primary": entry["primary"]}

    async def _move_primary(self, req: Request) -> dict[str, Any]:
        """movePrimary (``move_primary_coordinator.cpp``): clone every unsharded collection of
        the database (same UUID, options, indexes, documents, all ``fromMigrate``) to the new
        primary, give it the sharded collections' catalog entries too, switch
        ``config.databases.primary``, then drop the clones' sources on the old primary with
        ``fromMigrate`` (change streams see nothing)."""
        db, to = req.arg, req.get("to")
        if not isinstance(db, str) or not db:
            raise MongoError(73, f"invalid database name '{db}'")
        if not isinstance(to, str):
            raise MongoError(40414, "BSON field 'movePrimary.to' is missing but a required field")
        async with self._ddl_lock:
            found = await self.find_all("databases", {"_id": db})
            if not found:
                raise MongoError(26, f"Database {db} not found")
            entry = found[0]
            old = entry["primary"]
            if to not in {s["_id"] for s in await self.shards()}:
                raise MongoError(70, f"Shard {to} not found")
            if to == old:
                return {"primary": old}
            sharded = {c["_id"]: c for c in await self.find_all("collections")}
            listed = await self.on_shard(old, db, {"listCollections": 1, "cursor": {"batchSize": 1 << 30}})
            moved: list[str] = []
            for info in listed["cursor"]["firstBatch"]:
                name = info["name"]
                if info.get("type", "collection") != "collection" or name.startswith("system."):
                    continue
                ns = f"{db}.{name}"
                meta = sharded.get(ns)
                ensure: dict[str, Any] = {"_shardsimEnsureCollection": name,
                                          "uuid": info.get("info", {}).get("uuid"),
                                          "options": info.get("options", {}), "primary": False}
                if meta is not None:
                    ensure["shardKey"] = meta["key"]
                if ensure["uuid"] is None:
                    del ensure["uuid"]
                await self.on_shard(to, db, ensure)
                if meta is not None:
                    continue  # its documents belong to chunks and stay where they are
                idx = await self.on_shard(old, db, {"listIndexes": name, "cursor": {"batchSize": 1 << 30}})
                specs = [i for i in idx["cursor"]["firstBatch"] if i.get("name") != "_id_"]
                if specs:
                    await self.on_shard(to, db, {"createIndexes": name, "indexes": specs,
                                                 "fromMigrate": True})
                docs = await self.shard_find_all(old, db, name)
                for i in range(0, len(docs), 1000):
                    await self.on_shard(to, db, {"insert": name, "documents": docs[i:i + 1000],
                                                 "ordered": False, "fromMigrate": True})
                moved.append(name)
            version = dict(entry.get("version") or {})
            version["lastMod"] = int(version.get("lastMod", 1)) + 1
            version["timestamp"] = self.clock.now()
            await self.update("databases", {"_id": db}, {"$set": {"primary": to, "version": version}})
            for name in moved:
                await self.on_shard(old, db, {"drop": name, "fromMigrate": True})
            log.info("moved primary of %s from %s to %s (%d collections)", db, old, to, len(moved))
            return {"primary": to}

    # -- shardCollection --------------------------------------------------------------------
    async def _shard_collection(self, req: Request) -> dict[str, Any]:
        """shardCollection (``create_collection_coordinator.cpp``): catalog entries, the
        collection with one UUID on every shard that gets chunks, and the ``shardCollection``
        no-op on the primary shard (``notifyChangeStreamsOnShardCollection``)."""
        ns = req.arg
        db, coll = split_ns(ns)
        pattern = KeyPattern.parse(req.get("key"))
        unique = bool(req.get("unique", False))
        if db in _UNSHARDABLE_DBS:
            raise MongoError(20, f"can't shard {db} database" if db != "config"
                             else "can't shard config database")
        if coll.startswith("system."):
            raise MongoError(20, f"can't shard system namespaces {ns}")
        if unique and pattern.is_hashed:
            raise MongoError(2, "hashed shard keys cannot be declared unique. It's possible to "
                                "ensure uniqueness on the hashed field by declaring an additional "
                                "(non-hashed) unique index on the field.")
        async with self._ddl_lock:
            existing = await self.find_all("collections", {"_id": ns})
            if existing:
                if existing[0]["key"] == pattern.pattern and bool(existing[0].get("unique")) == unique:
                    return {"collectionsharded": ns}
                raise MongoError(23, f"sharding already enabled for collection {ns} with options "
                                     f"{{ key: {existing[0]['key']}, unique: "
                                     f"{str(bool(existing[0].get('unique'))).lower()} }}")
            dbe = await self.ensure_database(db)
            primary = dbe["primary"]
            listed = await self.on_shard(primary, db, {"listCollections": 1, "filter": {"name": coll}})
            infos = listed["cursor"]["firstBatch"]
            if infos and infos[0].get("type") == "view":
                raise view_error(ns)
            if infos:
                uuid = infos[0].get("info", {}).get("uuid") or Binary(uuid_mod.uuid4().bytes, 4)
                options = infos[0].get("options", {})
                count = (await self.on_shard(primary, db, {"count": coll}))["n"]
            else:
                uuid, options, count = Binary(uuid_mod.uuid4().bytes, 4), {}, 0
            if options.get("capped"):
                raise MongoError(20, "can't shard a capped collection")
            shards = [s["_id"] for s in await self.shards() if not s.get("draining")]
            chunks = self._initial_chunks(pattern, primary, shards, count,
                                          req.get("numInitialChunks"))
            owners = [primary] + sorted({c.shard for c in chunks} - {primary})
            for shard in owners:
                await self.on_shard(shard, db, {
                    "_shardsimEnsureCollection": coll, "uuid": uuid, "shardKey": pattern.pattern,
                    "options": options, "primary": shard == primary})
                if pattern.pattern != {"_id": 1}:
                    name = "_".join(f"{f}_{v}" for f, v in pattern.pattern.items())
                    spec: dict[str, Any] = {"key": pattern.pattern, "name": name}
                    if unique:
                        spec["unique"] = True
                    cmd: dict[str, Any] = {"createIndexes": coll, "indexes": [spec]}
                    if shard != primary:
                        cmd["fromMigrate"] = True
                    try:
                        await self.on_shard(shard, db, cmd)
                    except MongoError as exc:  # an index that exists with other options
                        if exc.code not in (85, 86, 68):
                            raise
            now = self.clock.now()
            epoch = ObjectId()
            await self.insert("collections", [{
                "_id": ns, "lastmodEpoch": epoch,
                "lastmod": datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None),
                "timestamp": now, "uuid": uuid, "key": pattern.pattern, "unique": unique,
                "noBalance": False}])
            await self.insert("chunks", [
                self._chunk_doc(uuid, pattern, c, Timestamp(1, i), now)
                for i, c in enumerate(chunks)])
            o2 = {"shardCollection": ns, "shardKey": pattern.pattern, "unique": unique,
                  "presplitHashedZones": bool(req.get("presplitHashedZones", False))}
            if options.get("capped"):
                o2["capped"] = True
            await self.on_shard(primary, db, {"_shardsimNoop": {"msg": {"shardCollection": ns}},
                                              "o2": o2, "ns": ns, "ui": uuid})
            log.info("sharded %s on %s: %d chunks over %s", ns, pattern.pattern, len(chunks), owners)
            return {"collectionsharded": ns}

    @staticmethod
    def _initial_chunks(pattern: KeyPattern, primary: str, shards: list[str], count: int,
                        num_initial: Any) -> list[Chunk]:
        """One chunk on the primary for a ranged key; for a hashed key ``numInitialChunks``
        (default 2 per shard) evenly spaced chunks, round-robin over the shards when the
        collection is empty (``InitialSplitPolicy``), all on the primary otherwise."""
        gmin, gmax = tuple(pattern.global_min().values()), tuple(pattern.global_max().values())
        if not pattern.is_hashed or pattern.fields[0] not in pattern.hashed:
            return [Chunk(gmin, gmax, primary)]
        n = int(num_initial) if isinstance(num_initial, (int, float)) and num_initial else 2 * len(shards)
        points = hashed_split_points(max(1, n))
        rest_min, rest_max = gmin[1:], gmin[1:]
        bounds = [gmin] + [(p,) + rest_min for p in points] + [gmax]
        del rest_max
        order = [primary] + [s for s in shards if s != primary] if count else shards
        out = []
        for i in range(len(bounds) - 1):
            owner = primary if count else order[i % len(order)]
            out.append(Chunk(bounds[i], bounds[i + 1], owner))
        return out

    @staticmethod
    def _chunk_doc(uuid: Binary, pattern: KeyPattern, c: Chunk, lastmod: Timestamp,
                   now: Timestamp) -> dict[str, Any]:
        return {"_id": ObjectId(), "uuid": uuid, "min": pattern.key_to_bound(c.min),
                "max": pattern.key_to_bound(c.max), "shard": c.shard, "lastmod": lastmod,
                "onCurrentShardSince": now, "history": [{"validAfter": now, "shard": c.shard}]}

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

    @staticmethod
    def _chunk_map(pattern: KeyPattern, chunk_docs: list[dict[str, Any]]) -> ChunkMap:
        return ChunkMap(pattern, [Chunk(pattern.bound_to_key(d["min"]), pattern.bound_to_key(d["max"]),
                                        d["shard"]) for d in chunk_docs])

    def _locate(self, pattern: KeyPattern, chunk_docs: list[dict[str, Any]], req: Request,
                cmd: str) -> dict[str, Any]:
        """The chunk doc named by ``find`` (a document with the shard key; hashed fields are
        hashed) or ``bounds`` ([min, max] exactly a chunk's bounds)."""
        if req.get("bounds") is not None:
            bounds = req.get("bounds")
            if not isinstance(bounds, list) or len(bounds) != 2:
                raise MongoError(2, "bounds must be an array of two documents")
            lo, hi = pattern.bound_to_key(bounds[0]), pattern.bound_to_key(bounds[1])
            for d in chunk_docs:
                if compare_keys(pattern.bound_to_key(d["min"]), lo) == 0 and \
                        compare_keys(pattern.bound_to_key(d["max"]), hi) == 0:
                    return d
            raise MongoError(2, f"no chunk found with the shard key bounds [{bounds[0]}, {bounds[1]})")
        find = req.get("find")
        if not isinstance(find, dict):
            raise MongoError(2, f"need to specify find or bounds for {cmd}")
        key = pattern.key_of_query(find)
        if key is None:
            raise MongoError(61, f"no shard key found in chunk query {find}")
        cmap = self._chunk_map(pattern, chunk_docs)
        chunk = cmap.find(key)
        for d in chunk_docs:
            if compare_keys(pattern.bound_to_key(d["min"]), chunk.min) == 0:
                return d
        raise MongoError(1, "chunk not found")

    # -- split --------------------------------------------------------------------------------
    async def _split_chunk(self, req: Request) -> dict[str, Any]:
        """split: at ``middle``, or at the median key of the chunk named by ``find``/``bounds``
        (the midpoint of the hash range for a hashed key)."""
        ns = req.arg
        split_ns(ns, "split")
        async with self._ddl_lock:
            entry, pattern, chunk_docs = await self.load_collection(ns)
            if req.get("middle") is not None:
                middle = req.get("middle")
                if not isinstance(middle, dict) or set(middle) != set(pattern.fields):
                    raise MongoError(2, f"split key {middle} does not match the shard key "
                                        f"{pattern.pattern}")
                mid = pattern.bound_to_key(middle)
                cmap = self._chunk_map(pattern, chunk_docs)
                chunk = cmap.find(mid)
                doc = next(d for d in chunk_docs
                           if compare_keys(pattern.bound_to_key(d["min"]), chunk.min) == 0)
            else:
                doc = self._locate(pattern, chunk_docs, req, "split")
                lo, hi = pattern.bound_to_key(doc["min"]), pattern.bound_to_key(doc["max"])
                mid = await self._median(entry, pattern, doc, lo, hi)
            lo, hi = pattern.bound_to_key(doc["min"]), pattern.bound_to_key(doc["max"])
            if compare_keys(mid, lo) <= 0 or compare_keys(mid, hi) >= 0:
                raise MongoError(2, f"new split key {pattern.key_to_bound(mid)} is a boundary key "
                                    f"of existing chunk [{doc['min']},{doc['max']})")
            major = max(d["lastmod"].time for d in chunk_docs)
            minor = max(d["lastmod"].inc for d in chunk_docs if d["lastmod"].time == major)
            now = self.clock.now()
            await self.delete("chunks", {"_id": doc["_id"]})
            await self.insert("chunks", [
                self._chunk_doc(entry["uuid"], pattern, Chunk(lo, mid, doc["shard"]),
                                Timestamp(major, minor + 1), now),
                self._chunk_doc(entry["uuid"], pattern, Chunk(mid, hi, doc["shard"]),
                                Timestamp(major, minor + 2), now)])
            return {}

    async def _median(self, entry: dict[str, Any], pattern: KeyPattern, doc: dict[str, Any],
                      lo: tuple[Any, ...], hi: tuple[Any, ...]) -> tuple[Any, ...]:
        first = pattern.fields[0]
        if first in pattern.hashed and isinstance(lo[0], Int64 | int) and isinstance(hi[0], Int64 | int):
            return (Int64((int(lo[0]) + int(hi[0])) // 2),) + tuple(lo[1:])
        if first in pattern.hashed:
            a = -2 ** 63 if isinstance(lo[0], MinKey) else int(lo[0])
            b = 2 ** 63 - 1 if isinstance(hi[0], MaxKey) else int(hi[0])
            return (Int64((a + b) // 2),) + tuple(lo[1:])
        db, coll = entry["_id"].split(".", 1)
        keys = sorted((k for k in (pattern.key_of_doc(d) for d in
                                   await self.shard_find_all(doc["shard"], db, coll))
                       if compare_keys(lo, k) <= 0 and compare_keys(k, hi) < 0), key=SortKey)
        if len(keys) < 2:
            raise MongoError(2, "cannot find a split point: the chunk has fewer than 2 documents")
        return keys[len(keys) // 2]

    # -- moveChunk ------------------------------------------------------------------------
    async def _move_chunk(self, req: Request) -> dict[str, Any]:
        """moveChunk as a migration (``migration_source_manager.cpp``): clone the chunk's
        documents to the recipient as ``fromMigrate`` inserts, write ``migrateChunkToNewShard``
        on the donor when the recipient had no chunk of the collection, commit the chunk's new
        owner, then delete the documents on the donor with ``fromMigrate``.

        Writes to the chunk that arrive between cloning and commit are not caught up (no
        transfer-mods phase); the router running ``moveChunk`` holds its writes to the
        namespace meanwhile (``router.writes.NamespaceGate``).
        """
        ns = req.arg
        db, coll = split_ns(ns, "moveChunk")
        to = req.get("to")
        if not isinstance(to, str):
            raise MongoError(40414, "BSON field 'moveChunk.to' is missing but a required field")
        async with self._ddl_lock:
            entry, pattern, chunk_docs = await self.load_collection(ns)
            doc = self._locate(pattern, chunk_docs, req, "moveChunk")
            donor = doc["shard"]
            shard_names = {s["_id"] for s in await self.shards()}
            if to not in shard_names:
                raise MongoError(70, f"Shard {to} not found")
            if donor == to:
                return {"millis": 0}
            uuid = entry["uuid"]
            lo, hi = pattern.bound_to_key(doc["min"]), pattern.bound_to_key(doc["max"])
            recipient_had_chunks = any(d["shard"] == to for d in chunk_docs)
            await self.on_shard(to, db, {"_shardsimEnsureCollection": coll, "uuid": uuid,
                                         "shardKey": pattern.pattern, "options": {},
                                         "primary": False})
            if pattern.pattern != {"_id": 1}:
                name = "_".join(f"{f}_{v}" for f, v in pattern.pattern.items())
                try:
                    await self.on_shard(to, db, {"createIndexes": coll, "fromMigrate": True,
                                                 "indexes": [{"key": pattern.pattern, "name": name}]})
                except MongoError as exc:
                    if exc.code not in (85, 86, 68):
                        raise
            moving = [d for d in await self.shard_find_all(donor, db, coll)
                      if compare_keys(lo, k := pattern.key_of_doc(d)) <= 0 and compare_keys(k, hi) < 0]
            for i in range(0, len(moving), 1000):
                await self.on_shard(to, db, {"insert": coll, "documents": moving[i:i + 1000],
                                             "ordered": False, "fromMigrate": True})
            if not recipient_had_chunks:
                await self.on_shard(donor, db, {
                    "_shardsimNoop": {"msg": f"Migrating chunk from shard {donor} to shard {to} "
                                             f"with no chunks for this collection"},
                    "o2": {"migrateChunkToNewShard": ns, "fromShardId": donor, "toShardId": to},
                    "ns": ns, "ui": uuid})
            major = max(d["lastmod"].time for d in chunk_docs) + 1
            now = self.clock.now()
            await self.update("chunks", {"_id": doc["_id"]}, {"$set": {
                "shard": to, "lastmod": Timestamp(major, 0), "onCurrentShardSince": now},
                "$push": {"history": {"$each": [{"validAfter": now, "shard": to}], "$position": 0}}})
            ids = [d["_id"] for d in moving]
            for i in range(0, len(ids), 1000):
                await self.on_shard(donor, db, {"delete": coll, "fromMigrate": True, "deletes": [
                    {"q": {"_id": {"$in": ids[i:i + 1000]}}, "limit": 0}]})
            log.info("moved chunk %s of %s from %s to %s (%d docs)", doc["min"], ns, donor, to,
                     len(moving))
            return {"millis": 0}

    # -- metadata of DDL run by the router ---------------------------------------------------
    async def _drop_collection_meta(self, req: Request) -> dict[str, Any]:
        ns = req.arg
        async with self._ddl_lock:
            found = await self.find_all("collections", {"_id": ns})
            if found:
                await self.delete("chunks", {"uuid": found[0]["uuid"]})
                await self.delete("collections", {"_id": ns})
        return {}

    async def _rename_collection_meta(self, req: Request) -> dict[str, Any]:
        src, dst = req.arg, req.get("to")
        async with self._ddl_lock:
            target = await self.find_all("collections", {"_id": dst})
            if target:
                await self.delete("chunks", {"uuid": target[0]["uuid"]})
                await self.delete("collections", {"_id": dst})
            found = await self.find_all("collections", {"_id": src})
            if found:
                entry = dict(found[0])
                entry["_id"] = dst
                await self.delete("collections", {"_id": src})
                await self.insert("collections", [entry])
        return {}

    async def _drop_database_meta(self, req: Request) -> dict[str, Any]:
        db = req.arg
        async with self._ddl_lock:
            for entry in await self.find_all("collections", {"_id": {"$regex": f"^{re.escape(db)}\\."}}):
                await self.delete("chunks", {"uuid": entry["uuid"]})
                await self.delete("collections", {"_id": entry["_id"]})
            await self.delete("databases", {"_id": db})
        return {}

    # -- identity -------------------------------------------------------------------------
    def hello(self, req: Request) -> dict[str, Any]:
        reply = super().hello(req)
        reply["configsvr"] = 2
        return reply

    def parsed_options(self) -> dict[str, Any]:
        opts = dict(super().parsed_options())
        opts["sharding"] = {"clusterRole": "configsvr"}
        return opts
