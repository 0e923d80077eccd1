"""The shard pipeline as one list (shard/change_stream/pipeline.py): the stages each stream
gets, in the server's order (``_buildPipeline``), and what the cursor runs per event."""

from __future__ import annotations

import pytest
from bson import Timestamp

from shardsim.core import resume_token as rt
from shardsim.core import change_stream_spec as spec_mod
from support.fakes import FakeShardNode
from shardsim.shard.change_stream.pipeline import ShardPipeline, build_pipeline, fused_crud

OPLOG_MATCH = "$_internalChangeStreamOplogMatch"
UNWIND = "$_internalChangeStreamUnwindTransaction"
TRANSFORM = "$_internalChangeStreamTransform"
INVALIDATE = "$_internalChangeStreamCheckInvalidate"
RESUMABILITY = "$_internalChangeStreamCheckResumability"
ENSURE = "$_internalChangeStreamEnsureResumeTokenPresent"
TOPOLOGY = "$_internalChangeStreamCheckTopologyChange"
PRE = "$_internalChangeStreamAddPreImage"
POST = "$_internalChangeStreamAddPostImage"
SPLIT = "$changeStreamSplitLargeEvent"

TOKEN = rt.event_token(Timestamp(5, 1), bytes(16), "insert", {"_id": 1})
HWM = rt.make_high_water_mark(Timestamp(5, 1), 2)


def names(target, cs=None, rest=(), needs_merge=False, db="d"):
    spec = spec_mod.parse(db, target, [{"$changeStream": cs or {}}, *rest], needs_merge=needs_merge)
    return ShardPipeline(build_pipeline(FakeShardNode(), spec)).names()


@pytest.mark.parametrize("target,cs,rest,needs_merge,expected", [
    ("c", {}, [], False, [OPLOG_MATCH, UNWIND, TRANSFORM, INVALIDATE]),
    (1, {}, [], False, [OPLOG_MATCH, UNWIND, TRANSFORM, INVALIDATE]),
    ("c", {}, [], True, [OPLOG_MATCH, UNWIND, TRANSFORM, INVALIDATE, TOPOLOGY]),
    ("c", {"resumeAfter": TOKEN}, [], True,
     [OPLOG_MATCH, UNWIND, TRANSFORM, INVALIDATE, RESUMABILITY, TOPOLOGY]),
    ("c", {"resumeAfter": TOKEN}, [], False, [OPLOG_MATCH, UNWIND, TRANSFORM, INVALIDATE, ENSURE]),
    ("c", {"resumeAfter": HWM}, [], False,
     [OPLOG_MATCH, UNWIND, TRANSFORM, INVALIDATE, RESUMABILITY]),
    ("c", {"fullDocument": "updateLookup", "fullDocumentBeforeChange": "whenAvailable"},
     [{"$match": {"x": 1}}, {"$project": {"x": 1}}, {SPLIT: {}}], True,
     [OPLOG_MATCH, UNWIND, TRANSFORM, INVALIDATE, TOPOLOGY, PRE, POST, "$match, $project",
      SPLIT]),
    ("c", {}, [{SPLIT: {}}], False, [OPLOG_MATCH, UNWIND, TRANSFORM, INVALIDATE, SPLIT]),
])
def test_stages_in_server_order(target, cs, rest, needs_merge, expected):
    assert names(target, cs, rest, needs_merge) == expected


def test_cluster_streams_have_no_invalidate_check():
    assert names(1, {"allChangesForCluster": True}, db="admin") == [OPLOG_MATCH, UNWIND, TRANSFORM]


def test_per_event_steps_are_resolved_once():
    spec = spec_mod.parse("d", "c", [{"$changeStream": {"resumeAfter": TOKEN}}], needs_merge=True)
    pipe = ShardPipeline(build_pipeline(FakeShardNode(), spec))
    # The topology check guards only user stages: without them it is not a step.
    assert pipe.steps == (pipe.resume_step,) and pipe.resume_step == pipe.resume.process
    spec = spec_mod.parse("d", "c", [{"$changeStream": {}}, {"$match": {"x": 1}}],
                          needs_merge=True)
    pipe = ShardPipeline(build_pipeline(FakeShardNode(), spec))
    assert len(pipe.steps) == 2 and pipe.resume is None and pipe.resume_step is None
    with pytest.raises(ValueError):
        ShardPipeline(build_pipeline(FakeShardNode(), spec)[1:])


def test_fused_variant_only_for_eligible_streams():
    plain = spec_mod.parse("d", "c", [{"$changeStream": {}}], needs_merge=True)
    assert fused_crud(plain, [].append, bytes) is not None
    lookup = spec_mod.parse("d", "c", [{"$changeStream": {"fullDocument": "updateLookup"}}])
    assert fused_crud(lookup, [].append, bytes) is None
