"""MongoDB error codes, names and labels, and the exception every role raises.

Source of the codes: ``src/mongo/base/error_codes.yml`` in mongodb/mongo (8.0), and for the
labels ``src/mongo/db/error_labels.cpp`` (see ``shared/reference/server-internals-notes.md`` §6).
"""

from __future__ import annotations

from typing import Any, Iterable

# code -> codeName (the subset the roles can raise or forward; unknown codes render as "Location<N>").
CODE_NAMES: dict[int, str] = {
    1: "InternalError",
    2: "BadValue",
    4: "NoSuchKey",
    6: "HostUnreachable",
    7: "HostNotFound",
    8: "UnknownError",
    9: "FailedToParse",
    11: "UserNotFound",
    13: "Unauthorized",
    14: "TypeMismatch",
    15: "Overflow",
    20: "IllegalOperation",
    22: "InvalidBSON",
    26: "NamespaceNotFound",
    27: "IndexNotFound",
    40: "ConflictingUpdateOperators",
    43: "CursorNotFound",
    46: "LockBusy",
    48: "NamespaceExists",
    50: "MaxTimeMSExpired",
    52: "DollarPrefixedFieldName",
    54: "NotSingleValueField",
    56: "EmptyFieldName",
    59: "CommandNotFound",
    61: "ShardKeyNotFound",
    63: "OBSOLETE_StaleShardVersion",
    66: "ImmutableField",
    67: "CannotCreateIndex",
    68: "IndexAlreadyExists",
    70: "ShardNotFound",
    72: "InvalidOptions",
    73: "InvalidNamespace",
    79: "UnknownReplWriteConcern",
    85: "IndexOptionsConflict",
    86: "IndexKeySpecsConflict",
    89: "NetworkTimeout",
    91: "ShutdownInProgress",
    96: "OperationFailed",
    100: "UnsatisfiableWriteConcern",
    112: "WriteConflict",
    115: "CommandNotSupported",
    117: "ConflictingOperationInProgress",
    118: "NamespaceNotSharded",
    125: "CommandFailed",
    133: "FailedToSatisfyReadPreference",
    136: "CappedPositionLost",
    148: "ReadConcernMajorityNotEnabled",
    150: "StaleEpoch",
    121: "DocumentValidationFailure",
    168: "InvalidPipelineOperator",
    192: "FailPointEnabled",
    140: "UnsupportedFormat",
    205: "ClusterTimeFailsRateLimiter",
    206: "NoSuchSession",
    217: "IncompleteTransactionHistory",
    222: "CloseChangeStream",
    223: "IllegalOpMsgFlag",
    233: "TooManyDocumentSequences",
    166: "CommandNotSupportedOnView",
    167: "OptionNotSupportedOnView",
    169: "CommandOnShardedViewNotSupportedOnMongod",
    175: "QueryPlanKilled",
    189: "PrimarySteppedDown",
    211: "KeyNotFound",
    225: "TransactionTooOld",
    234: "RetryChangeStream",
    237: "CursorKilled",
    244: "NOT_YET_AVAILABLE_TransactionAborted",
    238: "NotImplemented",
    239: "SnapshotTooOld",
    251: "NoSuchTransaction",
    256: "TransactionCommitted",
    260: "InvalidResumeToken",
    262: "ExceededTimeLimit",
    263: "OperationNotSupportedInTransaction",
    267: "PreparedTransactionInProgress",
    266: "FailPointSetFailed",
    279: "ClientDisconnect",
    280: "ChangeStreamFatalError",
    286: "ChangeStreamHistoryLost",
    288: "ChecksumMismatch",
    326: "OplogQueryMinTsMissing",
    346: "ChangeStreamInvalidated",
    348: "ChangeStreamTopologyChange",
    351: "ChangeStreamStartAfterInvalidate",
    357: "InvalidBSONType",
    361: "CollectionUUIDMismatch",
    317: "ConnectionPoolExpired",
    384: "ConnectionError",
    9001: "SocketException",
    10107: "NotWritablePrimary",
    10334: "BSONObjectTooLarge",
    14031: "OutOfDiskSpace",
    11000: "DuplicateKey",
    11600: "InterruptedAtShutdown",
    11601: "Interrupted",
    11602: "InterruptedDueToReplStateChange",
    13297: "DatabaseDifferCase",
    28769: "NamespaceCannotBeSharded",
    40413: "IDLDuplicateField",
    40414: "IDLFailedToParse",
    40415: "IDLUnknownField",
    50768: "NotARetryableWriteCommand",
    1003141: "RemoveShardDrainingInProgress",
    13388: "StaleConfig",
    13435: "NotPrimaryNoSecondaryOk",
    13436: "NotPrimaryOrSecondary",
    20503: "Location20503",
    40324: "Location40324",
    40573: "Location40573",
    40602: "Location40602",
    40674: "Location40674",
    50865: "Location50865",
    50915: "BackupCursorOpenConflictWithCheckpoint",
    # Hex strings of an unknown stage, etc. are "Location" codes on the server too.
}

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
    """The server's codeName for ``code`` ("Location<code>" for assertion-site codes)."""
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


def change_stream_labels(code: int, *, is_change_stream: bool, command: str) -> list[str]:
    """The errorLabels a server adds to a failed command (error_labels.cpp ErrorLabelBuilder).

    ``ResumableChangeStreamError`` when an aggregate/getMore of a change stream fails with a
    resumable code; else ``NonResumableChangeStreamError`` for codes 280/286 on any command.
    """
    if command in ("aggregate", "getMore") and is_change_stream and code in RESUMABLE_CHANGE_STREAM_CODES:
        return ["ResumableChangeStreamError"]
    if code in NON_RESUMABLE_CHANGE_STREAM_CODES:
        return ["NonResumableChangeStreamError"]
    return []


def view_error(ns: str) -> MongoError:
    """CommandNotSupportedOnView (166) as ``AutoGetCollection`` raises it for a view."""
    return MongoError(166, f"Namespace {ns} is a view, not a collection")
