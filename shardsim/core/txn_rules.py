"""Which commands may run inside a multi-document transaction (``CommandHelpers::
canUseTransactions`` with ``txnCmdAllowlist``/``txnAdminCommands``, ``src/mongo/db/commands.cpp``;
mongos checks the same in ``strategy.cpp`` before running a command with ``autocommit``).
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


def check_transaction_command(name: str, db: str) -> None:
    """Raise OperationNotSupportedInTransaction (263) when command ``name`` on database ``db``
    may not run inside a transaction (``count`` has its own message). No labels: the error is
    not transient."""
    if name == "count":
        raise MongoError(263, "Cannot run 'count' in a multi-document transaction. Please see "
                              "http://dochub.mongodb.org/core/transaction-count for a recommended "
                              "alternative.")
    if name not in TXN_COMMANDS:
        raise MongoError(263, f"Cannot run '{name}' in a multi-document transaction.")
    if db == "admin" and name not in TXN_ADMIN_COMMANDS:
        raise MongoError(263, f"Cannot run command against the '{db}' database in a "
                              f"transaction.")
