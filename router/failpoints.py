"""Fail points on the router: ``configureFailPoint`` with ``failCommand`` and
``failGetMoreAfterCursorCheckout`` (test commands only, as on mongos).

Behaviour follows ``src/mongo/util/fail_point.cpp`` (modes ``off``, ``alwaysOn``,
``{times: n}``, ``{skip: n}``, ``{activationProbability: p}``; the reply's ``count`` is how often
the fail point was entered before) and ``CommandHelpers::evaluateFailCommandFailPoint``
(``data.failCommands`` names the client commands it applies to, ``appName`` narrows it to one
client, ``closeConnection`` drops the connection without replying, ``errorCode`` fails the
command with ``errmsg`` "Failing command via 'failCommand' failpoint" and exactly the
``errorLabels`` given, ``blockConnection``/``blockTimeMS`` delays the command,
``writeConcernError`` is attached to a successful reply). ``failGetMoreAfterCursorCheckout``
fails the next getMore after its cursor was found ("Hit the 'failGetMoreAfterCursorCheckout'
failpoint", ``cluster_find.cpp``), with the labels the router computes for that getMore.

The router's internal traffic to shards never passes through here, so it never consumes a
fail point. With ``--no-test-commands`` the command does not exist (CommandNotFound, 59).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from bson.int64 import Int64

from shardsim.errors import MongoError, change_stream_labels

FAIL_POINTS = ("failCommand", "failGetMoreAfterCursorCheckout")
# Commands failCommand never fails (the server exempts its own fail-point control).
_EXEMPT = frozenset({"configureFailPoint"})


class FailPoint:
    """One fail point's mode and data."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.mode = "off"
        self.times = 0
        self.skip = 0
        self.probability = 1.0
        self.data: dict[str, Any] = {}
        self.entered = 0

    def configure(self, mode: Any, data: Any) -> int:
        """Set the mode (``"off"``, ``"alwaysOn"``, ``{times}``, ``{skip}``,
        ``{activationProbability}``); returns the previous entry count. BadValue (2) on a bad
        mode, TypeMismatch (14) when ``data`` is not an object."""
        if data is not None and not isinstance(data, dict):
            raise MongoError(14, "the 'data' field must be a document")
        prev = self.entered
        times = skip = 0
        prob = 1.0
        if isinstance(mode, str):
            if mode not in ("off", "alwaysOn"):
                raise MongoError(2, "unknown mode: " + mode)
            kind = mode
        elif isinstance(mode, dict) and len(mode) == 1:
            kind, val = next(iter(mode.items()))
            if kind in ("times", "skip"):
                if isinstance(val, bool) or not isinstance(val, (int, float)):
                    raise MongoError(14, f"'{kind}' must be a number")
                if val < 0:
                    raise MongoError(2, f"'{kind}' must be >= 0")
                times = skip = int(val)
            elif kind == "activationProbability":
                if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val <= 1:
                    raise MongoError(2, "activationProbability must be between 0.0 and 1.0")
                prob = float(val)
            else:
                raise MongoError(2, "'mode' must be one of 'off', 'alwaysOn', 'times', and 'skip'")
        else:
            raise MongoError(2, "'mode' must be one of 'off', 'alwaysOn', 'times', and 'skip'")
        self.mode = kind
        self.times = times if kind == "times" else 0
        self.skip = skip if kind == "skip" else 0
        self.probability = prob
        self.data = dict(data or {})
        if kind == "times" and times == 0:
            self.mode = "off"
        self.entered = 0
        return prev

    def should_fail(self) -> bool:
        """Evaluate the mode once (counts down ``times``/``skip``)."""
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
            if random.random() >= self.probability:
                return False
        self.entered += 1
        return True


