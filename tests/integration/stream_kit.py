"""A change stream that an application keeps open across failovers, shared by the migration
tests (:mod:`test_donor_migration`, :mod:`test_migration_recovery`)."""

from __future__ import annotations

import time
from typing import Any

import pymongo.errors


class ResumingStream:
    """A change stream through the router that resumes from its last resume token after an
    error, as an application does: a shard's or the config server's failover (or kill) may end
    the router's cursor, and opening it again may itself fail until a primary is back."""

    def __init__(self, coll: Any) -> None:
        self.coll = coll
        self.stream = coll.watch()
        self.token = self.stream.resume_token

    def events(self, want: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Up to ``want`` events read within ``timeout`` seconds (fewer when the time ran out)."""
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            try:
                ev = self.stream.try_next()
            except pymongo.errors.PyMongoError:
                time.sleep(0.2)
                try:
                    self.stream = self.coll.watch(resume_after=self.token)
                except pymongo.errors.PyMongoError:
                    pass
                continue
            if ev is not None:
                out.append(ev)
                self.token = ev["_id"]
        return out
