"""Collation for queries, sorts and ``distinct`` (``collation`` of find, aggregate, count,
distinct, findAndModify and of each update/delete statement).

mongod compares strings with ICU (``src/mongo/db/query/collation/collator_factory_icu.cpp``,
``collator_interface_icu.cpp``). shardsim does too, through PyICU's API from the
``pyicu-wheels`` wheels (PyICU 2.15 with ICU 77.1 bundled; a pinned dependency on Linux, where
it installs without a compiler or the system's ICU headers; ``icu4py`` binds no collator and
``PyICU`` itself needs libicu-dev to build):

* ``locale: "simple"`` (or no collation): binary comparison, as mongod; ``simple`` with any
  other field is FailedToParse (9) "If locale=simple, no other fields should be present in: ...";
* any other locale makes an ICU ``Collator`` with the spec's ``strength`` (1-5), ``caseLevel``,
  ``caseFirst`` (upper/lower/off), ``numericOrdering``, ``alternate``
  (non-ignorable/shifted), ``maxVariable`` (punct/space), ``normalization`` and ``backwards``;
  a locale ICU does not know as given is BadValue (2) "Field 'locale' is invalid in: { locale:
  ... }" (with ". Did you mean '<locale>'?" when ICU would fall back to one), as
  ``validateLocaleID``; ``backwards`` at strength 1 and ``caseFirst`` at strength 1-2 without
  ``caseLevel`` are BadValue as ``validateCollationSpec``. Collators are cached per spec.

While a collation is bound (:func:`collation_scope`), :func:`fold` turns every string into a
:class:`CollationKey`: a ``str`` with the original text (so ``$regex``, which ignores the
collation in mongod, still sees the text) that compares, hashes and sorts by its ICU sort key.
The matcher, sorts, ``$match`` stages and ``distinct`` run on folded copies, so equality,
ranges, ``$in`` and orders are the locale's.

Without ICU (a platform where ``pyicu-wheels`` has no wheel: macOS with this pin), the old
folding is used and said so: strength 1 ignores case and diacritics, strength 2 case, other
strengths compare binary, ordering is code point order (:data:`ICU_AVAILABLE` is False).

Not faithful: mongod 8.0 bundles ICU 57.1 and reports collation ``version: "57.1"``; ICU 77.1
orders some characters added to Unicode since differently. A ``version`` other than "57.1" is
IncompatibleCollationVersion (161). Indexes and collections with a default collation are not
keyed by collation keys (the planner never uses an index while a collation is bound).

:func:`collation_scope` binds a collation for one command or statement (a ``contextvars``
variable, like :mod:`shardsim.core.expressions`).
"""

from __future__ import annotations

import contextlib
import contextvars
import unicodedata
from typing import Any, Callable, Iterator

from bson import Regex

from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError
from shardsim.core.values import format_value

try:  # PyICU's API (pyicu-wheels on Linux)
    import icu as _icu
except ImportError:  # pragma: no cover - a platform without the wheel
    _icu = None

ICU_AVAILABLE = _icu is not None
COLLATION_VERSION = "57.1"  # the ICU version mongod 8.0 bundles and reports

# The active folding function (None: binary comparison).
FOLD: contextvars.ContextVar[Callable[[str], str] | None] = contextvars.ContextVar(
    "shardsim_collation", default=None)
_FIELDS = {"locale", "strength", "caseLevel", "caseFirst", "numericOrdering", "alternate",
           "maxVariable", "normalization", "backwards", "version"}


