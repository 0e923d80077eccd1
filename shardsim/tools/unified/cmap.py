"""Connection-pool (CMAP) events of the unified test format: ``observeEvents`` names such as
``connectionReadyEvent`` and ``expectEvents`` with ``eventType: cmap``.

``unified-test-format.md`` §expectedCmapEvent: each expected event is ``{<name>: {fields}}``;
the fields a test may check are ``hasServiceId`` (poolClearedEvent), ``interruptInUseConnections``
(poolClearedEvent) and ``reason`` (connectionClosedEvent, connectionCheckOutFailedEvent).
pymongo's :class:`pymongo.monitoring.ConnectionPoolListener` gives the events.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from pymongo import monitoring

from .matcher import MatchError, RunnerError

# unified-format event name -> pymongo listener method
CMAP_EVENTS = {
    "poolCreatedEvent": "pool_created",
    "poolReadyEvent": "pool_ready",
    "poolClearedEvent": "pool_cleared",
    "poolClosedEvent": "pool_closed",
    "connectionCreatedEvent": "connection_created",
    "connectionReadyEvent": "connection_ready",
    "connectionClosedEvent": "connection_closed",
    "connectionCheckOutStartedEvent": "connection_check_out_started",
    "connectionCheckOutFailedEvent": "connection_check_out_failed",
    "connectionCheckedOutEvent": "connection_checked_out",
    "connectionCheckedInEvent": "connection_checked_in",
}

# the unified format's reason strings -> pymongo's ConnectionClosedReason/CheckOutFailedReason
_REASONS = {"stale": "stale", "idle": "idle", "error": "error", "poolClosed": "poolClosed",
            "timeout": "timeout", "connectionError": "connectionError"}


class CmapRecorder(monitoring.ConnectionPoolListener):
    """Records the connection-pool events named in ``observe`` (unified names) in order, as
    ``(name, pymongo event)``; ``enabled`` is switched off when a test's operations are done."""

    def __init__(self, observe: list[str]) -> None:
        self.observe = {n for n in observe if n in CMAP_EVENTS}
        self.events: list[tuple[str, Any]] = []
        self.enabled = True
        self._lock = threading.Lock()

    def _add(self, name: str, event: Any) -> None:
        if self.enabled and name in self.observe:
            with self._lock:
                self.events.append((name, event))


def _make_method(name: str):
    def method(self: CmapRecorder, event: Any) -> None:
        self._add(name, event)
    method.__name__ = CMAP_EVENTS[name]
    method.__doc__ = f"Record ``{name}``."
    return method


for _name, _method in CMAP_EVENTS.items():
    setattr(CmapRecorder, _method, _make_method(_name))


def match_cmap_events(expected: list[Mapping[str, Any]], actual: list[tuple[str, Any]],
                      ignore_extra: bool, client_id: str) -> None:
    """Compare observed CMAP events with ``expected`` (in order, as many unless
    ``ignore_extra``). Raises MatchError on a difference, RunnerError for an unknown event
    name or field."""
    names = [n for n, _ in actual]
    if len(actual) < len(expected) or (not ignore_extra and len(actual) != len(expected)):
        raise MatchError(f"client {client_id}: expected {len(expected)} cmap event(s), "
                         f"observed {len(actual)}: {names}")
    for i, (exp, (name, event)) in enumerate(zip(expected, actual)):
        if len(exp) != 1:
            raise RunnerError(f"expected cmap event must have one key: {list(exp)}")
        want, fields = next(iter(exp.items()))
        if want not in CMAP_EVENTS:
            raise RunnerError(f"unknown cmap event {want!r}")
        if want != name:
            raise MatchError(f"client {client_id}: cmap event {i}: expected {want}, observed "
                             f"{name} (all: {names})")
        for key, value in (fields or {}).items():
            if key == "hasServiceId":
                got = getattr(event, "service_id", None) is not None
                if got != bool(value):
                    raise MatchError(f"cmap event {i} ({name}): hasServiceId is {got}")
            elif key == "interruptInUseConnections":
                got = bool(getattr(event, "interrupt_connections", False))
                if got != bool(value):
                    raise MatchError(f"cmap event {i} ({name}): interruptInUseConnections is {got}")
            elif key == "reason":
                got = getattr(event, "reason", None)
                if got != _REASONS.get(value, value):
                    raise MatchError(f"cmap event {i} ({name}): reason {got!r}, expected {value!r}")
            else:
                raise RunnerError(f"{name}.{key} is not supported by this runner")
