"""A stub server that replays pre-encoded change events: the floor of a catch-up read.

``python bench/_replay_server.py EVENTS_FILE NS BATCH`` listens on a free loopback port, prints
``replay ready on 127.0.0.1:<port>`` and then answers a pymongo client's change stream
(``aggregate`` with ``$changeStream``, then ``getMore``) with the events of ``EVENTS_FILE``
(concatenated raw BSON documents, e.g. the router's own events of the same backlog), ``BATCH``
per reply, every reply encoded before the first client connects. Each ``aggregate`` starts the
events from the beginning; once they run out a ``getMore`` gets an empty batch. Besides that it
answers only the handshake (``hello``/``isMaster``, OP_QUERY or OP_MSG), ``ping``,
``killCursors`` and ``endSessions``.

It does no work per event, so a client reading from it measures what the client itself and the
loopback cost for these events (``bench_catchup.py``'s "replay floor"): the figure a change
stream server could at best reach on this machine with one pymongo consumer. Bench tool only.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import struct
import sys

import bson
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardsim.core import wire  # noqa: E402

_i32 = struct.Struct("<i")


def _split(raw: bytes) -> list[bytes]:
    """The documents of concatenated raw BSON."""
    out, pos = [], 0
    while pos < len(raw):
        n = _i32.unpack_from(raw, pos)[0]
        out.append(raw[pos:pos + n])
        pos += n
    return out


def _batches(events: list[bytes], ns: str, per: int) -> list[bytes]:
    """The getMore reply bodies, ``per`` events each, then one empty batch at the end."""
    out = []
    for i in range(0, len(events), per):
        chunk = [RawBSONDocument(e) for e in events[i:i + per]]
        pbrt = chunk[-1]["_id"]
        out.append(bson.encode({"cursor": {"nextBatch": chunk, "postBatchResumeToken": pbrt,
                                           "id": Int64(1), "ns": ns}, "ok": 1.0}))
    last = RawBSONDocument(events[-1])["_id"] if events else {"_data": "00"}
    out.append(bson.encode({"cursor": {"nextBatch": [], "postBatchResumeToken": last,
                                       "id": Int64(1), "ns": ns}, "ok": 1.0}))
    return out


def main() -> None:
    path, ns, per = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(path, "rb") as f:
        events = _split(f.read())
    replies = _batches(events, ns, per)
    first = bson.encode({"cursor": {"firstBatch": [], "postBatchResumeToken":
                                    RawBSONDocument(events[0])["_id"] if events else {"_data": "00"},
                                    "id": Int64(1), "ns": ns}, "ok": 1.0})
    hello = {"helloOk": True, "isWritablePrimary": True, "ismaster": True,
             "maxBsonObjectSize": 16 * 1024 * 1024, "maxMessageSizeBytes": 48_000_000,
             "maxWriteBatchSize": 100_000, "logicalSessionTimeoutMinutes": 30,
             "connectionId": 1, "minWireVersion": 0, "maxWireVersion": 25,
             "readOnly": False, "ok": 1.0}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pos = len(replies) - 1
        try:
            while True:
                head = await reader.readexactly(16)
                header = wire.parse_header(head)
                payload = await reader.readexactly(header.length - 16)
                msg = wire.parse_message(header, payload, head)
                if isinstance(msg, wire.OpQuery):
                    doc = bson.encode({**hello, "localTime": datetime.datetime.now()})
                    writer.write(wire.encode_op_reply(doc, response_to=header.request_id))
                    continue
                body = bson.decode(msg.body)
                name = next(iter(body))
                if name == "aggregate":
                    pos = 0
                    out = first
                elif name == "getMore":
                    out = replies[pos]
                    pos = min(pos + 1, len(replies) - 1)
                elif name in ("hello", "isMaster", "ismaster"):
                    out = bson.encode({**hello, "localTime": datetime.datetime.now()})
                elif name == "killCursors":
                    out = bson.encode({"cursorsKilled": body.get("cursors", []), "ok": 1.0})
                else:
                    out = bson.encode({"ok": 1.0})
                writer.write(wire.encode_op_msg(out, response_to=header.request_id))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def run() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        print(f"replay ready on 127.0.0.1:{port}", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
