"""Stage 5: resume from a token (``$_internalChangeStreamCheckResumability``,
``document_source_change_stream_check_resumability.cpp``).

Events that sort before the client's token are swallowed (kCheckNextDoc); the event equal to it
(kFoundToken) and everything after (kSurpassedToken) are returned — the token's own event is for
the router's ensure-resume-token-present check, which swallows it. Streams read directly (no
``needsMerge``) from an event token use :mod:`ensure_resume_token_present` instead, which
swallows it here. Comparison is
``compareAgainstClientResumeToken``'s order — clusterTime, tokenType, txnOpIndex, fromInvalidate,
uuid, eventIdentifier — which is exactly the KeyString byte order of the two tokens when they
have the same version (the transform keeps the client's version until the resume point is
passed), so it compares ``_data`` strings. A token with ``fragmentNum`` matches the unsplit event
and tells ``$changeStreamSplitLargeEvent`` to skip the fragments already seen.

History loss: the scan starts at the token's clusterTime (``$gte``); if the oldest oplog entry is
newer than that and is not the first entry of the shard's history (mongod's "initiating set"
no-op), the start point fell off the oplog: ChangeStreamHistoryLost (286), labelled
NonResumableChangeStreamError by the command layer.
"""

from __future__ import annotations

from typing import Any

from shardsim.core import resume_token as rt
from shardsim.core.clock import ts_key
from shardsim.core.errors import MongoError
from shardsim.core.change_stream_spec import StreamSpec
from shardsim.shard.change_stream.transform import Event

CHECK_NEXT, FOUND, SURPASSED = 0, 1, 2

INITIATING_SET_MSG = "initiating set"

HISTORY_LOST_MSG = ("Resume of change stream was not possible, as the resume point may no longer be "
                    "in the oplog.")


def assert_history_available(oplog: Any, start_key: int) -> None:
    """Raise ChangeStreamHistoryLost (286) if entries at or after ``start_key`` may be gone."""
    first = oplog.first_ts()
    if first is None:
        return
    fkey = ts_key(first)
    if fkey <= start_key:
        return
    head = oplog.get(fkey)
    if head is not None and head.get("op") == "n" and isinstance(head.get("o"), dict) \
            and head["o"].get("msg") == INITIATING_SET_MSG:
        return
    raise MongoError(286, HISTORY_LOST_MSG)


class CheckResumability:
    """The ``$_internalChangeStreamCheckResumability`` stage of a resumed stream: swallows
    events sorting before the client's token (``process(ev) -> ev | None``). ``found`` says
    whether the exact token was seen; ``done`` once the stream has reached it (from then on
    ``process`` returns every event as it is)."""

    name = "$_internalChangeStreamCheckResumability"

    def __init__(self, spec: StreamSpec) -> None:
        data = spec.resume_data
        assert data is not None
        self.fragment: int | None = data.fragmentNum
        self.merged = bool(spec.needs_merge)
        if data.fragmentNum is not None:
            data = rt.ResumeTokenData(data.clusterTime, data.version, data.tokenType, data.txnOpIndex,
                                      data.fromInvalidate, data.uuid, data.eventIdentifier, None)
            self.target = rt.encode(data)["_data"]
        else:
            self.target = spec.resume_token["_data"]  # type: ignore[index]
        self.target = self.target.upper()
        self.is_hwm = rt.is_high_water_mark(data)
        self.found = False
        self.done = False

    def compare(self, ev: Event) -> int:
        """CHECK_NEXT, FOUND or SURPASSED for ``ev`` against the client's token."""
        d = ev.token["_data"]
        if d < self.target:
            return CHECK_NEXT
        if d == self.target:
            return FOUND
        return SURPASSED

    def process(self, ev: Event) -> Event | None:
        """``ev`` if it is to be returned, else None (swallowed)."""
        if self.done:
            return ev
        status = self.compare(ev)
        if status == CHECK_NEXT:
            return None
        if status == FOUND:
            # Returned, not swallowed: with needsMerge the router's
            # $_internalChangeStreamEnsureResumeTokenPresent must see the token's own event
            # (the server's kFoundToken case: "Return the doc so DSEnsureResumeTokenPresent sees it").
            self.found = True
            self.done = True
            if self.fragment is not None:
                # A fragment's token: the fragments after it follow. For the router the token's
                # own fragment comes too, so its ensure-token-present stage finds the token
                # (and swallows it) even when it was the event's last fragment.
                ev.fragment_skip = self.fragment - 1 if self.merged else self.fragment
            return ev
        self.done = True
        return ev
