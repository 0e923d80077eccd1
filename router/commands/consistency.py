"""``checkMetadataConsistency`` through the router (mongos'
``cluster_check_metadata_consistency_cmd.cpp``): a cursor over the metadata inconsistencies
found between the config server's catalog and the shards.

shardsim's catalog has one writer (the config server) and DDL that updates it and the shards in
one step, so there is nothing inconsistent to report: the cursor is always empty. The levels
and their errors are mongos': ``{checkMetadataConsistency: 1}`` on ``admin`` (cluster level),
on another database (database level: NamespaceNotFound 26 when the database does not exist),
or ``{checkMetadataConsistency: "<coll>"}`` (collection level).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.commands import CommandFamily, Request
from shardsim.errors import MongoError

if TYPE_CHECKING:  # pragma: no cover
    from router.node import RouterNode

commands = CommandFamily("consistency")


@commands.handler("checkMetadataConsistency")
async def check_metadata_consistency(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{checkMetadataConsistency: 1|"<coll>", cursor?: {batchSize}}`` -> ``{cursor: {id,
    ns: "<db>.$cmd.checkMetadataConsistency", firstBatch: []}}``. Errors: InvalidNamespace
    (73) for ``config``/``local`` or a collection level on ``admin``, NamespaceNotFound (26)
    for a database the catalog does not know, TypeMismatch (14) for another argument type."""
    db, arg = req.db, req.arg
    if db in ("config", "local"):
        raise MongoError(73, f"Invalid db name: {db}")
    if isinstance(arg, str):
        if db == "admin":
            raise MongoError(73, "Cannot run collection-level checkMetadataConsistency on the "
                                 "admin database")
    elif isinstance(arg, bool) or not isinstance(arg, (int, float)) or arg != 1:
        raise MongoError(14, "checkMetadataConsistency argument must be 1 or a collection name")
    if db != "admin" and node.catalog.primary_shard(db) is None:
        await node.catalog.refresh()
        if node.catalog.primary_shard(db) is None:
            raise MongoError(26, f"Database {db} not found")
    batch_size = (req.get("cursor") or {}).get("batchSize")
    return await node.cursor_reply(f"{db}.$cmd.checkMetadataConsistency", [], req, batch_size)
