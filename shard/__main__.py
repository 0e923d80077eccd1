"""``python -m shardsim.shard --port P [--host H] --shard-name NAME [--dbpath DIR] ...``: run one shard.

Prints ``shardsim shard ready on HOST:PORT`` once listening (see :func:`shardsim.core.server.ready_line`).
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
@click.option("--port", type=int, default=27018, help="TCP port (0 picks a free one).")
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option("--shard-name", default="shard0", help="Shard name (also the replica-set name in hello).")
@click.option("--dbpath", type=click.Path(file_okay=False), default=None,
              help="Directory for the SQLite store; in memory when omitted.")
@click.option("--noop-interval-ms", type=int, default=1000,
              help="Period of the no-op oplog writer (ms).")
@click.option("--promise-mode", type=click.Choice(["clock", "mongod"]), default="clock",
              help="How empty change-stream batches advance postBatchResumeToken.")
@click.option("--oplog-size-mb", type=click.FloatRange(min=0, min_open=True), default=1024.0, help="Oplog size cap (MiB).")
@click.option("--oplog-cache-mb", type=click.FloatRange(min=0, min_open=True), default=64.0,
              help="With --dbpath: MiB of the newest oplog entries kept in memory (older ones "
                   "are read from disk).")
@click.option("--snapshot-history-mb", type=click.FloatRange(min=0, min_open=True), default=32.0,
              help="MiB of document history kept for snapshot reads (oldest dropped first).")
@click.option("--oplog-min-retention-hours", type=click.FloatRange(min=0), default=0.0,
              help="Entries younger than this are kept even over the size cap (hours).")
@click.option("--oplog-max-age-s", type=float, default=None,
              help="Entries older than this are truncated whatever the size (seconds).")
@click.option("--sync", type=click.Choice(["normal", "full"]), default="normal",
              help="SQLite synchronous mode (normal survives process crashes; full also OS crashes).")
@click.option("--log-level", default="WARNING", help="Python logging level.")
@click.option("--noscripting", is_flag=True, default=False,
              help="No server-side JavaScript ($where, $function), as mongod --noscripting.")
@replica_set_options
@security_options
@test_commands_options
@server_version_mod.click_option
def main(port: int, host: str, shard_name: str, dbpath: str | None, noop_interval_ms: int,
         promise_mode: str, oplog_size_mb: float, oplog_cache_mb: float, snapshot_history_mb: float,
         oplog_min_retention_hours: float,
         oplog_max_age_s: float | None, sync: str, repl_options: dict[str, Any],
                  test_commands: bool, log_level: str, server_version: str,
         noscripting: bool = False, **security: Any) -> None:
    """Run a shardsim shard (a mongod --shardsvr look-alike)."""
    if noscripting:
        from shardsim.core import javascript
        javascript.set_enabled(False)
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from shardsim.shard.node import ShardNode
    options = {
        "dbpath": dbpath, "noop_interval_ms": noop_interval_ms, "promise_mode": promise_mode,
        "oplog_size_mb": oplog_size_mb, "oplog_cache_mb": oplog_cache_mb,
        "snapshot_history_mb": snapshot_history_mb,
        "oplog_min_retention_hours": oplog_min_retention_hours,
        "oplog_max_age_s": oplog_max_age_s, "sync": sync, "server_version": server_version,
    }
    options.update(repl_options)
    sec_options, tls = apply_security("shard", **security)
    options.update(sec_options)
    from shardsim.shard.durable_integrity import EXIT_CORRUPTION, StorageCorruption
    try:
        node = ShardNode(shard_name=shard_name, host=host, port=port,
                         test_commands=test_commands, options=options)
    except StorageCorruption as exc:  # one line, like mongod's fatal start-up messages
        click.echo(f"shardsim shard: {exc}", err=True)
        sys.exit(EXIT_CORRUPTION)
    except RuntimeError as exc:  # e.g. DBPathInUse: exit like mongod does (code 100)
        click.echo(f"shardsim shard: {exc}", err=True)
        sys.exit(100)
    run_node(node, host, port, ready_message=ready_line("shard"), tls=tls)


if __name__ == "__main__":
    main()
