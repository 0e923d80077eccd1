"""The shard's half of an update that changes a document's shard key: the checks of mongod's
``UpdateStage::wasExistingShardKeyUpdated`` / ``_checkRestrictionsOnUpdatingShardKeyAreNotViolated``
(``src/mongo/db/exec/update_stage.cpp``) and ``UpsertStage::_performInsert``
(``src/mongo/db/exec/upsert_stage.cpp``), as MongoDB 8.0 runs them with
``featureFlagUpdateDocumentShardKeyUsingTransactionApi`` off (its default in 8.0):

* an update of a routed request (one carrying a sharded ``shardVersion``) that changes the
  shard-key value of the document it updates:

  * ``multi: true``: InvalidOptions (72) "Multi-update operations are not allowed when updating
    the shard key field.";
  * neither a retryable write nor in a transaction (no ``txnNumber``): IllegalOperation (20)
    "Must run update to shard key field in a multi-statement transaction or with retryWrites:
    true." (also when the document would stay on this shard);
  * the new key belongs to a chunk this shard does not own: WouldChangeOwningShard (283)
    "This update would cause the doc to change owning shards" with the extra info
    ``{preImage, postImage, shouldUpsert: false}`` (``WouldChangeOwningShardInfo::serialize``,
    ``src/mongo/s/would_change_owning_shard_exception.cpp``); nothing is written;

* an upsert whose new document belongs to another shard: IllegalOperation (20) "The upsert
  document could not be inserted onto the shard targeted by the query, since its shard key
  belongs on a different shard. Cross-shard upserts are only allowed when running in a
  transaction or with retryWrites: true." without a ``txnNumber``, else WouldChangeOwningShard
  (283) "The document we are inserting belongs on a different shard" with ``{preImage: <the
  query>, postImage: <the new document>, shouldUpsert: true}``.

The router reacts to 283 (:mod:`router.shard_key_update`). Inside a transaction a 283 write
error leaves the transaction open (the router goes on with a delete and an insert in it).

Not faithful: the query of a shard-key-changing update need not pin the full shard key (mongod:
31025 "Shard key update is not allowed without specifying the full shard key in the query",
unless the router's two-phase write allows it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import bson

from shardsim.core.errors import MongoError
from shardsim.core.shard_key import get_path

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode
    from shardsim.shard.write_context import WriteContext

WCOS = 283
UPDATE_MOVES = "This update would cause the doc to change owning shards"
UPSERT_MOVES = "The document we are inserting belongs on a different shard"
NEEDS_SESSION = ("Must run update to shard key field in a multi-statement transaction or with "
                 "retryWrites: true.")
UPSERT_NEEDS_SESSION = ("The upsert document could not be inserted onto the shard targeted by "
                        "the query, since its shard key belongs on a different shard. Cross-shard "
                        "upserts are only allowed when running in a transaction or with "
                        "retryWrites: true.")
MULTI = "Multi-update operations are not allowed when updating the shard key field."


def _metadata(node: "ShardNode", ctx: "WriteContext", ns: str) -> Any:
    """The filtering metadata of ``ns`` when this write was routed to a sharded collection
    (``OperationShardingState::isComingFromRouter`` and ``collDesc.isSharded()``), else None."""
    if not ctx.routed or ctx.from_migrate:
        return None
    meta = node.sharding.metadata.get(ns)
    return meta if meta is not None and meta.chunks is not None else None


def _key_bytes(pattern: Any, doc: dict[str, Any]) -> bytes:
    """The shard-key value of ``doc`` (missing fields as null, as ``extractShardKeyFromDoc``)
    as BSON, for a binary comparison."""
    return bson.encode({str(i): get_path(doc, f)[1] for i, f in enumerate(pattern.fields)})


def wcos_error(pre: Any, post: dict[str, Any], upsert: bool) -> MongoError:
    """WouldChangeOwningShard (283) with ``preImage``, ``postImage``, ``shouldUpsert``."""
    return MongoError(WCOS, UPSERT_MOVES if upsert else UPDATE_MOVES,
                      preImage=pre, postImage=post, shouldUpsert=upsert)


def check_update(node: "ShardNode", ctx: "WriteContext", ns: str, old: dict[str, Any],
                 new: dict[str, Any], multi: bool) -> None:
    """Raise as the module docstring says when updating ``old`` to ``new`` changes its shard
    key (``wasExistingShardKeyUpdated``); return when the key is unchanged or stays here."""
    meta = _metadata(node, ctx, ns)
    if meta is None or _key_bytes(meta.pattern, old) == _key_bytes(meta.pattern, new):
        return
    meta.pattern.key_of_doc(new)  # BadValue (2) for an array in a shard-key field
    if multi:
        raise MongoError(72, MULTI)
    if ctx.txn_number is None:
        raise MongoError(20, NEEDS_SESSION)
    if not meta.owns(new):
        raise wcos_error(old, new, False)


def check_upsert(node: "ShardNode", ctx: "WriteContext", ns: str, query: Any,
                 new: dict[str, Any]) -> None:
    """Raise as the module docstring says when the upserted ``new`` belongs to another shard
    (``UpsertStage::_performInsert``)."""
    meta = _metadata(node, ctx, ns)
    if meta is None or meta.owns(new):
        return
    if ctx.txn_number is None:
        raise MongoError(20, UPSERT_NEEDS_SESSION)
    raise wcos_error(query, new, True)
