"""Fail points for any role: ``configureFailPoint`` with ``failCommand`` and
``failGetMoreAfterCursorCheckout`` (test commands only, as on mongod and mongos).

:func:`install` attaches them to a :class:`shardsim.core.node.Node` (the router and every shard,
config server included). Behaviour follows the server:

* ``src/mongo/util/fail_point.cpp``: modes ``"off"``, ``"alwaysOn"``, ``{times: n}``,
  ``{skip: n}``, ``{activationProbability: p}``; the predicate (which command, which client) is
  evaluated before the mode, so commands the fail point does not apply to never use up
  ``times``/``skip``; ``configureFailPoint`` replies ``{count: <times entered before>}``.
* ``src/mongo/db/commands.cpp`` ``CommandHelpers::shouldActivateFailCommandFailPoint``: never
  ``configureFailPoint`` itself; not for local/internal clients unless ``failLocalClients`` /
  ``failInternalCommands``; ``appName``, ``namespace`` narrow it; ``failAllCommands`` or
  ``failCommands: [names]`` (any alias of the command).
* ``CommandHelpers::evaluateFailCommandFailPoint``: the fail point only triggers when it does
  something (``closeConnection``, ``blockConnection``, ``errorCode``): ``blockConnection``
  sleeps ``blockTimeMS`` (InvalidOptions 72 when missing/negative); ``closeConnection`` ends the
  connection without replying; ``errorCode`` fails the command with errmsg "Failing command via
  'failCommand' failpoint". ``writeConcernError`` is attached to the reply of a command that ran
  (``service_entry_point_shard_role.cpp``), a separate evaluation of the same fail point.
* Error labels (``src/mongo/db/error_labels.cpp`` ``getErrorLabels``): when ``errorLabels`` is an
  array in the data, the reply carries exactly those labels (none for ``[]``). Otherwise the
  node computes labels as for any error, except that a getMore failed by failCommand never gets
  ``ResumableChangeStreamError``: the label needs the cursor's originating command, which is only
  known after the cursor is checked out, and failCommand fires before that. (This is what the
  spec test "change stream does not resume if error does not contain
  ResumableChangeStreamError" relies on.)
* ``failGetMoreAfterCursorCheckout`` (``src/mongo/db/commands/getmore_cmd.cpp``): after the
  cursor was found, fails the getMore with ``errorCode`` (InternalError 1 when absent) and
  "Hit the 'failGetMoreAfterCursorCheckout' failpoint"; the failed getMore kills the cursor and
  gets the labels of any failed getMore on that cursor (ResumableChangeStreamError for a change
  stream and a resumable code). Its data is matched like failCommand's with
  ``failCommands: ["getMore"]``.

With ``test_commands`` off the command does not exist (CommandNotFound, 59).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from typing import Any

from bson.int64 import Int64

from shardsim.core.commands import CURRENT_REQUEST, CommandFamily
from shardsim.core.errors import MongoError, change_stream_labels
from shardsim.core.auth import privileges as priv

FAIL_POINTS = ("failCommand", "failGetMoreAfterCursorCheckout")
FAIL_COMMAND_ERRMSG = "Failing command via 'failCommand' failpoint"
FAIL_GET_MORE_ERRMSG = "Hit the 'failGetMoreAfterCursorCheckout' failpoint"



def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class FailPoint:
    """One fail point's mode and data (``fail_point.cpp``).

    ``mode`` is ``"off"``, ``"alwaysOn"``, ``"times"``, ``"skip"`` or
    ``"activationProbability"``; ``entered`` counts activations since the last configure.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.mode = "off"
        self.times = 0
        self.skip = 0
        self.probability = 1.0
        self.data: dict[str, Any] = {}
        self.entered = 0
        # The generator of activationProbability draws (the test kit seeds it per node).
        self.rng: random.Random | None = None

    def configure(self, mode: Any, data: Any) -> int:
        """Set the mode (``"off"``, ``"alwaysOn"``, ``{times: n}``, ``{skip: n}``,
        ``{activationProbability: p}``) and data; returns the previous entry count.

        Raises BadValue (2) for a bad mode, TypeMismatch (14) when ``data`` is not an object or
        ``times``/``skip`` is not a number."""
        if data is not None and not isinstance(data, dict):
            raise MongoError(14, "the 'data' field must be a document")
        times = skip = 0
        prob = 1.0
        if isinstance(mode, str):
            if mode not in ("off", "alwaysOn"):
                raise MongoError(2, "unknown mode: " + mode)
            kind = mode
        elif isinstance(mode, dict) and len(mode) == 1:
            kind, val = next(iter(mode.items()))
            if kind in ("times", "skip"):
                if not _is_number(val):
                    raise MongoError(14, f"'{kind}' must be a number")
                if val < 0:
                    raise MongoError(2, f"'{kind}' must be >= 0")
                times = skip = int(val)
            elif kind == "activationProbability":
                if not _is_number(val) or not 0 <= val <= 1:
                    raise MongoError(2, "activationProbability must be between 0.0 and 1.0")
                prob = float(val)
            else:
                raise MongoError(2, "'mode' must be one of 'off', 'alwaysOn', 'times', and 'skip'")
        else:
            raise MongoError(2, "'mode' must be one of 'off', 'alwaysOn', 'times', and 'skip'")
        prev = self.entered
        self.mode = kind
        self.times = times if kind == "times" else 0
        self.skip = skip if kind == "skip" else 0
        self.probability = prob
        self.data = dict(data or {})
        if kind == "times" and times == 0:
            self.mode = "off"
        self.entered = 0
        return prev

    @property
    def active(self) -> bool:
        return self.mode != "off"

    def should_fail(self) -> bool:
        """Evaluate the mode once (counts down ``times``/``skip``); True = the fail point fires."""
        mode = self.mode
        if mode == "off":
            return False
        if mode == "skip":
            if self.skip > 0:
                self.skip -= 1
                return False
        elif mode == "times":
            self.times -= 1
            if self.times <= 0:
                self.mode = "off"
        elif mode == "activationProbability":
            if (self.rng or random).random() >= self.probability:
                return False
        self.entered += 1
        return True


