"""One checker per invariant of a fault trial. Each takes the :class:`Observed` outcome of a
trial and returns a list of violations (strings; empty when the invariant holds).

A trial's writer runs, one after the other, for each op ``i``: ``insert {_id: i, seq: i}``
then ``update {_id: i} {$inc: {n: 1}}``. Each write is *acknowledged* (the driver returned a
result; an ``$inc`` that matched no document, because its insert was not applied, is noted
apart), or *ambiguous* (the driver raised: it may or may not have been applied; a retryable
write is never applied twice either way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from shardsim.testing import invariants


@dataclass
class Observed:
    """What a trial saw: the writer's outcomes, the final documents, the stream's events."""

    acked_inserts: set[int] = field(default_factory=set)
    ambiguous_inserts: set[int] = field(default_factory=set)
    acked_incs: set[int] = field(default_factory=set)  # acknowledged, matched its document
    acked_noop_incs: set[int] = field(default_factory=set)  # acknowledged, matched nothing
    ambiguous_incs: set[int] = field(default_factory=set)
    docs: dict[int, dict[str, Any]] = field(default_factory=dict)  # _id -> final document
    events: list[dict[str, Any]] = field(default_factory=list)  # in stream order


def _applied(o: Observed) -> dict[tuple[str, int], int]:
    """How many times each write took effect, read off the final documents: the insert of
    ``i`` once if its document is there, its ``$inc`` ``n`` times."""
    out = {("insert", i): 1 for i in o.docs}
    out.update({("update", i): d.get("n", 0) for i, d in o.docs.items()})
    return out


def _writes(inserts: set[int], incs: set[int]) -> list[tuple[str, int]]:
    return [("insert", i) for i in sorted(inserts)] + [("update", i) for i in sorted(incs)]


def no_lost_acknowledged_write(o: Observed) -> list[str]:
    """Every acknowledged insert is there; every acknowledged $inc is reflected
    (:func:`invariants.lost_writes`)."""
    out = []
    for op, i in invariants.lost_writes(_writes(o.acked_inserts, o.acked_incs), _applied(o)):
        out.append(f"acknowledged insert {i} lost" if op == "insert" else
                   f"acknowledged $inc of {i} lost (n={o.docs.get(i, {}).get('n', 0)})")
    return out


def no_doubled_write(o: Observed) -> list[str]:
    """No $inc applied twice, none applied that was acknowledged as matching nothing; no
    document that nobody inserted (:func:`invariants.doubled_writes`)."""
    possible = set(_writes(o.acked_inserts | o.ambiguous_inserts,
                           o.acked_incs | o.ambiguous_incs))
    out = []
    for (op, i), n in sorted(invariants.doubled_writes(_applied(o), possible)):
        if op == "insert":
            out.append(f"document {i} was never written")
        elif n > 1:
            out.append(f"$inc of {i} applied {n} times")
        else:
            out.append(f"$inc of {i} acknowledged as matching nothing but applied")
    return out


def _key(ev: dict[str, Any]) -> tuple[str, Any]:
    return ev["operationType"], ev["documentKey"]["_id"]


def no_lost_event(o: Observed) -> list[str]:
    """Every write that took effect (seen in the final documents) has its event
    (:func:`invariants.lost_events`)."""
    took_effect = sorted(w for w, n in _applied(o).items() if n >= 1)
    return [f"{op} event of {i} missing"
            for op, i in invariants.lost_events(took_effect, map(_key, o.events))]


def no_duplicated_event(o: Observed) -> list[str]:
    """Each event once: resume tokens unique, one event per (operation, document)
    (:func:`invariants.duplicate_events`)."""
    tokens = [e["_id"]["_data"] for e in o.events]
    keys = [_key(e) for e in o.events]
    out = [f"event {tokens[i]} delivered twice" for i, _ in invariants.duplicate_events(tokens)]
    out += [f"{keys[i][0]} event of {keys[i][1]} delivered twice"
            for i, _ in invariants.duplicate_events(keys)]
    return out


def no_reordered_event(o: Observed) -> list[str]:
    """Events in resume-token order, and the writer's acknowledged writes in write order: op
    ``i``'s insert before its update, and ``i`` before ``i + 1``
    (:func:`invariants.unordered_events`). An ambiguous write has no
    place in that order: when its shard died after applying it but before replying, the
    router never learned its cluster time, so a later write on another shard may get an
    earlier one (no causal order without an acknowledgement; mongod behaves the same)."""
    tokens = [e["_id"]["_data"] for e in o.events]
    out = [f"event {tokens[i]} after {tokens[i - 1]}"
           for i in invariants.unordered_events(tokens, strict=False)]
    acked = {(i, 0) for i in o.acked_inserts} | {(i, 1) for i in o.acked_incs}
    order = [(e["documentKey"]["_id"], 0 if e["operationType"] == "insert" else 1)
             for e in o.events if e["operationType"] in ("insert", "update")]
    order = [k for k in order if k in acked]
    out += [f"write {order[i]} streamed after {order[i - 1]}"
            for i in invariants.unordered_events(order, strict=False)]
    return out


CHECKERS: dict[str, Callable[[Observed], list[str]]] = {
    "lost_write": no_lost_acknowledged_write,
    "doubled_write": no_doubled_write,
    "lost_event": no_lost_event,
    "duplicated_event": no_duplicated_event,
    "reordered_event": no_reordered_event,
}


def check(o: Observed) -> dict[str, list[str]]:
    """``{invariant: violations}`` for every checker."""
    return {name: fn(o) for name, fn in CHECKERS.items()}
