"""Which commands may run inside a multi-document transaction (``CommandHelpers::
canUseTransactions`` with ``txnCmdAllowlist``/``txnAdminCommands``, ``src/mongo/db/commands.cpp``;
mongos checks the same in ``strategy.cpp`` before running a command with ``autocommit``), and
which of them may carry a write concern there (``validateWriteConcernForTransaction``,
``src/mongo/db/transaction/transaction_validation.cpp``).
"""

from __future__ import annotations

from shardsim.core.errors import MongoError

#: commands allowed with ``autocommit: false`` (``txnCmdAllowlist``)
TXN_COMMANDS = frozenset({
    "abortTransaction", "aggregate", "commitTransaction", "coordinateCommitTransaction",
    "create", "createIndexes", "delete", "distinct", "find", "findandmodify", "findAndModify",
    "getMore", "insert", "killCursors", "prepareTransaction", "update", "bulkWrite",
})
#: the ones of those allowed on the ``admin`` database (``txnAdminCommands``)
TXN_ADMIN_COMMANDS = frozenset({"abortTransaction", "commitTransaction",
                                "coordinateCommitTransaction", "prepareTransaction", "bulkWrite"})


# Aggregation stages whose constraints say TransactionRequirement::kNotAllowed.
NO_TXN_STAGES = ("$out", "$merge", "$collStats", "$currentOp", "$indexStats", "$listSessions",
                 "$listLocalSessions", "$planCacheStats")


def check_transaction_command(name: str, db: str, body: dict | None = None) -> None:
    """Raise OperationNotSupportedInTransaction (263) when command ``name`` on database ``db``
    may not run inside a transaction (``count`` has its own message), or an ``aggregate``
    (``body``) has a stage that may not (``Pipeline::validateCommon``: "Stage not supported
    inside of a multi-document transaction: $out"). No labels: the error is not transient."""
    if name == "aggregate" and body is not None and isinstance(body.get("pipeline"), list):
        for stage in body["pipeline"]:
            if isinstance(stage, dict) and len(stage) == 1 and next(iter(stage)) in NO_TXN_STAGES:
                raise MongoError(263, f"Stage not supported inside of a multi-document "
                                      f"transaction: {next(iter(stage))}")
    if name == "count":
        raise MongoError(263, "Cannot run 'count' in a multi-document transaction. Please see "
                              "http://dochub.mongodb.org/core/transaction-count for a recommended "
                              "alternative.")
    if name not in TXN_COMMANDS:
        raise MongoError(263, f"Cannot run '{name}' in a multi-document transaction.")
    if db == "admin" and name not in TXN_ADMIN_COMMANDS:
        raise MongoError(263, f"Cannot run command against the '{db}' database in a "
                              f"transaction.")


#: transaction statements that take a write concern outside a transaction (their
#: ``supportsWriteConcern``): inside one they may not carry it
TXN_WRITE_CONCERN_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify",
                                        "findandmodify", "create", "createIndexes", "bulkWrite"})


def check_transaction_write_concern(name: str, body: dict) -> None:
    """InvalidOptions (72) "writeConcern is not allowed within a multi-statement transaction"
    for a statement of a transaction (``autocommit: false``), the first included, that sets
    ``writeConcern``; only ``commitTransaction``/``abortTransaction`` (and the internal
    ``prepareTransaction``/``coordinateCommitTransaction``) may. mongod checks it in
    ``RunCommandAndWaitForWriteConcern::_setup`` (``service_entry_point_common.cpp``), mongos in
    ``ParseAndRunCommand::_parseCommand`` (``strategy.cpp``), both with
    ``validateWriteConcernForTransaction``; an empty ``writeConcern: {}`` is no write concern
    (the default is used)."""
    if body.get("autocommit") is not False or name not in TXN_WRITE_CONCERN_COMMANDS:
        return
    wc = body.get("writeConcern")
    if wc is not None and wc != {}:
        raise MongoError(72, "writeConcern is not allowed within a multi-statement transaction")
