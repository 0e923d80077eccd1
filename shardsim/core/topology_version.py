"""``topologyVersion`` and the awaitable ``hello`` (the SDAM streaming protocol).

A replica-set member answers ``hello`` with ``topologyVersion: {processId: ObjectId, counter:
long}``; the ``processId`` is new for every process start and the ``counter`` goes up on every
change a driver must see (a state change, a new primary, a stepdown). A driver that sends
``hello`` with the ``topologyVersion`` it last saw and ``maxAwaitTimeMS`` gets the answer only
when the topology changed or ``maxAwaitTimeMS`` passed (``src/mongo/db/repl/replication_info.cpp``
``CmdHello::run``; ``ReplicationCoordinatorImpl::awaitHelloResponse``; the SDAM spec's
"Streaming Protocol"). A request whose ``processId`` differs, or whose counter is older, is
answered at once; a counter newer than the server's is an error.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bson import ObjectId
from bson.int64 import Int64

from shardsim.core.errors import MongoError


class TopologyVersion:
    """One process's topology version: :attr:`process_id` (ObjectId, new at every start) and
    :attr:`counter` (int). :meth:`bump` on every change; :meth:`wait` for the awaitable hello."""

    def __init__(self) -> None:
        self.process_id = ObjectId()
        self.counter = 0
        self._waiters: set[asyncio.Event] = set()

    def doc(self) -> dict[str, Any]:
        """``{processId, counter}`` as ``hello`` carries it (``TopologyVersion`` IDL)."""
        return {"processId": self.process_id, "counter": Int64(self.counter)}

    def bump(self) -> None:
        """The topology changed: a new counter, and every waiting ``hello`` answers."""
        self.counter += 1
        for ev in self._waiters:
            ev.set()

    async def wait(self, body: dict[str, Any]) -> None:
        """Hold an awaitable ``hello`` (``topologyVersion`` + ``maxAwaitTimeMS`` in ``body``)
        until the topology changes or ``maxAwaitTimeMS`` (ms) pass; returns at once for a plain
        ``hello``, another process's version or an older counter.

        Raises MongoError as ``CmdHello::run`` (replication_info.cpp): 31368 when only one of
        the two fields is given ("A request with a 'topologyVersion' must include
        'maxAwaitTimeMS'" / the reverse), 31372 for a negative counter, the IDL's 51024 for a
        negative ``maxAwaitTimeMS``, TypeMismatch 14 for a non-number; and 31382 for a counter
        newer than this process's (``ReplicationCoordinatorImpl::awaitHelloResponse``)."""
        tv = body.get("topologyVersion")
        max_await = body.get("maxAwaitTimeMS")
        if tv is None and max_await is None:
            return
        if tv is None or max_await is None:
            raise MongoError(31368, "A request with a 'topologyVersion' must include "
                                    "'maxAwaitTimeMS'" if max_await is None else
                                    "A request with 'maxAwaitTimeMS' must include a "
                                    "'topologyVersion'")
        if isinstance(max_await, bool) or not isinstance(max_await, (int, float)):
            raise MongoError(14, "BSON field 'hello.maxAwaitTimeMS' is the wrong type, "
                                 "expected type 'long'")
        if max_await < 0:
            raise MongoError(51024, f"BSON field 'maxAwaitTimeMS' value must be >= 0, actual "
                                    f"value '{max_await}'")
        counter = tv.get("counter") if isinstance(tv, dict) else None
        if isinstance(counter, int) and counter < 0:
            raise MongoError(31372, "topologyVersion must have a non-negative counter")
        if not isinstance(tv, dict) or tv.get("processId") != self.process_id:
            return  # another process (or a restart): answer at once
        if not isinstance(counter, int) or counter < self.counter:
            return
        if counter > self.counter:
            raise MongoError(31382, "Received a topology version with the same process ID and "
                                    "a higher counter than the server's")
        changed = asyncio.Event()
        self._waiters.add(changed)
        # a timer, not asyncio.wait_for (which can lose a cancellation racing the event)
        timer = asyncio.get_running_loop().call_later(max_await / 1000.0, changed.set)
        try:
            await changed.wait()
        finally:
            timer.cancel()
            self._waiters.discard(changed)
