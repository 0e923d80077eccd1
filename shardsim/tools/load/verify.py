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
    """
    names = plan.spec.collection_names
    coll_index = {n: i for i, n in enumerate(names)}
    n = len(plan)
    seen = bytearray(n)
    arrived_at: dict[int, int] = {}
    tokens: dict[str, int] = {}
    kinds, colls, ids, prev = plan.kinds, plan.colls, plan.ids, plan.prev
    last_token = ""
    matched = 0
    violation: Violation | None = None

    def bad(i: int, kind: str, msg: str, ev: Event | None) -> Violation:
        return Violation(i, kind, msg, ev)

    for i, ev in enumerate(events):
        what = _describe_event(i, ev)
        # 1. duplicate by token
        j = tokens.get(ev.token)
        if j is not None:
            violation = bad(i, "duplicate", f"{what} is a duplicate of event #{j}", ev)
            break
        tokens[ev.token] = i
        # 3. which planned op is it?
        c = coll_index.get(ev.coll)
        code = OP_CODES.get(ev.op)
        seq = -1
        if c is not None and code is not None:
            if code == DELETE:
                seq = plan.deletes.get((c, ev.id), -1)
            elif 0 <= ev.seq < n and kinds[ev.seq] == code and colls[ev.seq] == c \
                    and ids[ev.seq] == ev.id:
                seq = ev.seq
        # 1b. duplicate by planned op (a re-delivered event with a different token)
        if seq >= 0 and seen[seq]:
            violation = bad(i, "duplicate", f"{what} repeats {plan.describe(seq)}, "
                            f"already delivered as event #{arrived_at[seq]}", ev)
            break
        # 2. token order
        if ev.token <= last_token:
            violation = bad(i, "token-order", f"{what} has a resume token not greater than "
                            f"the previous event's ({last_token[:26]}…)", ev)
            break
        last_token = ev.token
        if seq < 0:
            violation = bad(i, "unplanned", f"{what} matches no planned operation", ev)
            break
        # 4. document order
        p = prev[seq]
        if p >= 0 and not seen[p]:
            later = next((k for k in range(i + 1, len(events))
                          if _names(plan, events[k], p, coll_index)), None)
            fate = "which never arrived" if later is None else f"which arrived later as event #{later}"
            violation = bad(i, "document-order", f"{what} is {plan.describe(seq)} but arrived "
                            f"before the document's previous {plan.describe(p)}, {fate}", ev)
            break
        seen[seq] = 1
        arrived_at[seq] = i
        matched += 1

    missing = n - matched if violation is None else n - sum(seen)
    if violation is None and matched < n:
        first = seen.find(0)
        violation = Violation(-1, "missing", f"{plan.describe(first)} never arrived "
                              f"({n - matched} of {n} planned ops missing; stream ended after "
                              f"{len(events)} events)")
    final_checked = False
    if violation is None and final is not None:
        final_checked = True
        expected = plan.expected_final()
        violation = _compare_final(expected, final)
    return Report(violation is None, violation, len(events), n, matched, missing, final_checked)


def _names(plan: Plan, ev: Event, seq: int, coll_index: Mapping[str, int]) -> bool:
    """Does ``ev`` deliver planned op ``seq``?"""
    if coll_index.get(ev.coll) != plan.colls[seq] or ev.id != plan.ids[seq]:
        return False
    if plan.kinds[seq] == DELETE:
        return ev.op == "delete"
    return ev.seq == seq and OP_CODES.get(ev.op) == plan.kinds[seq]


def _compare_final(expected: Mapping[str, Mapping[Any, Mapping[str, Any]]],
                   final: Mapping[str, Mapping[Any, Mapping[str, Any]]]) -> Violation | None:
    for coll, docs in expected.items():
        got = final.get(coll, {})
        for _id, doc in docs.items():
            have = got.get(_id)
            if have is None:
                return Violation(-1, "final-state", f"final state: {coll} _id={_id!r} is missing "
                                 f"(expected {_summ(doc)})")
            if dict(have) != dict(doc):
                return Violation(-1, "final-state", f"final state: {coll} _id={_id!r} is "
                                 f"{_summ(have)}, expected {_summ(doc)}")
        extra = next((k for k in got if k not in docs), None)
        if extra is not None:
            return Violation(-1, "final-state", f"final state: {coll} _id={extra!r} should not "
                             f"exist ({len(got)} documents, expected {len(docs)})")
    return None


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
