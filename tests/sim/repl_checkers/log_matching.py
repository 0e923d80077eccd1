"""Log matching: two oplogs with an entry at the same optime hold the same entry there and the
same history before it. Checked inductively over every append (the same optime always carries
the same entry and follows the same predecessor optime) and directly on the final oplogs
(pairwise: identical prefixes up to their newest shared optime)."""

from __future__ import annotations

from typing import Any


def check(h: Any) -> list[str]:
    """Conflicting appends, and final oplogs that share an optime but not the prefix."""
    out = []
    seen: dict = {}
    for member, optime, uid, prev in h.appends:
        first = seen.setdefault(optime, (uid, prev, member))
        if first[:2] != (uid, prev):
            out.append(f"log matching: optime {optime} is entry {first[0]} after {first[1]} on "
                       f"member {first[2]} but entry {uid} after {prev} on member {member}")
            if len(out) > 5:
                return out
    logs = h.final_logs
    ids = sorted(logs)
    for i, a in enumerate(ids):
        index_a = {op: k for k, (op, _) in enumerate(logs[a])}
        for b in ids[i + 1:]:
            shared = [k for k, (op, _) in enumerate(logs[b]) if op in index_a]
            if not shared:
                continue
            kb = shared[-1]
            ka = index_a[logs[b][kb][0]]
            if logs[a][:ka + 1] != logs[b][:kb + 1]:
                out.append(f"log matching: final oplogs of members {a} and {b} share optime "
                           f"{logs[b][kb][0]} but not the entries before it")
    return out
