"""What a write contributes to its oplog entries besides the operation itself.

Kept apart from :mod:`shard.node` so the command modules (:mod:`shard.commands`) can build
contexts without importing the node class that installs them.
"""

from __future__ import annotations

from typing import Any


class WriteContext:
    """Session fields, ``fromMigrate`` and the open transaction of a write.

    ``lsid``/``txn_number`` (set for retryable writes and transactions) become the entry's
    ``lsid``, ``txnNumber`` and ``prevOpTime``; ``stmt_id`` its ``stmtId``; ``from_migrate`` its
    ``fromMigrate: true`` (``oplog_entry.idl``). ``txn`` is the open
    :class:`shard.sessions.Transaction` that buffers operations instead of logging them, and
    ``retry`` the :class:`shard.sessions.Session` of a retryable write; ``routed``: the write
    came from a router with a sharded ``shardVersion`` (``isComingFromRouter``), so a change of
    the shard key is checked (:mod:`shard.shard_key_update`).
    """

    __slots__ = ("lsid", "txn_number", "from_migrate", "txn", "stmt_id", "retry", "routed")

    def __init__(self, lsid: Any = None, txn_number: Any = None, from_migrate: bool = False,
                 txn: Any = None) -> None:
        self.lsid = lsid
        self.txn_number = txn_number
        self.from_migrate = from_migrate
        self.txn = txn
        self.stmt_id: int | None = None
        self.retry: Any = None  # the Session of a retryable write
        self.routed = False


NO_CONTEXT = WriteContext()
