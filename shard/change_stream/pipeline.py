"""The shard half of a change stream as one list of stages, built like the server's
``DocumentSourceChangeStream::_buildPipeline`` (``document_source_change_stream.cpp``; the
stages of a data shard's pipeline are listed in ``change_stream_pipeline_helpers.cpp``).

:func:`build_pipeline` returns, in order, the stages a stream needs (each an object from its
own module, ``name`` the server's stage name, one method ``process``)::

    OplogMatch                 $_internalChangeStreamOplogMatch       entry -> bool
    UnwindTransaction          $_internalChangeStreamUnwindTransaction entry -> entries
    Transform                  $_internalChangeStreamTransform        entry -> Event | None
    CheckInvalidate            $_internalChangeStreamCheckInvalidate  Event -> [Event, invalidate?]
                               (collection and database streams)
    CheckResumability          $_internalChangeStreamCheckResumability Event -> Event | None
      or EnsureResumeTokenPresent (a stream resumed from an event token, read directly)
    CheckTopologyChange        $_internalChangeStreamCheckTopologyChange  (needsMerge: sharded)
    AddPreImage                $_internalChangeStreamAddPreImage      (fullDocumentBeforeChange)
    AddPostImage               $_internalChangeStreamAddPostImage     (fullDocument)
    UserStages                 the user's $match, $project, ...       Event -> Event | None
    SplitLargeEvent            $changeStreamSplitLargeEvent           (when the user asks)

From the resumability check on, every stage is ``process(ev) -> ev | None`` (None: dropped);
:class:`ShardPipeline` resolves the list once per cursor into what the cursor
(:class:`.cursor.ChangeStreamCursor`) calls per entry and per event, so running the list costs
no call a stage does not make. The router's half (merge, ``$_internalChangeStreamHandleTopologyChange``,
the router's ensure-resume-token-present) runs on the router.

**Fused variant.** :func:`fused_crud` (:mod:`.fast_crud`) is a fused variant of oplog match +
transform + resumability + encoding for plain CRUD entries (insert/update/replace/delete outside
transactions) of streams that need nothing else per event (:func:`.fast_crud.eligible`): for
those entries the other stages are identities (nothing to unwind or invalidate, no images, no
user stages) and the cursor uses it only once the resumability check is done. It writes each
event's BSON directly and is byte-for-byte equal to running the list
(``tests/unit/test_change_stream_fast_crud.py``).
"""

from __future__ import annotations

from typing import Any, Callable

from shardsim.core import resume_token as rt
from shardsim.shard.change_stream import fast_crud
from shardsim.shard.change_stream.add_post_image import AddPostImage
from shardsim.shard.change_stream.add_pre_image import AddPreImage
from shardsim.shard.change_stream.check_invalidate import CheckInvalidate
from shardsim.shard.change_stream.check_resumability import CheckResumability
from shardsim.shard.change_stream.check_topology_change import CheckTopologyChange
from shardsim.shard.change_stream.ensure_resume_token_present import EnsureResumeTokenPresent
from shardsim.shard.change_stream.oplog_match import OplogMatch, crud_predicate
from shardsim.core.change_stream_spec import StreamSpec
from shardsim.shard.change_stream.split_large_event import SplitLargeEvent, event_size_limit
from shardsim.shard.change_stream.transform import Transform
from shardsim.shard.change_stream.unwind_transaction import UnwindTransaction
from shardsim.core.clock import ts_key
from shardsim.shard.change_stream.user_stages import UserStages

__all__ = ["build_pipeline", "ShardPipeline", "fused_crud"]

SPLIT_STAGE = "$changeStreamSplitLargeEvent"


