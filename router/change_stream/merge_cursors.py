"""The router's merging half of the pipeline: ``$mergeCursors`` over the
:class:`~router.change_stream.async_results_merger.Merger`, then the router-side stages, as
mongos' ``RouterStagePipeline`` runs them (notes §4.2 "Merge pipeline on mongos"):

1. ``$mergeCursors`` — the next event in resume-token order (:meth:`Merger.next_ready`); the
   router's ``_id == $sortKey`` check (``RouterStagePipeline::_validateAndConvertToBSON``) is
   done earlier, when a shard's batch is parsed (:mod:`router.change_stream.raw_events`);
2. ``$_internalChangeStreamHandleTopologyChange`` (:mod:`.handle_topology_change`): config
   events swallowed, a new shard becomes a :class:`NewShard` action;
3. identical tokens from two shards (a sharded DDL's one event) returned once; anything lower
   than the last event returned is an InternalError (1), never a reordered stream;
4. ``$_internalChangeStreamEnsureResumeTokenPresent`` (:mod:`.ensure_resume_token_present`),
   only when resuming from an event token;
5. an ``invalidate`` ends the stream (the client's cursor is then exhausted).

:meth:`ChangeStreamMerge.next` runs them one event at a time;
:meth:`ChangeStreamMerge.take` is the fused fast path for runs of plain shard events (a
catch-up), which skips stages 2, 4 and 5 because it stops at the first event they would act
on. Pure and sans-IO, like the merger: the router's cursor and ``tests/sim/`` drive it.
"""

from __future__ import annotations

from typing import Any, Iterable

from shardsim.core.cursors import array_header_bytes
from shardsim.core.errors import MongoError
from shardsim.core.server_version import NEW_SHARD_OPS
from shardsim.router.change_stream.async_results_merger import Merger
from shardsim.router.change_stream.ensure_resume_token_present import EnsureResumeTokenPresent
from shardsim.router.change_stream.handle_topology_change import HandleTopologyChange, NewShard
from shardsim.router.change_stream.raw_events import Block, Item, Key

# The shards' new-shard event, swallowed by the merge: ``kNewShardDetected`` (6.0, and 7.0 shards
# under a 6.0 router) or ``migrateChunkToNewShard`` (7.0+), see ``server_version.NEW_SHARD_OPS``.
_NEW_SHARD_OPS = NEW_SHARD_OPS
# The v2 reader's control events (router/change_stream/reader_v2.py): swallowed, never returned.
_CONTROL_OPS = frozenset({"moveChunk", "movePrimary", "namespacePlacementChanged"})
# Operation types :meth:`ChangeStreamMerge.take` leaves to :meth:`ChangeStreamMerge.next`.
_GENERAL_OPS = frozenset({"invalidate"}) | NEW_SHARD_OPS | _CONTROL_OPS


