"""A command cancelled while it waits for its reply (the coordinator cancels the other
prepares once one participant fails, ``shard/transaction_coordinator.py``) must not leave its
connection in the pool: the reply still on the wire would be read as the answer to the next
command sent on that connection (issue 28 R2: a prepareTransaction answered by an earlier
command's ``{ok: 1}``, ``KeyError: 'prepareTimestamp'``; an abortTransaction answered by a
prepare's reply, leaving the participant prepared)."""

from __future__ import annotations

import asyncio

import bson

from shardsim.core import wire
from shardsim.core.client import Pool


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer ``{echo: n, delay: s}`` with ``{ok: 1, echo: n}`` after ``s`` seconds."""
    try:
        while True:
            raw = await reader.readexactly(wire.HEADER_SIZE)
            header = wire.parse_header(raw)
            payload = await reader.readexactly(header.length - wire.HEADER_SIZE)
            msg = wire.parse_message(header, payload, raw)
            body = bson.decode(msg.body)
            await asyncio.sleep(body.get("delay", 0))
            writer.write(wire.encode_op_msg(bson.encode({"ok": 1, "echo": body["echo"]}),
                                            response_to=header.request_id))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        writer.close()


def test_cancelled_command_does_not_leave_its_reply_for_the_next_one() -> None:
    async def run() -> list[int]:
        server = await asyncio.start_server(_serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool("127.0.0.1", port)
        try:
            slow = asyncio.ensure_future(pool.command("admin", {"echo": 1, "delay": 0.2}))
            await asyncio.sleep(0.05)  # written, its reply not yet read
            slow.cancel()
            await asyncio.gather(slow, return_exceptions=True)
            await asyncio.sleep(0.3)  # the first reply is on the wire now
            got = [(await pool.command("admin", {"echo": n}))["echo"] for n in (2, 3)]
        finally:
            pool.close()
            server.close()
            await server.wait_closed()
        return got

    assert asyncio.run(run()) == [2, 3]


class _ClosedTransportWriter:
    """A stream writer whose transport is gone, as uvloop reports it: ``write`` raises
    RuntimeError (not OSError)."""

    def write(self, data: bytes) -> None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True "
                           "reading=False 0x0>; the handler is closed")

    async def drain(self) -> None:  # pragma: no cover
        return None

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        return None


def test_write_to_a_closed_transport_is_a_network_error() -> None:
    """uvloop's RuntimeError on a write to a dead peer is SocketException (9001), so the router
    answers a network error (retryable, UnknownTransactionCommitResult for a commit), never
    InternalError with Python text (issue 28: fault trial txn seed 28096)."""
    from shardsim.core.client import Connection
    from shardsim.core.errors import MongoError

    async def run() -> MongoError:
        conn = Connection("127.0.0.1", 1)
        conn._reader, conn._writer = asyncio.StreamReader(), _ClosedTransportWriter()  # type: ignore
        try:
            await conn.command("admin", {"ping": 1})
        except MongoError as exc:
            assert conn.broken
            return exc
        raise AssertionError("no error")

    exc = asyncio.run(run())
    assert exc.code == 9001 and "network error" in str(exc)
