"""Container health check for shardsim roles (Dockerfile HEALTHCHECK, compose healthcheck).

Usage: healthcheck.py [--host 127.0.0.1] [--port 27017] [--tcp] [--timeout-ms 3000]

Default: sends one `ping` command as an OP_MSG over a raw socket and exits 0 when the reply
document has ok: 1, else 1. It deliberately avoids a full driver (no pymongo MongoClient, no
monitoring threads): Docker runs it every few seconds in every container of a 2-core machine.
With --tcp it only checks that the port accepts a TCP connection (the Spark master and worker,
which do not speak the MongoDB protocol). Exit codes follow Docker's HEALTHCHECK contract:
0 healthy, 1 unhealthy. Wire format: MongoDB OP_MSG (opcode 2013), one kind-0 section.
"""
import argparse
import os
import socket
import struct
import sys

OP_MSG = 2013


def ping(host: str, port: int, timeout_s: float) -> dict:
    """Send {ping: 1, $db: "admin"} and return the decoded reply document.

    Raises OSError on network failure, ValueError on a malformed reply.
    """
    import bson  # pymongo's BSON codec (a dependency of shardsim)

    body = struct.pack("<I", 0) + b"\x00" + bson.encode({"ping": 1, "$db": "admin"})
    msg = struct.pack("<iiii", 16 + len(body), 1, 0, OP_MSG) + body
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(msg)
        header = _recv_exact(s, 16)
        length, _req, _resp_to, opcode = struct.unpack("<iiii", header)
        if opcode != OP_MSG or not 21 <= length <= 48 * 1024 * 1024:
            raise ValueError(f"unexpected reply opcode {opcode} length {length}")
        payload = _recv_exact(s, length - 16)
    if payload[4] != 0:  # payload = flagBits (4 bytes), then section kind 0 + BSON
        raise ValueError("reply does not start with a kind-0 section")
    doc_len = struct.unpack_from("<i", payload, 5)[0]
    return bson.decode(payload[5:5 + doc_len])


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed by the server")
        buf += chunk
    return bytes(buf)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=int(os.environ.get("SHARDSIM_LISTEN_PORT", "27017")))
    p.add_argument("--tcp", action="store_true", help="only check that the port accepts connections")
    p.add_argument("--timeout-ms", type=int, default=3000)
    a = p.parse_args()
    try:
        if a.tcp:
            socket.create_connection((a.host, a.port), timeout=a.timeout_ms / 1000).close()
            return 0
        reply = ping(a.host, a.port, a.timeout_ms / 1000)
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {a.host}:{a.port}: {exc}", file=sys.stderr)
        return 1
    if reply.get("ok") == 1:
        return 0
    print(f"unhealthy: {a.host}:{a.port}: {reply}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
