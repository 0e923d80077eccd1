"""Why a stream waits: the ``changeStream`` sub-document of a router change-stream cursor's
``$currentOp`` entry. shardsim's own; a real mongos reports nothing of this kind.

``{changeStream: {clusterTime, highWaterMark, heldEvent, waitingFor: [names], stagedEvents,
remotes: [...]}}``:

* ``clusterTime`` — the router's cluster time (Timestamp) when the entry was made;
* ``highWaterMark`` — the merger's high-water mark (the router's postBatchResumeToken), or null;
* ``heldEvent`` — the resume token of the smallest buffered event that is not released because
  of promises, or null (nothing buffered, or every buffered event is ready);
* ``waitingFor`` — the names of the remotes that hold the merge back right now
  (:func:`waiting_for`): with an event held, the open remotes whose promise is missing or below
  its token (:meth:`router.change_stream.async_results_merger.Merger.blocking_remotes`, the ARM's
  ``_getMinPromisedSortKey`` rule, notes §1.5); with no event held, the open remotes without a
  promise or holding the lowest promise while it is behind the router's cluster time (an event
  written now would wait for them). Empty when nothing waits (or an error is pending);
* ``stagedEvents`` — events the merge has released and encoded into the client's next reply
  ahead of its getMore (a catch-up, :mod:`router.change_stream.staged_batch`); they are no
  longer counted in any remote's ``bufferedEvents``, and ``highWaterMark`` is already past
  them (the client gets them, and a postBatchResumeToken past them, with its next getMore);
* ``remotes`` — one document per remote, shards and the config server (``name: "config"``) in
  the merger's order: ``{name, host, state, ns, cursorId, postBatchResumeToken (its promise, or null),
  promiseClusterTime (the Timestamp in that token, or null), lagMillis, bufferedEvents,
  inFlight, exhausted, closed, error}``. ``lagMillis`` is how far the promise is behind the
  router's cluster time, in ms (cluster times count whole seconds, so it moves in steps of
  1000; null without a promise); ``bufferedEvents`` counts events received and not yet
  returned to the client (the merger's buffer and release queue); ``inFlight`` says a getMore
  to it is outstanding; ``error`` is the code of the error it reported, or null. ``host`` is
  the member the remote cursor is on (its getMores go there: the member the stream's
  ``readPreference`` selected when it was opened, as mongos' ARM keeps each remote's
  ``HostAndPort``, ``async_results_merger.h`` ``RemoteCursorData::shardHostAndPort``) and
  ``state`` that member's state as the router's monitor last saw it (``PRIMARY``,
  ``SECONDARY``, ``OTHER``, ``UNKNOWN``; null when no monitor watches it, e.g. a config server
  given as a plain ``host:port``: :meth:`router.shard_registry.ShardRegistry.member_state`).

mongos' own ``$currentOp`` (``localOps: true``) reports an idle router cursor as a
``GenericCursor`` (``cursor: {cursorId, createdDate, lastAccessDate, nDocsReturned, ...}``)
without its remotes; the shard side of a remote cursor is seen with ``$currentOp`` without
``localOps`` (each shard's entry carries ``shard`` and ``host``). The ``changeStream``
sub-document, ``host`` and ``state`` included, is shardsim's addition.

Pure: reads the stream's state (:class:`router.change_stream.cursor.RouterChangeStream`),
changes nothing (apart from :meth:`Merger.ready`'s move of ready events to the release queue,
which changes no outcome).
"""

from __future__ import annotations

from typing import Any, Callable

from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.router.change_stream.async_results_merger import Merger, Remote
from shardsim.core.clock import ts_from_key, ts_key
from shardsim.core.resume_token import token_ts_key


def _promise_ts(remote: Remote) -> int | None:
    return token_ts_key(remote.promise[0]) if remote.promise is not None else None


def waiting_for(merger: Merger, now: Timestamp) -> tuple[Any, list[Remote]]:
    """``(held event's token or None, the remotes holding the merge back)``, as described in
    the module docstring; ``now`` is the router's cluster time."""
    if merger.status is not None:
        return None, []
    item, blocking = merger.blocking_remotes()
    if item is not None:
        return item.token, blocking
    live = [r for r in merger.remotes if not r.closed and r.cursor_id != 0]
    missing = [r for r in live if r.promise is None]
    if missing:
        return None, missing
    if not live or merger.queue:
        return None, []
    lowest = min(r.promise for r in live)  # type: ignore[type-var]
    lowest_ts = token_ts_key(lowest[0])
    if lowest_ts is None or lowest_ts >= ts_key(now):
        return None, []
    return None, [r for r in live if r.promise == lowest]


def remote_entry(remote: Remote, now: Timestamp, state: str | None = None) -> dict[str, Any]:
    """The per-remote document (module docstring); ``state``: its member's state (None: not
    monitored)."""
    pts = _promise_ts(remote)
    lag = None if pts is None else max(0, now.time - (pts >> 32)) * 1000
    return {
        "name": remote.name,
        "host": remote.address,
        "state": state,
        "ns": remote.ns,
        "cursorId": Int64(remote.cursor_id),
        "postBatchResumeToken": remote.promise_token,
        "promiseClusterTime": None if pts is None else ts_from_key(pts),
        "lagMillis": lag,
        "bufferedEvents": sum(e.n for e in remote.buffer) + remote.queued,
        "inFlight": remote.in_flight,
        "exhausted": remote.exhausted,
        "closed": remote.closed,
        "error": None if remote.status is None else remote.status.code,
    }


def change_stream_report(merger: Merger, now: Timestamp,
                         state_of: Callable[[Remote], str | None] | None = None,
                         staged: int = 0) -> dict[str, Any]:
    """The ``changeStream`` sub-document for a stream whose merger is ``merger`` at the router's
    cluster time ``now`` (module docstring); ``state_of(remote)`` gives its member's state;
    ``staged`` the events already merged into the next reply."""
    held, blocking = waiting_for(merger, now)
    return {
        "clusterTime": now,
        "highWaterMark": merger.hwm_token,
        "heldEvent": held,
        "waitingFor": [r.name for r in blocking],
        "stagedEvents": staged,
        "remotes": [remote_entry(r, now, state_of(r) if state_of else None)
                    for r in merger.remotes],
    }


__all__ = ["change_stream_report", "remote_entry", "waiting_for"]
