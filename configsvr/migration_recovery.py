"""The config server's fail points for the operations it drives, and who counts as unreachable.

Chunk migrations are driven and completed by the donor shard's primary
(:mod:`shard.migration_source`, with the ``moveChunkHangAtStep3..6`` fail points there); the
config server only holds its DDL lock while it waits for the donor's ``_shardsvrMoveRange``
reply (released when that request ends, also when the donor dies), so nothing of a migration
is left for it to recover. What stays here are the resharding coordinator's fail points:
``reshardingPauseCoordinatorBeforeBlockingWrites`` (cloned and caught up, at the end of the
``clone`` phase) and ``reshardingPauseCoordinatorBeforeCompletion`` (decision persisted and
catalog switched, before the renames), after ``resharding_coordinator_service.cpp``'s.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from shardsim.core.failpoints import FailPoint
from shardsim.core.protocol.versions import NETWORK_ERRORS

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr")

# A shard that cannot be reached (network, shutting down, not primary).
UNREACHABLE = NETWORK_ERRORS | {91, 11600, 189, 10107, 13436}
# The config server's fail points (pauseWhileSet), by name.
HANG_POINTS = ("reshardingPauseCoordinatorBeforeBlockingWrites",
               "reshardingPauseCoordinatorBeforeCompletion")


class MigrationRecovery:
    """``node.migration_recovery``: the config server's fail points (``hang[name]``)."""

    def __init__(self, node: "ConfigServerNode") -> None:
        self.node = node
        self.hang = {name: FailPoint(name) for name in HANG_POINTS}

    def install_fail_points(self) -> None:
        """Make the fail points configurable (``configureFailPoint``; test commands only)."""
        fps = self.node.failpoints
        if fps is not None:
            for fp in self.hang.values():
                fps.add(fp)

    async def pause(self, name: str) -> None:
        """``<name>.pauseWhileSet()`` (one of :data:`HANG_POINTS`)."""
        fp = self.hang[name]
        if fp.should_fail():
            log.info("Hit %s failpoint", fp.name)
            while fp.active:
                await asyncio.sleep(0.01)
