"""The ``shardsim`` command line: one group, subcommands loaded lazily from their modules.

``up``/``status``/``down`` (local mini cluster), ``fault`` (faults on demand for it), ``top``
(its change-stream cursors, live), ``spec`` (unified spec tests), ``load`` (PySpark load +
verifier), ``tail`` (a change stream's events and decoded tokens) and ``decode-token``. Each subcommand lives next to the code it drives.
"""

from __future__ import annotations

import importlib

import click

# subcommand -> "module:attribute" of a click.Command
SUBCOMMANDS = {
    "up": "shardsim.tools.launcher_cli:up",
    "status": "shardsim.tools.launcher_cli:status",
    "down": "shardsim.tools.launcher_cli:down",
    "spec": "shardsim.tools.unified.cli:spec",
    "load": "shardsim.tools.load.cli:load",
    "fault": "shardsim.tools.fault_cli:fault",
    "top": "shardsim.tools.top:top",
    "tail": "shardsim.tools.token_cli:tail",
    "decode-token": "shardsim.tools.token_cli:decode_token",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when used (fast start-up)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup)
@click.version_option(package_name="shardsim")
def main() -> None:
    """shardsim: a MongoDB-compatible sharded cluster that serves change streams like mongos."""


if __name__ == "__main__":  # pragma: no cover
    main()
