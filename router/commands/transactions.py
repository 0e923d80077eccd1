"""Ending a transaction through the router: ``commitTransaction``, ``abortTransaction``
(mongos' ``cluster_commit_transaction_cmd.cpp`` / ``cluster_abort_transaction_cmd.cpp``).

A transaction through the router uses one shard (the state is
:class:`router.transactions.TransactionRouter`, ``RouterNode.transactions``); both commands are
forwarded to that shard. ``startTransaction`` needs no command of its own: it rides on the
transaction's first statement, which the read and write paths forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.forwarding import forwardable, reply_body
from shardsim.commands import CommandFamily, Request
from shardsim.errors import MongoError

if TYPE_CHECKING:  # pragma: no cover
    from router.node import RouterNode

commands = CommandFamily("transactions")


@commands.handler("commitTransaction")
async def commit_transaction(node: "RouterNode", req: Request) -> dict[str, Any]:
    """Commit on the transaction's shard and return its reply body; ``{}`` for a transaction
    that touched no shard (nothing to commit)."""
    shard = node.transactions.shard_of(req)
    if shard is None:
        return {}
    return reply_body(await node.shard_command(shard, "admin", forwardable(req.body)))


@commands.handler("abortTransaction")
async def abort_transaction(node: "RouterNode", req: Request) -> dict[str, Any]:
    """Abort on the transaction's shard, forget the transaction, return the shard's reply body.
    NoSuchTransaction (251, TransientTransactionError) for a transaction that touched no shard;
    the shard's error as it is (the transaction is then kept)."""
    shard = node.transactions.shard_of(req)
    if shard is None:
        txn_number = node.transactions.key(req)[1]
        raise MongoError(251, f"Transaction with {{ txnNumber: {txn_number} }} has been aborted.",
                         labels=["TransientTransactionError"])
    reply = await node.shard_command(shard, "admin", forwardable(req.body))
    node.transactions.end(req)
    return reply_body(reply)
