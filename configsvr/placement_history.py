"""``config.placementHistory``: which shards owned data of a namespace since when, and the
``_configsvrGetHistoricalPlacement`` command that reads it (the 9.0 v2 change-stream reader
targets only the shards it names).

Documents, as the server keeps them (``NamespacePlacementType``, ``placement_history.idl``):
``{nss, timestamp, shards}`` — ``nss`` a collection (``"db.coll"``) or a database (``"db"``,
``shards`` = its primary), ``timestamp`` the cluster time from which the placement holds,
``shards`` sorted shard ids (``[]`` once dropped). A document with ``nss: ""`` marks when the
history was initialised (``initializePlacementHistory`` snapshots the current catalog, here on the
first record); a point in time before it is ``NotAvailable`` and the reader falls back to v1
(``ChangeStreamShardTargeterBase::initialize``: ``kSwitchToV1``).

Writers (each after its catalog write, under the DDL lock): database creation and
``movePrimary`` (the database's primary), ``shardCollection``, a chunk migration that changes the
set of owning shards, reshardCollection/moveCollection/unshardCollection, renameCollection,
``drop`` and ``dropDatabase`` (``shards: []``). Those that change a placement without a moveChunk
control event also write a ``namespacePlacementChanged`` no-op (``o2: {namespacePlacementChanged:
1, ns: {db[, coll]}, committedAt}``, ``buildNamespacePlacementChangedOplogEntry`` in the server's
change-stream notifier) on the shards that owned data before and after, so a v2 reader that
targets the old owners learns of it (:func:`notify`).

Reading (:func:`placement_at`), as the server's query answers it for a collection: the latest
collection document at or before the time when it names shards; otherwise the collection is
untracked (unsharded, or dropped and perhaps re-created unsharded) and lives on the database's
primary of that time; no database document (or one with ``shards: []``) means the database did not
exist: no shards (the reader then waits on the config server for the database's creation).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from shardsim.core.auth import privileges as priv
from shardsim.core.clock import ts_key
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.protocol import shard as shrq

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr.placement")

COLL = "placementHistory"
INIT_NSS = ""  # the initialisation marker's nss
_init_lock = asyncio.Lock()

commands = CommandFamily("placement")


async def _ensure_initialized(node: "ConfigServerNode") -> Timestamp:
    """The history's initialisation time; on first use, snapshot the catalog (every database's
    primary, every sharded collection's owning shards) at the current time, then the marker."""
    found = await node.find_all(COLL, {"nss": INIT_NSS})
    if found:
        return found[0]["timestamp"]
    async with _init_lock:
        found = await node.find_all(COLL, {"nss": INIT_NSS})
        if found:
            return found[0]["timestamp"]
        now = node.clock.tick()  # after every time already handed out: earlier is NotAvailable
        docs: list[dict[str, Any]] = []
        for d in await node.find_all("databases"):
            docs.append({"nss": d["_id"], "timestamp": now, "shards": [d["primary"]]})
        for c in await node.find_all("collections"):
            owners = sorted({ch["shard"] for ch in await node.find_all("chunks", {"uuid": c["uuid"]})})
            docs.append({"nss": c["_id"], "timestamp": now, "shards": owners})
        shards = sorted(s["_id"] for s in await node.shards())
        docs.append({"nss": INIT_NSS, "timestamp": now, "shards": shards})
        await node.insert(COLL, docs)
        return now


async def clear(node: "ConfigServerNode") -> None:
    """Forget the history (an FCV downgrade): the next record or query starts a new one."""
    await node.delete(COLL, {})


async def record(node: "ConfigServerNode", nss: str, shards: list[str] | set[str]) -> Timestamp:
    """Record that from now on ``nss`` is placed on ``shards`` (``[]``: dropped). Returns the
    document's timestamp (the config server's cluster time after the caller's catalog write)."""
    await _ensure_initialized(node)
    ts = node.clock.now()
    await node.insert(COLL, [{"nss": nss, "timestamp": ts, "shards": sorted(shards)}])
    return ts


async def collection_owners(node: "ConfigServerNode", ns: str) -> list[str]:
    """The shards owning chunks of sharded ``ns`` now (``[]`` when it is not sharded)."""
    found = await node.find_all("collections", {"_id": ns})
    if not found:
        return []
    return sorted({c["shard"] for c in await node.find_all("chunks", {"uuid": found[0]["uuid"]})})