class ChangeStreamMerge:
    """The merged stream of one client change stream: the stages above run over ``merger``.

    ``resume_token`` — the client's resumeAfter/startAfter token (dict) or None; an event token
    (not a HWM) builds the :class:`EnsureResumeTokenPresent` check (``resume_check``, None once
    passed). ``known_shards`` — shard names that already have a cursor (config.shards inserts
    for them are ignored; kept in ``topology``). ``start_after`` — whether the token came as
    ``startAfter``; not needed here (an invalidate token is recognised from its bytes).
    Attributes the owner reads: ``last_key`` (key of the last event returned), ``invalidated``
    (an ``invalidate`` was returned: the batch carrying it is the last).
    """

    def __init__(self, merger: Merger, *, resume_token: Any = None,
                 known_shards: Iterable[str] = (), start_after: bool = False) -> None:
        self.merger = merger
        self.topology = HandleTopologyChange(known_shards)
        self.resume_check = EnsureResumeTokenPresent.for_token(resume_token)
        self.last_key: Key | None = None
        self.invalidated = False
        self._stashed: Item | None = None
        # What the topology stage swallows besides config-cursor events, and whether it is the
        # v2 reader's (control events then move the HWM by their own rule): use_v2_reader().
        self._swallowed = _NEW_SHARD_OPS
        self._v2 = False

    def use_v2_reader(self, stage: Any) -> None:
        """Make ``stage`` (a :class:`router.change_stream.reader_v2.HandleTopologyChangeV2`) the
        topology stage: control events are swallowed and handed to it, and the HWM follows
        their rule (``HandleTopologyChangeV2.fix_hwm``); the new-shard event is not swallowed
        (a v2 stream has none: a faked one reaches the client, as on the server)."""
        self.topology = stage
        self._swallowed = _CONTROL_OPS
        self._v2 = True

    def take(self, limit: int, budget: int | None, count: int, used: int) -> tuple[list[Any], Any, int]:
        """Fast path of :meth:`next` for a catch-up: pop ready plain events (shard events that
        are not ``invalidate``/``kNewShardDetected``, in strictly increasing order, no resume
        check pending) while fewer than ``limit`` are taken and the reply stays within
        ``budget`` bytes. ``count``/``used`` — events/bytes already in the reply (each event
        costs its size plus its array element header; ``budget`` None = payloads are not bytes,
        no byte limit, as in the simulation). Returns (outputs, token of the last event or
        None, new ``used``): each output is one event's payload or a :class:`Block` of several
        (see :meth:`Block.write`). Stops at the first event needing :meth:`next`'s general
        handling, which then takes it; the HWM follows exactly as with :meth:`next`."""
        out: list[Any] = []
        m = self.merger
        if self._stashed is not None or self.resume_check is not None or m.status is not None:
            return out, None, used
        q = m.queue
        last_key = self.last_key
        last: Any = None  # the last output (Item payload's item, or Block)
        hwm = m.hwm
        hwm_src: Any = None  # what set the HWM last here (its token is read once, at the end)
        taken = 0
        while taken < limit and (q or m.refill()):
            e = q[0]
            r = e.src
            key = e.key
            if last_key is not None and key <= last_key:
                break
            if type(e) is Block:
                n = min(limit - taken, e.n)
                if budget is not None:
                    n = e.fit(n, count, used, budget)
                    if n == 0:
                        break
                    used += e.payload_bytes(n) + array_header_bytes(count, count + n)
                if n < e.n:
                    e = e.split(n)
                else:
                    q.popleft()
                key = e.last
                out.append(e)
            else:
                if r.is_config or e.op in _GENERAL_OPS:
                    break
                n = 1
                if budget is not None:
                    sz = len(e.payload) + len(str(count)) + 2
                    if count and used + sz > budget:
                        break
                    used += sz
                q.popleft()
                out.append(e.payload)
            r.queued -= n
            if r.closed and not r.buffer and not r.queued:
                m.remotes.remove(r)
            if r.eligible and (hwm is None or key > hwm):
                hwm, hwm_src = key, e
            last_key = key
            last = e
            count += n
            taken += n
        if hwm_src is not None:
            m.hwm = hwm
            m.hwm_token = hwm_src.last_token
        self.last_key = last_key
        if last is None:
            return out, None, used
        tok = last.last_token
        return out, tok, used

    def push_back(self, item: Item) -> None:
        """Return ``item`` again from the next :meth:`next` (a batch was full, 16 MiB; mongos
        stashes the result for the next batch). At most one item is held."""
        self._stashed = item

    def next(self) -> Item | NewShard | None:
        """The next event to return (an :class:`Item`), a :class:`NewShard` action (the caller
        opens the shard's cursor and adds it to the merger before calling again), or None when
        nothing is ready. Raises MongoError: the merger's pending remote error, InternalError
        (1) for an event below the last one returned, ChangeStreamFatalError (280) from the
        resume check."""
        if self._stashed is not None:
            item, self._stashed = self._stashed, None
            return item
        m = self.merger
        while m.ready():
            hk, ht = m.hwm, m.hwm_token
            item, remote = m.next_ready()
            if remote.is_config or item.op in self._swallowed:
                # HandleTopologyChange: swallowed; a shard added to config.shards opens a cursor.
                action = self.topology.process(item, remote.is_config)
                if self._v2:
                    self.topology.fix_hwm(m, hk, ht, item)
                if action is not None:
                    return action
                continue
            if self.last_key is not None and item.key <= self.last_key:
                if item.key == self.last_key:
                    continue  # the same event from two shards (identical token): return it once
                raise MongoError(1, f"change stream merge out of order: {item.key[0]} after "
                                    f"{self.last_key[0]}")
            if self.resume_check is not None:  # EnsureResumeTokenPresent, until past the token
                if not self.resume_check.process(item):
                    continue
                self.resume_check = None
            self.last_key = item.key
            if item.op == "invalidate":
                self.invalidated = True
            return item
        return None
