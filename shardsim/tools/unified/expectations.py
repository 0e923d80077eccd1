"""What a unified test expects, checked: ``expectResult``, ``expectError``, ``expectEvents`` and
``outcome`` (``unified-test-format.md`` §expectedError, §expectedEvent, §Test Runner
Implementation). A mixin of :class:`~shardsim.tools.unified.runner.Runner`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import pymongo
from bson import json_util
from pymongo.errors import PyMongoError

from . import operations as ops
from .cmap import match_cmap_events
from .entities import COMMAND_EVENTS, RecordedEvent
from .matcher import MatchError, RunnerError, bson_type

if TYPE_CHECKING:  # pragma: no cover
    from .runner import TestContext


class Expectations:
    """``expect*`` and ``outcome`` checks of :class:`~shardsim.tools.unified.runner.Runner`
    (uses its ``internal`` client); raise :class:`MatchError` on a mismatch."""

    internal: Any

    def _check_outcome(self, cd: Mapping) -> None:
        coll = self.internal.get_database(cd["databaseName"]).get_collection(cd["collectionName"])
        from pymongo.read_concern import ReadConcern
        coll = coll.with_options(read_concern=ReadConcern("local"),
                                 read_preference=pymongo.ReadPreference.PRIMARY)
        actual = list(coll.find({}, sort=[("_id", 1)]))
        expected = cd["documents"]
        if len(actual) != len(expected) or not all(
                exact_equal(e, a) for e, a in zip(expected, actual)):
            raise MatchError(f"outcome of {cd['databaseName']}.{cd['collectionName']}: expected "
                             f"{json_util.dumps(expected)}, got {json_util.dumps(actual)}")

    def _check_result(self, ctx: TestContext, expected: Any, result: ops.OpResult) -> None:
        """expectResult: iterables of documents match element-wise as root-level documents."""
        if result.docs_are_roots and isinstance(expected, list):
            actual = list(result.value)
            if len(actual) != len(expected):
                raise MatchError(f"expected {len(expected)} document(s), got {len(actual)}")
            for i, (e, v) in enumerate(zip(expected, actual)):
                ctx.matcher.match(e, v, root=True, path=f"result.{i}")
        else:
            ctx.matcher.match(expected, result.value, root=True, path="result")

    def _check_error(self, ctx: TestContext, spec: Mapping, exc: BaseException) -> None:
        from .operations_extra import check_client_bulk_error, error_result
        outer = exc
        if type(exc).__name__ == "ClientBulkWriteException" and \
                getattr(exc, "error", None) is not None:
            exc = exc.error  # the top-level error is what errorCode etc. describe
        reply = ops.server_reply(exc)
        from_server = ops.error_is_from_server(exc)
        desc = f"{type(exc).__name__}: {exc}"
        for key, want in spec.items():
            if key == "isError":
                continue
            if key == "isClientError":
                if want and from_server:
                    raise MatchError(f"expected a client error, got a server error ({desc})")
                if not want and not from_server:
                    raise MatchError(f"expected a server error, got a client error ({desc})")
            elif key == "isTimeoutError":
                is_timeout = isinstance(exc, PyMongoError) and exc.timeout
                if bool(want) != bool(is_timeout):
                    raise MatchError(f"expected isTimeoutError={want}, got {desc}")
            elif key == "errorContains":
                text = (reply or {}).get("errmsg") or str(exc)
                if str(want).lower() not in str(text).lower() and \
                        str(want).lower() not in str(exc).lower():
                    raise MatchError(f"expected the error message to contain {want!r}, got {desc}")
            elif key == "errorCode":
                code = (reply or {}).get("code", getattr(exc, "code", None)) if from_server else None
                if code != want:
                    raise MatchError(f"expected server error code {want}, got {code} ({desc})")
            elif key == "errorCodeName":
                name = (reply or {}).get("codeName") if from_server else None
                if not isinstance(name, str) or name.lower() != str(want).lower():
                    raise MatchError(f"expected codeName {want}, got {name} ({desc})")
            elif key == "errorLabelsContain":
                for label in want:
                    if not (isinstance(exc, PyMongoError) and exc.has_error_label(label)):
                        raise MatchError(f"expected error label {label!r} ({desc}; labels "
                                         f"{_labels(exc)})")
            elif key == "errorLabelsOmit":
                for label in want:
                    if isinstance(exc, PyMongoError) and exc.has_error_label(label):
                        raise MatchError(f"expected no error label {label!r} ({desc})")
            elif key == "errorResponse":
                if reply is None:
                    raise MatchError(f"expected a server error response, got {desc}")
                ctx.matcher.match(want, reply, root=True, path="errorResponse")
            elif key in ("writeErrors", "writeConcernErrors"):
                check_client_bulk_error(ctx, key, want, outer)
            elif key == "expectResult":
                partial = error_result(outer)
                ctx.matcher.match(want, partial if partial is not None else ops_missing(),
                                  root=True, path="error.result")
            else:
                raise RunnerError(f"expectError.{key} is not supported by this runner")

    def _check_events(self, ctx: TestContext, spec: Mapping) -> None:
        ce = ctx.entities.get(spec["client"], "client")
        event_type = spec.get("eventType", "command")
        if event_type == "cmap":
            if ce.cmap is None:
                raise RunnerError(f"client {ce.id!r} does not observe CMAP events")
            match_cmap_events(spec["events"], list(ce.cmap.events),
                              bool(spec.get("ignoreExtraEvents", False)), ce.id)
            return
        if event_type != "command":
            raise RunnerError(f"expectEvents eventType {event_type!r} is not supported")
        if ce.recorder is None:
            raise RunnerError(f"client {ce.id!r} does not observe events")
        actual = list(ce.recorder.events)
        expected = spec["events"]
        ignore_extra = bool(spec.get("ignoreExtraEvents", False))
        listing = "\n".join(f"  {i}: {describe_event(e)}" for i, e in enumerate(actual))
        if len(actual) < len(expected) or (not ignore_extra and len(actual) != len(expected)):
            raise MatchError(f"client {ce.id}: expected {len(expected)} event(s)"
                             f"{' (or more)' if ignore_extra else ''}, observed {len(actual)}: "
                             f"{[describe_event(e, short=True) for e in actual]}\n"
                             f"observed events:\n{listing}")
        for i, (exp, act) in enumerate(zip(expected, actual)):
            try:
                self._match_event(ctx, exp, act)
            except MatchError as exc:
                raise MatchError(f"client {ce.id}: event {i}: {exc}\nobserved events:\n"
                                 f"{listing}") from None

    def _match_event(self, ctx: TestContext, exp: Mapping, act: RecordedEvent) -> None:
        if len(exp) != 1:
            raise RunnerError(f"expected event must have one key: {list(exp)}")
        kind, fields = next(iter(exp.items()))
        if kind not in COMMAND_EVENTS:
            raise RunnerError(f"expected event type {kind!r} is not supported")
        if act.kind != kind:
            raise MatchError(f"expected {kind}, observed {act.kind} "
                             f"({act.event.command_name})")
        ev = act.event
        for key, want in fields.items():
            if key == "command":
                ctx.matcher.match(want, ev.command, root=True, path="command")
            elif key == "reply":
                ctx.matcher.match(want, ev.reply, root=True, path="reply")
            elif key == "commandName":
                if ev.command_name != want:
                    raise MatchError(f"expected commandName {want!r}, got {ev.command_name!r}")
            elif key == "databaseName":
                if ev.database_name != want:
                    raise MatchError(f"expected databaseName {want!r}, got {ev.database_name!r}")
            elif key == "hasServiceId":
                if bool(want) != (ev.service_id is not None):
                    raise MatchError(f"expected hasServiceId={want}")
            elif key == "hasServerConnectionId":
                if bool(want) != (ev.server_connection_id is not None):
                    raise MatchError(f"expected hasServerConnectionId={want}")
            else:
                raise RunnerError(f"{kind}.{key} is not supported by this runner")


def exact_equal(expected: Any, actual: Any) -> bool:
    """Exact BSON equality (types included) ignoring document key order (``outcome`` rule)."""
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and set(expected) == set(actual) and all(
            exact_equal(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, (list, tuple)):
        return isinstance(actual, (list, tuple)) and len(expected) == len(actual) and all(
            exact_equal(e, a) for e, a in zip(expected, actual))
    return bson_type(expected) == bson_type(actual) and expected == actual


def describe_event(e: RecordedEvent, short: bool = False) -> str:
    """``commandStartedEvent aggregate@database0 {...}`` (for failure messages)."""
    ev = e.event
    head = f"{e.kind} {ev.command_name}@{ev.database_name}"
    if short:
        return head
    body = getattr(ev, "command", None) if e.kind == "commandStartedEvent" else \
        getattr(ev, "reply", None)
    return f"{head} {_short(body)}" if body is not None else head


def _short(value: Any, limit: int = 600) -> str:
    try:
        text = json_util.dumps(value)
    except Exception:
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _first_line(text: str) -> str:
    """First line of a message without pymongo's ", full error: {...}" tail."""
    line = text.splitlines()[0] if text else ""
    return line.split(", full error:")[0]


def _labels(exc: BaseException) -> list[str]:
    details = getattr(exc, "details", None) or {}
    labels = list(details.get("errorLabels", [])) if isinstance(details, dict) else []
    return labels or sorted(getattr(exc, "_error_labels", set()))


def ops_missing() -> Any:
    from .matcher import MISSING
    return MISSING
