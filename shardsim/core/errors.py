"""MongoDB error codes, names and labels, and the exception every role raises.

Source of the codes: ``src/mongo/base/error_codes.yml`` in mongodb/mongo (8.0), and for the
labels ``src/mongo/db/error_labels.cpp`` (see ``shared/reference/server-internals-notes.md`` §6).
"""

from __future__ import annotations

from typing import Any, Iterable

from shardsim.core.error_codes import ERROR_CODE_NAMES

# code -> codeName: every code of the server's error_codes.yml (shardsim/error_codes.py says
# where the table came from). Any other code is an assertion-site code: "Location<code>".
CODE_NAMES: dict[int, str] = ERROR_CODE_NAMES


# Codes whose errors get `ResumableChangeStreamError` when they fail a change stream's
# aggregate/getMore: isRetriableError || isNetworkError || isNeedRetargettingError || 234 || 133
# (error_labels.cpp; error_codes.yml categories RetriableError, NetworkError, NeedRetargettingError).
RESUMABLE_CHANGE_STREAM_CODES: frozenset[int] = frozenset({
    6, 7, 89, 91, 133, 134, 150, 189, 234, 262, 317, 358, 384, 402, 406, 407, 412, 453, 462,
    9001, 10107, 11600, 11602, 13388, 13435, 13436, 50915, 91331, 10045600,
})

# Category NonResumableChangeStreamError (error_codes.yml).
NON_RESUMABLE_CHANGE_STREAM_CODES: frozenset[int] = frozenset({280, 286})

# Category RetriableError: the driver's retryable-writes rule adds RetryableWriteError for these.
RETRYABLE_WRITE_CODES: frozenset[int] = frozenset({
    6, 7, 89, 91, 134, 189, 262, 317, 358, 384, 402, 406, 407, 412, 453, 462, 9001, 10107,
    11600, 11602, 13435, 13436, 50915, 91331, 10045600,
})


def code_name(code: int) -> str:
    """The server's codeName for ``code``: the name ``error_codes.yml`` gives it, else
    ``"Location<code>"`` (an assertion-site code such as 40324, as mongod reports it)."""
    return CODE_NAMES.get(code, f"Location{code}")


class MongoError(Exception):
    """A command failure that becomes an ``{ok: 0, errmsg, code, codeName[, errorLabels]}`` reply.

    ``code`` is a MongoDB error code (int); ``labels`` are the ``errorLabels`` strings;
    ``extra`` fields are appended to the reply (e.g. ``keyPattern``/``keyValue`` for 11000,
    ``writeErrors`` for a bulk write).
    """

    def __init__(self, code: int, errmsg: str, *, labels: Iterable[str] = (),
                 code_name_override: str | None = None, **extra: Any) -> None:
        super().__init__(errmsg)
        self.code = int(code)
        self.errmsg = errmsg
        self.code_name = code_name_override or code_name(self.code)
        self.labels: list[str] = list(labels)
        self.extra = extra

    def to_reply(self) -> dict[str, Any]:
        """The error reply body in the server's field order: ok, errmsg, code, codeName, then extras."""
        reply: dict[str, Any] = {"ok": 0.0, "errmsg": self.errmsg, "code": self.code,
                                 "codeName": self.code_name}
        reply.update(self.extra)
        if self.labels:
            reply["errorLabels"] = list(self.labels)
        return reply

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"MongoError({self.code}, {self.errmsg!r}, labels={self.labels})"


def error(code: int, errmsg: str, **extra: Any) -> MongoError:
    """Shorthand constructor: ``raise error(2, "bad")``."""
    return MongoError(code, errmsg, **extra)


def change_stream_labels(code: int, *, is_change_stream: bool, command: str,
                         profile: Any = None) -> list[str]:
    """The errorLabels a server adds to a failed command (error_labels.cpp ErrorLabelBuilder).

    ``ResumableChangeStreamError`` when an aggregate/getMore of a change stream fails with a
    resumable code; else ``NonResumableChangeStreamError`` for codes 280/286 on any command.
    ``profile`` (a :class:`shardsim.core.server_version.ServerProfile`, None = 8.0): on 6.0
    code 63 is StaleShardVersion, a NeedRetargettingError and so resumable (error_codes.yml of
    6.0; OBSOLETE from 7.0).
    """
    resumable = code in RESUMABLE_CHANGE_STREAM_CODES or (
        profile is not None and code in profile.extra_resumable_codes)
    if command in ("aggregate", "getMore") and is_change_stream and resumable:
        return ["ResumableChangeStreamError"]
    if code in NON_RESUMABLE_CHANGE_STREAM_CODES:
        return ["NonResumableChangeStreamError"]
    return []


def view_error(ns: str) -> MongoError:
    """CommandNotSupportedOnView (166) as ``AutoGetCollection`` raises it for a view."""
    return MongoError(166, f"Namespace {ns} is a view, not a collection")


_COMMIT_OR_ABORT = frozenset({"commitTransaction", "coordinateCommitTransaction",
                              "abortTransaction"})


def is_transient_transaction_error(code: int, *, has_write_concern_error: bool,
                                   commit_or_abort: bool) -> bool:
    """``isTransientTransactionError`` (``src/mongo/db/error_labels.cpp``): WriteConflict (112),
    LockTimeout (24), PreparedTransactionInProgress (267), the SnapshotError and
    NeedRetargettingError categories, ShardInvalidatedForTargeting and StaleDbVersion (249);
    for commit/abort also NoSuchTransaction (251) without a write concern error, for any other
    statement NoSuchTransaction and every RetriableError code."""
    from shardsim.core.error_codes import codes_in_category

    transient = code in (112, 24, 267, 249) or code in codes_in_category("SnapshotError") or \
        code in codes_in_category("NeedRetargettingError") or \
        CODE_NAMES.get(code) == "ShardInvalidatedForTargeting"
    if commit_or_abort:
        return transient or (code == 251 and not has_write_concern_error)
    return transient or code == 251 or code in RETRYABLE_WRITE_CODES


def transaction_labels(code: int | None, *, command: str, body: dict[str, Any],
                       wc_code: int | None = None) -> list[str]:
    """The labels ``ErrorLabelBuilder::build`` (``error_labels.cpp``) gives a failed command of
    a session: ``TransientTransactionError`` for a statement or commit/abort of a transaction
    (``txnNumber`` and ``autocommit`` present) failing with a transient code
    (:func:`is_transient_transaction_error`); otherwise ``RetryableWriteError`` for a retryable
    write (``txnNumber`` without ``autocommit``) or a commit/abort failing (or with a write
    concern error) with a RetriableError code. The two never come together. ``[]`` outside
    sessions with a txnNumber."""
    if "txnNumber" not in body:
        return []
    in_txn = "autocommit" in body
    commit_or_abort = command in _COMMIT_OR_ABORT
    if in_txn and code is not None and is_transient_transaction_error(
            code, has_write_concern_error=wc_code is not None, commit_or_abort=commit_or_abort):
        return ["TransientTransactionError"]
    if not in_txn or commit_or_abort:
        if (code is not None and code in RETRYABLE_WRITE_CODES) or \
                (wc_code is not None and wc_code in RETRYABLE_WRITE_CODES):
            return ["RetryableWriteError"]
    return []