def request_namespace(req: Any) -> str:
    """``db.coll`` of a request (``db`` alone when the command names no collection)."""
    name = req.name
    if name == "getMore":
        coll = req.body.get("collection")
    else:
        coll = req.body.get(name) if req.body else None
    return f"{req.db}.{coll}" if isinstance(coll, str) and coll else req.db


def is_local_client(conn: Any) -> bool:
    """A request a node runs against itself (connection id 0, like DBDirectClient)."""
    return conn is None or getattr(conn, "id", 0) == 0


class FailPoints:
    """A node's fail points and their evaluation; :func:`install` wires them in."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.points = {name: FailPoint(name) for name in FAIL_POINTS}

    def add(self, point: FailPoint) -> None:
        """Add a role's own fail point (e.g. the shard's promise faults,
        ``shard/change_stream/promise_faults.py``); ``configureFailPoint`` then finds it."""
        self.points[point.name] = point

    def canonical(self, name: str) -> str:
        return self.node.commands.canonical(name)

    # -- shouldActivateFailCommandFailPoint ---------------------------------------------------
    def applies(self, data: dict[str, Any], req: Any, command: str | None = None) -> bool:
        """Whether fail-point ``data`` applies to ``req`` (``command`` overrides its name)."""
        name = self.canonical(command or req.name)
        if name == "configureFailPoint":  # banned even when listed
            return False
        try:  # an unknown command is CommandNotFound before any fail point
            self.node.commands.lookup(name)
        except MongoError:
            return False
        if is_local_client(req.conn) and not (data.get("failLocalClients") is True
                                              or data.get("failInternalCommands") is True):
            return False
        app = data.get("appName")
        if app is not None and getattr(req.conn, "app_name", None) != app:
            return False
        ns = data.get("namespace")
        if ns is not None and request_namespace(req) != ns:
            return False
        if "failAllCommands" in data:
            return True
        names = data.get("failCommands")
        if not isinstance(names, list):
            return False
        return any(isinstance(n, str) and self.canonical(n) == name for n in names)

    # -- failCommand ----------------------------------------------------------------------------
    def fail_command_for(self, req: Any) -> dict[str, Any] | None:
        """The failCommand data when it fires for ``req`` before the command runs, else None."""
        fp = self.points["failCommand"]
        if not fp.active:
            return None
        data = fp.data
        acts = data.get("closeConnection") is True or data.get("blockConnection") is True or \
            _is_number(data.get("errorCode"))
        if not acts or not self.applies(data, req) or not fp.should_fail():
            return None
        return data

    def write_concern_error_for(self, req: Any, reply: dict[str, Any]) -> dict[str, Any] | None:
        """The failCommand data when its ``writeConcernError`` applies to ``req``'s reply."""
        fp = self.points["failCommand"]
        if not fp.active or "writeConcernError" in reply:
            return None
        data = fp.data
        if "writeConcernError" not in data or not self.applies(data, req) or not fp.should_fail():
            return None
        return data

    def computed_labels(self, req: Any, exc: MongoError) -> list[str]:
        """Labels of a failCommand error without ``errorLabels`` (see the module docstring)."""
        labels = list(self.node.error_labels(req, exc))
        if self.canonical(req.name) == "getMore":
            labels = [lb for lb in labels if lb != "ResumableChangeStreamError"]
        return labels

    # -- failGetMoreAfterCursorCheckout ---------------------------------------------------------
    def check_get_more(self, cursor: Any, req: Any = None) -> None:
        """Raise the configured error for a getMore whose cursor was just checked out."""
        fp = self.points["failGetMoreAfterCursorCheckout"]
        if not fp.active:
            return
        data = fp.data
        if req is not None:
            probe = dict(data)
            probe["failCommands"] = ["getMore"]
            if not self.applies(probe, req, "getMore"):
                return
        if not fp.should_fail():
            return
        code = data.get("errorCode")
        code = int(code) if _is_number(code) else 1
        labels = change_stream_labels(code, command="getMore",
                                      is_change_stream=bool(getattr(cursor, "is_change_stream", False)),
                                      profile=self.node.profile)
        raise MongoError(code, FAIL_GET_MORE_ERRMSG, labels=labels)


