"""The seeded replica-set simulation (repl_world.py) over the real replication core
(shardsim/core/repl/): 1,000 seeds (3 members, 5 on every fourth seed) with message delays, drops,
partitions, crashes and restarts, stepdown/freeze/stepUp, w:1 and w:majority clients, and one
checker per invariant (repl_checkers/). A failure names its seeds and how to replay them
(``python tests/sim/repl_run.py --seed N`` or ``python -m pytest tests/sim/test_repl_sim.py
--seed N``). The mutation tests break one rule of the protocol each and show that the checker
for the invariant it protects fails, so a green sweep means something."""

from __future__ import annotations

import pytest

from shardsim.core.repl import Rules
from sim.repl_checkers import (check_all, election_safety, no_acked_write_lost,
                               no_uncommitted_exposed)
from sim.repl_run import replay_hint, run_seed
from sim.repl_world import ReplWorld

SEEDS = 1000


def test_a_thousand_seeds_keep_every_invariant(replay_seed):
    seeds = [replay_seed] if replay_seed is not None else range(SEEDS)
    bad = {}
    totals = {"elections": 0, "acks": 0, "rolled back": 0}
    for seed in seeds:
        try:
            _, h, violations = run_seed(seed)
        except Exception as exc:  # noqa: BLE001 - a crash is a failing seed, named with its replay
            violations = [f"crashed: {exc!r}"]
        else:
            totals["elections"] += len(h.wins)
            totals["acks"] += len(h.acked)
            totals["rolled back"] += len(h.rolled_back)
        if violations:
            bad[seed] = violations
            print(f"seed {seed}: {violations[:3]}\n  {replay_hint(seed)}")
    first = min(bad) if bad else None
    assert not bad, (f"{len(bad)} seeds with violations: {sorted(bad)[:20]}; seed {first}: "
                     f"{bad[first][:3]}; {replay_hint(first)}")
    if replay_seed is None:
        # the sweep exercised what it is about: many elections, acknowledged majority writes
        # and rollbacks of unreplicated entries
        assert totals["elections"] > 2 * SEEDS and totals["acks"] > 15 * SEEDS
        assert totals["rolled back"] > SEEDS, totals


def caught(rule: str, checker, limit: int = 300) -> int | None:
    """The first seed (< limit) on which ``checker`` finds a violation with ``rule`` broken."""
    for seed in range(limit):
        world = ReplWorld(seed, members=5 if seed % 4 == 3 else 3, rules=Rules(**{rule: True}))
        if checker.check(world.run()):
            return seed
    return None


@pytest.mark.parametrize("rule, checker", [
    ("vote_twice", election_safety),
    ("commit_earlier_term", no_uncommitted_exposed),
    ("skip_freshness", no_acked_write_lost),
])
def test_a_broken_rule_is_caught_by_its_checker(rule, checker, replay_seed):
    if replay_seed is not None:
        pytest.skip("a search over seeds: not replayed one seed at a time")
    seed = caught(rule, checker)
    assert seed is not None, f"{rule}: no seed under 300 made {checker.__name__} fail"
    # and the same seed with the rule intact is clean
    _, _, violations = run_seed(seed)
    assert violations == [], replay_hint(seed)


def test_deterministic(replay_seed):
    for seed in ([replay_seed] if replay_seed is not None else [5, 7]):
        a, b = ReplWorld(seed).run(), ReplWorld(seed).run()
        assert (a.wins, a.acked, a.rolled_back, a.final_logs) == \
            (b.wins, b.acked, b.rolled_back, b.final_logs)


def test_the_replay_hint_names_the_seed():
    assert replay_hint(12, 5, "vote_twice") == (
        "replay: python tests/sim/repl_run.py --seed 12 --members 5 --break vote_twice "
        "(or python -m pytest tests/sim/test_repl_sim.py --seed 12)")
    assert check_all is not None


def test_the_replay_command_runs_one_seed_and_reports_violations(capsys):
    from sim.repl_run import main
    assert main(["--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("seed 1: 3 members") and "VIOLATION" not in out
    bad = caught("vote_twice", election_safety)
    assert main(["--seed", str(bad), "--break", "vote_twice"]) == 1
    assert "VIOLATION election safety" in capsys.readouterr().out
