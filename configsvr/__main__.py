"""``python -m shardsim.configsvr --port P [--host H] [--dbpath DIR] [--oplog-size-mb MB]
[--members h1:p1,h2:p2,h3:p3 [--initiate] [--set-name config]]``: run the config server, alone
or as one member of a config server replica set (CSRS, ``mongod --configsvr --replSet``).

Prints ``shardsim configsvr ready on HOST:PORT`` once listening (see :func:`shardsim.core.server.ready_line`).
"""

from __future__ import annotations

from typing import Any

import logging
import sys

import click

from shardsim.core.server import ready_line
from shardsim.core.auth.cli import apply as apply_security, security_options, test_commands_options
from shardsim.core.server import run_node
from shardsim.core import server_version as server_version_mod
from shardsim.shard.replication.cli import replica_set_options


@click.command(context_settings={"show_default": True})
@click.option("--port", type=int, default=27019, help="TCP port (0 picks a free one).")
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option("--dbpath", type=click.Path(file_okay=False), default=None,
              help="Directory for the SQLite store; in memory when omitted.")
@click.option("--noop-interval-ms", type=int, default=1000,
              help="Period of the no-op oplog writer (ms).")
@click.option("--oplog-size-mb", type=click.FloatRange(min=0, min_open=True), default=1024.0,
              help="Oplog size cap (MiB).")
@click.option("--oplog-cache-mb", type=click.FloatRange(min=0, min_open=True), default=64.0,
              help="With --dbpath: MiB of the newest oplog entries kept in memory (older ones "
                   "are read from disk).")
@click.option("--snapshot-history-mb", type=click.FloatRange(min=0, min_open=True), default=32.0,
              help="MiB of document history kept for snapshot reads (oldest dropped first).")
@click.option("--oplog-min-retention-hours", type=click.FloatRange(min=0), default=0.0,
              help="Entries younger than this are kept even over the size cap (hours).")
@click.option("--set-name", default="config",
              help="The config server replica set's name (hello setName, replSetGetConfig _id; "
                   "routers give it in --configdb NAME/h1,h2,h3).")
@click.option("--log-level", default="WARNING", help="Python logging level.")
@replica_set_options
@security_options
@test_commands_options
@server_version_mod.click_option
def main(port: int, host: str, dbpath: str | None, noop_interval_ms: int, oplog_size_mb: float,
         oplog_cache_mb: float, snapshot_history_mb: float,
         oplog_min_retention_hours: float, set_name: str, repl_options: dict[str, Any],
                  test_commands: bool, log_level: str, server_version: str,
         **security: Any) -> None:
    """Run the shardsim config server (a mongod --configsvr look-alike holding the catalog)."""
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from shardsim.configsvr.node import ConfigServerNode
    sec_options, tls = apply_security("configsvr", **security)
    from shardsim.shard.durable_integrity import EXIT_CORRUPTION, StorageCorruption
    options: dict[str, Any] = {
        "dbpath": dbpath, "noop_interval_ms": noop_interval_ms, "oplog_size_mb": oplog_size_mb,
        "oplog_cache_mb": oplog_cache_mb, "snapshot_history_mb": snapshot_history_mb,
        "oplog_min_retention_hours": oplog_min_retention_hours, "server_version": server_version,
        "set_name": set_name, **sec_options}
    options.update(repl_options)
    try:
        node = ConfigServerNode(host=host, port=port, test_commands=test_commands,
                                options=options)
    except StorageCorruption as exc:  # one line, like mongod's fatal start-up messages
        click.echo(f"shardsim configsvr: {exc}", err=True)
        sys.exit(EXIT_CORRUPTION)
    except RuntimeError as exc:  # e.g. DBPathInUse: exit like mongod does (code 100)
        click.echo(f"shardsim configsvr: {exc}", err=True)
        sys.exit(100)
    run_node(node, host, port, ready_message=ready_line("configsvr"), tls=tls)


if __name__ == "__main__":
    main()
