"""``validate`` on a shard, as mongod 8.0's ``src/mongo/db/commands/validate.cpp`` (``ValidateCmd``)
with ``src/mongo/db/catalog/collection_validation.cpp`` and ``validate_results.cpp``
(``ValidateResults::appendToResultObj``).

The checks are real for what shardsim stores: every document is counted (``nrecords``) and, with
``full: true``, re-encoded as BSON (a document that cannot be is a corrupt record); the keys of
each index are generated from the documents (``keysPerIndex``: one per document for ``_id_``, one
per distinct array element for a multikey index, none for a document a sparse or partial index
skips), and a unique index's key map is compared with them: an entry pointing at a document that
does not produce it is an ``extraIndexEntries`` item, a document key the map lacks a
``missingIndexEntries`` item; either makes ``valid: false`` and the index's
``indexDetails.<name>.valid`` false.

Reply, in mongod's order: ``ns, uuid, nInvalidDocuments, nNonCompliantDocuments, nrecords,
nIndexes, keysPerIndex, indexDetails, valid, repaired[, readTimestamp], warnings, errors,
extraIndexEntries, missingIndexEntries, corruptRecords``. Errors: NamespaceNotFound (26)
"Collection '<ns>' does not exist to validate.", CommandNotSupportedOnView (166) for a view,
InvalidOptions (72) for ``background`` with ``full`` or ``repair``, 73 for a bad name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import bson
from bson import Binary, Timestamp

from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError, view_error
from shardsim.shard.commands.helpers import ddl_name
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode
    from shardsim.shard.storage import Collection, Index

commands = CommandFamily("validate")


def _options(req: Request) -> tuple[bool, bool]:
    """``(full, background)``; InvalidOptions (72) for the combinations validate.cpp refuses."""
    full = bool(req.body.get("full"))
    background = bool(req.body.get("background"))
    if background and full:
        raise MongoError(72, "Running the validate command with both { background: true } and "
                             "{ full: true } is not supported.")
    if background and req.body.get("repair"):
        raise MongoError(72, "Running the validate command with both { background: true } and "
                             "{ repair: true } is not supported.")
    return full, background


def _index_check(coll: "Collection", idx: "Index") -> tuple[int, list[dict], list[dict]]:
    """``(keys, extra, missing)`` of one index against the documents."""
    if idx.name == "_id_":
        return len(coll.docs), [], []
    keys = 0
    wanted: dict[Any, Any] = {}
    for k, doc in coll.docs.items():
        for hk, kv in idx.keys_of(doc):
            keys += 1
            wanted[hk] = (k, kv)
    extra: list[dict] = []
    missing: list[dict] = []
    if idx.unique:
        for hk, owner in idx.entries.items():
            got = wanted.get(hk)
            if got is None or got[0] != owner:
                extra.append({"indexName": idx.name, "recordId": str(owner),
                              "keyString": repr(hk)})
        for hk, (k, kv) in wanted.items():
            if idx.entries.get(hk) != k:
                missing.append({"indexName": idx.name, "recordId": str(k), "indexKey": kv})
    return keys, extra, missing


def validate_collection(node: "ShardNode", coll: "Collection", full: bool,
                        background: bool) -> dict[str, Any]:
    """The reply body of ``validate`` for ``coll`` (see the module docstring)."""
    corrupt: list[Any] = []
    if full:
        for k, doc in coll.docs.items():
            try:
                bson.encode(doc)
            except Exception:
                corrupt.append(str(k))
    keys_per_index: dict[str, int] = {}
    details: dict[str, Any] = {}
    extra: list[dict] = []
    missing: list[dict] = []
    for name, idx in coll.indexes.items():
        n, e, m = _index_check(coll, idx)
        keys_per_index[name] = n
        details[name] = {"valid": not e and not m}
        extra += e
        missing += m
    errors: list[str] = []
    if extra or missing:
        errors.append("One or more indexes contain invalid index entries.")
    if corrupt:
        errors.append(f"Detected {len(corrupt)} corrupt records")
    out: dict[str, Any] = {
        "ns": coll.ns, "uuid": Binary(coll.uuid, 4), "nInvalidDocuments": len(corrupt),
        "nNonCompliantDocuments": 0, "nrecords": len(coll.docs), "nIndexes": len(coll.indexes),
        "keysPerIndex": keys_per_index, "indexDetails": details,
        "valid": not errors, "repaired": False,
    }
    if background:  # a checkpoint's timestamp: the last durable write here
        ts = node.oplog.last_ts()
        out["readTimestamp"] = ts if ts is not None else Timestamp(0, 0)
    out.update({"warnings": [], "errors": errors, "extraIndexEntries": extra,
                "missingIndexEntries": missing, "corruptRecords": corrupt})
    return out


@commands.handler("validate", secondary="optIn", privileges=priv.on_coll("validate"))
async def validate(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{validate: <coll>, full?, background?, repair?, metadata?}``: see the module docstring."""
    name = ddl_name(req)
    full, background = _options(req)
    coll = node.storage.get(req.db, name)
    if coll is None:
        if node.storage.view_def(req.db, name) is not None:
            raise view_error(f"{req.db}.{name}")
        raise MongoError(26, f"Collection '{req.db}.{name}' does not exist to validate.")
    return validate_collection(node, coll, full, background)


@commands.handler("fsync", privileges=priv.on_cluster("fsync"))
async def fsync(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{fsync: 1}`` on ``admin`` (mongod's ``FSyncCommand``, ``src/mongo/db/commands/fsync.cpp``):
    writes what a durable shard (``--dbpath``) has not committed yet, then ``{numFiles: 1}``.
    Unauthorized (13) on another database; ``lock: true`` (fsyncLock, blocking every write
    until fsyncUnlock) is not built: NotImplemented (238)."""
    if req.db != "admin":
        raise MongoError(13, "fsync may only be run against the admin database.")
    if req.get("lock"):
        raise MongoError(238, "fsync with lock: true (fsyncLock) is not supported by shardsim")
    node.flush()
    return {"numFiles": 1}
