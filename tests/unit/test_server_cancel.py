"""A connection task cancelled before its first step (what stopping the in-process kit does to
a connection accepted a moment earlier) ends quietly: no "Exception in callback ...
CancelledError" from the loop's exception handler, and its socket is closed
(``shardsim/core/server.py`` ``Server._accept``)."""

from __future__ import annotations

import asyncio
from typing import Any

from shardsim.core.node import Node
from shardsim.core.server import Server


def test_connection_task_cancelled_before_it_runs_is_quiet() -> None:
    async def scenario() -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        server = Server(Node(), "127.0.0.1", 0)
        await server.start()
        previous = loop.get_task_factory()

        def cancel_handlers(lp: Any, coro: Any, **kw: Any) -> asyncio.Task:
            task = asyncio.Task(coro, loop=lp, **kw)
            if getattr(coro, "__name__", "") == "_handle":
                task.cancel()  # before its first step, as a shutdown racing the accept does
            return task

        loop.set_task_factory(cancel_handlers)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            closed = await asyncio.wait_for(reader.read(), timeout=5)  # EOF: server closed it
            assert closed == b""
            writer.close()
            for _ in range(5):
                await asyncio.sleep(0)
        finally:
            loop.set_task_factory(previous)
            await server.close()
        return reported

    reported = asyncio.run(scenario())
    assert reported == [], [r.get("message") for r in reported]
