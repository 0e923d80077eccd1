"""Matching expected values against actual ones, per the unified test format.

Implements "Evaluating Matches" of ``unified-test-format.md``: root-level documents may carry
extra fields, nested ones may not; arrays must have the same length; numbers compare flexibly
(int32/int64/double, never bool, never Decimal128); and the special operators ``$$exists``,
``$$type``, ``$$unsetOrMatches``, ``$$matchesEntity``, ``$$matchesHexBytes``, ``$$sessionLsid``,
``$$lte``, ``$$matchAsDocument``, ``$$matchAsRoot``. A failed match raises :class:`MatchError`
whose message names the path (``root.ns.coll``) and both values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Callable

from bson import json_util
from bson.binary import Binary

from shardsim.core.commands import bson_type_name


class MatchError(AssertionError):
    """An expected value did not match the actual value (message says where and why)."""


class RunnerError(Exception):
    """The test file itself is invalid or uses something this runner does not support."""


class _Missing:
    """Marker for "the key is absent from the actual document"."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()

# $type aliases (https://www.mongodb.com/docs/manual/reference/operator/query/type/)
_NUMBER = ("int", "long", "double", "decimal")

# One implementation of the $type alias for the runner and the servers.
bson_type = bson_type_name


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_operator(value: Any) -> bool:
    """True when ``value`` is a document whose first and only key starts with ``$$``."""
    if not isinstance(value, Mapping) or len(value) != 1:
        return False
    key = next(iter(value))
    return isinstance(key, str) and key.startswith("$$")


def _show(value: Any) -> str:
    try:
        text = json_util.dumps(value, json_options=json_util.RELAXED_JSON_OPTIONS)
    except Exception:  # not BSON-encodable (a driver object): fall back to repr
        text = repr(value)
    return text if len(text) <= 400 else text[:400] + "..."


