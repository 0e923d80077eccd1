"""The verifier: a pure function over the received change events and the plan.

Checks, in stream order, for every received event (the first failure is reported):

1. **duplicate** – the same event (same resume token, or the same planned op) arrived before;
2. **token order** – ``_id._data`` strictly greater than the previous event's (tokens sort by
   their ``_data`` hex string in stream order: server resume_token.h, KeyString v2);
3. **planned** – the event is an insert/update/delete of a planned document op (insert and
   update events name their op through the ``s`` field; a delete is the document's only one);
4. **document order** – the document's previous planned op arrived already;

then after the stream: 5. **complete** – every planned op arrived; and 6. **final contents**
– the collections read back equal the plan's expected final state (when given).

:func:`inject_fault` perturbs a received stream (``reorder``, ``drop``, ``duplicate``) so a run
can prove the verifier catches each kind of fault.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from shardsim.testing import invariants
from shardsim.tools.load.plan import DELETE, INSERT, KIND_NAMES, UPDATE, Plan

OP_CODES = {"insert": INSERT, "update": UPDATE, "delete": DELETE}
FAULTS = ("reorder", "drop", "duplicate")


class Event(NamedTuple):
    """The parts of one change event the verifier needs.

    ``token`` the resume token's ``_data``; ``op`` operationType; ``coll`` collection name
    (``ns.coll``); ``id`` ``documentKey._id``; ``seq`` the plan op named by the event's
    payload (``fullDocument.s`` / ``updatedFields.s``; -1 when absent, e.g. deletes);
    ``recv`` wall-clock receive time (s since the epoch; 0.0 if unknown).
    """

    token: str
    op: str
    coll: str
    id: Any
    seq: int = -1
    recv: float = 0.0


def event_from_change(change: Mapping[str, Any], recv: float = 0.0) -> Event:
    """Extract an :class:`Event` from a change-stream document (pymongo dict)."""
    op = change.get("operationType", "")
    seq = -1
    if op == "insert":
        seq = (change.get("fullDocument") or {}).get("s", -1)
    elif op in ("update", "replace"):
        ud = change.get("updateDescription") or {}
        seq = (ud.get("updatedFields") or {}).get("s", -1)
        if op == "replace":
            seq = (change.get("fullDocument") or {}).get("s", -1)
    ns = change.get("ns") or {}
    dk = change.get("documentKey") or {}
    return Event(change["_id"]["_data"], op, ns.get("coll", ""), dk.get("_id"), seq, recv)


@dataclass
class Violation:
    """The first bad event: ``index`` in the received stream (-1 for a missing op / final
    state mismatch), ``kind`` (duplicate, token-order, unplanned, document-order, missing,
    final-state), and a human ``message`` naming the event."""

    index: int
    kind: str
    message: str
    event: Event | None = None

    def __str__(self) -> str:
        return self.message


@dataclass
class Report:
    """Outcome of :func:`verify`: ``ok``, the first ``violation`` (or None), and counters."""

    ok: bool
    violation: Violation | None
    events: int
    planned: int
    matched: int
    missing: int = 0
    final_checked: bool = False
    stats: dict[str, Any] = field(default_factory=dict)


def _describe_event(i: int, ev: Event) -> str:
    seq = f" s={ev.seq}" if ev.seq >= 0 else ""
    return f"event #{i} ({ev.op} {ev.coll} _id={ev.id!r}{seq}, token {ev.token[:26]}…)"


def verify(plan: Plan, events: Sequence[Event],
           final: Mapping[str, Mapping[Any, Mapping[str, Any]]] | None = None) -> Report:
    """Verify ``events`` (in received order) against ``plan``; see the module docstring.

    ``final`` is optional: collection name → ``{_id: document}`` as read back from the cluster.
    Events of other namespaces than the plan's collections are violations too (the watchers
    watch only the plan's database). Never raises on bad input; returns a :class:`Report`.

    Each invariant is one checker of :mod:`shardsim.testing.invariants` run over the whole
    stream (C-speed passes when it holds); the first bad event is the earliest any of them
    finds, ties going to the order of the module docstring (as one pass in stream order would
    report it).
    """
    n = len(plan)
    seqs = _planned_ops(plan, events)
    tokens = [ev.token for ev in events]
    found: list[tuple[int, int, str, str]] = []  # (index, rank, kind, message)
    for i, j in invariants.duplicate_events(tokens, first=True):
        found.append((i, 0, "duplicate", f"is a duplicate of event #{j}"))
    for i, j in invariants.duplicate_events(seqs, first=True, ignore=-1):
        found.append((i, 1, "duplicate", f"repeats {plan.describe(seqs[i])}, already "
                                         f"delivered as event #{j}"))
    for i in invariants.unordered_events(tokens, first=True):
        found.append((i, 2, "token-order", f"has a resume token not greater than the previous "
                                           f"event's ({tokens[i - 1][:26]}…)"))
    if -1 in seqs:
        found.append((seqs.index(-1), 3, "unplanned", "matches no planned operation"))
    for i, p in invariants.events_before_predecessor(seqs, plan.prev, first=True, size=n):
        later = next((k for k in range(i + 1, len(events))
                      if seqs[k] == p), None)
        fate = "which never arrived" if later is None else f"which arrived later as event #{later}"
        found.append((i, 4, "document-order", f"is {plan.describe(seqs[i])} but arrived before "
                                              f"the document's previous {plan.describe(p)}, {fate}"))
    violation: Violation | None = None
    if found:
        i, _, kind, msg = min(found)
        violation = Violation(i, kind, f"{_describe_event(i, events[i])} {msg}", events[i])
        matched = i  # every event before the first bad one delivered a planned op once
        missing = n - matched
    else:
        matched, missing = len(events), n - len(events)
        if matched < n:
            first = invariants.lost_events(range(n), seqs)[0]
            violation = Violation(-1, "missing", f"{plan.describe(first)} never arrived "
                                  f"({n - matched} of {n} planned ops missing; stream ended "
                                  f"after {len(events)} events)")
    final_checked = False
    if violation is None and final is not None:
        final_checked = True
        violation = _compare_final(plan.expected_final(), final)
    return Report(violation is None, violation, len(events), n, matched, missing, final_checked)


def _planned_ops(plan: Plan, events: Sequence[Event]) -> list[int]:
    """The planned op each event delivers (-1: none): an insert/update names its op in ``s``
    (checked against the plan's kind, collection and _id); a delete is its document's only
    one."""
    coll_index = {name: i for i, name in enumerate(plan.spec.collection_names)}
    n = len(plan)
    kinds, colls, ids, deletes = plan.kinds, plan.colls, plan.ids, plan.deletes
    out = []
    append = out.append
    for ev in events:
        c = coll_index.get(ev.coll)
        code = OP_CODES.get(ev.op)
        seq = -1
        if c is not None and code is not None:
            if code == DELETE:
                seq = deletes.get((c, ev.id), -1)
            elif 0 <= ev.seq < n and kinds[ev.seq] == code and colls[ev.seq] == c \
                    and ids[ev.seq] == ev.id:
                seq = ev.seq
        append(seq)
    return out


def _compare_final(expected: Mapping[str, Mapping[Any, Mapping[str, Any]]],
                   final: Mapping[str, Mapping[Any, Mapping[str, Any]]]) -> Violation | None:
    diff = invariants.final_state_diff(expected, final)
    if diff is None:
        return None
    what, coll, _id, doc, have = diff
    if what == "missing":
        msg = f"final state: {coll} _id={_id!r} is missing (expected {_summ(doc)})"
    elif what == "different":
        msg = f"final state: {coll} _id={_id!r} is {_summ(have)}, expected {_summ(doc)}"
    else:
        msg = (f"final state: {coll} _id={_id!r} should not exist ({len(final.get(coll, {}))} "
               f"documents, expected {len(expected[coll])})")
    return Violation(-1, "final-state", msg)


def _summ(doc: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" if k != "pad" else f"pad: <{len(v)} bytes>"
                           for k, v in doc.items()) + "}"


def inject_fault(events: Sequence[Event], fault: str | None, seed: int = 0
                 ) -> tuple[list[Event], str]:
    """Perturb a received stream for the verifier's self-test; returns (events, description).

    ``reorder`` swaps two adjacent events, ``drop`` removes one, ``duplicate`` delivers one
    event a second time a few events later. Positions are picked from ``seed`` in the middle
    half of the stream. ``None`` returns the stream unchanged. Raises ValueError for an unknown
    fault or a stream too short to perturb (< 2 events).
    """
    out = list(events)
    if not fault:
        return out, ""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
    if len(out) < 2:
        raise ValueError(f"cannot inject {fault}: only {len(out)} events received")
    rng = random.Random(seed)
    lo, hi = len(out) // 4, max(len(out) // 4 + 1, 3 * len(out) // 4)
    i = min(rng.randrange(lo, hi), len(out) - 2)
    if fault == "reorder":
        out[i], out[i + 1] = out[i + 1], out[i]
        return out, f"injected reorder: swapped received events #{i} and #{i + 1}"
    if fault == "drop":
        del out[i]
        return out, f"injected drop: removed received event #{i}"
    j = min(len(out), i + 1 + rng.randrange(5))
    out.insert(j, out[i])
    return out, f"injected duplicate: event #{i} delivered again at #{j}"


def final_from_docs(docs_by_coll: Mapping[str, Iterable[Mapping[str, Any]]]
                    ) -> dict[str, dict[Any, dict[str, Any]]]:
    """Collection name → documents (as read with find) to ``{coll: {_id: doc}}``."""
    return {c: {d["_id"]: dict(d) for d in docs} for c, docs in docs_by_coll.items()}


__all__ = ["Event", "Violation", "Report", "verify", "inject_fault", "event_from_change",
           "final_from_docs", "FAULTS", "KIND_NAMES"]
