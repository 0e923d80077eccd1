"""``--seed N``: replay one seed of the simulation. Every sweep in ``test_sim.py`` then runs only
that seed, with its own scenario (select one with ``-k``), and prints what happened::

    python -m pytest tests/sim --seed 1234 -k mongod
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--seed`` (an int; default: each test's own range of seeds)."""
    parser.getgroup("sim", "seeded simulation (tests/sim)").addoption(
        "--seed", type=int, default=None,
        help="run the simulation sweeps with this one seed only (replay a failure)")


@pytest.fixture
def replay_seed(request: pytest.FixtureRequest) -> int | None:
    """The ``--seed`` given on the command line, or None. (When pytest runs from a directory
    above ``tests/sim`` this conftest registers the option late; it is then None.)"""
    return request.config.getoption("seed", default=None)
