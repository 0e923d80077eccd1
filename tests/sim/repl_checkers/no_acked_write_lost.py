"""No majority-acknowledged write is lost: every entry acknowledged with ``w: "majority"`` is in
the oplog of every primary elected after the acknowledgement, and in the final oplog of every
member that took part in the healed set (Raft's Leader Completeness)."""

from __future__ import annotations

from typing import Any


def check(h: Any) -> list[str]:
    """Acknowledged entries missing from a later winner's oplog, or from a final oplog."""
    out = []
    acked = sorted(h.acked)
    for time, term, member, uids in h.win_logs:
        missing = [uid for at, uid, _ in acked if at < time and uid not in uids]
        if missing:
            out.append(f"acknowledged w:majority entries {missing[:5]} missing from member "
                       f"{member}, primary of term {term} from {time} ms")
    for member, log in sorted(h.final_logs.items()):
        have = {uid for _, uid in log}
        missing = [uid for _, uid, _ in acked if uid not in have]
        if missing:
            out.append(f"acknowledged w:majority entries {missing[:5]} missing from member "
                       f"{member}'s final oplog")
    return out
