"""``$changeStreamSplitLargeEvent`` (``document_source_change_stream_split_large_event.cpp``,
``change_stream_split_event_helpers.cpp``).

An event whose BSON is larger than 16 MiB (16 * 1024 * 1024 bytes) is split into fragments: each
``{_id: <token with fragmentNum i>, splitEvent: {fragment: i + 1, of: n}, <fields...>}`` with the
event's top-level fields distributed in order so every fragment fits. Without the stage, such an
event fails the batch with BSONObjectTooLarge (10334). When resuming from a fragment's token the
fragments up to and including it are skipped.
"""

from __future__ import annotations

from typing import Any

import bson

from shardsim.core import resume_token as rt
from shardsim.core.errors import MongoError
from shardsim.core.change_stream_spec import StreamSpec

MAX_EVENT_BYTES = 16 * 1024 * 1024  # BSONObjMaxUserSize
# An event may exceed the user limit a little with $sortKey/_id overhead (BSONObjMaxInternalSize).
INTERNAL_SLACK = 16 * 1024
# Room for _id, splitEvent and the $sortKey of each fragment.
_FRAGMENT_OVERHEAD = 4096


def too_large(size: int) -> MongoError:
    """BSONObjectTooLarge (10334) for an event of ``size`` bytes."""
    return MongoError(10334, f"BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and "
                             f"{MAX_EVENT_BYTES}(16MB)")


def split_event(doc: dict[str, Any], token: dict[str, Any], skip_through: int | None = None
                ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``[(fragment doc, fragment token), ...]`` for an oversized event (fragments numbered
    from 0 in tokens, from 1 in ``splitEvent``); fragments ``<= skip_through`` are dropped."""
    groups: list[list[tuple[str, Any, int]]] = [[]]
    used = 0
    limit = MAX_EVENT_BYTES - _FRAGMENT_OVERHEAD
    for k, v in doc.items():
        if k == "_id":
            continue
        size = len(bson.encode({k: v})) - 5
        if size > limit:
            raise too_large(size)
        if used + size > limit and groups[-1]:
            groups.append([])
            used = 0
        groups[-1].append((k, v, size))
        used += size
    data = rt.decode(token)
    n = len(groups)
    out = []
    for i, group in enumerate(groups):
        if skip_through is not None and i <= skip_through:
            continue
        data.fragmentNum = i
        ftoken = rt.encode(data)
        frag: dict[str, Any] = {"_id": ftoken, "splitEvent": {"fragment": i + 1, "of": n}}
        for k, v, _ in group:
            frag[k] = v
        out.append((frag, ftoken))
    return out


def event_size_limit(spec: StreamSpec) -> int:
    """The largest encoded event (bytes) a batch carries whole: BSONObjMaxUserSize, with room
    for ``$sortKey`` when the router merges the stream (``needsMerge``)."""
    return MAX_EVENT_BYTES + (INTERNAL_SLACK if spec.needs_merge else 0)


class SplitLargeEvent:
    """The ``$changeStreamSplitLargeEvent`` stage (in the pipeline only when the user's
    pipeline ends with it). An event's size is known once it is encoded, so the cursor's
    output calls ``process`` only for an event over :func:`event_size_limit`, or the event a
    fragment token resumes from; without this stage such an event fails with
    BSONObjectTooLarge (10334, :func:`too_large`)."""

    name = "$changeStreamSplitLargeEvent"
    __slots__ = ()

    def process(self, doc: dict[str, Any], token: dict[str, Any],
                skip_through: int | None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The fragments of the event ``doc`` (without ``$sortKey``) whose token is ``token``:
        ``[(fragment doc, fragment token), ...]`` (see :func:`split_event`). Raises
        BSONObjectTooLarge (10334) when one field alone is too large."""
        return split_event(doc, token, skip_through)
