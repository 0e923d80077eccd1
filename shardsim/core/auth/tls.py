"""TLS for the wire protocol (mongod's ``net.tls``): ``--tlsMode`` ``disabled`` (plain only),
``allowTLS`` and ``preferTLS`` (both on one port: a connection whose first byte is a TLS
handshake record, 0x16, is upgraded; ``preferTLS`` also makes outgoing member connections use
TLS), ``requireTLS`` (plain connections are closed). Contexts come from the standard ``ssl``
module; ``--tlsCAFile`` verifies peer certificates when they present one (mongod's default
``tlsAllowConnectionsWithoutCertificates`` is false, so with a CA file clients must present a
certificate there; here a client certificate is optional: see docs/security.md).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

TLS_MODES = ("disabled", "allowTLS", "preferTLS", "requireTLS")
TLS_HANDSHAKE = 0x16


@dataclass
class TlsSettings:
    """A server's TLS mode and context."""

    mode: str
    context: ssl.SSLContext


def server_context(cert_key_file: str, ca_file: str | None) -> ssl.SSLContext:
    """The server side: our certificate and key; peer certificates verified against
    ``ca_file`` when the peer sends one."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_key_file)
    if ca_file:
        ctx.load_verify_locations(ca_file)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(ca_file: str | None, cert_key_file: str | None) -> ssl.SSLContext:
    """The client side of member connections: verify the peer with ``ca_file`` and present
    our own certificate (members authenticate with the key file, not x.509). Host names are
    not checked (members are addressed by IP in the local cluster)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    if ca_file:
        ctx.load_verify_locations(ca_file)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    if cert_key_file:
        ctx.load_cert_chain(cert_key_file)
    return ctx
