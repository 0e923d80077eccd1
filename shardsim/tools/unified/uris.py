"""Connection strings of the deployment under test: one host of several (a client without
``useMultipleMongoses``, a fail point on one mongos), with credentials and options kept, and a
password hidden for printing."""

from __future__ import annotations

from pymongo.uri_parser import parse_uri


def _hosts_of(uri: str) -> list[tuple[str, int]]:
    return list(parse_uri(uri, validate=False, warn=True)["nodelist"])


def _split_uri(uri: str) -> tuple[str, str, str, str]:
    """``scheme://[userinfo@]hosts[/tail]`` → ``(scheme, "userinfo@" or "", hosts, "/tail" or "")``
    (userinfo is percent-encoded, so it has no ``/`` and its last ``@`` ends it)."""
    scheme, rest = uri.split("://", 1)
    hostpart, sep, tail = rest.partition("/")
    userinfo, at, hosts = hostpart.rpartition("@")
    return scheme, userinfo + at, hosts, sep + tail


def _single_host_uri(uri: str) -> str:
    """``uri`` reduced to its first host, keeping credentials and options
    (useMultipleMongoses: false)."""
    nodes = parse_uri(uri, validate=False, warn=True)["nodelist"]
    if len(nodes) <= 1:
        return uri
    return host_uri(uri, nodes[0])


def host_uri(uri: str, address: tuple[str, int]) -> str:
    """``uri`` with its host list replaced by ``address`` (credentials and options kept)."""
    scheme, userinfo, _hosts, tail = _split_uri(uri)
    host, port = address
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{userinfo}{host}:{port}{tail}"


def redact_uri(uri: str) -> str:
    """``uri`` with the password of its userinfo replaced by ``***`` (for printing)."""
    scheme, userinfo, hosts, tail = _split_uri(uri)
    if ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***@"
    return f"{scheme}://{userinfo}{hosts}{tail}"