async def notify(node: "ConfigServerNode", nss: str, shards: set[str] | list[str],
                 committed_at: Timestamp, ui: Any = None) -> None:
    """Write the ``namespacePlacementChanged`` no-op on each of ``shards`` (those that owned
    ``nss`` before or after the change); a shard that does not answer is skipped (its stream
    readers learn the placement at their next refresh)."""
    db, _, coll = nss.partition(".")
    ns_field: dict[str, Any] = {"db": db}
    if coll:
        ns_field["coll"] = coll
    o2 = {"namespacePlacementChanged": 1, "ns": ns_field, "committedAt": committed_at}
    for shard in sorted(shards):
        try:
            await node.on_shard(shard, db, shrq.Noop({"msg": {"namespacePlacementChanged": nss}},
                                                     o2=o2, ns=nss, ui=ui).to_command())
        except MongoError as exc:
            log.warning("namespacePlacementChanged for %s not written on %s: %s", nss, shard,
                        exc.errmsg)


async def _latest(node: "ConfigServerNode", nss: str, at: Timestamp) -> dict[str, Any] | None:
    docs = await node.find_all(COLL, {"nss": nss, "timestamp": {"$lte": at}},
                               sort={"timestamp": -1})
    return docs[0] if docs else None


async def placement_at(node: "ConfigServerNode", nss: str, at: Timestamp,
                       whole_cluster: bool = False) -> tuple[str, list[str]]:
    """``(status, shards)`` of ``nss`` at ``at`` (see the module docstring). A database
    (``"db"``) is its primary plus every collection of it placed elsewhere; ``whole_cluster``
    every shard placed at that time."""
    init = await _ensure_initialized(node)
    if ts_key(at) < ts_key(init):
        return "NotAvailable", []
    if whole_cluster or not nss:
        nsses = {d["nss"] for d in await node.find_all(COLL, {"timestamp": {"$lte": at}})}
        out: set[str] = set()
        for n in nsses - {INIT_NSS}:
            doc = await _latest(node, n, at)
            if doc:
                out.update(doc["shards"])
        return "OK", sorted(out)
    db, _, coll = nss.partition(".")
    db_doc = await _latest(node, db, at)
    primary = list(db_doc["shards"]) if db_doc else []
    if coll:
        doc = await _latest(node, nss, at)
        if doc and doc["shards"]:
            return "OK", sorted(doc["shards"])
        return "OK", primary
    if not primary:
        return "OK", []
    out = set(primary)
    for n in {d["nss"] for d in await node.find_all(
            COLL, {"nss": {"$regex": "^" + db.replace(".", "\\.") + "\\."},
                   "timestamp": {"$lte": at}})}:
        doc = await _latest(node, n, at)
        if doc:
            out.update(doc["shards"])
    return "OK", sorted(out)


@commands.handler(csrq.GetHistoricalPlacement.NAME, privileges=priv.INTERNAL)
async def get_historical_placement(node: "ConfigServerNode", req: Request) -> dict[str, Any]:
    """``{_configsvrGetHistoricalPlacement: nss, at, targetWholeCluster?,
    checkIfPointInTimeIsInFuture?, ignoreRemovedShards?}`` -> ``{historicalPlacement: {shards,
    status}}`` (``configsvr_get_historical_placement_command.cpp``). ``FutureClusterTime`` when
    asked to check and ``at`` is past the config server's cluster time; with
    ``ignoreRemovedShards`` the shards no longer in ``config.shards`` are left out and
    ``anyRemovedShardDetected`` says whether there were any. TypeMismatch (14) when ``at`` is
    not a Timestamp."""
    nss = req.arg if isinstance(req.arg, str) else ""
    at = req.get("at")
    if not isinstance(at, Timestamp):
        raise MongoError(14, "BSON field '_configsvrGetHistoricalPlacement.at' is the wrong type, "
                             "expected type 'timestamp'")
    if req.get("checkIfPointInTimeIsInFuture") and ts_key(at) > ts_key(node.clock.now()):
        return {"historicalPlacement": {"shards": [], "status": "FutureClusterTime"}}
    status, shards = await placement_at(node, nss, at, bool(req.get("targetWholeCluster")))
    out: dict[str, Any] = {"shards": shards, "status": status}
    if req.get("ignoreRemovedShards") and status == "OK":
        live = {s["_id"] for s in await node.shards()}
        kept = [s for s in shards if s in live]
        out["shards"] = kept
        out["anyRemovedShardDetected"] = len(kept) != len(shards)
    return {"historicalPlacement": out}
