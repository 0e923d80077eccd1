"""The security options every role's ``__main__`` takes (mongod's names):

``--auth``                    enforce authentication and authorization (off by default)
``--keyFile PATH``            internal authentication key (implies ``--auth``, as in mongod)
``--tlsMode MODE``            ``disabled`` (default), ``allowTLS``, ``preferTLS``, ``requireTLS``
``--tlsCertificateKeyFile``   the PEM file with this process's certificate and private key
``--tlsCAFile``               the CA that signs the certificates of peers (members and clients)

and (:func:`test_commands_options`) whether the test-only commands exist: off by default, as
in mongod/mongos (``enableTestCommands``, ``src/mongo/db/commands/test_commands_enabled.h``);
``--setParameter enableTestCommands=1`` (mongod's spelling) or ``--enable-test-commands`` turn
them on (``configureFailPoint``, the ``_shardsim*`` testing commands).

:func:`apply` reads the key file, configures this process's outgoing member connections
(:func:`shardsim.core.client.configure`) and returns the node options and the server's TLS settings.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import click

from shardsim.core import client
from shardsim.core.auth.security import read_key_file
from shardsim.core.auth.tls import TLS_MODES, TlsSettings, client_context, server_context


def security_options(fn: Callable) -> Callable:
    """Decorator adding the security options to a click command (as keyword ``security``
    arguments: ``auth``, ``key_file``, ``tls_mode``, ``tls_cert``, ``tls_ca``)."""
    options = [
        click.option("--auth", is_flag=True, default=False,
                     help="Require authentication and check every command's privileges."),
        click.option("--keyFile", "key_file", type=click.Path(dir_okay=False), default=None,
                     help="Key file for internal authentication (implies --auth)."),
        click.option("--tlsMode", "tls_mode", type=click.Choice(TLS_MODES), default="disabled",
                     help="TLS for client and member connections."),
        click.option("--tlsCertificateKeyFile", "tls_cert", type=click.Path(dir_okay=False),
                     default=None, help="PEM certificate and key of this process."),
        click.option("--tlsCAFile", "tls_ca", type=click.Path(dir_okay=False), default=None,
                     help="PEM CA certificates to verify peers with."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def apply(role: str, *, auth: bool, key_file: str | None, tls_mode: str,
          tls_cert: str | None, tls_ca: str | None) -> tuple[dict[str, Any], TlsSettings | None]:
    """``(node options, server TLS settings or None)``; exits with status 1 and mongod's reason
    for a bad key file or TLS configuration (``BadValue`` at start-up in mongod)."""
    key = None
    if key_file:
        try:
            key = read_key_file(key_file)
        except (OSError, ValueError) as exc:
            click.echo(f"shardsim {role}: {exc}", err=True)
            sys.exit(1)
    tls = None
    out_ctx = None
    if tls_mode != "disabled":
        if not tls_cert:
            click.echo(f"shardsim {role}: need tlsCertificateKeyFile or certificateSelector when "
                       f"TLS is enabled", err=True)
            sys.exit(1)
        tls = TlsSettings(tls_mode, server_context(tls_cert, tls_ca))
        if tls_mode in ("preferTLS", "requireTLS"):  # outgoing member connections use TLS
            out_ctx = client_context(tls_ca, tls_cert)
    client.configure(key=key, ssl_context=out_ctx)
    return {"auth": bool(auth or key), "key": key, "tls_mode": tls_mode}, tls


_TRUE = ("1", "true")
_FALSE = ("0", "false")


def test_commands_options(fn: Callable) -> Callable:
    """Decorator adding ``--enable-test-commands``, ``--setParameter NAME=VALUE`` (only
    ``enableTestCommands``; anything else exits with status 1 and mongod's "Illegal
    --setParameter parameter") and the old ``--no-test-commands`` (hidden; it wins) to a click
    command, which receives one keyword ``test_commands: bool`` (False unless enabled)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, enable_test_commands: bool, set_parameter: tuple[str, ...],
                no_test_commands: bool, **kwargs: Any) -> Any:
        on = enable_test_commands
        for item in set_parameter:
            name, _, value = item.partition("=")
            if name != "enableTestCommands":
                click.echo(f'Illegal --setParameter parameter: "{name}"', err=True)
                sys.exit(1)
            if value.lower() not in _TRUE + _FALSE:
                click.echo(f"Bad value for parameter \"enableTestCommands\": \"{value}\"",
                           err=True)
                sys.exit(1)
            on = value.lower() in _TRUE
        return fn(*args, test_commands=on and not no_test_commands, **kwargs)
    options = [
        click.option("--enable-test-commands", is_flag=True, default=False,
                     help="Enable the test-only commands (configureFailPoint, ...); off by "
                          "default as in mongod."),
        click.option("--setParameter", "set_parameter", multiple=True, metavar="NAME=VALUE",
                     help="mongod's spelling: --setParameter enableTestCommands=1."),
        click.option("--no-test-commands", is_flag=True, default=False, hidden=True,
                     help="Disable test-only commands (the default)."),
    ]
    for opt in reversed(options):
        wrapper = opt(wrapper)
    return wrapper
