"""Stage 6 (streams not merged by a router): the resume token must be seen
(``$_internalChangeStreamEnsureResumeTokenPresent``,
``document_source_change_stream_ensure_resume_token_present.cpp``).

When resuming from an event token (not a high-water mark) directly on a shard, the first event
that sorts after the token must be preceded by the token's own event; otherwise the stream fails
with ChangeStreamFatalError (280) "cannot resume stream; the resume token was not found." —
labelled NonResumableChangeStreamError. With ``needsMerge`` the router runs this check on the
merged stream instead, so the shard only runs :mod:`check_resumability`.
"""

from __future__ import annotations

from typing import Any

from shardsim.core.errors import MongoError
from shardsim.shard.change_stream.check_resumability import CHECK_NEXT, FOUND, CheckResumability
from shardsim.shard.change_stream.transform import Event


def _token_repr(token: dict[str, Any]) -> str:
    parts = [f'_data: "{token["_data"]}"']
    if token.get("_typeBits") is not None:
        parts.append(f"_typeBits: BinData(0, {bytes(token['_typeBits']).hex().upper()})")
    return "{" + ", ".join(parts) + "}"


class EnsureResumeTokenPresent(CheckResumability):
    """Like :class:`CheckResumability`, but surpassing the token unseen is fatal, and the
    token's own event is swallowed. It takes the resumability check's place in the pipeline
    (:mod:`.pipeline`) of a stream read directly from an event token; the server puts it at the
    end of the pipeline instead, with the same result for the events returned."""

    name = "$_internalChangeStreamEnsureResumeTokenPresent"

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self._client_token = spec.resume_token

    def process(self, ev: Event) -> Event | None:
        """``ev`` to return, None to swallow; ChangeStreamFatalError (280) if the token is passed unseen."""
        if self.done:
            return ev
        status = self.compare(ev)
        if status == CHECK_NEXT:
            return None
        if status == FOUND:
            self.found = True
            self.done = True
            if self.fragment is not None:
                ev.fragment_skip = self.fragment
                return ev
            return None
        raise MongoError(280, "cannot resume stream; the resume token was not found. "
                              + _token_repr(self._client_token))
