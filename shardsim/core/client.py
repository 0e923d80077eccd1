"""An asyncio client for talking to other shardsim processes (router -> shards/config server).

Replies can be decoded lazily as :class:`bson.raw_bson.RawBSONDocument` so the router forwards
change events as raw bytes (never decoding what it only passes on). Network failures raise
:class:`~shardsim.core.errors.MongoError` with the network-error codes a real mongos reports
(HostUnreachable 6, NetworkTimeout 89, SocketException 9001), which are resumable.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Iterator

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from shardsim.core import large_messages, wire
from shardsim.core.errors import MongoError
from shardsim.core.links import CUT_REASON, LINKS
from shardsim.core.node import CODEC, decode

RAW_CODEC = CodecOptions(document_class=RawBSONDocument)


def _encode(doc: Any) -> bytes:
    return bson.encode(doc, codec_options=CODEC)


class InternalSecurity:
    """How this process's outgoing member connections are secured (one setting per process,
    from ``--keyFile`` and the TLS options; :func:`configure`): ``key`` (None = no internal
    authentication) makes every new connection authenticate as ``__system@local`` with
    SCRAM-SHA-256 (mongod's keyFile internal authentication); ``ssl`` (an
    :class:`ssl.SSLContext` or None) wraps it in TLS."""

    key: str | None = None
    ssl: Any = None


INTERNAL = InternalSecurity()


def configure(*, key: str | None = None, ssl_context: Any = None) -> None:
    """Set this process's :data:`INTERNAL` security (called once by a role's ``__main__``)."""
    INTERNAL.key = key
    INTERNAL.ssl = ssl_context


class Connection:
    """One connection to ``host:port``; commands run one at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self.broken = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def connect(self, timeout: float = 5.0) -> None:
        if LINKS.is_cut(self.address):  # a test cut the link (shardsim.core.links)
            self.broken = True
            raise MongoError(6, f"Couldn't connect to server {self.address} :: caused by :: "
                                f"{CUT_REASON}")
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=2 ** 20,
                                        ssl=INTERNAL.ssl), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            self.broken = True
            raise MongoError(6, f"Couldn't connect to server {self.address} :: caused by :: "
                                f"{exc or type(exc).__name__}") from None
        if INTERNAL.key is not None:
            await self._authenticate(INTERNAL.key, timeout)
        LINKS.track(self)

    async def _authenticate(self, key: str, timeout: float) -> None:
        """SCRAM-SHA-256 as ``__system@local`` (keyFile internal authentication); the
        connection is closed and AuthenticationFailed (18) raised when the peer refuses."""
        from shardsim.core.auth.scram import SCRAM_SHA_256, ClientConversation, ScramFailed
        conv = ClientConversation(SCRAM_SHA_256, "__system", key)

        async def step(body: dict[str, Any]) -> dict[str, Any]:
            body["$db"] = "local"
            raw = await self._round_trip(
                wire.encode_op_msg(bson.encode(body, codec_options=CODEC)), timeout)
            reply = decode(raw)
            if not reply.get("ok"):
                self.close()
                raise remote_error(reply)
            return reply

        first = await step({"saslStart": 1, "mechanism": SCRAM_SHA_256, "payload": conv.first(),
                            "options": {"skipEmptyExchange": True}})
        final = await step({"saslContinue": 1, "conversationId": first["conversationId"],
                            "payload": conv.final(bytes(first["payload"]))})
        try:
            conv.verify(bytes(final["payload"]))
        except ScramFailed:
            self.close()
            raise MongoError(18, "Authentication failed.") from None

    async def command_bytes(self, body: bytes, timeout: float | None = None) -> bytes:
        """Send one OP_MSG with raw BSON ``body``; return the raw BSON reply body.
        ``timeout`` (s) bounds the whole exchange (NetworkTimeout 89 and the connection is
        closed when it passes)."""
        async with self._lock:
            if self._writer is None:
                await self.connect()
            return await self._round_trip(wire.encode_op_msg(body), timeout)

    def write_request(self, body: bytes) -> bool:
        """Write one OP_MSG request with raw BSON ``body`` now, without waiting; its reply is
        read with :meth:`read_reply`. Only for a connection its owner uses one request at a
        time (no lock is taken). Returns False, and closes the connection, when it is not
        connected or the peer has closed it."""
        w = self._writer
        if w is None or self.broken or w.is_closing() or self.peer_closed() or \
                (LINKS.cut and LINKS.is_cut(self.address)):
            self.close()
            return False
        try:
            w.write(wire.encode_op_msg(body))
        except (OSError, RuntimeError):
            self.close()
            return False
        return True

    async def read_reply(self, timeout: float | None = None) -> bytes:
        """The raw BSON reply body to the request :meth:`write_request` wrote; errors as
        :meth:`command_bytes`."""
        return await self._round_trip(None, timeout)

    async def _round_trip(self, msg: bytes | None, timeout: float | None) -> bytes:
        """Write ``msg`` (unless None) and read one reply's body, mapping failures to
        NetworkTimeout (89) / SocketException (9001) and closing the connection (also when
        the caller is cancelled meanwhile)."""
        if self._reader is None or self._writer is None:
            self.broken = True
            raise MongoError(9001, f"not connected to {self.address}")
        if LINKS.cut and LINKS.is_cut(self.address):
            self.close()
            raise MongoError(9001, f"network error while contacting {self.address} :: caused "
                                   f"by :: {CUT_REASON}")
        try:
            if timeout is None:
                raw_header, header, payload = await self._exchange(msg)
            else:
                # One timer for the exchange (asyncio.timeout), not a wait_for per read:
                # wait_for wraps each read in a new Task, two per command on the hot path.
                async with asyncio.timeout(timeout):
                    raw_header, header, payload = await self._exchange(msg)
        except asyncio.CancelledError:
            # cancelled between writing the request and reading its reply: that reply would be
            # read as the next command's answer, so the connection is not reused
            self.close()
            raise
        except TimeoutError:
            self.close()
            raise MongoError(89, f"operation exceeded time limit talking to {self.address}") from None
        except (OSError, asyncio.IncompleteReadError, wire.ProtocolError) as exc:
            self.close()
            raise MongoError(9001, f"network error while contacting {self.address} :: caused by :: "
                                   f"{type(exc).__name__}: {exc}") from None
        # a cluster member's reply: no depth scan (a getMore batch of events is megabytes)
        parsed = wire.parse_message(header, payload, raw_header, check_depth=False)
        if isinstance(parsed, wire.BadMessage):
            raise parsed.error
        if isinstance(parsed, wire.OpMsg):
            return parsed.body
        raise MongoError(17, "unexpected reply opcode")

    async def _exchange(self, msg: bytes | None) -> tuple[bytes, wire.Header, bytes]:
        """Write ``msg`` (unless None: already written) and read one reply: (raw header, parsed
        header, payload)."""
        assert self._reader is not None and self._writer is not None
        if msg is not None:
            try:
                self._writer.write(msg)
                await self._writer.drain()
            except RuntimeError as exc:
                # uvloop's transport refuses a write once the peer is gone ("unable to
                # perform operation on <TCPTransport closed=True ...>; the handler is
                # closed"): a network error like any other (issue 28: a coordinator killed
                # under a commit answered InternalError with that text)
                raise ConnectionResetError(str(exc)) from None
        raw_header = await self._reader.readexactly(wire.HEADER_SIZE)
        header = wire.parse_header(raw_header)
        payload = await self._reader.readexactly(header.length - wire.HEADER_SIZE)
        return raw_header, header, payload

    async def command(self, db: str, cmd: dict[str, Any], *, raw: bool = False,
                      check: bool = True, timeout: float | None = None) -> Any:
        """Run ``cmd`` on ``db``. Returns a dict (or RawBSONDocument with ``raw``); with
        ``check`` an ``ok: 0`` reply raises MongoError carrying its code, codeName and labels."""
        body = dict(cmd)
        body["$db"] = db
        if large_messages.LARGE_REQUEST.get():  # forwarding a large request: encode off the loop
            encoded = await large_messages.encode_off_loop(body, _encode)
        else:
            encoded = bson.encode(body, codec_options=CODEC)
        reply_bytes = await self.command_bytes(encoded, timeout)
        reply: Any = RawBSONDocument(reply_bytes, RAW_CODEC) if raw else decode(reply_bytes)
        if check and not reply.get("ok"):
            raise remote_error(reply)
        return reply

    def peer_closed(self) -> bool:
        """True once the server closed an idle connection (EOF or error seen by the reader)."""
        r = self._reader
        return r is not None and (r.at_eof() or r.exception() is not None)

    def close(self) -> None:
        self.broken = True
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # pragma: no cover
                pass
        self._writer = None
        self._reader = None