def _labels_override(data: dict[str, Any]) -> list[str] | None:
    labels = data.get("errorLabels")
    return list(labels) if isinstance(labels, list) else None


def _apply_override(reply: dict[str, Any], override: list[str] | None) -> None:
    if override is None:
        return
    if reply.get("ok") and "writeConcernError" not in reply:
        return
    reply.pop("errorLabels", None)
    if override:
        reply["errorLabels"] = list(override)


# configureFailPoint: a command family, installed only with test commands on.
commands = CommandFamily("failpoints")


@commands.handler("configureFailPoint", secondary="always", privileges=priv.NO_AUTH)
async def configure_fail_point(node: Any, req: Any) -> dict[str, Any]:
    """``{configureFailPoint: name, mode, data?}`` -> ``{count: Long}`` (times the point was
    entered before). Errors: 14 for a non-string name, BadValue (2) for an unknown point or a
    missing mode (``fail_point_cmd.cpp``)."""
    name = req.arg
    if not isinstance(name, str):
        raise MongoError(14, "BSON field 'configureFailPoint.configureFailPoint' is the wrong "
                             "type, expected type 'string'")
    fp = node.failpoints.points.get(name)
    if fp is None:
        raise MongoError(2, f"Cannot find FailPoint named '{name}'")
    if "mode" not in req.body:
        raise MongoError(2, "Missing mode argument")
    prev = fp.configure(req.body["mode"], req.body.get("data"))
    return {"count": Int64(prev)}


# The labels a failCommand override sets for the request being run (before -> after).
_override: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "shardsim_fp_override", default=None)


class FailCommandHook:
    """``failCommand`` as a :class:`shardsim.core.node.CommandHook`: before a command it may
    block, close the connection or answer an error; after it, add a ``writeConcernError`` and
    the configured ``errorLabels``."""

    def __init__(self, fps: FailPoints) -> None:
        self.fps = fps

    async def before_command(self, req: Any) -> dict[str, Any] | None:
        _override.set(None)
        try:
            data = self.fps.fail_command_for(req)
        except MongoError:
            data = None
        if data is None:
            return None
        override = _labels_override(data)
        _override.set(override)
        if data.get("blockConnection") is True:
            block = data.get("blockTimeMS")
            if not _is_number(block) or block < 0:
                exc = MongoError(72, "must specify 'blockTimeMS' when 'blockConnection' is true"
                                 if not _is_number(block) else "'blockTimeMS' must be non-negative")
                return self._error_reply(req, exc, override)
            await asyncio.sleep(float(block) / 1000)
        if data.get("closeConnection") is True:
            # The server loop drops the connection on ConnectionError, without replying.
            raise ConnectionResetError("failCommand closeConnection")
        code = data.get("errorCode")
        if _is_number(code):
            return self._error_reply(req, MongoError(int(code), FAIL_COMMAND_ERRMSG), override)
        return None

    def after_command(self, req: Any, reply: dict[str, Any]) -> None:
        override = _override.get()
        if override is None and self.fps.points["failCommand"].mode == "off":
            return  # the usual case: nothing to add, no labels to override
        wce_data = self.fps.write_concern_error_for(req, reply)
        if wce_data is not None:
            reply["writeConcernError"] = wce_data["writeConcernError"]
            if override is None:
                override = _labels_override(wce_data)
        _apply_override(reply, override)

    def _error_reply(self, req: Any, exc: MongoError, override: list[str] | None) -> dict[str, Any]:
        exc.labels = override if override is not None else self.fps.computed_labels(req, exc)
        reply = exc.to_reply()
        self.fps.node.cluster_time_fields(req, reply)
        return reply


def install(node: Any) -> FailPoints:
    """Attach fail points to ``node`` (a :class:`shardsim.core.node.Node`; sets ``node.failpoints``).

    With ``node.test_commands`` true: installs the ``configureFailPoint`` family (and
    ``_shardsimCutLinks``, :mod:`shardsim.core.links`), the
    failCommand hook (:attr:`Node.command_hooks`) and the failGetMoreAfterCursorCheckout check
    (:attr:`CursorManager.get_more_checks`). Without test commands nothing is wired and
    ``configureFailPoint`` stays unknown (CommandNotFound, 59)."""
    fps = FailPoints(node)
    node.failpoints = fps
    if not node.test_commands:
        return fps
    node.commands.install(node, commands)
    from shardsim.core import links
    links.install(node)  # _shardsimCutLinks: gated like configureFailPoint
    node.command_hooks.append(FailCommandHook(fps))
    node.cursors.get_more_checks.append(
        lambda cursor: fps.check_get_more(cursor, CURRENT_REQUEST.get()))
    return fps
