"""Liveness: once the set is healed (every member up, no partition, no loss), a writable
primary of the newest term exists within a bound, and a ``w: "majority"`` write issued on it
is acknowledged before the run ends; and no member ever asks to be woken at the same instant
over and over (a timer its ``tick`` never clears)."""

from __future__ import annotations

from typing import Any

from sim.repl_world import LIVENESS_BOUND


def check(h: Any) -> list[str]:
    """No primary within the bound after the heal, no acknowledgement of the final write, or
    a member stuck waking at one instant."""
    stuck = [f"liveness: member {m} asked to be woken at {t} ms over and over (next wake {w})"
             for t, m, w in h.stuck[:3]]
    if h.primary_after_heal is None:
        return stuck + [f"liveness: no writable primary of the newest term in the "
                        f"{h.end_time - h.heal_time} ms after the set healed at "
                        f"{h.heal_time} ms"]
    out = stuck
    took = h.primary_after_heal - h.heal_time
    if took > LIVENESS_BOUND:
        out.append(f"liveness: a primary took {took} ms after the heal (bound {LIVENESS_BOUND})")
    if h.final_write_acked is None:
        out.append(f"liveness: the w:majority write issued at {h.final_write_issued} ms on the "
                   f"healed set was never acknowledged")
    return out
