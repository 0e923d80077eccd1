"""The invariants of a change stream and of the writes behind it, in one place.

What a sharded cluster owes the writer and the watcher, stated once and used by the seeded
simulation (``tests/sim/checkers/``), the fault trials (``tests/faults/checkers.py``) and the
load verifier (:mod:`shardsim.tools.load.verify`), and by users of the test kit:

* **writes against the final documents**: :func:`lost_writes` (an acknowledged write whose
  effect is not there), :func:`doubled_writes` (a write applied twice, or applied though nobody
  may have made it), :func:`final_state_diff` (the documents read back against the expected
  ones);
* **events against the writes**: :func:`lost_events` (a write that took effect without its
  event), :func:`unexpected_events` (an event of no write), :func:`duplicate_events` (the same
  event, or the same write's event, twice), :func:`unordered_events` (resume tokens not
  strictly increasing in stream order), :func:`events_before_predecessor` (a write's event
  before the event of the write it follows, e.g. a document's update before its insert) and
  :func:`rolled_back_events` (an event of a write the cluster rolled back: a change stream
  reads at the majority commit point, so it never returns one; server
  ``src/mongo/db/pipeline/document_source_change_stream.cpp`` opens its oplog scan at majority
  read concern).

A *write id* is any hashable value naming one write (``("insert", 7)``, a load plan's op
number); a *token* anything ordered as resume tokens are (the ``_data`` hex strings compare in
stream order: server ``resume_token.h``, KeyString). Every checker is a pure function, returns
the violations as data (indexes into the stream, write ids), never raises on bad input, and
with ``first=True`` stops at the first violation. The common case (no violation) runs at C
speed where it can (``set``, ``map``): the load verifier checks a million events with them.
"""

from __future__ import annotations

import operator
from itertools import islice
from typing import Any, Callable, Container, Hashable, Iterable, Mapping, Sequence

# -- writes against the final documents ------------------------------------------------------


def lost_writes(acknowledged: Iterable[Hashable], applied: Mapping[Hashable, int]) -> list[Any]:
    """The acknowledged writes (in the given order) whose effect is not in the final documents:
    ``applied[w]`` (how many times write ``w`` took effect, read off the final documents;
    missing = 0) is below 1."""
    return [w for w in acknowledged if applied.get(w, 0) < 1]


def doubled_writes(applied: Mapping[Hashable, int], possible: Container[Hashable]
                   ) -> list[tuple[Any, int]]:
    """``(write, times)`` for every write that took effect more than once, or at all though it
    is not in ``possible`` (the writes that were acknowledged as applied or whose outcome is
    unknown: a write acknowledged as matching nothing, or never sent, must not show)."""
    return [(w, n) for w, n in applied.items() if n > 1 or (n > 0 and w not in possible)]


def final_state_diff(expected: Mapping[str, Mapping[Any, Mapping[str, Any]]],
                     final: Mapping[str, Mapping[Any, Mapping[str, Any]]]
                     ) -> tuple[str, str, Any, Any, Any] | None:
    """The first difference between the expected documents and those read back, both as
    ``{collection: {_id: document}}``: ``("missing", coll, _id, expected_doc, None)``,
    ``("different", coll, _id, expected_doc, found_doc)`` or ``("extra", coll, _id, None,
    found_doc)``; None when they are equal (collections of ``final`` not in ``expected`` are
    not judged)."""
    for coll, docs in expected.items():
        got = final.get(coll, {})
        for _id, doc in docs.items():
            have = got.get(_id)
            if have is None:
                return ("missing", coll, _id, doc, None)
            if dict(have) != dict(doc):
                return ("different", coll, _id, doc, have)
        extra = next((k for k in got if k not in docs), None)
        if extra is not None:
            return ("extra", coll, extra, None, got[extra])
    return None


# -- events against the writes ----------------------------------------------------------------


def lost_events(expected: Iterable[Hashable], delivered: Iterable[Hashable]) -> list[Any]:
    """The writes of ``expected`` (in its order) that took effect but whose event is not among
    ``delivered`` (the write ids of the events received)."""
    got = delivered if isinstance(delivered, (set, frozenset)) else set(delivered)
    return [w for w in expected if w not in got]


def unexpected_events(writes: Sequence[Hashable], expected: Container[Hashable],
                      first: bool = False) -> list[int]:
    """Indexes of the events whose write id is not in ``expected`` (an event nobody's write
    made, or of another namespace)."""
    out = []
    for i, w in enumerate(writes):
        if w not in expected:
            out.append(i)
            if first:
                break
    return out


def duplicate_events(keys: Sequence[Hashable], first: bool = False,
                     ignore: Any = None) -> list[tuple[int, int]]:
    """``(index, index of the first occurrence)`` of every event whose key (a resume token, or
    the write id it delivers) was delivered before; keys equal to ``ignore`` (e.g. the id of
    an event that names no write) are skipped."""
    ignored = keys.count(ignore) if ignore is not None else 0
    if len(set(keys)) - (1 if ignored else 0) == len(keys) - ignored:
        return []  # the usual case, at C speed
    out: list[tuple[int, int]] = []
    seen: dict[Any, int] = {}
    for i, k in enumerate(keys):
        if ignore is not None and k == ignore:
            continue
        j = seen.get(k)
        if j is not None:
            out.append((i, j))
            if first:
                break
        else:
            seen[k] = i
    return out


def unordered_events(tokens: Sequence[Any], first: bool = False,
                     strict: bool = True) -> list[int]:
    """Indexes ``i`` where ``tokens[i]`` does not sort after ``tokens[i - 1]`` (strictly, or
    at least equal with ``strict=False``): a merged stream returns its events in increasing
    resume-token order, each once."""
    less = operator.lt if strict else operator.le
    if all(map(less, tokens, islice(tokens, 1, None))):
        return []  # the usual case, at C speed
    out = []
    for i in range(1, len(tokens)):
        if not less(tokens[i - 1], tokens[i]):
            out.append(i)
            if first:
                break
    return out


def events_before_predecessor(writes: Sequence[int], prev: Sequence[int] | Callable[[int], int],
                              first: bool = False, size: int | None = None
                              ) -> list[tuple[int, int]]:
    """``(index, predecessor)`` of every event delivering write ``w`` (a non-negative int)
    whose predecessor ``prev[w]`` (the write it follows, e.g. the same document's previous
    write; negative: none) was not delivered before it. Negative write ids (events that name
    no write) are skipped. ``size`` bounds the write ids (default: ``len(prev)``)."""
    get = prev.__getitem__ if not callable(prev) else prev
    seen = bytearray(size if size is not None else len(prev))  # type: ignore[arg-type]
    out = []
    for i, w in enumerate(writes):
        if w < 0:
            continue
        p = get(w)
        if p >= 0 and not seen[p]:
            out.append((i, p))
            if first:
                break
        seen[w] = 1
    return out


def rolled_back_events(writes: Sequence[Hashable], rolled_back: Container[Hashable],
                       first: bool = False) -> list[int]:
    """Indexes of the events that deliver a write of ``rolled_back`` (the ids of the writes a
    rollback undid: they were never majority-committed, so no change stream may return
    them)."""
    out = []
    for i, w in enumerate(writes):
        if w in rolled_back:
            out.append(i)
            if first:
                break
    return out


__all__ = ["doubled_writes", "duplicate_events", "events_before_predecessor",
           "final_state_diff", "lost_events", "lost_writes", "rolled_back_events",
           "unexpected_events", "unordered_events"]
