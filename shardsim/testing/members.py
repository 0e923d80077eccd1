"""One member of an in-process cluster: a role's node behind the ordinary server loop.

:class:`GatedServer` is :class:`shardsim.core.server.Server` (the loop every role process runs) with
two additions the test kit needs: a *gate* that, when closed, holds every command of every
connection before it runs and every reply before it is sent (``pause_shard``: the shard stops
answering, as a mongod stopped with SIGSTOP would); ``Server.abort`` drops the
listening socket and every connection without a goodbye (``kill_shard``).

:class:`Member` keeps what is needed to build the node again on the same port and dbpath
(``restart_shard``). Tasks a member's node starts are tracked through the :data:`OWNER`
context variable and :class:`TaskTracker` (a task factory), so a killed or stopped member
leaves no task behind.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, Awaitable, Callable

from shardsim.core import wire
from shardsim.core.node import Node
from shardsim.core.server import Server

#: The member (by name) on whose behalf the current task runs; tasks inherit it.
OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("shardsim_testing_owner",
                                                                   default=None)


class TaskTracker:
    """A task factory recording each task under the :data:`OWNER` of the context it starts in.

    Installed on the cluster's event loop by :meth:`install`; chains to a factory that was
    already set (a user's loop may have one) and :meth:`uninstall` puts that one back.
    """

    def __init__(self) -> None:
        self.tasks: dict[str, set[asyncio.Task]] = {}
        self._previous: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._previous = loop.get_task_factory()
        loop.set_task_factory(self._factory)

    def uninstall(self) -> None:
        if self._loop is not None and self._loop.get_task_factory() == self._factory:
            self._loop.set_task_factory(self._previous)
        self._loop = None

    def _factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task:
        ctx = kw.get("context")
        owner = (ctx if ctx is not None else contextvars.copy_context()).get(OWNER)
        if self._previous is not None:
            task = self._previous(loop, coro, **kw)
        else:
            task = asyncio.Task(coro, loop=loop, **kw)
        if owner is not None:
            bucket = self.tasks.setdefault(owner, set())
            bucket.add(task)
            task.add_done_callback(bucket.discard)
        return task

    async def cancel(self, owner: str) -> None:
        """Cancel every unfinished task of ``owner`` (not the calling task) and wait for them."""
        me = asyncio.current_task()
        tasks = [t for t in self.tasks.pop(owner, set()) if t is not me and not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)


async def run_as(owner: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run ``fn(*args)`` in a task owned by ``owner`` (the tasks it starts are owned too)."""
    ctx = contextvars.copy_context()
    ctx.run(OWNER.set, owner)
    return await asyncio.get_running_loop().create_task(fn(*args), context=ctx)


class GatedServer(Server):
    """The role server loop with a pause gate (see the module docstring)."""

    def __init__(self, node: Node, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(node, host, port)
        self.gate = asyncio.Event()
        self.gate.set()

    async def _respond(self, msg: wire.Message, conn: Any, decoded: Any = None) -> bytes | None:
        if not self.gate.is_set():
            await self.gate.wait()
        out = await super()._respond(msg, conn, decoded)
        if not self.gate.is_set():  # a reply computed while paused waits too (an awaitData getMore)
            await self.gate.wait()
        return out


class Member:
    """A config server, shard or router of the in-process cluster.

    ``make_node(port)`` builds a fresh node (same options each time); ``port`` is fixed after
    the first start so a restart comes back on the same address (the catalog names shards by
    address). ``server`` is None while the member is down (killed or stopped).
    """

    def __init__(self, name: str, role: str, make_node: Callable[[int], Node], host: str,
                 dbpath: str | None = None) -> None:
        self.name = name
        self.role = role
        self.make_node = make_node
        self.host = host
        self.port = 0
        self.dbpath = dbpath
        self.node: Node | None = None
        self.server: GatedServer | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.server is not None

    @property
    def paused(self) -> bool:
        """Running with its gate closed (``pause_shard``): it answers nothing."""
        return self.server is not None and not self.server.gate.is_set()

    async def start(self) -> None:
        """Build the node and listen (on the kept port after the first start)."""
        node = self.make_node(self.port)
        server = GatedServer(node, self.host, self.port)
        self.node = node
        await server.start()
        self.server = server
        self.port = server.port

    async def stop(self, tracker: TaskTracker) -> None:
        """Shut down as the role process does on SIGTERM (the node's ``shutdown``: periodic
        tasks stopped, cursors killed, pools closed, durable stores flushed and closed)."""
        server, self.server = self.server, None
        if server is None:
            return
        server.gate.set()
        await server.close()
        await tracker.cancel(self.name)

    async def kill(self, tracker: TaskTracker) -> None:
        """Stop like ``kill -9``: connections dropped (``Server.abort``), tasks cancelled, then
        the node's public ``crash()`` (nothing flushed: a durable shard has committed every
        acknowledged write already; the dbpath lock freed)."""
        server, self.server = self.server, None
        if server is None:
            return
        server.abort()
        await tracker.cancel(self.name)
        server.gate.set()
        server.node.crash()