def _strip_accents(s: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", s) if not unicodedata.combining(c))


class CollationKey(str):
    """A string under a collation: the text itself (``str`` methods, regexes and output see
    it) compared, ordered and hashed by ``key``, its ICU sort key (bytes). Comparing it with
    a plain string or another type is left to the other operand (NotImplemented)."""

    __slots__ = ("key",)

    def __new__(cls, text: str, key: bytes) -> "CollationKey":
        obj = str.__new__(cls, text)
        obj.key = key
        return obj

    def __eq__(self, other: object) -> Any:
        if isinstance(other, CollationKey):
            return self.key == other.key
        return NotImplemented

    def __ne__(self, other: object) -> Any:
        if isinstance(other, CollationKey):
            return self.key != other.key
        return NotImplemented

    def __lt__(self, other: object) -> Any:
        return self.key < other.key if isinstance(other, CollationKey) else NotImplemented

    def __le__(self, other: object) -> Any:
        return self.key <= other.key if isinstance(other, CollationKey) else NotImplemented

    def __gt__(self, other: object) -> Any:
        return self.key > other.key if isinstance(other, CollationKey) else NotImplemented

    def __ge__(self, other: object) -> Any:
        return self.key >= other.key if isinstance(other, CollationKey) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.key)

    def __reduce__(self) -> Any:
        return (CollationKey, (str(self), self.key))


_ENUMS = {"caseFirst": ("upper", "lower", "off"), "alternate": ("non-ignorable", "shifted"),
          "maxVariable": ("punct", "space")}
_BOOLS = ("caseLevel", "numericOrdering", "normalization", "backwards")
_CACHE: dict[Any, Callable[[str], str] | None] = {}


def _freeze(spec: dict[str, Any]) -> Any:
    return tuple((k, v if not isinstance(v, (dict, list)) else repr(v)) for k, v in spec.items())


