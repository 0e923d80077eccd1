"""The floor under every role's CPU per message: a bare Python OP_MSG echo process (uvloop,
asyncio streams, the project's wire codec and ``bson``, no node at all), woken after an idle gap.

A child process answers ``ping`` (and the driver's ``hello``) with ``{ok: 1}``; the parent
(pymongo) sends a burst of ``k`` pings, one round trip after the other, after each sleep of
``--gap-ms`` and reads the child's CPU (``/proc/PID/task/*/schedstat``). Printed: CPU per burst
and per ping, back to back (gap 0) and after the gap for k = 1, 2, 4, 8.

What it shows (issue 30): the first message after an idle gap costs a Python process several
times what a back-to-back one does (cold caches, whatever the code), each further message of the
same burst much less. So a role's CPU per insert-to-event sample depends on how often it is
woken after the other processes ran as much as on its own per-command path. Compare
``bench_latency_breakdown.py``'s router CPU per ping (idle) with ``k = 1`` here.

Usage: ``python bench/bench_wake_floor.py [--gap-ms 100] [--samples 150]``. Figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import bson
import pymongo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import cpu_seconds, machine  # noqa: E402  (also puts the project root on sys.path)
from shardsim.core import wire  # noqa: E402

_HELLO = {"helloOk": True, "isWritablePrimary": True, "maxWireVersion": 21, "minWireVersion": 0,
          "maxBsonObjectSize": 16777216, "maxMessageSizeBytes": 48000000,
          "maxWriteBatchSize": 100000, "ok": 1.0}


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        try:
            raw_header = await reader.readexactly(wire.HEADER_SIZE)
            header = wire.parse_header(raw_header)
            payload = await reader.readexactly(header.length - wire.HEADER_SIZE)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        msg = wire.parse_message(header, payload, raw_header)
        body = bson.decode(msg.body)
        reply = {"ok": 1.0} if "ping" in body else _HELLO
        writer.write(wire.encode_op_msg(bson.encode(reply), response_to=msg.request_id))
        await writer.drain()


def _serve(port: int) -> None:
    import uvloop

    async def main() -> None:
        server = await asyncio.start_server(_handle, "127.0.0.1", port)
        await server.serve_forever()
    uvloop.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gap-ms", type=float, default=100.0)
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--port", type=int, default=27997)
    a = ap.parse_args()
    print(f"machine: {machine()}  load: {os.getloadavg()[0]:.2f}", flush=True)
    pid = os.fork()
    if pid == 0:
        try:
            _serve(a.port)
        finally:
            os._exit(0)
    try:
        client: pymongo.MongoClient = pymongo.MongoClient(
            f"mongodb://127.0.0.1:{a.port}/?directConnection=true", serverSelectionTimeoutMS=10000)
        client.admin.command("ping")
        for gap, k in ((0.0, 1), (a.gap_ms, 1), (a.gap_ms, 2), (a.gap_ms, 4), (a.gap_ms, 8)):
            n = a.samples * 10 if not gap else a.samples
            c0 = cpu_seconds([pid])
            for _ in range(n):
                if gap:
                    time.sleep(gap / 1000)
                for _ in range(k):
                    client.admin.command("ping")
            per_wake = (cpu_seconds([pid]) - c0) / n * 1e6
            print(f"gap {gap:5.0f} ms, {k} ping(s) per burst: echo CPU {per_wake:6.0f} us per burst, "
                  f"{per_wake / k:6.0f} us per ping", flush=True)
        client.close()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
