"""``python -m tests.faults [--role shard|router|config|txn|router-bulkwrite|shard-createindexes|
shard-dropdatabase|migration-config|migration-donor|migration-recipient|reshard-config|all]
[--trials N] [--seed S] [--ops N]``: fault trials on one durable 2-shard cluster per role (or
scenario: :mod:`.migration`, :mod:`.ddl_trial`), then one summary table (and the ``txn``
role's own table per moment).
Trial ``k`` of a run has seed ``S + k`` (printed per trial); ``--seed X --trials 1 --role R``
replays one. ``txn``: the coordinator shard killed before/after its commit decision and the
client's commit retried later (:mod:`.txn_trial`), with its own table per moment."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time

from shardsim.tools.launcher import Cluster

from .checkers import CHECKERS, DDL_CHECKERS, FAILOVER_CHECKERS, SHARD_CHECKERS, TXN_CHECKERS
from .failover import FAILOVER_ROLES, new_cluster, run_failover_trial
from .harness import ROLES, TrialResult, needs_test_commands, run_trial
from .migration import SCENARIOS, run_scenario
from .txn_trial import MOMENTS

ALL = ROLES + SCENARIOS + FAILOVER_ROLES


def _txn_summary(rs: list[TrialResult]) -> str:
    """The ``txn`` trials: per moment, outcomes, the retried commit's answers, violations."""
    cols = ["moment", "trials", "failed", "committed", "aborted", "retry ok", "retry 251",
            "retry other", *TXN_CHECKERS, "s/trial"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for moment in sorted(MOMENTS):
        ms = [r for r in rs if f"moment {moment}" in r.notes]
        if not ms:
            continue
        row = [moment, len(ms), sum(not r.ok for r in ms),
               sum("outcome commit" in r.notes for r in ms),
               sum("outcome abort" in r.notes for r in ms),
               sum("retry ok" in r.notes for r in ms), sum("retry 251" in r.notes for r in ms),
               sum(not ({"retry ok", "retry 251"} & set(r.notes)) for r in ms),
               *(sum(len(r.violations[c]) for r in ms) for c in TXN_CHECKERS),
               f"{sum(r.seconds for r in ms) / len(ms):.1f}"]
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines)


def _summary(results: list[TrialResult]) -> str:
    """One row per role/scenario (its first seed, trials, failures, writes, events, each
    checker's violations: ``-`` where the role does not run that checker), then the ``txn``
    trials per moment."""
    checkers = [*CHECKERS, *SHARD_CHECKERS, *DDL_CHECKERS, *TXN_CHECKERS, *FAILOVER_CHECKERS]
    ran = [r for r in results if r.role in ALL]
    checkers = [c for c in checkers if any(c in r.violations for r in ran)]  # the checkers run
    cols = ["role", "first seed", "trials", "failed", "acked writes", "ambiguous", "events",
            *checkers, "writer stalled", "s/trial"]
    rows = []
    for role in ALL:
        rs = [r for r in results if r.role == role]
        if not rs:
            continue
        cells = [sum(len(r.violations[c]) for r in rs if c in r.violations)
                 if any(c in r.violations for r in rs) else "-" for c in checkers]
        rows.append([role, min(r.seed for r in rs), len(rs), sum(not r.ok for r in rs),
                     sum(r.acked for r in rs), sum(r.ambiguous for r in rs),
                     sum(r.events for r in rs), *cells,
                     sum(any("did not finish" in n for n in r.notes) for r in rs),
                     f"{sum(r.seconds for r in rs) / len(rs):.1f}"])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] if rows else []
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    txn = [r for r in results if r.role == "txn"]
    if txn:
        lines += ["", _txn_summary(txn)]
    return "\n".join(lines)


def _print(role: str, r: TrialResult) -> None:
    bad = {c: v[:3] for c, v in r.violations.items() if v}
    print(f"{role:6} seed {r.seed:>8} victim {r.victim:9} acked {r.acked:4} "
          f"ambiguous {r.ambiguous:3} events {r.events:4} {r.seconds:5.1f}s "
          f"{'ok' if r.ok else 'FAIL ' + str(bad)} {' '.join(r.notes)}", flush=True)


def _run_failover(role: str, seed: int, trials: int, ops: int,
                  transactions: bool = True, until: float | None = None) -> list[TrialResult]:
    """``trials`` trials of failover role ``role`` (:mod:`.failover`) on one in-process
    cluster of 2 shards x 3 members (seeded with the run's first seed); no new trial starts
    after ``until`` (``time.time()``)."""
    results = []
    cluster = new_cluster(seed)
    try:
        for k in range(trials):
            if until is not None and time.time() > until:
                print(f"{role}: stopped after {k} trials (--max-seconds)", flush=True)
                break
            r = run_failover_trial(cluster, role, seed + k, ops, transactions)
            results.append(r)
            _print(role, r)
    finally:
        cluster.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    p.add_argument("--role", choices=[*ALL, "all"], default="all")
    p.add_argument("--trials", type=int, default=100, help="trials per role")
    p.add_argument("--seed", type=int, default=None, help="seed of the first trial")
    p.add_argument("--ops", type=int, default=150, help="writer ops per trial")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="failover roles: start no new trial after this many seconds")
    p.add_argument("--no-txn", action="store_true",
                   help="failover roles: leave the transaction writer out")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    print(f"fault trials: seed {seed}, {args.trials} per role, {args.ops} ops each", flush=True)
    roles = ALL if args.role == "all" else (args.role,)
    until = None if args.max_seconds is None else time.time() + args.max_seconds
    results: list[TrialResult] = []
    for role in roles:
        if role in FAILOVER_ROLES:
            results += _run_failover(role, seed, args.trials, args.ops, not args.no_txn,
                                     until)
            continue
        with tempfile.TemporaryDirectory(prefix="shardsim-faults-") as tmp:
            # the txn role, the DDL and the migration scenarios use fail points
            cluster = Cluster(shards=2, durable=True, base_dir=tmp,
                              test_commands=needs_test_commands(role))
            cluster.start()
            try:
                for k in range(args.trials):
                    r = (run_scenario if role in SCENARIOS else run_trial)(
                        cluster, role, seed + k, args.ops)
                    results.append(r)
                    _print(role, r)
            finally:
                cluster.stop()
    print()
    print(_summary(results))
    failed = [r for r in results if not r.ok]
    if failed:
        print("replay: " + ", ".join(f"--role {r.role} --seed {r.seed} --trials 1"
                                     for r in failed[:5]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
