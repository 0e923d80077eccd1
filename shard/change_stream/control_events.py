"""The shard side of the 9.0 v2 change-stream reader: control events
(``DocumentSourceChangeStreamInjectControlEvents``; ``src/mongo/s/change_streams/control_events.h``).

A stream opened by a v2 router (``$changeStream.version: "v2"`` in the shard's command) turns two
sharding no-ops into *control events*, which the router consumes to retarget its cursors and never
returns to the client:

- ``o2: {moveChunk: ns, donor, recipient, allCollectionChunksMigratedFromDonor}`` (written on the
  donor by ``buildMoveChunkOplogEntries``) -> ``{operationType: "moveChunk", operationDescription:
  {donor, recipient, allCollectionChunksMigratedFromDonor}}`` (``MoveChunkControlEvent``);
- ``o2: {namespacePlacementChanged: 1, ns: {db[, coll]}, committedAt}`` -> ``{operationType:
  "namespacePlacementChanged", ns: {db[, coll]}}`` (``NamespacePlacementChangedControlEvent``).

They pass the user's stages untouched, like the new-shard event (the server marks them with the
``$changeStreamControlEvent`` metadata; shardsim reuses the topology-change bypass of
:mod:`.check_topology_change`). A v2 stream has no legacy new-shard event: the v2 router does not
swallow ``migrateChunkToNewShard`` (jstests: a faked one "passes through" in v2), so the shard does
not emit it. A v1 stream sees neither control event.
"""

from __future__ import annotations

from typing import Any

CONTROL_OPS = frozenset({"moveChunk", "movePrimary", "namespacePlacementChanged"})
_MOVE_CHUNK_FIELDS = ("donor", "recipient", "allCollectionChunksMigratedFromDonor")


def control_event(o2: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any] | None] | None:
    """``(operationType, operationDescription, ns override or None)`` of the control event of a
    no-op's ``o2`` for a v2 stream, or None when the no-op is not a control no-op."""
    if "moveChunk" in o2:
        return "moveChunk", {k: o2.get(k) for k in _MOVE_CHUNK_FIELDS}, None
    if "namespacePlacementChanged" in o2:
        ns = o2.get("ns") if isinstance(o2.get("ns"), dict) else {}
        return "namespacePlacementChanged", {"ns": ns}, ns
    return None


def is_control_noop(o2: dict[str, Any]) -> bool:
    """Does the oplog filter of a v2 stream keep this no-op (a control no-op)?"""
    return "moveChunk" in o2 or "namespacePlacementChanged" in o2
