"""``$changeStreamSplitLargeEvent`` (``document_source_change_stream_split_large_event.cpp``,
``change_stream_split_event_helpers.cpp``).

An event whose BSON is larger than ``kBSONObjMaxChangeEventSize`` (16 MiB + 8 KiB) is split into
fragments: each ``{_id: <token with fragmentNum i>, splitEvent: {fragment: i + 1, of: n},
<fields...>}``, the event's top-level fields ordered by size (smallest first) and packed greedily
so every fragment fits (:func:`split_event`), so fragment boundaries and counts are mongod's. Without the stage, such an
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
MAX_INTERNAL_BYTES = MAX_EVENT_BYTES + INTERNAL_SLACK  # BSONObjMaxInternalSize
# DocumentSourceChangeStreamSplitLargeEvent::kBSONObjMaxChangeEventSize: an event (with its
# $sortKey when merged) larger than this is split.
MAX_CHANGE_EVENT_BYTES = MAX_INTERNAL_BYTES - 8 * 1024


def too_large(size: int, token: Any = None) -> MongoError:
    """BSONObjectTooLarge (10334) for an event of ``size`` bytes, in mongod's words
    (``BSONObj::_assertInvalid``): the internal limit and, when known, the first element (the
    event's ``_id``, as ``BSONElement::toString`` prints it)."""
    msg = (f"BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and "
           f"{MAX_INTERNAL_BYTES}(16MB)")
    if isinstance(token, dict):
        inner = ", ".join(f'{k}: "{v}"' if isinstance(v, str) else f"{k}: {v!r}"
                          for k, v in token.items())
        msg += f" First element: _id: {{ {inner} }}"
    return MongoError(10334, msg)


def _element_size(key: str, value: Any) -> int:
    return len(bson.encode({key: value})) - 5  # the document's length and terminator


def split_event(doc: dict[str, Any], token: dict[str, Any], skip_through: int | None = None
                ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``[(fragment doc, fragment token), ...]`` for an oversized event, as
    ``change_stream_split_event::splitChangeEvent`` builds them: the fields but ``_id``
    sorted by (BSON element size, name), smallest first, then packed greedily — each fragment
    ``{_id: <token with fragmentNum i>, splitEvent: {fragment: i + 1, of: n}, <fields>}``
    (counted with its ``$sortKey``) takes fields while it stays within
    ``kBSONObjMaxChangeEventSize`` minus the token's size, and at least one. Fragments
    ``<= skip_through`` are dropped. Errors: 7182502 (nothing but ``_id``), 7182500 (one field
    too large for a fragment), ChangeStreamFatalError (280) when resuming skips every
    fragment."""
    fields = sorted(((_element_size(k, v), k, v) for k, v in doc.items() if k != "_id"),
                    key=lambda f: (f[0], f[1].encode()))
    if not fields:
        raise MongoError(7182502, "Cannot split an empty event or an event containing solely "
                                  "'_id' field")
    max_fragment = MAX_CHANGE_EVENT_BYTES - len(bson.encode(token))
    data = rt.decode(token)
    built: list[tuple[dict[str, Any], dict[str, Any]]] = []
    i = 0
    while i < len(fields):
        data.fragmentNum = len(built)
        ftoken = rt.encode(data)
        frag: dict[str, Any] = {"_id": ftoken,
                                "splitEvent": {"fragment": len(built) + 1, "of": 0}}
        size = len(bson.encode({**frag, "$sortKey": [ftoken]}))
        while True:
            fsize, k, v = fields[i]
            frag[k] = v
            size += fsize
            i += 1
            if i >= len(fields) or size + fields[i][0] > max_fragment:
                break
        if size > max_fragment:
            raise MongoError(7182500, f"Splitting change event failed: fragment size {size} is "
                                      f"greater than maximum allowed fragment size "
                                      f"{max_fragment}")
        built.append((frag, ftoken))
    n = len(built)
    out = []
    for j, (frag, ftoken) in enumerate(built):
        if skip_through is not None and j <= skip_through:
            continue
        frag["splitEvent"]["of"] = n
        out.append((frag, ftoken))
    if skip_through and not out:
        raise MongoError(280, "Attempted to resume from a split event, but the resumed stream "
                              "produced a different split. Ensure that the pipeline used to "
                              "resume is the same as the original")
    return out


def event_size_limit(spec: StreamSpec) -> int:
    """The largest encoded event (bytes) a batch carries whole. With
    ``$changeStreamSplitLargeEvent``: ``kBSONObjMaxChangeEventSize`` (16 MiB + 8 KiB, the size
    counted with ``$sortKey`` when the router merges the stream); without it
    BSONObjMaxUserSize, with room for ``$sortKey`` when merged (``needsMerge``)."""
    if any(name == "$changeStreamSplitLargeEvent" for name, _ in spec.user_stages):
        return MAX_CHANGE_EVENT_BYTES
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
