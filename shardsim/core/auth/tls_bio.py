"""TLS over an already-open asyncio stream with :class:`ssl.MemoryBIO` (for ``allowTLS`` /
``preferTLS``, where the server reads the first byte before it knows the connection is TLS, so
``start_tls`` cannot be used: the buffered ClientHello would be lost).

:class:`TlsStream` offers what the server loop uses of a reader (``readexactly``) and a writer
(``write``, ``drain``, ``close``, ``get_extra_info``)."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any


class TlsStream:
    """Server-side TLS on ``reader``/``writer``; ``first``: bytes already read."""

    def __init__(self, ctx: ssl.SSLContext, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, first: bytes) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._in, self._out, server_side=True)
        self._in.write(first)
        self._reader = reader
        self._writer = writer
        self._buf = bytearray()

    async def _pump_in(self) -> None:
        data = await self._reader.read(65536)
        if not data:
            raise asyncio.IncompleteReadError(bytes(self._buf), None)
        self._in.write(data)

    def _flush_out(self) -> None:
        data = self._out.read()
        if data:
            self._writer.write(data)

    async def handshake(self) -> None:
        """Complete the TLS handshake (raises ssl.SSLError / ConnectionError on failure)."""
        while True:
            try:
                self._tls.do_handshake()
                self._flush_out()
                await self._writer.drain()
                return
            except ssl.SSLWantReadError:
                self._flush_out()
                await self._writer.drain()
                await self._pump_in()

    def reader(self) -> "TlsStream":
        return self

    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            try:
                chunk = self._tls.read(65536)
            except ssl.SSLWantReadError:
                self._flush_out()
                await self._pump_in()
                continue
            except ssl.SSLError as exc:
                raise ConnectionError(str(exc)) from None
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(self._buf), n)
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def write(self, data: Any) -> None:
        for part in data if isinstance(data, list) else (data,):
            self._tls.write(part)
        self._flush_out()

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        self._writer.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._tls
        return self._writer.get_extra_info(name, default)
