"""``_configsvrReshardCollection``: ``reshardCollection``, ``moveCollection`` and
``unshardCollection`` (8.0 runs all three as resharding; ``configsvr_reshard_collection_cmd.cpp``,
``reshard_collection_coordinator.cpp``, ``move_collection_coordinator`` /
``unshard_collection_coordinator``). The phases are in :mod:`configsvr.resharding`.

``{_configsvrReshardCollection: ns, provenance, key?, unique?, numInitialChunks?, toShard?,
forceRedistribution?, phase: "clone" | "commit" | "abort"}``: the router runs ``clone``
(initializing, cloning, applying), then holds its writes to the namespace and runs ``commit``
(the critical section), or ``abort`` when that failed. ``clone`` replies ``{noop: true}``
when there is nothing to do (same key, same shard).

Errors, as the server's: InvalidNamespace (73), IDLFailedToParse (40414) for a missing
``key``/``toShard``, NamespaceNotSharded (118) for reshardCollection/unshardCollection of a
collection that is not sharded, NamespaceNotFound (26) for moveCollection of a missing or
sharded collection, ShardNotFound (70), ConflictingOperationInProgress (117) when the
collection is already being resharded (or an interrupted resharding of it cannot be cleaned up
yet: :mod:`configsvr.resharding_recovery`), ReshardCollectionAborted (341) for ``commit``
without ``clone``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.configsvr import resharding, resharding_recovery
from shardsim.configsvr.catalog import split_ns
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.shard_key import Chunk, KeyPattern
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

commands = CommandFamily("resharding")

_PROVENANCES = ("reshardCollection", "moveCollection", "unshardCollection")


async def _least_loaded(node: ConfigServerNode, shards: list[str]) -> str:
    """The shard with the least data (``listDatabases`` totalSize); unshardCollection's
    default ``toShard``."""
    sizes = {}
    for s in shards:
        reply = await node.on_shard(s, "admin", {"listDatabases": 1})
        sizes[s] = reply.get("totalSize", 0)
    return min(shards, key=lambda s: (sizes[s], s))


async def _build(node: ConfigServerNode, req: Request) -> resharding.ReshardOp | None:
    """Validate the request and make its :class:`ReshardOp` (None: nothing to do)."""
    ns = req.arg
    db, coll = split_ns(ns)
    prov = req.get("provenance", "reshardCollection")
    if prov not in _PROVENANCES:
        raise MongoError(2, f"unknown provenance {prov}")
    shard_docs = await node.shards()
    shards = [s["_id"] for s in shard_docs if not s.get("draining")]
    found = await node.find_all("collections", {"_id": ns})
    entry = found[0] if found else None
    sharded = entry is not None and not entry.get("unsplittable")
    dbs = await node.find_all("databases", {"_id": db})
    primary = dbs[0]["primary"] if dbs else None
    to = req.get("toShard")
    if prov == "reshardCollection":
        key = req.get("key")
        if key is None:
            raise MongoError(40414, "BSON field 'reshardCollection.key' is missing but a "
                                    "required field")
        pattern = KeyPattern.parse(key)
        if entry is None:
            raise MongoError(118, f"Collection {ns} is not sharded.")
        if entry["key"] == pattern.pattern and not req.get("forceRedistribution"):
            return None
    else:
        pattern = KeyPattern({"_id": 1})
        if prov == "moveCollection":
            if not isinstance(to, str):
                raise MongoError(40414, "BSON field 'moveCollection.toShard' is missing but a "
                                        "required field")
            if sharded:
                raise MongoError(26, f"Cannot move a sharded collection: {ns}")
        elif not sharded:
            raise MongoError(118, f"Collection {ns} is not sharded.")
    if to is not None and to not in {s["_id"] for s in shard_docs}:
        raise MongoError(70, f"Shard {to} not found")
    if entry is not None:
        chunks = await node.find_all("chunks", {"uuid": entry["uuid"]})
        donors = sorted({c["shard"] for c in chunks})
        old_uuid, old_key = entry["uuid"], entry["key"]
    else:
        donors, old_key = [primary] if primary else [], {}
        old_uuid = None
    if not donors:
        raise MongoError(26, f"Namespace {ns} not found")
    listed = await node.on_shard(donors[0], db, {"listCollections": 1, "filter": {"name": coll}})
    infos = listed["cursor"]["firstBatch"]
    if not infos or infos[0].get("type") == "view":
        raise MongoError(26, f"Namespace {ns} not found")
    if old_uuid is None:
        old_uuid = infos[0]["info"]["uuid"]
    if prov == "unshardCollection" and to is None:
        to = await _least_loaded(node, shards)
    if prov != "reshardCollection" and donors == [to]:
        return None
    idx = await node.on_shard(donors[0], db, {"listIndexes": coll})
    indexes = [i for i in idx["cursor"]["firstBatch"]]
    chunks_new = [Chunk(tuple(pattern.global_min().values()), tuple(pattern.global_max().values()),
                        to)] if prov != "reshardCollection" else []
    return resharding.ReshardOp(
        ns=ns, db=db, coll=coll, entry=entry, old_uuid=old_uuid, old_key=old_key,
        pattern=pattern, new_uuid=resharding.new_uuid(), chunks=chunks_new, donors=donors,
        primary=primary or donors[0], provenance=prov,
        unique=bool(req.get("unique", False)) if prov == "reshardCollection" else False,
        to_shard=to, options=infos[0].get("options", {}), indexes=indexes)


@commands.handler(csrq.ReshardCollection.NAME, privileges=priv.INTERNAL)
async def reshard_collection(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """One phase of a resharding (module docstring). ``clone`` -> ``{noop}``; ``commit`` and
    ``abort`` -> ``{}``."""
    ns = req.arg
    phase = req.get("phase", "clone")
    if phase == "clone":
        async with node.ddl_lock:
            if ns in node.reshardings:
                raise MongoError(117, f"{ns} is already being resharded")
            if await resharding_recovery.recover(node, ns):  # one a restart interrupted
                raise MongoError(117, f"an interrupted resharding of {ns} is not cleaned up "
                                      f"yet: a shard does not answer")
            op = await _build(node, req)
            if op is None:
                return {"noop": True}
            node.reshardings[ns] = op
            try:
                await resharding.save_state(node, op, "cloning")
                shards = [s["_id"] for s in await node.shards() if not s.get("draining")]
                await resharding.mark(node, op)
                docs = await resharding.donor_docs(node, op)
                await resharding.prepare(node, op, shards, docs)
                await resharding.clone(node, op, docs)
            except BaseException:
                node.reshardings.pop(ns, None)
                await resharding.abort(node, op)
                raise
        try:
            for _ in range(5):  # applying, outside the lock; until little is left
                if await resharding.catch_up(node, op) < 10:
                    break
            await node.migration_recovery.pause("reshardingPauseCoordinatorBeforeBlockingWrites")
        except BaseException:  # the router sends no abort after a failed clone phase
            if node.reshardings.get(ns) is op:
                node.reshardings.pop(ns, None)
                async with node.ddl_lock:
                    await resharding.abort(node, op)
            raise
        return {"noop": False}
    op = node.reshardings.pop(ns, None)
    if op is None:
        if phase == "abort":
            return {}
        raise MongoError(341, f"no resharding of {ns} in progress")
    async with node.ddl_lock:
        if phase == "abort":
            await resharding.abort(node, op)
            return {}
        try:
            await resharding.commit(node, op)
        except BaseException:
            state = await node.find_all(resharding.STATE_COLL, {"_id": op.new_uuid})
            if state and state[0].get("state") == "committing":
                resharding_recovery.start(node)  # decided: rolled forward in the background
            else:
                await resharding.abort(node, op)
            raise
    return {}
