"""``maxTimeMS`` as an operation's deadline, and scans that let other clients in (issue 28).

mongod runs each operation on its own thread and checks its deadline at interrupt points
(``OperationContext::checkForInterrupt``, ``src/mongo/db/operation_context.cpp``): past
``maxTimeMS`` the operation fails with MaxTimeMSExpired (50) ``operation exceeded time limit``.
Here one asyncio loop serves every client of a process, so:

- :func:`deadline_scope` (entered by ``Node.run_command`` for the commands in
  :data:`TIMED_COMMANDS`) keeps the request's deadline in a context variable, for the task
  that runs the command (not for tasks it starts, which may outlive it);
- :func:`check` is the interrupt point: the matcher calls it for every document it tests
  (:mod:`shardsim.core.regex_limits` installs it), the router's targeting between slices of a large
  ``$in``;
- :class:`Pacer` is what a long loop awaits now and then: it checks the deadline and, once
  :data:`SLICE_S` of CPU has passed since the loop last let go, yields to the event loop so
  other connections are served (mongod's query yielding, ``PlanYieldPolicy``).

A getMore's ``maxTimeMS`` is its awaitData wait, not a deadline (``getMore`` is not timed here).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextvars import ContextVar
from typing import Any, Generator, Iterator, TypeVar

from shardsim.core.errors import MongoError

# The commands whose maxTimeMS bounds the work they do (mongod: every command; the ones that
# scan or target are the ones that can run long here). Change-stream aggregates are excluded
# by the caller (their maxTimeMS is the wait of the first batch).
TIMED_COMMANDS = frozenset({"find", "aggregate", "count", "distinct", "update", "delete",
                            "findAndModify", "bulkWrite"})
SLICE_S = 0.002  # at most this much CPU between two yields of a Pacer (seconds)

T = TypeVar("T")
# (deadline on time.monotonic(), the task running the operation): tasks the operation starts
# inherit the context but not the deadline (a background task outlives its request).
_deadline: ContextVar[tuple[float, Any] | None] = ContextVar("shardsim_deadline", default=None)


def expired_error() -> MongoError:
    """MaxTimeMSExpired (50) as mongod words it."""
    return MongoError(50, "operation exceeded time limit")


@contextlib.contextmanager
def deadline_scope(max_time_ms: Any) -> Iterator[None]:
    """Run the body under a deadline ``max_time_ms`` milliseconds from now (0 or None: no
    deadline, as mongod). An already stricter deadline (a nested scope) is kept."""
    if not max_time_ms:
        yield
        return
    deadline = time.monotonic() + float(max_time_ms) / 1000.0
    outer = _deadline.get()
    if outer is not None:
        deadline = min(outer[0], deadline)
    token = _deadline.set((deadline, asyncio.current_task()))
    try:
        yield
    finally:
        _deadline.reset(token)


def _current() -> float | None:
    held = _deadline.get()
    if held is None or held[1] is not asyncio.current_task():
        return None  # no deadline, or a task the operation started (it inherits the context)
    return held[0]


def remaining() -> float | None:
    """Seconds left before the current operation's deadline (negative: past it); None
    without a deadline."""
    deadline = _current()
    return None if deadline is None else deadline - time.monotonic()


def check() -> None:
    """The interrupt point: MaxTimeMSExpired (50) once the deadline has passed."""
    deadline = _current()
    if deadline is not None and time.monotonic() >= deadline:
        raise expired_error()


class Pacer:
    """A long loop's interrupt point: ``await pacer.tick()`` checks the deadline (50) and
    yields to the event loop when :data:`SLICE_S` has passed since the last yield."""

    __slots__ = ("_since",)

    def __init__(self) -> None:
        self._since = time.perf_counter()

    def due(self) -> bool:
        """True when the loop should yield now."""
        return time.perf_counter() - self._since >= SLICE_S

    async def tick(self) -> None:
        check()
        if time.perf_counter() - self._since >= SLICE_S:
            await asyncio.sleep(0)
            self._since = time.perf_counter()
            check()


async def run_steps(steps: Generator[None, None, T]) -> T:
    """Run a generator that yields (None) between slices of its work and returns a result,
    with a :class:`Pacer` between slices: the deadline is checked (50) at each, the event loop
    let in every :data:`SLICE_S`."""
    pacer = Pacer()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await pacer.tick()
