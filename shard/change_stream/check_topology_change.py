"""Stage 7: ``kNewShardDetected`` bypasses the user's stages
(``$_internalChangeStreamCheckTopologyChange``,
``document_source_change_stream_check_topology_change.cpp``).

On the server the stage throws ChangeStreamTopologyChange carrying the event and the executor
returns it as a result, so the user's ``$match``/``$project`` never see it and the router gets it
intact. Here the event is flagged and the cursor skips the user stages for it. Such events exist
only for router-merged streams (the oplog filter admits them only with ``needsMerge``).
"""

from __future__ import annotations

from shard.change_stream.transform import Event


def bypasses_user_stages(ev: Event) -> bool:
    """True for topology-change events that must reach the router unfiltered."""
    return ev.topology
