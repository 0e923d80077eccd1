"""The replica-set options of a member's command line (``python -m shardsim.shard`` and
``python -m shardsim.configsvr``): ``--members``, ``--initiate`` and the pv1 timings, as one click
decorator that hands the command a single keyword, ``repl_options`` (the node options that make
the process a member: ``repl_hosts``, ``repl_initiate``, ``election_timeout_ms``,
``heartbeat_interval_ms``, ``heartbeat_timeout_ms``; ``{}`` without ``--members``: one node).

Defaults are mongod's (``ReplSetConfig``: electionTimeoutMillis 10000, heartbeatIntervalMillis
2000, heartbeatTimeoutSecs 10)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import click


def replica_set_options(fn: Callable) -> Callable:
    """Decorator adding the replica-set options to a click command, which receives them as one
    keyword ``repl_options: dict`` (see the module doc)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, members: str | None, initiate: bool, election_timeout_ms: int,
                heartbeat_interval_ms: int, heartbeat_timeout_ms: int, **kwargs: Any) -> Any:
        repl: dict[str, Any] = {}
        if members:
            repl = {"repl_hosts": [h.strip() for h in members.split(",") if h.strip()],
                    "repl_initiate": initiate, "election_timeout_ms": election_timeout_ms,
                    "heartbeat_interval_ms": heartbeat_interval_ms,
                    "heartbeat_timeout_ms": heartbeat_timeout_ms}
        return fn(*args, repl_options=repl, **kwargs)
    options = [
        click.option("--members", default=None,
                     help="Every member of this process's replica set, host:port,... in _id "
                          "order, this one included (shardsim's replSetInitiate at start-up; "
                          "one node when omitted)."),
        click.option("--initiate", is_flag=True,
                     help="With --members: this member initiates the set (writes the "
                          "'initiating set' entry; give it to one member, once)."),
        click.option("--election-timeout-ms", type=click.IntRange(min=1), default=10000,
                     help="With --members: electionTimeoutMillis."),
        click.option("--heartbeat-interval-ms", type=click.IntRange(min=1), default=2000,
                     help="With --members: heartbeatIntervalMillis."),
        click.option("--heartbeat-timeout-ms", type=click.IntRange(min=1), default=10000,
                     help="With --members: heartbeatTimeoutSecs, in ms."),
    ]
    for opt in reversed(options):
        wrapper = opt(wrapper)
    return wrapper
