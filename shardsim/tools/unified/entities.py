"""The entity map of a unified test and the per-client command-event recorder.

``unified-test-format.md`` §Entity Map: names are unique, lookups check existence and type.
Driver objects are pymongo's (MongoClient, Database, Collection, ClientSession, ChangeStream,
Cursor, CommandCursor); BSON values saved with ``saveResultAsEntity`` are stored as kind
``"bson"``.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from dataclasses import dataclass, field
from typing import Any

from pymongo import monitoring

from .matcher import RunnerError

# Commands whose events are never observed unless observeSensitiveCommands is true
# (command-logging-and-monitoring spec, "Security").
SENSITIVE_COMMANDS = frozenset({
    "authenticate", "saslstart", "saslcontinue", "getnonce", "createuser", "updateuser",
    "copydbgetnonce", "copydbsaslstart", "copydb",
})
_HELLO = frozenset({"hello", "ismaster"})

COMMAND_EVENTS = ("commandStartedEvent", "commandSucceededEvent", "commandFailedEvent")


@dataclass
class RecordedEvent:
    """One observed command-monitoring event: its type name and pymongo's event object."""

    kind: str
    event: Any


class CommandRecorder(monitoring.CommandListener):
    """Records command events for one client entity, filtered as the unified format requires.

    Ignores event types not in ``observe``, command names in ``ignore`` (case-sensitive, as
    written in the test), ``configureFailPoint`` (always), and sensitive commands unless
    ``observe_sensitive``. ``enabled`` is switched off once a test's operations are done.
    """

    def __init__(self, observe: list[str], ignore: list[str], observe_sensitive: bool) -> None:
        self.observe = set(observe)
        self.ignore = set(ignore)
        self.observe_sensitive = observe_sensitive
        self.events: list[RecordedEvent] = []
        self.enabled = True
        self._lock = threading.Lock()

    def _ignored(self, name: str, command: Any | None) -> bool:
        if name in self.ignore or name == "configureFailPoint":
            return True
        if not self.observe_sensitive:
            low = name.lower()
            if low in SENSITIVE_COMMANDS:
                return True
            # hello is sensitive when it carries speculativeAuthenticate; pymongo then
            # redacts the command to an empty document.
            if low in _HELLO and command is not None and (
                    len(command) == 0 or "speculativeAuthenticate" in command):
                return True
        return False

    def _add(self, kind: str, event: Any, command: Any | None) -> None:
        if not self.enabled or kind not in self.observe:
            return
        if self._ignored(event.command_name, command):
            return
        with self._lock:
            self.events.append(RecordedEvent(kind, event))

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self._add("commandStartedEvent", event, event.command)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._add("commandSucceededEvent", event, getattr(event, "reply", None))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._add("commandFailedEvent", event, None)


@dataclass
class ClientEntity:
    """A client entity: the MongoClient plus its recorder (None when no events are observed)."""

    id: str
    client: Any
    recorder: CommandRecorder | None = None
    closed: bool = False
    cmap: Any = None  # a cmap.CmapRecorder when CMAP events are observed


@dataclass
class CursorEntity:
    """A FindCursor/CommandCursor entity with a one-document push-back buffer.

    ``createFindCursor`` must create the server-side cursor up front; pymongo's Cursor is lazy,
    so the runner reads the first document and keeps it here for the first iteration.
    """

    cursor: Any
    pending: list = field(default_factory=list)


class EntityMap:
    """Unique names → (kind, object). Kinds: client, database, collection, session,
    changeStream, findCursor, commandCursor, bson."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[str, Any]] = {}
        self._lock = threading.Lock()
        # a session's lsid, kept at creation: pymongo refuses session_id once it has ended,
        # and $$sessionLsid must still match the commands it sent before.
        self.lsids: dict[str, Any] = {}

    def add(self, name: str, kind: str, obj: Any) -> None:
        """Store ``obj``; RunnerError if ``name`` is taken."""
        with self._lock:
            if name in self._items:
                raise RunnerError(f"entity {name!r} is already defined")
            self._items[name] = (kind, obj)

    def get(self, name: str, kind: str | tuple[str, ...] | None = None) -> Any:
        """The object named ``name``; RunnerError if missing or not of ``kind``."""
        kind_obj = self._items.get(name)
        if kind_obj is None:
            raise RunnerError(f"entity {name!r} is not defined")
        k, obj = kind_obj
        kinds = (kind,) if isinstance(kind, str) else kind
        if kinds is not None and k not in kinds:
            raise RunnerError(f"entity {name!r} is a {k}, expected {'/'.join(kinds)}")
        return obj

    def kind(self, name: str) -> str:
        if name not in self._items:
            raise RunnerError(f"entity {name!r} is not defined")
        return self._items[name][0]

    def for_matcher(self, name: str, kind: str | None) -> Any:
        """Lookup used by ``$$matchesEntity`` (any BSON entity) and ``$$sessionLsid``."""
        if kind == "session":
            session = self.get(name, "session")
            if name in self.lsids:
                return SimpleNamespace(session_id=self.lsids[name])
            return session
        return self.get(name, "bson")

    def items(self) -> list[tuple[str, str, Any]]:
        return [(n, k, o) for n, (k, o) in self._items.items()]

    def __contains__(self, name: str) -> bool:
        return name in self._items