def build_pipeline(node: Any, spec: StreamSpec) -> list[Any]:
    """The stages of ``spec``'s shard pipeline, in order (see the module docstring).

    ``node``: the shard (``pre_images``, ``find_document``) for the image stages. Raises the
    user stages' parse errors (:class:`.user_stages.UserStages`) and the resume token's decode
    errors, as opening the stream does.
    """
    oplog = node.oplog
    lookup = (lambda ts: oplog.get(ts_key(ts))) if oplog is not None else None
    stages: list[Any] = [OplogMatch(spec), UnwindTransaction(crud_predicate(spec), lookup),
                         Transform(spec)]
    if spec.kind != "cluster":
        stages.append(CheckInvalidate(spec))
    if spec.resume_data is not None:
        # A router's stream (needsMerge) or a high-water mark: the router (or nobody) checks
        # that the token's event is present; a direct stream from an event token checks here.
        if spec.needs_merge or rt.is_high_water_mark(spec.resume_data):
            stages.append(CheckResumability(spec))
        else:
            stages.append(EnsureResumeTokenPresent(spec))
    if spec.needs_merge:
        stages.append(CheckTopologyChange())
    if spec.full_document_before_change != "off":
        stages.append(AddPreImage(node, spec.full_document_before_change))
    if spec.full_document != "default":
        stages.append(AddPostImage(node, spec.full_document))
    if any(name != SPLIT_STAGE for name, _ in spec.user_stages):
        stages.append(UserStages(spec.user_stages))
    if any(name == SPLIT_STAGE for name, _ in spec.user_stages):
        stages.append(SplitLargeEvent())
    return stages


class ShardPipeline:
    """A :func:`build_pipeline` list resolved for the cursor, once per cursor.

    * ``match``: the oplog match's predicate; ``unwind``: the unwind stage's ``process``;
      ``transform``: the :class:`.transform.Transform`; ``invalidate``: the check-invalidate
      stage's ``process``, or None (cluster streams have none).
    * ``steps``: the ``process`` bound methods of the event stages in order, a tuple the cursor
      loops over per event. :class:`.check_topology_change.CheckTopologyChange` only guards the
      user's stages (the image stages leave ``kNewShardDetected`` untouched), so it is a step
      only when there are user stages.
    * ``resume``: the resumability stage or None, ``resume_step`` its step (the cursor tells an
      event that stage swallowed from one the user's stages filtered out).
    * ``split``: the split-large-event stage or None.

    Raises ValueError when the list does not start with oplog match, unwind, transform.
    """

    __slots__ = ("stages", "match", "unwind", "transform", "invalidate", "steps", "resume",
                 "resume_step", "split")

    def __init__(self, stages: list[Any]) -> None:
        self.stages = tuple(stages)
        if len(stages) < 3 or not (isinstance(stages[0], OplogMatch)
                                   and isinstance(stages[1], UnwindTransaction)
                                   and isinstance(stages[2], Transform)):
            raise ValueError("a shard pipeline starts with oplog match, unwind, transform")
        self.match: Callable[[dict[str, Any]], bool] = stages[0].process
        self.unwind = stages[1].process
        self.transform: Transform = stages[2]
        rest = list(stages[3:])
        self.invalidate = rest.pop(0).process if rest and isinstance(rest[0], CheckInvalidate) \
            else None
        self.split = rest.pop() if rest and isinstance(rest[-1], SplitLargeEvent) else None
        self.resume = rest[0] if rest and isinstance(rest[0], CheckResumability) else None
        guards = any(isinstance(s, UserStages) for s in rest)
        self.steps = tuple(s.process for s in rest
                           if guards or not isinstance(s, CheckTopologyChange))
        self.resume_step = self.steps[0] if self.resume is not None else None

    def names(self) -> list[str]:
        """The stages' names in order (the server's names; for logs and tests)."""
        return [s.name for s in self.stages]


def fused_crud(spec: StreamSpec, append: Callable[[Any], None],
               make_doc: Callable[[bytes], Any]) -> fast_crud.Run | None:
    """The fused variant of the pipeline for ``spec``'s plain CRUD entries (see the module
    docstring and :func:`.fast_crud.build` for the call shape), or None when ``spec`` needs
    per-event work it does not do. ``append`` receives ``(make_doc(raw), token bytes, size)``."""
    if not fast_crud.eligible(spec):
        return None
    return fast_crud.build(spec, append, make_doc, event_size_limit(spec))
