"""Collation for queries, sorts and ``distinct`` (``collation`` of find, aggregate, count,
distinct, findAndModify and of each update/delete statement).

mongod compares strings with ICU (``src/mongo/db/query/collation/collator_interface_icu.cpp``).
No maintained Python ICU binding with a collator installs here from a wheel (PyPI has no
PyICU wheels; ``icu4py`` 1.2 binds break iterators, locales and message formats but no
collator; ``pyuca`` has the root collation only, no locales or strengths), so shardsim
implements the part the strengths decide for equality, as folding of string values:

* ``locale: "simple"`` (or no collation): binary comparison, as mongod;
* ``strength: 1`` (primary): case and diacritics ignored (``"Résumé" == "resume"``);
* ``strength: 2`` (secondary): case ignored, diacritics significant;
* ``strength >= 3`` (the default): strings compare as they are.

Not faithful: ordering is code point order of the folded strings, not the locale's
(``"a" < "B"`` holds under ICU at every strength, here only at strengths 1-2);
``caseLevel``, ``caseFirst``, ``numericOrdering``, ``alternate``, ``maxVariable`` and
``backwards`` are accepted and ignored; locales are not checked against ICU's list.

:func:`collation_scope` binds a collation for one command or statement (a ``contextvars``
variable, like :mod:`shardsim.core.expressions`); :func:`fold` is what the matcher, sort and
``distinct`` apply to values while one is bound.
"""

from __future__ import annotations

import contextlib
import contextvars
import unicodedata
from typing import Any, Callable, Iterator

from bson import Regex

from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError

# The active folding function (None: binary comparison).
FOLD: contextvars.ContextVar[Callable[[str], str] | None] = contextvars.ContextVar(
    "shardsim_collation", default=None)
_FIELDS = {"locale", "strength", "caseLevel", "caseFirst", "numericOrdering", "alternate",
           "maxVariable", "normalization", "backwards", "version"}


def _strip_accents(s: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", s) if not unicodedata.combining(c))


def folder(spec: Any) -> Callable[[str], str] | None:
    """The folding function of a ``collation`` document (None for binary comparison).
    FailedToParse/TypeMismatch/BadValue as mongod: 14 for a non-document, 40414 without
    ``locale``, 40415 for an unknown field, 2 for a strength outside 1..5."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise MongoError(14, f"BSON field 'collation' is the wrong type "
                             f"'{bson_type_name(spec)}', expected type 'object'")
    for k in spec:
        if k not in _FIELDS:
            raise MongoError(40415, f"BSON field 'Collation.{k}' is an unknown field.")
    locale = spec.get("locale")
    if not isinstance(locale, str):
        raise MongoError(40414, "BSON field 'Collation.locale' is missing but a required field")
    strength = spec.get("strength", 3)
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or \
            not 1 <= strength <= 5:
        raise MongoError(2, f"Field 'strength' must be an integer 1 through 5. Got: {strength}")
    if locale == "simple":
        return None
    if strength == 1:
        return lambda s: _strip_accents(s).casefold()
    if strength == 2:
        return str.casefold
    return None


@contextlib.contextmanager
def collation_scope(spec: Any) -> Iterator[None]:
    """Bind the collation ``spec`` (see :func:`folder`) for the ``with`` block; ``None``
    keeps whatever is bound."""
    if spec is None:
        yield
        return
    token = FOLD.set(folder(spec))
    try:
        yield
    finally:
        FOLD.reset(token)


def fold(value: Any) -> Any:
    """``value`` with every string folded by the bound collation (documents and arrays
    recursively; field names, regexes and ``$regex`` operands untouched); ``value`` itself
    when no folding collation is bound."""
    f = FOLD.get()
    if f is None:
        return value
    return _fold(value, f)


def _fold(value: Any, f: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return f(value)
    if isinstance(value, dict):
        return {k: (v if k in ("$regex", "$options") else _fold(v, f)) for k, v in value.items()}
    if isinstance(value, list):
        return [_fold(v, f) for v in value]
    if isinstance(value, Regex):
        return value
    return value


def active() -> bool:
    """True while a folding collation is bound."""
    return FOLD.get() is not None