class FailPoints:
    """The router's fail points; :func:`install` attaches one to the router node."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self.points = {name: FailPoint(name) for name in FAIL_POINTS}

    # -- failCommand ----------------------------------------------------------------------------
    def fail_command_for(self, req: Any) -> dict[str, Any] | None:
        """The failCommand data when it triggers for ``req``, else None."""
        fp = self.points["failCommand"]
        if fp.mode == "off":
            return None
        name = self.router.commands.canonical(req.name)
        if name in _EXEMPT:
            return None
        data = fp.data
        names = data.get("failCommands") or []
        if name not in names and req.name not in names:
            return None
        app = data.get("appName")
        if app is not None and getattr(req.conn, "app_name", None) != app:
            return None
        if not fp.should_fail():
            return None
        return data

    # -- failGetMoreAfterCursorCheckout ---------------------------------------------------------
    def check_get_more(self, cursor: Any) -> None:
        """Raise the configured error once the getMore's cursor is checked out."""
        fp = self.points["failGetMoreAfterCursorCheckout"]
        if fp.mode == "off" or not fp.should_fail():
            return
        code = fp.data.get("errorCode", 1)
        code = int(code) if isinstance(code, (int, float)) and not isinstance(code, bool) else 1
        exc = MongoError(code, "Hit the 'failGetMoreAfterCursorCheckout' failpoint")
        exc.labels = change_stream_labels(code, is_change_stream=bool(getattr(cursor, "is_change_stream", False)),
                                          command="getMore")
        raise exc


def install(router: Any) -> FailPoints:
    """Attach fail points to ``router`` (a :class:`router.node.RouterNode`): registers
    ``configureFailPoint`` (only with test commands enabled), wraps ``run_command`` for
    failCommand and ``cursors.get_more`` for failGetMoreAfterCursorCheckout."""
    fps = FailPoints(router)
    router.failpoints = fps
    if not getattr(router, "test_commands", True):
        return fps

    async def configure_fail_point(req: Any) -> dict[str, Any]:
        name = req.arg
        if not isinstance(name, str):
            raise MongoError(14, "BSON field 'configureFailPoint.configureFailPoint' is the wrong "
                                 "type, expected type 'string'")
        fp = fps.points.get(name)
        if fp is None:
            raise MongoError(2, f"Cannot find FailPoint named '{name}'")
        if "mode" not in req.body:
            raise MongoError(2, "Missing mode argument")
        prev = fp.configure(req.body["mode"], req.body.get("data"))
        return {"count": Int64(prev)}

    router.commands.register("configureFailPoint", configure_fail_point)

    inner_run = router.run_command

    async def run_command(req: Any) -> dict[str, Any]:
        data = fps.fail_command_for(req)
        if data is None:
            return await inner_run(req)
        block = data.get("blockConnection")
        if block:
            await asyncio.sleep(float(data.get("blockTimeMS", 0)) / 1000)
        if data.get("closeConnection"):
            # The server loop drops the connection on ConnectionError, without replying.
            raise ConnectionResetError("failCommand closeConnection")
        code = data.get("errorCode")
        if code is not None:
            exc = MongoError(int(code), "Failing command via 'failCommand' failpoint")
            reply = exc.to_reply()
            labels = data.get("errorLabels")
            if labels:
                reply["errorLabels"] = list(labels)
            router.cluster_time_fields(req, reply)
            return reply
        reply = await inner_run(req)
        wce = data.get("writeConcernError")
        if wce is not None:
            reply["writeConcernError"] = wce
            labels = data.get("errorLabels")
            if labels:
                reply["errorLabels"] = list(labels)
        return reply

    router.run_command = run_command

    cursors = router.cursors
    inner_get_more = cursors.get_more

    async def get_more(cursor_id: int, collection: str, batch_size: int | None,
                       max_time_ms: int | None) -> dict[str, Any]:
        cursor = cursors.get(cursor_id)  # CursorNotFound (43) first, as on mongos
        try:
            fps.check_get_more(cursor)
        except MongoError:
            await cursors.kill([cursor_id])  # a failed getMore kills its cursor
            raise
        return await inner_get_more(cursor_id, collection, batch_size, max_time_ms)

    cursors.get_more = get_more
    return fps