def folder(spec: Any) -> Callable[[str], str] | None:
    """The folding function of a ``collation`` document (None for binary comparison): with
    ICU, ``text -> CollationKey``. Errors as mongod: TypeMismatch (14) for a non-document or a
    field of the wrong type, 40414 without ``locale``, 40415 for an unknown field, BadValue
    (2) for a strength outside 1..5, an unknown enumeration value, an unknown locale or an
    invalid combination, FailedToParse (9) for ``simple`` with other fields,
    IncompatibleCollationVersion (161) for another ``version``."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise MongoError(14, f"BSON field 'collation' is the wrong type "
                             f"'{bson_type_name(spec)}', expected type 'object'")
    if not spec:  # an empty collation is no collation (mongod checks isEmpty() first)
        return None
    try:
        cache_key = _freeze(spec)
        if cache_key in _CACHE:
            return _CACHE[cache_key]
    except TypeError:
        cache_key = None
    f = _make_folder(spec)
    if cache_key is not None and len(_CACHE) < 256:
        _CACHE[cache_key] = f
    return f


def _make_folder(spec: dict[str, Any]) -> Callable[[str], str] | None:
    for k in spec:
        if k not in _FIELDS:
            raise MongoError(40415, f"BSON field 'Collation.{k}' is an unknown field.")
    locale = spec.get("locale")
    if not isinstance(locale, str):
        if "locale" in spec:
            raise MongoError(14, f"BSON field 'Collation.locale' is the wrong type "
                                 f"'{bson_type_name(locale)}', expected type 'string'")
        raise MongoError(40414, "BSON field 'Collation.locale' is missing but a required field")
    strength = spec.get("strength", 3)
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or \
            not 1 <= strength <= 5 or strength != int(strength):
        raise MongoError(2, f"Field 'strength' must be an integer 1 through 5. Got: {strength}")
    strength = int(strength)
    for k in _BOOLS:
        if k in spec and not isinstance(spec[k], bool):
            raise MongoError(14, f"BSON field 'Collation.{k}' is the wrong type "
                                 f"'{bson_type_name(spec[k])}', expected type 'bool'")
    for k, allowed in _ENUMS.items():
        if k in spec:
            if not isinstance(spec[k], str):
                raise MongoError(14, f"BSON field 'Collation.{k}' is the wrong type "
                                     f"'{bson_type_name(spec[k])}', expected type 'string'")
            if spec[k] not in allowed:
                raise MongoError(2, f"Enumeration value '{spec[k]}' for field "
                                    f"'Collation.{k}' is not a valid value.")
    if locale == "simple":
        if len(spec) > 1:
            raise MongoError(9, f"If locale=simple, no other fields should be present in: "
                                f"{format_value(spec)}")
        return None
    if "\x00" in locale:
        raise MongoError(2, f"Field 'locale' cannot contain null byte. Collation spec: "
                            f"{format_value(spec)}")
    if locale == "":
        raise MongoError(2, f"Field 'locale' cannot be the empty string in: {format_value(spec)}")
    version = spec.get("version")
    if version is not None and version != COLLATION_VERSION:
        raise MongoError(161, f"Requested collation version {version} but the only available "
                             f"collator version was {COLLATION_VERSION}. Requested collation "
                             f"spec: {format_value(spec)}")
    case_level = spec.get("caseLevel", False)
    case_first = spec.get("caseFirst", "off")
    if spec.get("backwards") and strength == 1:
        raise MongoError(2, f"'backwards' is invalid with 'strength' of 1 in: "
                            f"{format_value(spec)}")
    if case_first != "off" and not case_level and strength <= 2:
        raise MongoError(2, f"'caseFirst' is invalid unless 'caseLevel' is on or 'strength' is "
                            f"greater than 2 in: {format_value(spec)}")
    if _icu is None:
        if strength == 1:
            return lambda s: _strip_accents(s).casefold()
        if strength == 2:
            return str.casefold
        return None
    return _icu_folder(spec, locale, strength)


def _icu_folder(spec: dict[str, Any], locale: str, strength: int) -> Callable[[str], str]:
    """``text -> CollationKey`` through an ICU collator configured as
    ``parseToCollationSpec`` configures mongod's; BadValue (2) for a locale ICU would not use
    as given (``validateLocaleID``)."""
    icu = _icu
    loc = icu.Locale(locale)
    if loc.isBogus():
        raise MongoError(2, f"Field 'locale' is not valid in: {format_value(spec)}")
    coll = icu.Collator.createInstance(loc)
    valid = coll.getLocale(icu.ULocDataLocaleType.VALID_LOCALE).getName()
    if locale != "root" and valid != locale:
        msg = f"Field 'locale' is invalid in: {format_value(spec)}"
        if valid and valid != "root":
            msg += f". Did you mean '{valid}'?"
        raise MongoError(2, msg)
    attr, on_off = icu.UCollAttribute, icu.UCollAttributeValue
    levels = {1: on_off.PRIMARY, 2: on_off.SECONDARY, 3: on_off.TERTIARY,
              4: on_off.QUATERNARY, 5: on_off.IDENTICAL}
    coll.setAttribute(attr.STRENGTH, levels[strength])
    flag = {True: on_off.ON, False: on_off.OFF}
    for field, a in (("caseLevel", attr.CASE_LEVEL), ("numericOrdering", attr.NUMERIC_COLLATION),
                     ("normalization", attr.NORMALIZATION_MODE),
                     ("backwards", attr.FRENCH_COLLATION)):
        if field in spec:
            coll.setAttribute(a, flag[spec[field]])
    if "caseFirst" in spec:
        coll.setAttribute(attr.CASE_FIRST, {"upper": on_off.UPPER_FIRST,
                                            "lower": on_off.LOWER_FIRST,
                                            "off": on_off.OFF}[spec["caseFirst"]])
    if "alternate" in spec:
        coll.setAttribute(attr.ALTERNATE_HANDLING, on_off.SHIFTED
                          if spec["alternate"] == "shifted" else on_off.NON_IGNORABLE)
    if "maxVariable" in spec:
        coll.setMaxVariable(icu.UColReorderCode.PUNCTUATION if spec["maxVariable"] == "punct"
                            else icu.UColReorderCode.SPACE)
    sort_key = coll.getSortKey

    def fold_text(text: str) -> str:
        if type(text) is CollationKey:
            return text
        return CollationKey(text, sort_key(text))
    return fold_text


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
