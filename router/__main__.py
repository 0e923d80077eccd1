"""``python -m shardsim.router --port P --configdb HOST:PORT [--enable-test-commands]``: run a router.

Prints ``shardsim router ready on HOST:PORT`` once listening (see :func:`shardsim.core.server.ready_line`).
"""

from __future__ import annotations

from typing import Any

import logging

import click

from shardsim.core.server import ready_line
from shardsim.core.auth.cli import apply as apply_security, security_options, test_commands_options
from shardsim.core.server import run_node
from shardsim.core import server_version as server_version_mod


@click.command(context_settings={"show_default": True})
@click.option("--port", type=int, default=27017, help="TCP port (0 picks a free one).")
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option("--configdb", required=True,
              help="The config server: HOST:PORT, or its replica set SETNAME/HOST:PORT,...")
@click.option("--log-level", default="WARNING", help="Python logging level.")
@security_options
@test_commands_options
@server_version_mod.click_option
def main(port: int, host: str, configdb: str, test_commands: bool, log_level: str, server_version: str,
         **security: Any) -> None:
    """Run a shardsim router (a mongos look-alike)."""
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from shardsim.router.node import RouterNode
    sec_options, tls = apply_security("router", **security)
    node = RouterNode(configdb=configdb, host=host, port=port, test_commands=test_commands,
                      options={"configdb": configdb, "server_version": server_version,
                               **sec_options})
    run_node(node, host, port, ready_message=ready_line("router"), tls=tls)


if __name__ == "__main__":
    main()
