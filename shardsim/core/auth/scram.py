"""SCRAM-SHA-1 and SCRAM-SHA-256 with the ``scramp`` library (no crypto of our own).

What is MongoDB's own (``src/mongo/db/auth/sasl_scram_server_conversation.cpp``,
``src/mongo/db/auth/sasl_commands.cpp`` and the drivers' auth spec,
``shared/specs/auth/auth.md``):

* SCRAM-SHA-1 hashes ``hex(md5("<user>:mongo:<password>"))`` (``createPasswordDigest``) and uses
  that digest as the SCRAM password; SCRAM-SHA-256 uses the SASLprep'd password itself
  (scramp applies SASLprep in ``make_auth_info``).
* The stored credentials are mongod's ``admin.system.users`` ``credentials`` sub-document:
  ``{"SCRAM-SHA-1": {iterationCount, salt, storedKey, serverKey}, "SCRAM-SHA-256": {...}}``
  with base64 strings, iteration counts 10000 / 15000 (``scramIterationCount`` /
  ``scramSHA256IterationCount``).
* The conversation is the RFC 5802 exchange in ``payload`` BinData; after the client's proof
  mongod sends ``v=<server signature>`` and ``done: true`` when the client asked
  ``options.skipEmptyExchange`` (every current driver), else one more empty round.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any, Callable

from scramp import ScramClient, ScramMechanism
from scramp.core import ScramException

SCRAM_SHA_1 = "SCRAM-SHA-1"
SCRAM_SHA_256 = "SCRAM-SHA-256"
MECHANISMS = (SCRAM_SHA_1, SCRAM_SHA_256)
ITERATIONS = {SCRAM_SHA_1: 10000, SCRAM_SHA_256: 15000}


def mongo_sha1_digest(user: str, password: str) -> str:
    """``hex(md5("<user>:mongo:<password>"))``: the SCRAM-SHA-1 password (auth spec,
    "MONGODB-CR" digest)."""
    return hashlib.md5(f"{user}:mongo:{password}".encode()).hexdigest()


def scram_password(mechanism: str, user: str, password: str) -> str:
    """The password SCRAM hashes for ``mechanism``."""
    return mongo_sha1_digest(user, password) if mechanism == SCRAM_SHA_1 else password


def make_credentials(user: str, password: str,
                     mechanisms: tuple[str, ...] | list[str] = MECHANISMS) -> dict[str, Any]:
    """mongod's ``credentials`` document for ``user``/``password`` (one entry per mechanism).

    Raises ``ValueError`` for a password SASLprep rejects (the caller reports BadValue 2)."""
    out: dict[str, Any] = {}
    for mech in mechanisms:
        try:
            salt, stored, server, iters = ScramMechanism(mech).make_auth_info(
                scram_password(mech, user, password), iteration_count=ITERATIONS[mech])
        except ScramException as exc:
            raise ValueError(str(exc)) from None
        out[mech] = {"iterationCount": iters, "salt": base64.b64encode(salt).decode(),
                     "storedKey": base64.b64encode(stored).decode(),
                     "serverKey": base64.b64encode(server).decode()}
    return out


def auth_info(credentials: dict[str, Any], mechanism: str) -> tuple[bytes, bytes, bytes, int] | None:
    """``(salt, storedKey, serverKey, iterationCount)`` of one mechanism's credentials, or None."""
    cred = credentials.get(mechanism)
    if not isinstance(cred, dict):
        return None
    return (base64.b64decode(cred["salt"]), base64.b64decode(cred["storedKey"]),
            base64.b64decode(cred["serverKey"]), int(cred["iterationCount"]))


class ScramFailed(Exception):
    """The conversation failed (wrong proof, unknown user, malformed message): the command
    reports AuthenticationFailed (18) "Authentication failed." as mongod does, whatever the
    cause."""


@dataclass
class ServerConversation:
    """One server-side SCRAM conversation (a ``saslStart`` and its ``saslContinue`` s).

    ``lookup(user) -> credentials document or None`` gives the stored credentials; ``user`` is
    set once the client-first message is read; ``done`` once the proof checked out."""

    mechanism: str
    lookup: Callable[[str], dict[str, Any] | None]
    user: str = ""
    done: bool = False
    step: int = 0
    skip_empty: bool = False

    def __post_init__(self) -> None:
        self._server = ScramMechanism(self.mechanism).make_server(self._auth_fn)

    def _auth_fn(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        self.user = username
        creds = self.lookup(username)
        info = auth_info(creds, self.mechanism) if creds else None
        if info is None:
            raise KeyError(username)
        return info

    def start(self, payload: bytes) -> bytes:
        """The client-first message -> the server-first message."""
        try:
            self._server.set_client_first(payload.decode("utf-8"))
            self.step = 1
            return self._server.get_server_first().encode()
        except (ScramException, UnicodeDecodeError, KeyError) as exc:
            raise ScramFailed(str(exc)) from None

    def finish(self, payload: bytes) -> bytes:
        """The client-final message (with the proof) -> the server-final message."""
        if self.step != 1:
            raise ScramFailed("unexpected SCRAM step")
        try:
            self._server.set_client_final(payload.decode("utf-8"))
            out = self._server.get_server_final().encode()
        except (ScramException, UnicodeDecodeError) as exc:
            raise ScramFailed(str(exc)) from None
        self.step = 2
        self.done = True
        return out


class ClientConversation:
    """The client side, for the members' internal authentication (``__system`` with the key
    file): :meth:`first` then :meth:`final` then :meth:`verify` the server's signature."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self._client = ScramClient([mechanism], user, scram_password(mechanism, user, password))

    def first(self) -> bytes:
        return self._client.get_client_first().encode()

    def final(self, server_first: bytes) -> bytes:
        self._client.set_server_first(server_first.decode())
        return self._client.get_client_final().encode()

    def verify(self, server_final: bytes) -> None:
        """Raises ScramFailed when the server's signature is wrong."""
        try:
            self._client.set_server_final(server_final.decode())
        except ScramException as exc:
            raise ScramFailed(str(exc)) from None
