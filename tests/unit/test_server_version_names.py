"""Version-dependent internal event names (no sockets): the shard's new-shard event is
``kNewShardDetected`` in v1-token streams of 6.0/7.0 shards and ``migrateChunkToNewShard``
otherwise (``change_stream_helpers_legacy.cpp`` ``getNewShardDetectedOpName``;
``document_source_change_stream.h`` ``kNewShardDetectedOpType``); the router swallows both."""

from __future__ import annotations

import datetime

import pytest
from bson import Binary, Timestamp

from shardsim.core import change_stream_spec as spec_mod
from shardsim.core import resume_token as rt
from shardsim.core import server_version as versions
from shardsim.shard.change_stream.transform import Transform

U1 = Binary(bytes(range(16)), 4)
NOOP = {"op": "n", "ns": "d.c", "ui": U1, "ts": Timestamp(100, 1),
        "wall": datetime.datetime(2026, 1, 1),
        "o": {"msg": "Migrating chunk from shard s0 to shard s1 with no chunks for this collection"},
        "o2": {"migrateChunkToNewShard": "d.c", "fromShardId": "s0", "toShardId": "s1"}}


@pytest.mark.parametrize("profile,gen_v2,name", [
    ("6.0", None, "kNewShardDetected"),            # a 6.0 stream makes v1 tokens
    ("6.0", True, "migrateChunkToNewShard"),
    ("7.0", None, "migrateChunkToNewShard"),
    ("7.0", False, "kNewShardDetected"),           # a 7.0 shard under a 6.0 router
    ("8.0", None, "migrateChunkToNewShard"),
    ("8.0", False, "migrateChunkToNewShard"),      # the legacy helper is gone after 7.0
    ("9.0", None, "migrateChunkToNewShard"),
])
def test_new_shard_event_name(profile: str, gen_v2: bool | None, name: str) -> None:
    cs = {} if gen_v2 is None else {"$_generateV2ResumeTokens": gen_v2}
    spec = spec_mod.parse("d", "c", [{"$changeStream": cs}], needs_merge=True,
                          profile=versions.get(profile))
    ev = Transform(spec).process(dict(NOOP))
    assert ev is not None and ev.topology
    assert ev.doc["operationType"] == name
    data = rt.decode(ev.token)
    if spec.token_version == 1:  # v1: a classic event, eventIdentifier = documentKey (missing)
        assert data.version == 1 and data.eventIdentifier is None
    else:
        assert data.eventIdentifier == {"operationType": name, "operationDescription":
                                        {"fromShardId": "s0", "toShardId": "s1"}}


def test_router_swallows_both_names() -> None:
    from shardsim.router.change_stream import merge_cursors
    assert {"kNewShardDetected", "migrateChunkToNewShard"} <= merge_cursors._GENERAL_OPS
    assert versions.NEW_SHARD_OPS == {"kNewShardDetected", "migrateChunkToNewShard"}