def remote_error(reply: Any) -> MongoError:
    """A MongoError from an ``ok: 0`` reply (code, errmsg, codeName, errorLabels kept)."""
    code = int(reply.get("code", 8) or 8)
    exc = MongoError(code, str(reply.get("errmsg", "unknown error")),
                     code_name_override=reply.get("codeName"))
    labels = reply.get("errorLabels")
    if labels:
        exc.labels = list(labels)
    if "resolvedView" in reply:  # 169 from a shard: the router re-runs the view (ResolvedView)
        exc.extra["resolvedView"] = reply["resolvedView"]
    # the ErrorExtraInfo of codes that carry one (error_codes.yml extra:), which mongos
    # passes on: DuplicateKeyErrorInfo, CannotConvertIndexToUniqueInfo, DocumentValidation...
    for field in _EXTRA_INFO_FIELDS:
        if field in reply:
            exc.extra[field] = reply[field]
    return exc


_EXTRA_INFO_FIELDS = ("keyPattern", "keyValue", "violations", "errInfo",
                      # WouldChangeOwningShardInfo (283)
                      "preImage", "postImage", "shouldUpsert", "userPostImage")


class Pool:
    """Connections to one address: idle ones are reused, broken ones dropped."""

    def __init__(self, host: str, port: int, max_idle: int = 16) -> None:
        self.host = host
        self.port = port
        self._idle: list[Connection] = []
        self._max_idle = max_idle

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def acquire(self) -> Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.broken and not conn.peer_closed():
                return conn
            conn.close()  # e.g. the server restarted while the connection sat idle
        conn = Connection(self.host, self.port)
        await conn.connect()
        return conn

    def release(self, conn: Connection) -> None:
        if not conn.broken and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    @contextlib.contextmanager
    def _lent(self, conn: Connection) -> Iterator[Connection]:
        """``conn`` in use by one request; back to the pool afterwards. A network error means
        the peer went away (e.g. restarted): its other idle connections are dead too, so they
        are all dropped, as mongos' pool does on a network error
        (ConnectionPool::dropConnections), instead of failing once each."""
        try:
            yield conn
        except MongoError:
            if conn.broken:
                self.close()
            raise
        finally:
            self.release(conn)

    async def command(self, db: str, cmd: dict[str, Any], **kw: Any) -> Any:
        """Run one command on a pooled connection."""
        conn = await self.acquire()
        with self._lent(conn):
            return await conn.command(db, cmd, **kw)

    def write_now(self, db: str, cmd: dict[str, Any]) -> Connection | None:
        """Write ``cmd`` on ``db`` (encoded as :meth:`Connection.command` does) now, without
        yielding the loop, on an idle connection (the request is on its way before the caller's
        task next awaits), and return that connection, taken out of the pool: read the reply
        with :meth:`finish`. None, with nothing written, when no idle connection is at hand
        (the caller then runs the command with :meth:`command`, which connects)."""
        if not self._idle:
            return None
        body = dict(cmd)
        body["$db"] = db
        encoded = bson.encode(body, codec_options=CODEC)
        while self._idle:
            conn = self._idle.pop()
            if not conn.broken and not conn.peer_closed() and conn.write_request(encoded):
                return conn
            conn.close()  # (write_request closed it already when it refused)
        return None

    async def finish(self, conn: Connection, *, raw: bool = False,
                     timeout: float | None = None) -> Any:
        """The reply to the request :meth:`write_now` wrote on ``conn`` (a dict, or a
        RawBSONDocument with ``raw``; an ``ok: 0`` reply is returned, not raised); ``conn``
        goes back to the pool. Network failures raise as :meth:`command` does (and drop the
        pool's idle connections)."""
        with self._lent(conn):
            reply_bytes = await conn.read_reply(timeout)
            return RawBSONDocument(reply_bytes, RAW_CODEC) if raw else decode(reply_bytes)

    def close(self) -> None:
        for c in self._idle:
            c.close()
        self._idle.clear()


def parse_address(addr: str, default_port: int = 27017) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``."""
    host, _, port = addr.rpartition(":")
    if not host:
        return addr, default_port
    return host, int(port)
