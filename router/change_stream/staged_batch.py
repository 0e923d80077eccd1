"""The client's next batch, built ahead while the client is busy with the last one (catch-up).

A catch-up read alternates: the client decodes a large reply, then asks for the next; the
router, if it waited for that getMore, would merge and encode the next 10,000 events while the
client sits idle (0.7-0.9 µs per event of its critical path, ``bench/RESULTS.md`` issue 30).
So after a large reply the router keeps taking the events that are already releasable (the
same :meth:`ChangeStreamMerge.take` the getMore runs, in the same order, with the same 16 MiB
accounting) and encodes them as the next reply's array elements; the getMore then starts from
them and takes whatever else is ready. Only plain events are staged (``take`` stops at an
``invalidate``, a new shard or a control event, which the getMore handles one by one).

Taking an event early does not change what the client sees: the merge releases an event only
once every remote has promised past it, whenever that is asked, and the postBatchResumeToken is
still computed when the reply is built. Staged events that are not yet delivered when the stream
fails or is killed are simply dropped, as the events a failing getMore had taken already are: the
client resumes from the last token it received and reads them again.

A getMore asking for fewer events than are staged (drivers keep one batchSize, so this is rare)
gets the first ones (:meth:`StagedBatch.split`), with the last of them as its
postBatchResumeToken (the high-water mark may have passed the staged rest), and the rest stays
staged for the next getMore.
"""

from __future__ import annotations

from typing import Any

from bson.binary import Binary
from bson.raw_bson import RawBSONDocument

from shardsim.core.cursors import element_headers
from shardsim.router.change_stream.raw_events import Block

__all__ = ["StagedBatch", "write_outputs"]


class StagedBatch:
    """Encoded array elements of the next reply: ``parts`` (byte strings to concatenate:
    element header ``0x03 "<i>" 0x00`` then the event document, indexes from 0), ``n`` events,
    ``size`` bytes as the reply's 16 MiB accounting counts them (documents plus element
    headers), ``last_token`` the resume token ``{_data[, _typeBits]}`` of the last event."""

    __slots__ = ("parts", "n", "size", "last_token")

    def __init__(self) -> None:  # noqa: D107 - see the class docstring
        self.parts: list[Any] = []
        self.n = 0
        self.size = 0
        self.last_token: Any = None

    def add(self, outputs: list[Any], token: Any, size: int) -> None:
        """Append what :meth:`ChangeStreamMerge.take` returned (``outputs``: payloads and
        :class:`Block` runs; ``token`` its last event's; ``size`` its new byte count)."""
        self.n = write_outputs(self.parts, outputs, self.n)
        self.size = size
        self.last_token = token

    def compact(self) -> None:
        """Join the parts into one byte string (done ahead, so the reply does not walk one
        list entry per event piece on the client's critical path)."""
        if len(self.parts) > 1:
            self.parts = [b"".join(self.parts)]

    def split(self, k: int) -> tuple["StagedBatch", "StagedBatch"]:
        """The first ``k`` events (``0 < k < n``) and the rest, the rest renumbered from 0.
        Walks the elements' bytes (type byte, index, NUL, document length): the rare path."""
        arr = b"".join(self.parts)
        bounds = []
        pos = 0
        for _ in range(self.n):
            doc = arr.index(b"\x00", pos + 1) + 1
            end = doc + int.from_bytes(arr[doc:doc + 4], "little")
            bounds.append((pos, doc, end))
            pos = end
        head = StagedBatch()
        head.parts = [arr[:bounds[k][0]]]
        head.n = k
        head.size = bounds[k][0]
        head.last_token = _token(arr[bounds[k - 1][1]:bounds[k - 1][2]])
        rest = StagedBatch()
        for i, (_h, doc, end) in enumerate(bounds[k:]):
            rest.parts.append(element_headers(i, 1)[0])
            rest.parts.append(arr[doc:end])
        rest.n = self.n - k
        rest.size = sum(map(len, rest.parts))
        rest.last_token = self.last_token
        return head, rest


def write_outputs(parts: list[Any], outputs: list[Any], n: int) -> int:
    """Append :meth:`ChangeStreamMerge.take`'s ``outputs`` (event payloads and :class:`Block`
    runs) to ``parts`` as BSON array elements numbered from ``n``; returns the next index."""
    for o in outputs:
        if type(o) is Block:
            n = o.write(parts, n)
        else:
            parts.append(element_headers(n, 1)[0])
            parts.append(o)
            n += 1
    return n


def _token(doc: bytes) -> dict[str, Any]:
    """The ``_id`` (resume token) of an event document, as a plain dict."""
    tok = dict(RawBSONDocument(doc)["_id"].items())
    tb = tok.get("_typeBits")
    if type(tb) is bytes:  # BinData subtype 0 decodes as bytes; kept as Binary, as Block's
        tok["_typeBits"] = Binary(tb, 0)
    return tok
