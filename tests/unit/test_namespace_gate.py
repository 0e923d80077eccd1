"""router.writes.NamespaceGate: writes enter and exit without a lock round while nothing blocks
the gate, so these check what the lock used to guarantee: ``block`` waits for the writes in
flight (an exit must wake it), and writes that arrive while it is blocked wait for ``unblock``."""

from __future__ import annotations

import asyncio

from shardsim.router.writes import NamespaceGate


def test_block_waits_for_writes_in_flight_and_holds_new_ones() -> None:
    async def scenario() -> list[str]:
        gate = NamespaceGate()
        events: list[str] = []
        await gate.enter()
        await gate.enter()
        assert gate.active == 2

        async def blocker() -> None:
            await gate.block()
            events.append("blocked")

        async def late_write() -> None:
            await gate.enter()
            events.append("late write entered")
            await gate.exit()

        b = asyncio.create_task(blocker())
        await asyncio.sleep(0)
        assert not b.done()  # two writes in flight
        late = asyncio.create_task(late_write())
        await gate.exit()
        await asyncio.sleep(0)
        assert not b.done()  # one left
        await gate.exit()  # the last one: must wake the blocker
        await asyncio.wait_for(b, 1.0)
        for _ in range(3):
            await asyncio.sleep(0)
        assert not late.done()  # held while blocked
        await gate.unblock()
        await asyncio.wait_for(late, 1.0)
        assert gate.active == 0 and gate.blocked == 0
        return events

    assert asyncio.run(scenario()) == ["blocked", "late write entered"]


def test_block_with_no_writes_returns_at_once_and_nested_blocks_need_as_many_unblocks() -> None:
    async def scenario() -> None:
        gate = NamespaceGate()
        await asyncio.wait_for(gate.block(), 1.0)
        await asyncio.wait_for(gate.block(), 1.0)
        w = asyncio.create_task(gate.enter())
        await gate.unblock()
        for _ in range(3):
            await asyncio.sleep(0)
        assert not w.done()
        await gate.unblock()
        await asyncio.wait_for(w, 1.0)
        assert gate.active == 1
        await gate.exit()
        assert gate.active == 0

    asyncio.run(scenario())