class Matcher:
    """Evaluates matches; ``entities`` resolves ``$$matchesEntity``/``$$sessionLsid`` names.

    ``entities`` is a callable ``(name, kind) -> object`` raising :class:`RunnerError` for an
    unknown name or wrong type (``kind`` is ``None`` for any BSON entity or ``"session"``).
    """

    def __init__(self, entities: Callable[[str, str | None], Any] | None = None) -> None:
        self._entities = entities

    # -- public API -----------------------------------------------------------------------------
    def match(self, expected: Any, actual: Any, *, root: bool = True, path: str = "root") -> None:
        """Assert ``actual`` matches ``expected``; raise :class:`MatchError` otherwise."""
        self._match(expected, actual, root, path)

    def matches(self, expected: Any, actual: Any, *, root: bool = True) -> bool:
        """Boolean form of :meth:`match` (for event searches)."""
        try:
            self._match(expected, actual, root, "root")
        except MatchError:
            return False
        return True

    # -- internals ------------------------------------------------------------------------------
    def _match(self, expected: Any, actual: Any, root: bool, path: str) -> None:
        if isinstance(expected, Mapping):
            if is_operator(expected):
                self._operator(expected, actual, root, path)
                return
            if actual is MISSING:
                raise MatchError(f"{path}: expected {_show(expected)} but the field is missing")
            if not isinstance(actual, Mapping):
                raise MatchError(f"{path}: expected a document {_show(expected)}, "
                                 f"got {bson_type(actual)} {_show(actual)}")
            for key, value in expected.items():
                sub = f"{path}.{key}"
                act = actual[key] if key in actual else MISSING
                if is_operator(value):
                    self._operator(value, act, False, sub)
                    continue
                if act is MISSING:
                    raise MatchError(f"{sub}: expected {_show(value)} but the field is missing")
                self._match(value, act, False, sub)
            if not root:
                extra = [k for k in actual if k not in expected]
                if extra:
                    raise MatchError(f"{path}: unexpected field(s) {extra} in nested document "
                                     f"{_show(actual)}")
            return
        if isinstance(expected, (list, tuple)):
            if actual is MISSING:
                raise MatchError(f"{path}: expected {_show(expected)} but the field is missing")
            if not isinstance(actual, (list, tuple)):
                raise MatchError(f"{path}: expected an array, got {bson_type(actual)} {_show(actual)}")
            if len(actual) != len(expected):
                raise MatchError(f"{path}: expected {len(expected)} element(s), got {len(actual)}: "
                                 f"{_show(actual)}")
            for i, value in enumerate(expected):
                self._match(value, actual[i], False, f"{path}.{i}")
            return
        if actual is MISSING:
            raise MatchError(f"{path}: expected {_show(expected)} but the field is missing")
        self._scalar(expected, actual, path)

    def _scalar(self, expected: Any, actual: Any, path: str) -> None:
        if _is_number(expected) and _is_number(actual):
            if expected == actual:
                return
            raise MatchError(f"{path}: expected {expected!r}, got {actual!r}")
        et, at = bson_type(expected), bson_type(actual)
        if et != at:
            raise MatchError(f"{path}: expected {et} {_show(expected)}, got {at} {_show(actual)}")
        if isinstance(expected, (bytes, Binary)) or isinstance(actual, (bytes, Binary)):
            es = getattr(expected, "subtype", 0)
            as_ = getattr(actual, "subtype", 0)
            if es != as_ or bytes(expected) != bytes(actual):
                raise MatchError(f"{path}: expected {_show(expected)}, got {_show(actual)}")
            return
        if expected != actual:
            raise MatchError(f"{path}: expected {_show(expected)}, got {_show(actual)}")

    def _operator(self, spec: Mapping, actual: Any, root: bool, path: str) -> None:
        op, arg = next(iter(spec.items()))
        if op == "$$exists":
            if not isinstance(arg, bool):
                raise RunnerError(f"{path}: $$exists takes a boolean, got {arg!r}")
            if arg and actual is MISSING:
                raise MatchError(f"{path}: expected the field to exist")
            if not arg and actual is not MISSING:
                raise MatchError(f"{path}: expected the field to be absent, got {_show(actual)}")
            return
        if op == "$$unsetOrMatches":
            if actual is MISSING:
                return
            self._match(arg, actual, root, path)
            return
        if op == "$$type":
            names = [arg] if isinstance(arg, str) else list(arg)
            if actual is MISSING:
                raise MatchError(f"{path}: expected a value of type {names}, the field is missing")
            allowed: set[str] = set()
            for name in names:
                allowed.update(_NUMBER if name == "number" else (name,))
            got = bson_type(actual)
            if got not in allowed:
                raise MatchError(f"{path}: expected type {names}, got {got} {_show(actual)}")
            return
        if op == "$$matchesEntity":
            if self._entities is None:
                raise RunnerError(f"{path}: $$matchesEntity used without an entity map")
            entity = self._entities(arg, None)
            self._match(entity, actual, root, path)
            return
        if op == "$$sessionLsid":
            if self._entities is None:
                raise RunnerError(f"{path}: $$sessionLsid used without an entity map")
            session = self._entities(arg, "session")
            lsid = session.session_id
            if actual is MISSING:
                raise MatchError(f"{path}: expected lsid of session {arg!r}, the field is missing")
            if not isinstance(actual, Mapping) or dict(actual) != dict(lsid):
                raise MatchError(f"{path}: expected lsid {_show(lsid)} of session {arg!r}, "
                                 f"got {_show(actual)}")
            return
        if op == "$$lte":
            if not _is_number(arg):
                raise RunnerError(f"{path}: $$lte takes a number, got {arg!r}")
            if actual is MISSING or not _is_number(actual):
                raise MatchError(f"{path}: expected a number <= {arg!r}, got {_show(actual)}")
            if not actual <= arg:
                raise MatchError(f"{path}: expected <= {arg!r}, got {actual!r}")
            return
        if op == "$$matchesHexBytes":
            if not isinstance(arg, str) or len(arg) % 2 or not re.fullmatch(r"[0-9A-Fa-f]*", arg):
                raise RunnerError(f"{path}: malformed $$matchesHexBytes {arg!r}")
            want = bytes.fromhex(arg)
            if isinstance(actual, str):
                got = actual.encode("latin-1", "replace")
            elif isinstance(actual, (bytes, bytearray)):
                got = bytes(actual)
            else:
                raise MatchError(f"{path}: expected bytes {arg}, got {_show(actual)}")
            if got != want:
                raise MatchError(f"{path}: expected bytes {arg}, got {got.hex().upper()}")
            return
        if op == "$$matchAsDocument":
            if not isinstance(actual, str):
                raise MatchError(f"{path}: $$matchAsDocument needs an Extended JSON string, got "
                                 f"{bson_type(actual)} {_show(actual)}")
            try:
                parsed = json_util.loads(actual)
            except Exception as exc:
                raise MatchError(f"{path}: not valid Extended JSON ({exc}): {actual!r}") from None
            if not isinstance(parsed, Mapping):
                raise MatchError(f"{path}: Extended JSON is not a document: {actual!r}")
            self._match(arg, parsed, False, path)
            return
        if op == "$$matchAsRoot":
            if actual is MISSING or not isinstance(actual, Mapping):
                raise MatchError(f"{path}: $$matchAsRoot needs a document, got {_show(actual)}")
            if not isinstance(arg, Mapping):
                raise RunnerError(f"{path}: $$matchAsRoot takes a document")
            self._match(arg, actual, True, path)
            return
        if op == "$$placeholder":
            raise RunnerError(f"{path}: $$placeholder cannot be used in an expectation")
        raise RunnerError(f"{path}: unsupported special operator {op}")
