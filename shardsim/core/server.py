"""The asyncio server loop: a thin shell around :mod:`shardsim.core.wire` and a :class:`~shardsim.core.node.Node`.

One task per connection; commands on one connection run one at a time (as on mongod), many
connections run concurrently. A malformed message gets an error reply and the connection
stays open; an unframeable one (impossible length) or a connection-fatal parse error closes
that connection only. uvloop is used when installed.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import signal
import sys
from itertools import count
from typing import Any

from bson.raw_bson import RawBSONDocument

from shardsim.core import compression, large_messages, wire
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.cursors import RawBSONParts
from shardsim.core.errors import MongoError
from shardsim.core.node import Node, decode, encode

log = logging.getLogger("shardsim.core.server")
_conn_ids = count(1)


def _request_from_body(body: dict[str, Any], raw: bytes, conn: ConnectionInfo,
                       sequences: dict[str, list[bytes]] | None = None,
                       default_db: str = "admin") -> Request:
    if not body:
        raise MongoError(59, "no such command: ''")
    name = next(iter(body))
    db = body.get("$db", default_db)
    if not isinstance(db, str):
        raise MongoError(14, "BSON field '$db' is the wrong type, expected type 'string'")
    return Request(name=name, db=db, body=body, conn=conn, raw=raw, sequences=sequences or {})


def request_from_op_msg(msg: wire.OpMsg, conn: ConnectionInfo, *, sliced: bool = False) -> Request:
    """Decode an OP_MSG into a Request; kind-1 sequences become list fields of the body.
    ``sliced``: decode with :func:`shardsim.core.large_messages.decode_sliced` (on a worker thread,
    so the event loop gets the GIL between slices)."""
    dec = large_messages.decode_sliced if sliced else decode
    body = dec(msg.body)
    for name, docs in msg.sequences.items():
        if name in body:
            raise MongoError(40433, f"Duplicate field between body and document sequence {name}")
        body[name] = [dec(d) for d in docs]
    if "$db" not in body:
        raise MongoError(40571, "OP_MSG requests require a $db argument")
    return _request_from_body(body, msg.body, conn, msg.sequences)


def request_from_op_query(msg: wire.OpQuery, conn: ConnectionInfo, *,
                          sliced: bool = False) -> Request:
    """Decode a legacy OP_QUERY command on ``<db>.$cmd`` (``sliced``: as
    :func:`request_from_op_msg`)."""
    db, _, coll = msg.collection.partition(".")
    if coll != "$cmd":
        raise MongoError(352, "Unsupported OP_QUERY command: legacy find is not supported")
    body = (large_messages.decode_sliced if sliced else decode)(msg.query)
    if "$query" in body or "query" in body and len(body) > 1 and isinstance(body.get("query"), dict):
        body = body.get("$query", body.get("query"))
    return _request_from_body(dict(body), msg.query, conn, default_db=db)


class Server:
    """Serve ``node`` on ``host:port`` (port 0 picks a free one; ``node.port`` is then set).

    ``tls`` (:class:`shardsim.core.auth.tls.TlsSettings` or None): ``requireTLS`` serves TLS only
    (a plain client's bytes fail the handshake and the connection closes); ``allowTLS`` /
    ``preferTLS`` serve both on the one port, upgrading a connection whose first byte is a TLS
    handshake record, as mongod does."""

    def __init__(self, node: Node, host: str = "127.0.0.1", port: int = 0,
                 tls: Any = None) -> None:
        self.node = node
        self.host = host
        self.port = port
        self.tls = tls
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()  # connection tasks (asyncio keeps weak refs)

    async def start(self) -> None:
        tls = self.tls
        if tls is not None and tls.mode != "requireTLS":
            self._server = await asyncio.start_server(self._accept_sniff, self.host, self.port,
                                                      limit=2 ** 20, reuse_address=True)
        else:
            self._server = await asyncio.start_server(
                self._accept, self.host, self.port, limit=2 ** 20, reuse_address=True,
                ssl=tls.context if tls is not None else None)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        self.node.host = self.host
        self.node.port = self.port
        large_messages.start_worker()
        await self.node.startup()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._conns):
            w.close()
        await self.node.shutdown()

    def abort(self) -> None:
        """Close the listening socket and drop every connection at once, without replies
        (the sockets of a process killed with ``kill -9``; the node is not shut down: see
        :meth:`shardsim.core.node.Node.crash`)."""
        if self._server is not None:
            self._server.close()
        for w in list(self._conns):
            transport = w.transport
            if transport is not None:
                transport.abort()
        self._conns.clear()

    async def serve_forever(self) -> None:
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The accept callback: run :meth:`_handle` in a task of our own. (Handing asyncio a
        coroutine makes ``StreamReaderProtocol`` watch the task with a callback that calls
        ``task.exception()``, which raises for a task cancelled before its first step — a
        connection accepted just as the in-process kit stops — and prints "Exception in
        callback ... CancelledError".)"""
        self._start_task(self._handle(reader, writer), writer)

    def _accept_sniff(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """:meth:`_accept` for allowTLS/preferTLS (:meth:`_sniff` first)."""
        self._start_task(self._sniff(reader, writer), writer)

    def _start_task(self, coro: Any, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                writer.close()  # cancelled before _handle's own cleanup could run
                return
            exc = t.exception()
            if exc is not None:
                log.error("connection handler failed", exc_info=exc)
                writer.close()

        task.add_done_callback(done)

    async def _sniff(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """allowTLS/preferTLS: peek at the first byte (still in the reader's buffer) and
        upgrade the connection to TLS when it starts a TLS handshake."""
        try:
            first = await reader.read(1)
        except (ConnectionError, OSError):
            writer.close()
            return
        if not first:
            writer.close()
            return
        if first[0] != 0x16:
            await self._handle(_Prefixed(reader, first), writer)
            return
        # A TLS client: feed the buffered ClientHello back through a memory-BIO TLS layer.
        await self._handle_tls(reader, writer, first)

    async def _handle_tls(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          first: bytes) -> None:
        from shardsim.core.auth.tls_bio import TlsStream
        stream = TlsStream(self.tls.context, reader, writer, first)
        try:
            await stream.handshake()
        except Exception:
            writer.close()
            return
        await self._handle(stream.reader(), stream)  # type: ignore[arg-type]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        conn = ConnectionInfo(id=next(_conn_ids), peer=f"{peer[0]}:{peer[1]}" if peer else "")
        self._conns.add(writer)
        stats = self.node.stats
        stats.connection_opened()
        try:
            while True:
                try:
                    raw_header = await reader.readexactly(wire.HEADER_SIZE)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                try:
                    header = wire.parse_header(raw_header)
                except wire.ProtocolError as exc:
                    log.warning("closing connection %s: %s", conn.peer, exc)
                    return
                try:
                    payload = await reader.readexactly(header.length - wire.HEADER_SIZE)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                compressor_id = None
                if header.op_code == wire.OP_COMPRESSED:  # session_workflow.cpp _processMessage
                    try:
                        raw_header, payload, compressor_id = compression.decompress(
                            payload, header.request_id, header.response_to)
                    except compression.CompressionError as exc:
                        log.warning("closing connection %s: %s", conn.peer, exc)
                        return
                    header = wire.parse_header(raw_header)
                decoded = None
                if len(payload) < large_messages.OFF_LOOP_BYTES:
                    msg = wire.parse_message(header, payload, raw_header)
                else:  # parse and decode off the loop (issue 28)
                    msg = large_messages.pre_auth_refusal(self.node, header, payload, conn)
                    if msg is None:
                        msg, decoded = await large_messages.parse_off_loop(
                            header, payload, raw_header, lambda m: _decode_request(m, conn))
                if decoded is None:
                    out = await self._respond(msg, conn)
                else:  # what it sends on is encoded off the loop, its objects freed there
                    token = large_messages.LARGE_REQUEST.set(True)
                    try:
                        out = await self._respond(msg, conn, decoded)
                    finally:
                        large_messages.LARGE_REQUEST.reset(token)
                    if isinstance(decoded, Request):
                        holder, decoded = [decoded.body], None
                        large_messages.release(holder)
                stats.message(header.length, _size(out))
                while out is not None:
                    # only a request that allowed exhaust can get a moreToCome reply
                    nxt = exhaust_next(msg, out) \
                        if type(msg) is wire.OpMsg and msg.flags & wire.FLAG_EXHAUST_ALLOWED else None
                    if compressor_id is not None:  # the reply uses the request's compressor
                        out = compression.compress(out, compressor_id)
                    writer.write(out)
                    await writer.drain()
                    if nxt is None or conn.closed:
                        break
                    msg = nxt  # exhaust: run it again without waiting for a request
                    out = await self._respond(msg, conn)
                    stats.message(0, _size(out))
                if isinstance(msg, wire.BadMessage) and msg.fatal:
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            stats.connection_closed()
            conn.closed = True
            self._conns.discard(writer)
            try:
                writer.close()
            except Exception:  # pragma: no cover - already closed
                pass

    async def _respond(self, msg: wire.Message, conn: ConnectionInfo,
                       decoded: Request | MongoError | None = None) -> bytes | None:
        """The reply bytes for ``msg`` (None for moreToCome); ``decoded``: its Request or
        decoding error when it was decoded off the loop already."""
        node = self.node
        if isinstance(msg, wire.BadMessage):
            reply = msg.error.to_reply()
            node.cluster_time_fields(None, reply)
            if msg.op_code == wire.OP_QUERY:
                return wire.encode_op_reply(encode(reply), response_to=msg.request_id)
            return wire.encode_op_msg(encode(reply), response_to=msg.request_id)
        if isinstance(msg, wire.OpMsg):
            try:
                if isinstance(decoded, MongoError):
                    raise decoded
                req = decoded if decoded is not None else request_from_op_msg(msg, conn)
            except MongoError as exc:
                reply = exc.to_reply()
                node.cluster_time_fields(None, reply)
                req = None
            else:
                reply = await node.run_command(req)
            if msg.more_to_come:
                return None
            flags = wire.FLAG_MORE_TO_COME if exhaust_continues(msg, req, reply) else 0
            return wire.encode_op_msg(encode_reply_parts(reply), response_to=msg.request_id,
                                      flags=flags)
        try:
            if isinstance(decoded, MongoError):
                raise decoded
            req = decoded if decoded is not None else request_from_op_query(msg, conn)
        except MongoError as exc:
            reply = exc.to_reply()
            node.cluster_time_fields(None, reply)
        else:
            reply = await node.run_command(req)
        return wire.encode_op_reply(encode_reply(reply), response_to=msg.request_id)


def exhaust_continues(msg: wire.OpMsg, req: Request | None, reply: dict[str, Any]) -> bool:
    """True when the reply to ``msg`` goes out with ``moreToCome`` and the server runs the same
    request again on its own (exhaust cursors: ``makeExhaustMessage`` in
    ``src/mongo/transport/session_workflow.cpp``, ``getmore_cmd.cpp`` asking for the next
    invocation): an OP_MSG ``getMore`` with ``exhaustAllowed``, answered ok with a live cursor and
    a non-empty batch (an empty batch, what a tailable cursor gives when it has nothing, ends the
    stream instead of spinning; the client then sends its next getMore itself)."""
    if not msg.flags & wire.FLAG_EXHAUST_ALLOWED or req is None or req.name != "getMore":
        return False
    cur = reply.get("cursor") if type(reply) is dict and reply.get("ok", 1) else None
    if type(cur) is RawBSONParts:  # a batch of encoded events (change streams)
        return bool(cur.cursor_id) and cur.n_docs > 0
    if type(cur) is not dict:
        return False
    return bool(cur.get("id")) and bool(cur.get("nextBatch"))


def exhaust_next(msg: wire.Message, out: bytes) -> wire.OpMsg | None:
    """The request an exhaust reply ``out`` (uncompressed) stands for next: ``msg`` again, its
    checksum flag dropped, with the reply's requestID as its own (so the following reply's
    responseTo names the previous reply, as mongod's); None when ``out`` has no moreToCome."""
    if not isinstance(msg, wire.OpMsg) or len(out) < wire.HEADER_SIZE + 4:
        return None
    _length, reply_id, _to, op_code = wire.HEADER.unpack_from(out, 0)
    flags = int.from_bytes(out[16:20], "little")
    if op_code != wire.OP_MSG or not flags & wire.FLAG_MORE_TO_COME:
        return None
    return wire.OpMsg(reply_id, (msg.flags & ~wire.FLAG_CHECKSUM_PRESENT) | wire.FLAG_EXHAUST_ALLOWED,
                      msg.body, msg.sequences, msg.compressor_id)


def _decode_request(msg: wire.Message, conn: ConnectionInfo) -> Request:
    """The Request of a parsed message, decoded slice by slice (runs on a worker thread)."""
    if isinstance(msg, wire.OpMsg):
        return request_from_op_msg(msg, conn, sliced=True)
    return request_from_op_query(msg, conn, sliced=True)  # type: ignore[arg-type]


def _size(out: Any) -> int:
    """Bytes of an encoded reply: bytes, a list of parts (a spliced batch) or None."""
    if out is None:
        return 0
    if isinstance(out, (bytes, bytearray, memoryview)):
        return len(out)
    return sum(len(p) for p in out)


class _Prefixed:
    """A StreamReader with bytes already read put back in front (:meth:`Server._sniff`)."""

    def __init__(self, reader: asyncio.StreamReader, head: bytes) -> None:
        self._reader = reader
        self._head = head

    async def readexactly(self, n: int) -> bytes:
        if not self._head:
            return await self._reader.readexactly(n)
        head, self._head = self._head[:n], self._head[n:]
        if len(head) == n:
            return head
        return head + await self._reader.readexactly(n - len(head))


_CURSOR_PLACEHOLDER = RawBSONDocument(b"\x05\x00\x00\x00\x00")
_CURSOR_MARKER = b"\x03cursor\x00\x05\x00\x00\x00\x00"


def encode_reply_parts(reply: dict[str, Any]) -> bytes | list[bytes]:
    """Encode a reply; when its ``cursor`` is a :class:`RawBSONParts` (a batch of forwarded
    events), the pieces of the body instead of bytes, so the batch is copied once, into the
    framed message."""
    cur = reply.get("cursor") if type(reply) is dict else None
    if type(cur) is not RawBSONParts:
        return encode_reply(reply)
    body = encode_reply({**reply, "cursor": _CURSOR_PLACEHOLDER})
    at = body.find(_CURSOR_MARKER)
    if at < 0:  # an error reply replaced it: nothing to splice
        return body
    at += len(_CURSOR_MARKER) - 5
    return [(len(body) - 5 + cur.size).to_bytes(4, "little"), body[4:at], *cur.parts, body[at + 5:]]


def encode_reply(reply: dict[str, Any]) -> bytes:
    """Encode a reply; one that cannot be encoded becomes an InternalError reply."""
    try:
        return encode(reply)
    except Exception as exc:
        log.exception("cannot encode reply")
        err = MongoError(1, f"cannot encode reply: {exc}").to_reply()
        return encode(err)


# The line a role process prints once it listens: the contract with whoever started it
# (the launcher, the test harnesses, compose health checks read it).
READY_RE = re.compile(r"shardsim (\w+) ready on ([\w.\-]+):(\d+)")


def ready_line(role: str) -> str:
    """The ready message a role prints (``{host}``/``{port}`` filled by :func:`run_node`)."""
    return f"shardsim {role} ready on {{host}}:{{port}}"


def run_node(node: Node, host: str, port: int, *, ready_message: str | None = None,
             tls: Any = None) -> None:
    """Run ``node`` until SIGINT/SIGTERM (uvloop when installed). Prints ``ready_message``
    (formatted with ``port``) once listening, so launchers can wait for it. ``tls``: see
    :class:`Server`."""
    try:
        import uvloop  # noqa: F401
        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run

    async def main() -> None:
        server = Server(node, host, port, tls)
        await server.start()
        # Change-stream batches allocate many short-lived objects (events, tokens, items): with
        # the default gen-0 threshold (700) a catch-up spends ~10 % of its CPU in the cyclic
        # GC, full collections traversing every stored document. Collect less often, and keep
        # the objects that exist at start (modules, tables) out of every collection.
        gc.freeze()
        gc.set_threshold(20_000, 20, 10)
        # Large requests are parsed on a worker thread (shardsim/core/large_messages.py): the loop's
        # thread waits at most this long for the GIL when it has a connection to serve.
        sys.setswitchinterval(0.001)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if ready_message:
            print(ready_message.format(port=server.port, host=host), flush=True)
        serve = asyncio.create_task(server.serve_forever())
        await stop.wait()
        serve.cancel()
        await server.close()

    prof_dir = os.environ.get("SHARDSIM_PROFILE")
    if not prof_dir:
        runner(main())
        return
    # Profiling aid for bench work: SHARDSIM_PROFILE=DIR writes DIR/<role>-<pid>.prof (cProfile)
    # when the process stops (SIGTERM/SIGINT), e.g. for bench/ runs. cProfile times wall clock:
    # a send that wakes another process on this core is charged the time that process runs
    # first. SHARDSIM_PROFILE_TIMER=cpu times the thread's CPU instead (slower to profile).
    import cProfile
    import time
    prof = (cProfile.Profile(time.thread_time)
            if os.environ.get("SHARDSIM_PROFILE_TIMER") == "cpu" else cProfile.Profile())
    prof.enable()
    try:
        runner(main())
    finally:
        prof.disable()
        role = type(node).__name__.replace("Node", "").lower() or "node"
        prof.dump_stats(os.path.join(prof_dir, f"{role}-{os.getpid()}.prof"))
