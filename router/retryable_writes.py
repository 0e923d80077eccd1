"""Retryable writes through the router, as mongos runs them: the router keeps no retry record.

A client's retryable write (``lsid`` + ``txnNumber``, no ``autocommit``) is forwarded to every
shard it targets with the same ``lsid`` and ``txnNumber`` and, per child batch, the
``stmtIds`` of the statements it carries (``write_ops::getStmtIdForWriteAt``: the client's
``stmtIds[i]``, else ``stmtId + i``, else ``i``; ``batch_write_op.cpp``
``BatchWriteOp::buildBatchRequest``). Each shard keeps its session record
(``config.transactions``, :mod:`shard.sessions`) and answers a statement it already executed
from that record without applying it again, so a retry after a client timeout, a router crash
or a shard restart is applied once whichever router runs it.

Sending a child batch of a retryable write is idempotent, so the router itself retries it on a
retriable error (mongos' ``Shard::RetryPolicy::kIdempotent`` in
``batch_write_exec.cpp`` ``executeChildBatches``); a batch that still cannot be sent becomes
write errors ("Write results unavailable from <shard>", ``processErrorResponseFromLocal``),
never a top-level error of the client's command.

The same policy, through the same helper (:func:`send_idempotent`), covers the other retryable
writes mongos 8.0 retries itself:

* ``findAndModify`` with ``lsid``/``txnNumber``: ``cluster_find_and_modify_cmd.cpp``
  (``_runCommand``) sends it with ``isRetryableWrite ? Shard::RetryPolicy::kIdempotent :
  Shard::RetryPolicy::kNoRetry``; the new primary answers a retry from its session record and
  retry image, so the document is modified once and the reply carries the first pre/post image.
  A plain findAndModify is sent once (``kNoRetry``): it may have run, so its error goes to the
  client as is.
* ``bulkWrite``'s child batches: ``bulk_write_exec.cpp`` (``executeChildBatches``) uses
  ``kIdempotent`` when the operation has a ``txnNumber`` outside a transaction, else
  ``kNoRetry``.

Retry policy (``shard.cpp`` ``Shard::remoteIsRetriableError``): ``kIdempotent`` retries the
retriable error category (``isMongosRetriableError``: network, shutdown, not-primary) or a
``RetryableWriteError`` label; ``kNotIdempotent`` only a not-primary error (the command did not
run); ``kNoRetry`` nothing. ``AsyncRequestsSender`` (``async_requests_sender.cpp``
``handleResponse``) tells the shard's monitor of the failed host (``updateReplSetMonitor``;
here :meth:`router.node.RouterNode.shard_command_at` reports it to
:mod:`router.shard_registry`) and retries while ``_retryCount < kMaxNumFailedHostRetryAttempts``
(3): up to 4 attempts, each targeting the primary anew (waiting for an election up to
``defaultFindReplicaSetHostTimeoutMS``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from shardsim.core.errors import RETRYABLE_WRITE_CODES, MongoError

# Codes after which a child batch of a retryable write is sent again (ErrorCategory::
# RetriableError in error_codes.yml: network errors, shutdown, not-primary).
RETRIABLE_CODES = RETRYABLE_WRITE_CODES
# Attempts per request (the first one and AsyncRequestsSender's kMaxNumFailedHostRetryAttempts,
# 3, retries).
MAX_ATTEMPTS = 4
RETRY_PAUSE_S = 0.05
# FailedToSatisfyReadPreference: no member of the shard to send the child batch to.
TARGETING_FAILED = 133


def is_retryable(body: dict[str, Any]) -> bool:
    """True for a retryable write: ``lsid`` and ``txnNumber`` outside a transaction."""
    return isinstance(body.get("lsid"), dict) and body.get("txnNumber") is not None and \
        body.get("autocommit") is not False


def stmt_id_at(body: dict[str, Any], index: int) -> int:
    """The stmtId of the client's ``index``-th statement (``write_ops::getStmtIdForWriteAt``):
    ``stmtIds[index]`` when the client sent ``stmtIds``, else ``stmtId + index`` (``stmtId``
    defaults to 0)."""
    ids = body.get("stmtIds")
    if isinstance(ids, list) and index < len(ids):
        return int(ids[index])
    base = body.get("stmtId", 0)
    return int(base or 0) + index


async def send_idempotent(send: Any, retryable: bool) -> Any:
    """Await ``send()`` (a coroutine factory); for a retryable write (``retryable``: mongos'
    ``RetryPolicy::kIdempotent``), again (up to :data:`MAX_ATTEMPTS` in all) while it fails
    with a :data:`RETRIABLE_CODES` MongoError or one labelled ``RetryableWriteError``
    (``Shard::remoteIsRetriableError``); otherwise once (``kNoRetry``). ``send`` targets the
    shard anew on each call (the failed host was reported to the shard's monitor). Returns its
    result or raises its last error. Used by a retryable write's child batches (insert, update,
    delete, bulkWrite) and by a retryable findAndModify."""
    attempts = MAX_ATTEMPTS if retryable else 1
    for attempt in range(attempts):
        try:
            return await send()
        except MongoError as exc:
            if attempt + 1 >= attempts or not _retriable(exc):
                raise
        await asyncio.sleep(RETRY_PAUSE_S)
    raise AssertionError("unreachable")  # pragma: no cover


def _retriable(exc: MongoError) -> bool:
    """``Shard::remoteIsRetriableError`` under ``kIdempotent``: the code or the label."""
    return exc.code in RETRIABLE_CODES or "RetryableWriteError" in (exc.labels or ())


def unavailable_error(index: int, shard: str, exc: MongoError) -> dict[str, Any]:
    """The write error of a statement whose child batch got no reply from ``shard``:
    ``{index, code, errmsg: "Write results unavailable from <shard> :: caused by :: ..."}``
    (``batch_write_exec.cpp`` ``processErrorResponseFromLocal``); when no member of the shard
    could be targeted (FailedToSatisfyReadPreference 133), "Write results unavailable from
    failing to target a host in the shard <shard> :: caused by :: Could not find host ..." as
    mongos words it."""
    where = (f"failing to target a host in the shard {shard}" if exc.code == TARGETING_FAILED
             else shard)
    return {"index": index, "code": exc.code,
            "errmsg": f"Write results unavailable from {where} :: caused by :: {exc.errmsg}"}
