"""Stage 7: the new-shard event (``migrateChunkToNewShard``; ``kNewShardDetected`` in v1-token
streams of 6.0/7.0, :func:`shardsim.core.server_version.new_shard_op_name`) bypasses the rest of
the pipeline
(``$_internalChangeStreamCheckTopologyChange``,
``document_source_change_stream_check_topology_change.cpp``).

On the server the stage throws ChangeStreamTopologyChange carrying the event and the executor
(``plan_executor_pipeline.cpp``) returns it as a result, so the stages after it (images, the
user's ``$match``/``$project``) never see it and the router gets it intact. Here the stage raises
:class:`TopologyChangeDetected` and the cursor outputs the event it carries. Such events exist
only for router-merged streams (the oplog filter admits them only with ``needsMerge``), so the
pipeline has this stage only then (:mod:`.pipeline`).
"""

from __future__ import annotations

from shardsim.shard.change_stream.transform import Event


class TopologyChangeDetected(Exception):
    """Carries a ``kNewShardDetected`` event past the remaining stages to the cursor's output
    (the server's ChangeStreamTopologyChangeInfo). Never reaches a client as an error."""

    def __init__(self, event: Event) -> None:
        super().__init__("kNewShardDetected")
        self.event = event


class CheckTopologyChange:
    """The ``$_internalChangeStreamCheckTopologyChange`` stage: ``process(ev)`` returns ``ev``,
    or raises :class:`TopologyChangeDetected` for a topology-change event (``ev.topology``)."""

    name = "$_internalChangeStreamCheckTopologyChange"
    __slots__ = ()

    def process(self, ev: Event) -> Event:
        """``ev`` unchanged; TopologyChangeDetected for the new-shard event."""
        if ev.topology:
            raise TopologyChangeDetected(ev)
        return ev
