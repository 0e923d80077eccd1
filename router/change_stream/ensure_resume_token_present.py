"""Router stage: the client's resume token must be in the merged stream
(``$_internalChangeStreamEnsureResumeTokenPresent``,
``document_source_change_stream_ensure_resume_token_present.cpp``, notes §8.2).

Every shard gets the client's ``resumeAfter``/``startAfter`` token unchanged; the shard that
holds the token's event returns it (and what follows), the others what follows it. On the
merged stream, events up to and including the token are swallowed (1..N identical tokens, e.g.
the same invalidate from several shards), and the first event past it fails the stream with
ChangeStreamFatalError (280) "cannot resume stream; the resume token was not found." unless the
token itself was seen. Only for event tokens: a high-water-mark token (any postBatchResumeToken
of an empty batch) needs no check, and the stage is then not built at all. The shard-side twin
of this stage is ``shard/change_stream/ensure_resume_token_present.py`` (streams not merged by
a router).
"""

from __future__ import annotations

from typing import Any

from shardsim.core.resume_token import is_hwm_data, is_invalidate_data
from shardsim.router.change_stream.raw_events import Item, Key, document_string
from shardsim.core.resume_token import token_key
from shardsim.core.errors import MongoError


class EnsureResumeTokenPresent:
    """The check for one stream: ``key`` (the token's sort key), ``seen`` (its event was
    swallowed), ``is_invalidate`` (an invalidate token, e.g. from ``startAfter``: the event that
    follows the invalidate needs no proof). Build it with :meth:`for_token`; the merge drops it
    once :meth:`process` let an event through, so after the resume point it costs nothing."""

    __slots__ = ("key", "seen", "is_invalidate")

    def __init__(self, key: Key, is_invalidate: bool) -> None:
        self.key = key
        self.seen = False
        self.is_invalidate = is_invalidate

    @classmethod
    def for_token(cls, resume_token: Any) -> EnsureResumeTokenPresent | None:
        """The stage for the client's ``resumeAfter``/``startAfter`` token (a dict), or None
        when there is nothing to check (no token, or a high-water-mark token). Raises MongoError
        1 when the token has no string ``_data`` (:func:`token_key`)."""
        if resume_token is None:
            return None
        key = token_key(resume_token)
        if is_hwm_data(key[0]):
            return None
        return cls(key, is_invalidate_data(key[0]))

    def process(self, item: Item) -> bool:
        """False: swallow ``item`` (it sorts at or before the token; the token's own event
        marks it seen). True: ``item`` is the first event past the token and goes on; the check
        is over. Raises ChangeStreamFatalError (280) when the stream passed the token without
        having seen it (and it is not an invalidate token)."""
        if item.key < self.key:
            return False
        if item.key == self.key:
            self.seen = True
            return False
        if not self.seen and not self.is_invalidate:
            raise MongoError(280, "cannot resume stream; the resume token was not found. "
                                  f"{document_string(item.token)}")
        return True
