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


def no_lost_acknowledged_write(o: Observed) -> list[str]:
    """Every acknowledged insert is there; every acknowledged $inc is reflected."""
    out = [f"acknowledged insert {i} lost" for i in sorted(o.acked_inserts) if i not in o.docs]
    out += [f"acknowledged $inc of {i} lost (n={o.docs.get(i, {}).get('n', 0)})"
            for i in sorted(o.acked_incs) if o.docs.get(i, {}).get("n", 0) < 1]
    return out


def no_doubled_write(o: Observed) -> list[str]:
    """No $inc applied twice, none applied that was acknowledged as matching nothing; no
    document that nobody inserted."""
    out = [f"$inc of {i} applied {d.get('n')} times" for i, d in sorted(o.docs.items())
           if d.get("n", 0) > 1]
    out += [f"$inc of {i} acknowledged as matching nothing but applied" for i in
            sorted(o.acked_noop_incs) if o.docs.get(i, {}).get("n", 0) > 0]
    known = o.acked_inserts | o.ambiguous_inserts
    out += [f"document {i} was never written" for i in sorted(o.docs) if i not in known]
    return out


def _key(ev: dict[str, Any]) -> tuple[str, Any]:
    return ev["operationType"], ev["documentKey"]["_id"]


def no_lost_event(o: Observed) -> list[str]:
    """Every write that took effect (seen in the final documents) has its event."""
    seen = {_key(e) for e in o.events}
    out = [f"insert event of {i} missing" for i in sorted(o.docs) if ("insert", i) not in seen]
    out += [f"update event of {i} missing" for i, d in sorted(o.docs.items())
            if d.get("n", 0) >= 1 and ("update", i) not in seen]
    return out


def no_duplicated_event(o: Observed) -> list[str]:
    """Each event once: resume tokens unique, one event per (operation, document)."""
    out: list[str] = []
    tokens: set[str] = set()
    keys: set[tuple[str, Any]] = set()
    for e in o.events:
        tok = e["_id"]["_data"]
        if tok in tokens:
            out.append(f"event {tok} delivered twice")
        tokens.add(tok)
        k = _key(e)
        if k in keys:
            out.append(f"{k[0]} event of {k[1]} delivered twice")
        keys.add(k)
    return out


def no_reordered_event(o: Observed) -> list[str]:
    """Events in resume-token order, and the writer's acknowledged writes in write order: op
    ``i``'s insert before its update, and ``i`` before ``i + 1``. An ambiguous write has no
    place in that order: when its shard died after applying it but before replying, the
    router never learned its cluster time, so a later write on another shard may get an
    earlier one (no causal order without an acknowledgement; mongod behaves the same)."""
    out: list[str] = []
    prev = ""
    for e in o.events:
        tok = e["_id"]["_data"]
        if tok < prev:
            out.append(f"event {tok} after {prev}")
        prev = tok
    acked = {(i, 0) for i in o.acked_inserts} | {(i, 1) for i in o.acked_incs}
    order = [(e["documentKey"]["_id"], 0 if e["operationType"] == "insert" else 1)
             for e in o.events if e["operationType"] in ("insert", "update")]
    order = [k for k in order if k in acked]
    for a, b in zip(order, order[1:]):
        if b < a:
            out.append(f"write {b} streamed after {a}")
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


# -- interrupted migrations and reshardings (tests/faults/migration.py) -----------------------
@dataclass
class ShardState:
    """Every shard's own documents of a trial's collection (read directly from each shard),
    the owner of a document by ``config.chunks`` (``owner``), what was left of the migration
    machinery (``leftovers``: coordinator documents, range-deletion tasks, temporary
    collections, resharding state), the writer's ``$inc``s per ``_id`` (``acked``,
    ``ambiguous``), the ``_id``s that must exist, and the stream's events."""

    docs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # shard -> documents
    owner: Callable[[dict[str, Any]], Any] = lambda doc: None
    leftovers: list[str] = field(default_factory=list)
    acked: dict[Any, int] = field(default_factory=dict)
    ambiguous: dict[Any, int] = field(default_factory=dict)
    ids: set[Any] = field(default_factory=set)
    events: list[dict[str, Any]] = field(default_factory=list)
    pattern: Any = None
    chunks: list[Any] = field(default_factory=list)


def no_orphan(st: ShardState) -> list[str]:
    """No shard keeps a document of a chunk it does not own."""
    return [f"{shard} keeps {d['_id']} of {st.owner(d)}'s chunk"
            for shard, docs in sorted(st.docs.items()) for d in docs if st.owner(d) != shard]


def no_duplicate_copy(st: ShardState) -> list[str]:
    """Each document on one shard only, and every document there."""
    where: dict[Any, list[str]] = {}
    for shard, docs in st.docs.items():
        for d in docs:
            where.setdefault(d["_id"], []).append(shard)
    out = [f"{i} on {w}" for i, w in sorted(where.items(), key=repr) if len(w) > 1]
    out += [f"document {i} lost" for i in sorted(st.ids - set(where), key=repr)]
    return out


def _n(st: ShardState) -> dict[Any, int]:
    """The final ``n`` of each ``_id`` (the owner's copy when there are several)."""
    out: dict[Any, int] = {}
    for shard, docs in st.docs.items():
        for d in docs:
            if st.owner(d) == shard or d["_id"] not in out:
                out[d["_id"]] = int(d.get("n", 0))
    return out


def no_lost_inc(st: ShardState) -> list[str]:
    """Every acknowledged ``$inc`` is in the document (no stale copy won)."""
    n = _n(st)
    return [f"{i}: n={n.get(i, 0)} < {k} acknowledged $inc" for i, k in sorted(st.acked.items())
            if n.get(i, 0) < k]


def no_doubled_inc(st: ShardState) -> list[str]:
    """No ``$inc`` applied twice: ``n`` at most acknowledged + ambiguous."""
    n = _n(st)
    return [f"{i}: n={v} > {st.acked.get(i, 0)} acknowledged + {st.ambiguous.get(i, 0)} "
            f"ambiguous" for i, v in sorted(n.items(), key=repr)
            if v > st.acked.get(i, 0) + st.ambiguous.get(i, 0)]


def nothing_left(st: ShardState) -> list[str]:
    """No coordinator document, range-deletion task, temporary collection or resharding
    state left after the recovery."""
    return list(st.leftovers)


def no_cleanup_event(st: ShardState) -> list[str]:
    """The stream shows the ``$inc``s, one event each, and nothing of the clone, the range
    deletions or the drops (all ``fromMigrate``)."""
    kinds = [e["operationType"] for e in st.events]
    out = [f"{k} event of {e.get('documentKey')}" for k, e in zip(kinds, st.events)
           if k != "update"]
    applied = sum(_n(st).values())
    if kinds.count("update") != applied:
        out.append(f"{kinds.count('update')} update events for {applied} applied $inc")
    return out


SHARD_CHECKERS: dict[str, Callable[[ShardState], list[str]]] = {
    "orphan": no_orphan,
    "duplicate_copy": no_duplicate_copy,
    "lost_inc": no_lost_inc,
    "doubled_inc": no_doubled_inc,
    "leftover": nothing_left,
    "cleanup_event": no_cleanup_event,
}


def check_shards(st: ShardState) -> dict[str, list[str]]:
    """``{invariant: violations}`` for every shard checker."""
    return {name: fn(st) for name, fn in SHARD_CHECKERS.items()}
