"""Recovering a commit decision on the coordinator shard (mongod's
``txn_two_phase_commit_cmds.cpp``, ``CoordinateCommitTransactionCmd::typedRun``).

``coordinateCommitTransaction`` reaches this module in two ways:

* with an empty participant list: a router that never saw the transaction (the client's commit
  retry went to another mongos) recovers its outcome with the ``recoveryToken``
  (``TransactionRouter::Router::_commitWithRecoveryToken``), and so does a router retrying the
  commit of a single-write-shard transaction (a synthetic token). The shard answers from its
  coordinator when it coordinates (or has a persisted coordinator document for) the
  transaction (``TransactionCoordinatorService::recoverCommit``; a coordination not yet started
  is not started: ``cancelIfCommitNotYetStarted``);
* with participants, when no coordinator exists any more (its coordination completed and its
  document is deleted, or a restart found none: ``coordinateCommit`` returns ``boost::none``).
  A retried commit never starts a second two-phase commit.

Either way, without a coordinator the outcome comes from this shard's own participant
(``TransactionParticipant::beginOrContinue`` with ``kContinue``, :func:`recover_from_participant`):

* committed (also across a restart: the session record keeps ``state: "committed"``): ``{}``;
* in progress (the first commit never reached this shard): aborted here, then NoSuchTransaction;
* prepared: waits until the coordinator's decision reaches it (``onExitPrepare``), then as above;
* aborted: NoSuchTransaction (251) "Recovering the transaction's outcome found the transaction
  aborted";
* another txnNumber: TransactionTooOld (225) for an older one, NoSuchTransaction "Given
  transaction number N does not match any in-progress transactions. ..." for a newer one.

NoSuchTransaction on a commit carries TransientTransactionError (``error_labels.cpp``
``isTransientTransactionError``: ``coordinateCommitTransaction`` is a commit command, the label
is left off only with a write concern error): the transaction is aborted on every shard, so
running it again is safe. A committed transaction always answers ok.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.commands import Request
from shardsim.core.errors import MongoError
from shardsim.shard.sessions import TRANSIENT, full_lsid

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

_ABORTED = "Transaction was aborted"
_FOUND_ABORTED = "Recovering the transaction's outcome found the transaction aborted"


def decision_reply(decision: dict[str, Any]) -> dict[str, Any]:
    """The reply to ``coordinateCommitTransaction`` for a coordinator's ``decision``: ``{}``
    for commit; for abort the abort status with the context "Transaction was aborted"
    (``uassertStatusOKWithContext``): OperationNotSupportedInTransaction (263) when a
    participant refused to prepare a transaction that created a collection, else
    NoSuchTransaction (251, TransientTransactionError)."""
    if decision["decision"] == "commit":
        return {}
    status = decision.get("abortStatus") or {}
    if status.get("code") == 263:
        # create_new_collections_prepared_transactions.js: the client gets that reason
        raise MongoError(263, str(status.get("errmsg", "")))
    raise MongoError(251, f"{_ABORTED} :: caused by :: {status.get('errmsg', '')}",
                     labels=TRANSIENT)


async def recover_commit_decision(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``coordinateCommitTransaction {participants: []}``: the outcome of ``req``'s
    transaction (``lsid``, ``txnNumber``) from this shard's coordinator
    (:func:`decision_reply`), else from its participant (:func:`recover_from_participant`)."""
    lsid = full_lsid(req.get("lsid"))
    decision = await node.coordinators.decision_of(lsid, int(req.get("txnNumber")))
    if decision is not None:
        return decision_reply(decision)
    return await recover_from_participant(node, req)


async def recover_from_participant(node: "ShardNode", req: Request) -> dict[str, Any]:
    """The outcome of ``req``'s transaction as this shard's participant knows it (module
    docstring): ``{}`` when committed; raises NoSuchTransaction (251, TransientTransactionError)
    when aborted (an in-progress transaction is aborted first) or unknown, TransactionTooOld
    (225), 50768 without a session or ``autocommit: false``. A prepared transaction is waited
    for."""
    while True:
        async with node.sessions.checkout(req.body["lsid"]):
            _s, txn = node.sessions.txn_for_end(req)  # 225, 251 "Given transaction number ..."
            if txn.state == "committed":
                return {}
            if txn.state == "in_progress":  # abortTransaction on the local participant
                txn.rollback(node.storage)
                txn.state = "aborted"
            if txn.state == "aborted":
                raise MongoError(251, _FOUND_ABORTED, labels=TRANSIENT)
        # prepared: wait until the coordinator's decision reaches this participant
        await node.sessions.wait_decision(1.0)
