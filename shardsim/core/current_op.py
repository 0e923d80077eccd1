"""The ``$currentOp`` aggregation stage, as far as shardsim answers it: idle cursors.

``db.getSiblingDB("admin").aggregate([{$currentOp: {idleCursors: true, localOps: true}}])``
(``{aggregate: 1, pipeline: [...], cursor: {}}`` on ``admin``).

Options and their errors follow ``src/mongo/db/pipeline/document_source_current_op.cpp``
(``LiteParsed::parse`` and ``createFromBson``): the stage's value must be an object (TypeMismatch
14); ``allUsers``, ``idleConnections``, ``idleSessions``, ``localOps``, ``truncateOps``,
``idleCursors``, ``backtrace`` must be booleans (FailedToParse 9: "The 'X' parameter of the
$currentOp stage must be a boolean value, but found: T"); any other field is FailedToParse 9
("Unrecognized option 'X' in $currentOp stage."); the stage must be first and run with
``{aggregate: 1}`` on ``admin`` (InvalidNamespace 73).

Each idle cursor is reported as ``CommonProcessInterface::getCurrentOps`` does
(``src/mongo/db/pipeline/process_interface/common_process_interface.cpp``):
``{type: "idleCursor", host, ns, [lsid], cursor: {cursorId, createdDate, lastAccessDate,
nDocsReturned, nBatchesReturned, noCursorTimeout, tailable, awaitData, [originatingCommand]}}``
(the GenericCursor of ``generic_cursor.idl`` without the fields lifted to the top level). A
cursor may add its own fields (:meth:`shardsim.core.cursors.Cursor.current_op_extra`): the router's
change-stream cursors add ``changeStream`` (shardsim's own, see
:mod:`router.change_stream.current_op`).

A cursor pinned by a getMore right now (an awaitData change stream spends most of its time
so) is not idle: it is reported, whatever ``idleCursors`` says, as the active operation of that
getMore, as ``CurOp::reportState`` does for a getMore: ``{type: "op", host, desc, active: true,
currentOpTime, opid, secs_running, microsecs_running, op: "getmore", ns, command: {getMore,
collection}, cursor: {..., operationUsingCursorId}}`` (fewer fields than mongod's: no client,
locks or waiting fields).

What shardsim does not report: other operations in progress (shardsim keeps no ``CurOp``),
idle connections and sessions, transaction coordinators; ``allUsers`` is accepted and ignored
(every cursor is listed).
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from bson.int64 import Int64

from shardsim.core.errors import MongoError

STAGE = "$currentOp"
BOOL_OPTIONS = ("allUsers", "idleConnections", "idleSessions", "localOps", "truncateOps",
                "idleCursors", "backtrace")
_BSON_TYPE_NAMES = {bool: "bool", int: "int", float: "double", str: "string", dict: "object",
                    list: "array", type(None): "null"}


def _type_name(value: Any) -> str:
    if isinstance(value, Int64):
        return "long"
    return _BSON_TYPE_NAMES.get(type(value), type(value).__name__)


def is_current_op(pipeline: Any) -> bool:
    """Does ``pipeline`` start with ``$currentOp``?"""
    return (isinstance(pipeline, list) and bool(pipeline) and isinstance(pipeline[0], dict)
            and STAGE in pipeline[0])


def parse(db: str, target: Any, pipeline: list[Any]) -> dict[str, bool]:
    """Check a ``$currentOp`` pipeline; returns the options (every one of
    :data:`BOOL_OPTIONS`, False when absent). Raises MongoError 14, 9 or 73 as described in the
    module docstring, and 40602 when ``$currentOp`` appears after the first stage."""
    spec = pipeline[0][STAGE]
    if not isinstance(spec, dict):
        raise MongoError(14, f"$currentOp options must be specified in an object, but found: "
                             f"{_type_name(spec)}")
    options = {name: False for name in BOOL_OPTIONS}
    for name, value in spec.items():
        if name not in BOOL_OPTIONS:
            raise MongoError(9, f"Unrecognized option '{name}' in $currentOp stage.")
        if not isinstance(value, bool):
            raise MongoError(9, f"The '{name}' parameter of the $currentOp stage must be a "
                                f"boolean value, but found: {_type_name(value)}")
        options[name] = value
    if db != "admin" or target != 1 or isinstance(target, bool):
        raise MongoError(73, "$currentOp must be run against the 'admin' database with "
                             "{aggregate: 1}")
    for stage in pipeline[1:]:
        if isinstance(stage, dict) and STAGE in stage:
            raise MongoError(40602, "$currentOp is only valid as the first stage in a pipeline.")
    return options


def _date(seconds: float) -> datetime.datetime:
    """A wall-clock time (seconds) as a BSON date (millisecond precision, UTC)."""
    ms = int(seconds * 1000)
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)


def idle_cursor_entry(host: str, cursor: Any) -> dict[str, Any]:
    """The ``idleCursor`` document of one cursor (:class:`shardsim.core.cursors.Cursor`); ``host`` is
    the reporting process's ``host:port``. Fields as in the module docstring, then the cursor's
    :meth:`~shardsim.core.cursors.Cursor.current_op_extra` fields."""
    entry: dict[str, Any] = {"type": "idleCursor", "host": host, "ns": cursor.ns}
    if cursor.lsid is not None:
        entry["lsid"] = cursor.lsid
    generic: dict[str, Any] = {
        "cursorId": Int64(cursor.id),
        "createdDate": _date(cursor.created_wall),
        "lastAccessDate": _date(cursor.last_access_wall),
        "nDocsReturned": Int64(cursor.n_docs_returned),
        "nBatchesReturned": Int64(cursor.n_batches_returned),
        "noCursorTimeout": bool(cursor.no_timeout),
        "tailable": bool(cursor.tailable),
        "awaitData": bool(cursor.await_data),
    }
    if cursor.originating_command is not None:
        generic["originatingCommand"] = cursor.originating_command
    entry["cursor"] = generic
    entry.update(cursor.current_op_extra())
    return entry


def getmore_entry(host: str, cursor: Any, now: float) -> dict[str, Any]:
    """The active-operation document of the getMore pinning ``cursor`` (module docstring);
    ``now`` is the wall clock (seconds)."""
    idle = idle_cursor_entry(host, cursor)
    started = cursor.getmore_started_wall or now
    running_us = max(0, int((now - started) * 1_000_000))
    generic = dict(idle["cursor"])
    generic["operationUsingCursorId"] = Int64(cursor.op_id)
    entry: dict[str, Any] = {
        "type": "op", "host": host, "desc": "conn", "active": True,
        "currentOpTime": _date(now).isoformat(timespec="milliseconds"),
        "opid": cursor.op_id, "secs_running": Int64(running_us // 1_000_000),
        "microsecs_running": Int64(running_us), "op": "getmore", "ns": cursor.ns,
        "command": {"getMore": Int64(cursor.id), "collection": cursor.ns.split(".", 1)[-1]},
    }
    if cursor.lsid is not None:
        entry["lsid"] = cursor.lsid
    entry["cursor"] = generic
    entry.update(cursor.current_op_extra())
    return entry


def local_operations(node: Any, options: dict[str, bool]) -> list[dict[str, Any]]:
    """What this process reports for ``$currentOp`` with ``options`` (:func:`parse`): one
    :func:`getmore_entry` per cursor pinned by a getMore now, and, when ``idleCursors`` is true,
    one :func:`idle_cursor_entry` per other open cursor (see the module docstring)."""
    now = time.time()
    out = []
    for c in node.cursors.all():
        if c.in_use:
            out.append(getmore_entry(node.address, c, now))
        elif options.get("idleCursors"):
            out.append(idle_cursor_entry(node.address, c))
    return out


__all__ = ["BOOL_OPTIONS", "STAGE", "getmore_entry", "idle_cursor_entry", "is_current_op", "local_operations",
           "parse"]
