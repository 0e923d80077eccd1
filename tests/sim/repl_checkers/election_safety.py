"""Election safety: at most one member wins the election of a term (Raft's Election Safety;
PV1's one vote per term, persisted, is what guarantees it)."""

from __future__ import annotations

from typing import Any


def check(h: Any) -> list[str]:
    """Every term won by two different members."""
    winner: dict[int, int] = {}
    out = []
    for time, term, member in h.wins:
        if winner.setdefault(term, member) != member:
            out.append(f"election safety: term {term} won by member {winner[term]} and by "
                       f"member {member} (at {time} ms)")
    return out
