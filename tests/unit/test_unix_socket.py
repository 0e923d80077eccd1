"""Cluster members on one machine talk over Unix domain sockets (shardsim/client.py
``unix_socket_path``, shardsim/server.py ``Server``): named as mongod names its own
(``mongodb-<port>.sock``), in the directory the launcher gives (``SHARDSIM_UNIX_SOCKET_DIR``);
TCP stays the fallback and the only transport when no directory is set."""

from __future__ import annotations

import asyncio
import os
import socket

from shardsim.client import UNIX_SOCKET_DIR_ENV, Connection, unix_socket_path
from shardsim.node import Node
from shardsim.server import Server


def _family(conn: Connection) -> int:
    assert conn._writer is not None
    return conn._writer.get_extra_info("socket").family


async def _serve_and_ping(sock_dir: str) -> dict:
    out: dict = {}
    srv = Server(Node(), "127.0.0.1", 0)
    await srv.start()
    try:
        path = os.path.join(sock_dir, f"mongodb-{srv.port}.sock")
        out["path"] = srv.unix_path == path and os.path.exists(path)
        conn = Connection("127.0.0.1", srv.port)
        await conn.connect()
        out["family"] = _family(conn)
        out["ping"] = (await conn.command("admin", {"ping": 1}))["ok"]
        conn.close()
        # Not loopback: TCP, whatever the directory says.
        out["remote_host_path"] = unix_socket_path("10.1.2.3", srv.port)
    finally:
        await srv.close()
    out["removed"] = not os.path.exists(path)
    return out


def test_members_listen_and_connect_on_unix_sockets(tmp_path, monkeypatch):
    monkeypatch.setenv(UNIX_SOCKET_DIR_ENV, str(tmp_path))
    out = asyncio.run(_serve_and_ping(str(tmp_path)))
    assert out["path"] is True
    assert out["family"] == socket.AF_UNIX
    assert out["ping"] == 1.0
    assert out["remote_host_path"] is None
    assert out["removed"] is True


async def _stale_then_tcp(sock_dir: str) -> dict:
    out: dict = {}
    srv = Server(Node(), "127.0.0.1", 0)
    # A socket file left by a killed process on the same port, nobody listening on it.
    await srv.start()
    path = srv.unix_path
    assert path is not None
    srv._unix_server.close()  # type: ignore[union-attr]
    srv._unix_server = None
    stale = socket.socket(socket.AF_UNIX)
    os.unlink(path)
    stale.bind(path)
    stale.close()
    try:
        conn = Connection("127.0.0.1", srv.port)
        await conn.connect()  # refused on the file: falls back to TCP
        out["family"] = _family(conn)
        out["ping"] = (await conn.command("admin", {"ping": 1}))["ok"]
        conn.close()
        # A new server on that port replaces the stale file.
        srv2 = Server(Node(), "127.0.0.1", 0)
        srv2.port = srv.port
        await srv.close()
        await srv2.start()
        try:
            conn = Connection("127.0.0.1", srv2.port)
            await conn.connect()
            out["family2"] = _family(conn)
            conn.close()
        finally:
            await srv2.close()
    finally:
        await srv.close()
    return out


def test_stale_socket_file_falls_back_to_tcp_and_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv(UNIX_SOCKET_DIR_ENV, str(tmp_path))
    out = asyncio.run(_stale_then_tcp(str(tmp_path)))
    assert out["family"] == socket.AF_INET and out["ping"] == 1.0
    assert out["family2"] == socket.AF_UNIX


def test_no_directory_means_tcp_only(monkeypatch):
    monkeypatch.delenv(UNIX_SOCKET_DIR_ENV, raising=False)
    assert unix_socket_path("127.0.0.1", 27018) is None

    async def run() -> tuple:
        srv = Server(Node(), "127.0.0.1", 0)
        await srv.start()
        try:
            conn = Connection("127.0.0.1", srv.port)
            await conn.connect()
            fam = _family(conn)
            conn.close()
            return srv.unix_path, fam
        finally:
            await srv.close()
    assert asyncio.run(run()) == (None, socket.AF_INET)


def test_overlong_directory_is_not_used(monkeypatch):
    monkeypatch.setenv(UNIX_SOCKET_DIR_ENV, "/tmp/" + "d" * 120)
    assert unix_socket_path("127.0.0.1", 27018) is None
