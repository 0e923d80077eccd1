"""Simple filters compiled once per query into Python closures (mongomock's results, faster).

mongomock's matcher (``filtering.filter_applies``) interprets the filter for every document
(about 5-20 µs each). :func:`compile_filter` turns the forms queries mostly use into one
closure per query, as mongod parses a filter once into a ``MatchExpression`` tree
(``expression_parser.cpp``) and runs it per document:

* ``{field: v}`` and ``{field: {$eq: v}}``, ``$gt``/``$gte``/``$lt``/``$lte``, ``$in`` (a
  list of such values), ``$exists`` (bool), several fields, ``$and`` of such filters;
* ``field``: a top-level name (no dots, no ``$``); ``v``: an int, a float other than NaN, or
  a string (``$in`` elements alike).

A document whose value at such a field is anything but an int, float, bool, string or null
(an array, a subdocument, a date...) is matched by mongomock instead, so arrays, type brackets
and the rest keep exactly mongomock's answers; for the plain values the closures give the
answers mongomock gives (``0 == False`` included; ranges within the number or the string
bracket). Anything else returns None: the caller uses :func:`shardsim.core.query.matches`.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

_PLAIN_DOC = (int, float, bool, str, type(None))
_RANGE = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}
_MISSING = object()
_FALLBACK = object()  # a test's answer: "ask mongomock"


def _operand(v: Any) -> bool:
    t = type(v)
    return t is str or t is int or (t is float and not math.isnan(v))


def _number(v: Any) -> bool:
    t = type(v)
    return t is int or t is float


def _field_tests(field: str, spec: Any) -> list[Callable[[Any], Any]] | None:
    """Tests of one field's value (``_MISSING`` when absent): True/False, or ``_FALLBACK``."""
    if isinstance(spec, dict) and spec and all(isinstance(k, str) and k.startswith("$")
                                               for k in spec):
        tests = []
        for op, arg in spec.items():
            if op == "$eq" and _operand(arg):
                tests.append(_eq(arg))
            elif op in _RANGE and _operand(arg):
                tests.append(_range(_RANGE[op], arg))
            elif op == "$in" and isinstance(arg, list) and all(map(_operand, arg)):
                tests.append(_in(arg))
            elif op == "$exists" and type(arg) is bool:
                tests.append(_exists(arg))
            else:
                return None
        return tests
    if _operand(spec):
        return [_eq(spec)]
    return None


def _eq(x: Any) -> Callable[[Any], Any]:
    def test(v: Any) -> Any:
        if v is _MISSING:
            return False
        if type(v) not in _PLAIN_DOC:
            return _FALLBACK
        return v is not None and v == x
    return test


def _in(xs: list[Any]) -> Callable[[Any], Any]:
    strs = {x for x in xs if type(x) is str}
    nums = [x for x in xs if type(x) is not str]

    def test(v: Any) -> Any:
        if v is _MISSING or v is None:
            return False
        t = type(v)
        if t not in _PLAIN_DOC:
            return _FALLBACK
        if t is str:
            return v in strs
        return any(v == x for x in nums)
    return test


def _range(op: Callable[[Any, Any], bool], x: Any) -> Callable[[Any], Any]:
    want_str = type(x) is str

    def test(v: Any) -> Any:
        if v is _MISSING or v is None:
            return False
        t = type(v)
        if t not in _PLAIN_DOC:
            return _FALLBACK
        if want_str:
            return t is str and op(v, x)
        return _number(v) and op(v, x)
    return test


def _exists(want: bool) -> Callable[[Any], Any]:
    def test(v: Any) -> Any:
        return (v is not _MISSING) == want
    return test


def _collect(filt: dict[str, Any], out: list[tuple[str, list[Any]]]) -> bool:
    for field, spec in filt.items():
        if field == "$and":
            if not isinstance(spec, list) or not spec or \
                    not all(isinstance(c, dict) and c and _collect(c, out) for c in spec):
                return False
            continue
        if not isinstance(field, str) or not field or "." in field or field.startswith("$"):
            return False
        tests = _field_tests(field, spec)
        if tests is None:
            return False
        out.append((field, tests))
    return True


def compile_filter(filt: dict[str, Any] | None) -> Callable[[dict[str, Any]], Any] | None:
    """A closure ``doc -> True | False | _FALLBACK`` for ``filt``, or None when the filter is
    not one of the simple forms. Use :func:`matcher` for a ready ``(filt, doc) -> bool``."""
    if not filt or not isinstance(filt, dict):
        return None
    clauses: list[tuple[str, list[Any]]] = []
    if not _collect(filt, clauses):
        return None

    def run(doc: dict[str, Any]) -> Any:
        for field, tests in clauses:
            v = doc.get(field, _MISSING)
            for test in tests:
                r = test(v)
                if r is not True:
                    return r
        return True
    return run


def matcher(filt: dict[str, Any] | None, slow: Callable[[Any, Any], bool],
            tick: Callable[[], None] | None = None) -> Callable[[Any, dict[str, Any]], bool]:
    """``(filt, doc) -> bool`` for one query: the compiled closure with ``slow`` (mongomock's
    matcher, :func:`shardsim.core.query.matches`) for the documents it does not decide, or
    ``slow`` itself when the filter does not compile. ``tick`` (the deadline check) is called
    every 512 documents."""
    run = compile_filter(filt)
    if run is None:
        return slow
    seen = [0]

    def match(f: Any, doc: dict[str, Any]) -> bool:
        if tick is not None:
            seen[0] += 1
            if not seen[0] & 511:
                tick()
        r = run(doc)
        if r is _FALLBACK:
            return slow(f, doc)
        return r
    return match
