"""Stage 4: after a drop/rename/dropDatabase, emit ``invalidate``
(``$_internalChangeStreamCheckInvalidate``, ``document_source_change_stream_check_invalidate.cpp``).

Invalidating commands: collection streams — drop, rename (of or onto the collection),
dropDatabase; database streams — dropDatabase; cluster streams — none. The invalidate event is
``{_id, operationType: "invalidate", clusterTime, wallTime}`` whose token is the invalidating
event's token with ``fromInvalidate: true`` (so it sorts right after it). The cursor closes after
the batch that carries it. A stream opened with ``startAfter`` an invalidate token does not emit
that invalidate again and keeps running (it is swallowed by the resume check instead).
"""

from __future__ import annotations

from shardsim.core import resume_token as rt
from shardsim.core.change_stream_spec import StreamSpec
from shardsim.shard.change_stream.transform import Event


def is_invalidating(spec: StreamSpec, ev: Event) -> bool:
    """``isInvalidatingCommand`` for this stream type."""
    if not ev.invalidating:
        return False
    op = ev.doc["operationType"]
    if spec.kind == "collection":
        return op in ("drop", "rename", "dropDatabase")
    if spec.kind == "database":
        return op == "dropDatabase"
    return False


def invalidate_event(ev: Event) -> Event:
    """The ``invalidate`` that follows ``ev``."""
    data = rt.decode(ev.token)
    data.fromInvalidate = True
    token = rt.encode(data)
    doc = {"_id": token, "operationType": "invalidate", "clusterTime": ev.doc["clusterTime"],
           "wallTime": ev.doc.get("wallTime")}
    inv = Event(doc, token, ev.ts)
    inv.txn_op_index = ev.txn_op_index
    return inv


class CheckInvalidate:
    """The ``$_internalChangeStreamCheckInvalidate`` stage of a collection or database stream
    (the server adds it to no other): ``process(ev) -> [ev]`` or ``[ev, invalidate]``. The
    invalidate that closes the stream has ``invalidating`` set; the cursor ends after the batch
    that carries it (the server's stage throws ChangeStreamInvalidated on the next call)."""

    name = "$_internalChangeStreamCheckInvalidate"

    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        data = spec.resume_data
        self._start_after_invalidate = (spec.resume_token["_data"]
                                        if spec.start_after and data is not None and data.fromInvalidate
                                        else None)
        self.closing = False

    def process(self, ev: Event) -> list[Event]:
        """``[ev]``, or ``[ev, invalidate]`` after an invalidating command."""
        if not is_invalidating(self.spec, ev):
            return [ev]
        inv = invalidate_event(ev)
        if self._start_after_invalidate is not None and inv.token["_data"] == self._start_after_invalidate:
            # startAfter this very invalidate: the resume check swallows it; do not close.
            self._start_after_invalidate = None
            return [ev, inv]
        inv.invalidating = True  # marks "close after this"
        return [ev, inv]
