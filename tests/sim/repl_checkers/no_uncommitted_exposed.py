"""No uncommitted entry is ever exposed as committed: what a change stream (or a majority read)
on any member returned -- the entries up to that member's commit point -- never includes an
entry that a rollback removes afterwards (on any member), and a rollback never has to go below
a commit point. (An entry rolled back on one member while still uncommitted may legitimately
commit later from another member's oplog: only a rollback after its exposure is a violation.)"""

from __future__ import annotations

from typing import Any


def check(h: Any) -> list[str]:
    """Rolled-back entries that some member had exposed, and rollbacks below a commit point."""
    out = [f"member {m} had to roll back below its commit point at {t} ms: {msg}"
           for t, m, msg in h.rollback_errors]
    for time, member, uid in h.rolled_back:
        if uid in h.exposed and h.exposed[uid][0] <= time:
            at, by = h.exposed[uid]
            out.append(f"entry {uid} exposed as committed by member {by} at {at} ms was rolled "
                       f"back by member {member} at {time} ms")
    return out
