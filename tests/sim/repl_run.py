"""The replica-set simulation from a shell: replay one seed, or sweep many.

    python tests/sim/repl_run.py --seed 1234 [--members 5] [--break vote_twice] [-v]
    python tests/sim/repl_run.py --seeds 1000 [--members 3]

``--break RULE`` runs the core with one protocol rule broken (``vote_twice``,
``skip_freshness``, ``commit_earlier_term``): the checkers must then find violations.
Without ``--members``, a sweep runs seed ``s`` with 5 members when ``s % 4 == 3`` and 3
otherwise, as the tests do. Exit status 1 when any seed has violations. The checkout this file
is in comes first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve()
sys.path[:0] = [str(_HERE.parents[2]), str(_HERE.parents[1])]  # the checkout, tests/

from shardsim.core.repl import Rules  # noqa: E402
from sim.repl_checkers import check_all  # noqa: E402
from sim.repl_world import ReplWorld, members_for  # noqa: E402

RULES = ("vote_twice", "skip_freshness", "commit_earlier_term")


def replay_hint(seed: int, members: int | None = None, broken: str | None = None) -> str:
    """The shell command that replays ``seed`` (and the pytest one)."""
    extra = f" --members {members}" if members else ""
    extra += f" --break {broken}" if broken else ""
    return (f"replay: python tests/sim/repl_run.py --seed {seed}{extra} "
            f"(or python -m pytest tests/sim/test_repl_sim.py --seed {seed})")


def run_seed(seed: int, members: int | None = None, broken: str | None = None):
    """Run one seed: ``(world, history, violations)``."""
    rules = Rules(**{broken: True}) if broken else Rules()
    world = ReplWorld(seed, members=members or members_for(seed), rules=rules)
    history = world.run()
    return world, history, check_all(history)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (see the module docstring), run, print; 1 if a seed has violations."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    one = ap.add_mutually_exclusive_group()
    one.add_argument("--seed", type=int, help="replay this seed")
    one.add_argument("--seeds", type=int, default=1000, help="sweep seeds 0..N-1")
    ap.add_argument("--members", type=int, choices=(3, 5), default=None)
    ap.add_argument("--break", dest="broken", choices=RULES, default=None)
    ap.add_argument("-v", "--verbose", action="store_true", help="print elections and oplogs")
    args = ap.parse_args(argv)
    if args.seed is not None:
        world, h, bad = run_seed(args.seed, args.members, args.broken)
        print(f"seed {args.seed}: {len(world.members)} members, drop {world.drop}, max delay "
              f"{world.max_delay} ms; {len(h.wins)} elections, {len(h.acked)} majority acks, "
              f"{len(h.rolled_back)} entries rolled back; healed at {h.heal_time} ms, primary "
              f"at {h.primary_after_heal} ms")
        if args.verbose:
            for t, term, m in h.wins:
                print(f"  {t:6d} ms: member {m} won term {term}")
            for m, log in sorted(h.final_logs.items()):
                print(f"  member {m}: {len(log)} entries, last {log[-1][0] if log else None}")
        for v in bad:
            print(f"VIOLATION {v}")
        return 1 if bad else 0
    t0 = time.perf_counter()
    failed = 0
    for seed in range(args.seeds):
        _, _, bad = run_seed(seed, args.members, args.broken)
        if bad:
            failed += 1
            print(f"seed {seed}: {bad[:3]}\n  {replay_hint(seed, args.members, args.broken)}")
    print(f"{args.seeds} seeds: {failed} with violations, {time.perf_counter() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
