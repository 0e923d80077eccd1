"""Recovering a commit decision: ``coordinateCommitTransaction`` with an empty participant
list (mongod's ``coordinate_commit_transaction_cmd.cpp``, the ``recoverCommit`` branch).

A router that never saw a transaction (the client's commit retry went to another mongos)
recovers its outcome from the ``recoveryToken``'s shard with ``coordinateCommitTransaction
{participants: []}`` (``TransactionRouter::Router::_commitWithRecoveryToken``). That shard
answers:

* from its coordinator when it coordinates (or has a persisted coordinator document for) the
  transaction: ``{}`` for commit, NoSuchTransaction (251) for abort;
* else from its own participant (``beginOrContinue`` with ``kContinue``): ``{}`` when the
  transaction committed here; a transaction still in progress (never committed, e.g. the
  first commit never reached the shards) is aborted and answers NoSuchTransaction; a prepared
  one is waited for until it is decided; an aborted or unknown one answers NoSuchTransaction.
  An older txnNumber answers TransactionTooOld (225).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.commands import Request
from shardsim.core.errors import MongoError
from shardsim.shard.sessions import TRANSIENT, full_lsid

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

_ABORTED = "Transaction was aborted"


async def recover_commit_decision(node: "ShardNode", req: Request) -> dict[str, Any]:
    """The outcome of ``req``'s transaction (``lsid``, ``txnNumber``): ``{}`` when committed;
    raises NoSuchTransaction (251, TransientTransactionError) when aborted or unknown (an
    in-progress transaction is aborted first), TransactionTooOld (225), 50768 without
    ``autocommit: false``."""
    lsid = full_lsid(req.get("lsid"))
    txn_number = int(req.get("txnNumber"))
    decision = await node.coordinators.decision_of(lsid, txn_number)
    if decision is not None:
        if decision["decision"] == "commit":
            return {}
        raise MongoError(251, f"{_ABORTED} :: caused by :: "
                              f"{decision['abortStatus'].get('errmsg', '')}", labels=TRANSIENT)
    while True:
        async with node.sessions.checkout(req.body["lsid"]):
            try:
                s, txn = node.sessions.txn_for_end(req)
            except MongoError as exc:
                if exc.code == 251:
                    raise MongoError(251, _ABORTED, labels=TRANSIENT) from None
                raise
            if txn.state == "committed":
                return {}
            if txn.state == "in_progress":  # abortTransactionIfNotPrepared
                txn.rollback(node.storage)
                txn.state = "aborted"
            if txn.state == "aborted":
                raise MongoError(251, _ABORTED, labels=TRANSIENT)
        # prepared: wait until the coordinator's decision reaches this participant
        await node.sessions.wait_decision(1.0)
