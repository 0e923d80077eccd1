"""The shard's internal commands, shardsim's own (not MongoDB commands): the config server
creates a sharded collection's copy on a shard with ``_shardsimEnsureCollection`` (same UUID
everywhere, shard key recorded) and writes marker no-op oplog entries (shardCollection,
migrations) with ``_shardsimNoop``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson import Binary

from shardsim.core.commands import CommandFamily, Request, check_type
from shardsim.core.errors import MongoError
from shardsim.shard.commands.helpers import ddl_name
from shardsim.shard.write_context import WriteContext
from shardsim.core.protocol import shard as shrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode

commands = CommandFamily("internal")


@commands.handler(shrq.EnsureCollection.NAME, privileges=priv.INTERNAL)
async def ensure_collection(node: ShardNode, req: Request) -> dict[str, Any]:
    """``{_shardsimEnsureCollection: <coll>, uuid?, shardKey?, options?, primary?}`` (sent by
    the config server): create the collection with the given UUID
    (logged ``fromMigrate: true`` unless ``primary: true``) or record the shard key on the
    existing one. ``{uuid, created}``. Errors: 14, CollectionUUIDMismatch (361), 73."""
    storage = node.storage
    name = ddl_name(req)
    uuid = req.body.get("uuid")
    if uuid is not None and not (isinstance(uuid, Binary) and uuid.subtype == 4 and len(uuid) == 16):
        raise MongoError(14, "BSON field '_shardsimEnsureCollection.uuid' is the wrong type, "
                             "expected type 'uuid'")
    shard_key = req.body.get("shardKey")
    if shard_key is not None and not isinstance(shard_key, dict):
        raise MongoError(14, "BSON field '_shardsimEnsureCollection.shardKey' is the wrong "
                             "type, expected type 'object'")
    options = check_type(req, "options", dict, "object") or {}
    primary = req.body.get("primary") is True
    coll = storage.get(req.db, name)
    if coll is not None:
        if uuid is not None and bytes(uuid) != coll.uuid:
            raise MongoError(361, "Collection UUID does not match that specified",
                             db=req.db, collectionUUID=uuid, expectedCollection=name,
                             actualCollection=name)
        if shard_key is not None:
            coll.shard_key = dict(shard_key)
            storage.note_catalog(coll)
        return {"uuid": coll.ui, "created": False}
    ctx = WriteContext(from_migrate=not primary)
    coll = node.create_collection(req.db, name, dict(options),
                                  uuid=bytes(uuid) if uuid is not None else None,
                                  shard_key=dict(shard_key) if shard_key else None, ctx=ctx)
    return {"uuid": coll.ui, "created": True}


@commands.handler(shrq.Noop.NAME, privileges=priv.INTERNAL)
async def noop(node: ShardNode, req: Request) -> dict[str, Any]:
    """``{_shardsimNoop: <o>, o2?, ns?, ui?}`` (shardsim's own): write an ``op: "n"``
    oplog entry; ``{ts}`` and ``operationTime`` = its ts. TypeMismatch (14) for a non-object."""
    request = shrq.Noop.parse(req.body)
    ts = node.write_noop(request.o, request.o2, request.ns or "", request.ui)
    return {"ts": ts, "__operationTime": ts}
