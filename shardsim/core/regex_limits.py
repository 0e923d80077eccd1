"""``$regex`` with a match limit, and the matcher's deadline check (issue 28, audit D2).

mongod 8.0 evaluates ``$regex`` with PCRE2 (``src/mongo/util/pcre.cpp``): a backtracking
pattern such as ``(a|a)+$`` stops at PCRE2's match limit (10,000,000 steps by default) and
``RegexMatchExpression::matchesSingleElement`` (``src/mongo/db/matcher/expression_leaf.cpp``)
takes a match that ended in an error as *no match*: the document is not returned and no error is
raised. The operation runs on its own thread, and past ``maxTimeMS`` it fails with
MaxTimeMSExpired (50).

Python's ``re`` has no limit and cannot be interrupted (``(a+)+$`` on ``"a" * 28 + "!"`` held a
shard's only loop for 18.8 s). Here a ``$regex`` is evaluated with the ``regex`` package, which
avoids much of that backtracking (``(a+)+$`` is linear in it) and takes a ``timeout``:

- each evaluation (one pattern against one string) may run :data:`MATCH_BUDGET_S` (2 ms,
  plus :data:`BUDGET_PER_MB_S` per MB of string), this project's stand-in for PCRE2's match
  limit; past it the string does not match, as in 8.0;
- within an operation that has a deadline (``maxTimeMS``, :mod:`shardsim.core.max_time`) the
  evaluation stops at the deadline instead and the operation fails with 50.

:func:`install` puts both into mongomock's matcher (its ``$regex`` operator and its bare-regex
and ``$in`` paths), and makes every ``filter_applies`` call (one per document tested by finds,
counts, updates, deletes and ``$match`` stages) an interrupt point for ``maxTimeMS``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import regex as _regex_mod
from bson import Regex

from shardsim.core import max_time
from shardsim.core.errors import MongoError

MATCH_BUDGET_S = 0.002  # one pattern against one (short) string, at most (seconds)
BUDGET_PER_MB_S = 0.02  # and this much more per MB of string (a linear scan of 16 MB: ~60 ms)


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str, flags: int) -> Any:
    """``pattern`` compiled by the ``regex`` package (``re`` flag values are its own)."""
    try:
        return _regex_mod.compile(pattern, flags | _regex_mod.VERSION0)
    except _regex_mod.error as exc:  # ``re`` took it; report it as mongod reports a bad one
        raise MongoError(51091, f"Regular expression is invalid: {exc}") from None


# ``re`` flags as the ``regex`` package numbers them (the same values, but for ASCII)
_FLAGS = ((re.IGNORECASE, _regex_mod.IGNORECASE), (re.MULTILINE, _regex_mod.MULTILINE),
          (re.DOTALL, _regex_mod.DOTALL), (re.VERBOSE, _regex_mod.VERBOSE),
          (re.ASCII, _regex_mod.ASCII))


def _flags(re_flags: int) -> int:
    return sum(theirs for ours, theirs in _FLAGS if re_flags & ours)


def _pattern_of(spec: Any) -> Any:
    if isinstance(spec, str):
        return _compiled(spec, 0)
    if isinstance(spec, re.Pattern):
        return _compiled(spec.pattern, _flags(spec.flags))
    if isinstance(spec, Regex):
        compiled = spec.try_compile()
        return _compiled(compiled.pattern, _flags(compiled.flags))
    if isinstance(spec, _regex_mod.Pattern):
        return spec
    raise MongoError(2, "$regex has to be a string")


def search(spec: Any, text: str) -> bool:
    """True when the pattern ``spec`` (a string, ``re`` pattern or ``bson.Regex``) matches
    somewhere in ``text``. An evaluation past its budget is no match; one that
    reaches the operation's deadline raises MaxTimeMSExpired (50)."""
    pattern = _pattern_of(spec)
    limit = MATCH_BUDGET_S + BUDGET_PER_MB_S * (len(text) / 1_000_000)
    left = max_time.remaining()
    budget = limit if left is None else max(0.0, min(limit, left))
    try:
        return pattern.search(text, timeout=budget) is not None
    except TimeoutError:
        if left is not None and left <= limit:
            raise max_time.expired_error() from None
        return False  # the match limit: no match, as RegexMatchExpression in 8.0


def regex_op(doc_val: Any, spec: Any) -> bool:
    """mongomock's ``_regex(doc_val, regex)`` with :func:`search`: a string, or an array with
    a matching string element."""
    if isinstance(doc_val, str):
        return search(spec, doc_val)
    if isinstance(doc_val, list):
        return any(search(spec, item) for item in doc_val if isinstance(item, str))
    return False


def install() -> None:
    """Put :func:`regex_op` and the deadline check into mongomock's matcher (idempotent)."""
    from mongomock import filtering as mm_filtering
    if getattr(mm_filtering, "_shardsim_limits", False):
        return
    mm_filtering._regex = regex_op
    ops = mm_filtering._filterer_inst._operator_map
    ops["$regex"] = mm_filtering._not_nothing_and(regex_op)
    original = mm_filtering.filter_applies

    def filter_applies(search_filter: Any, document: Any) -> bool:
        max_time.check()
        return original(search_filter, document)

    mm_filtering.filter_applies = filter_applies
    mm_filtering._shardsim_limits = True
