"""Promise requests to idle shards: shardsim's own protocol, not part of MongoDB.

A real mongos waits for an idle shard's getMore to end (its await period, up to 1 s, or its
next periodic no-op) before that shard's promise lets an event of another shard through. A
getMore already waiting on an idle shard is not woken by a write elsewhere, so a shardsim
router asks for the promise instead: when the merge holds an event at cluster time T only
because other remotes have not promised past T, it sends each of those shards
``{_shardsimAdvanceClusterTime: Timestamp(T), promises: true, $clusterTime}`` (its
``$clusterTime`` >= T) on a connection kept per shard for these requests. The shard side is
``shard/change_stream/cursor.py`` ``register``:

- a ``clock``-mode shard replies ``{promises: [{id, batches, postBatchResumeToken}]}``: for
  each of its cursors whose getMore is waiting with nothing to return, HWM(>= T + 1); that
  getMore keeps waiting. The promise is applied to the remote with that cursor id once the
  router has read ``batches`` replies from it (:meth:`Merger.on_promise`);
- a cursor with events to return, or no getMore waiting, ends its getMore at once instead
  (the request is sticky on the shard: a getMore that starts waiting later still honours it);
- a ``mongod``-mode shard answers the waiting getMore when its next oplog entry (the periodic
  no-op) passes T, as its promise is still only its newest oplog time.

The same request is sent from the write path (:meth:`PromiseRequests.ask_watchers`): right
after a write on a namespace an open stream watches is forwarded
(:meth:`PromiseRequests.before_shard_write`), and when a shard acknowledges it at a later time
than that request asked for (:meth:`PromiseRequests.on_shard_write`), that stream's other
remotes are asked at once, so their promises reach the router about when the write's event
does.

Latency only: what is released, and when it may be, is still decided by the merge rule (an
event is released only once every remote has promised past it); a lost or ignored request
only means the remote answers at the end of its await. ``docs/change-streams-router.md``
("Idle shards") has the figures.

State: one :class:`PromiseRequests` per router (``RouterNode.promise_requests``), shared by all
its streams. A stream it serves is any object with ``closed``, ``merger`` (a
:class:`~router.change_stream.async_results_merger.Merger`), ``pools`` (remote id -> Pool),
``wake`` (asyncio.Event), ``idle`` / ``sent_at`` (remote id -> its last reply had no events /
monotonic time its getMore was sent), ``watches(ns)`` and ``schedule_getmores()``:
:class:`router.change_stream.cursor.RouterChangeStream`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import weakref
from typing import Any

import bson
from bson.timestamp import Timestamp

from shardsim.core.resume_token import token_ts_key
from shardsim.core.client import Connection
from shardsim.core.clock import HybridLogicalClock, ts_from_key, ts_key
from shardsim.core.errors import MongoError
from shardsim.core.node import CODEC, DUMMY_SIGNATURE
from shardsim.core.protocol.shard import AdvanceClusterTime

log = logging.getLogger("shardsim.router.change_stream")

# Ask idle shards for promises from the write path too (see PromiseRequests.on_shard_write).
EARLY_PROMISE_REQUESTS = True
# Requests sent before a write is forwarded (PromiseRequests.before_shard_write) ask for a
# promise this many ticks past the router's clock plus one per statement: enough for the
# write's own time when the written shard's clock is at most this far ahead of the router's.
EARLY_TICKS = 4
# A remote whose last reply carried events is busy and answers soon anyway: it is asked only
# once its getMore has been out this long (ms).
ACTIVE_REQUEST_DELAY_MS = 10
# How long the router waits for a promise reply (s); a shard that does not answer only costs
# latency (its getMore still ends with its await period).
PROMISE_REPLY_TIMEOUT_S = 30.0


class PromiseRequests:
    """Router-wide record of promise requests, per shard address (``host:port``): the highest
    time key asked for (``sent``), the connection they go out on (``channels``), the request
    out now (``pending``, its task), the newest time wanted meanwhile (``want``) and the streams
    to wake once that is sent (``deferred``); plus the open streams (``streams``, weak: a stream
    adds itself once established and discards itself when closed). ``clock`` — the router's
    :class:`~shardsim.core.clock.HybridLogicalClock` (gossiped on requests, advanced by replies).

    Cost control: the request is sticky on the shard, so at most one is sent per shard address
    and newer time, and at most one is out per address (a newer time wanted meanwhile goes out
    when its reply is in), whatever the number of streams.
    """

    __slots__ = ("clock", "sent", "channels", "pending", "want", "deferred", "streams")

    def __init__(self, clock: HybridLogicalClock) -> None:
        self.clock = clock
        self.sent: dict[str, int] = {}
        self.channels: dict[str, Connection] = {}
        self.pending: dict[str, Any] = {}
        self.want: dict[str, int] = {}
        self.deferred: dict[str, set[Any]] = {}
        self.streams: Any = weakref.WeakSet()

    # -- when to ask ---------------------------------------------------------------------------
    def request_for_held_event(self, stream: Any) -> float | None:
        """``stream``'s smallest buffered event is held back only by other remotes' promises
        (:meth:`Merger.blocking_remotes`): ask those remotes' shards for a promise past its
        cluster time T, except remotes with no getMore out (nothing to cut short), remotes
        whose last reply carried events until their getMore has been out
        ``ACTIVE_REQUEST_DELAY_MS``, and shard addresses already asked for T or later (by any
        stream). Returns the delay (s) after which this should be called again (a busy remote
        becomes eligible), or None. Never raises; sends in the background."""
        item, remotes = stream.merger.blocking_remotes()
        if item is None or not remotes:
            return None
        t = token_ts_key(item.key[0])
        if t is None:
            return None
        pools = stream.pools
        now = time.monotonic()
        again: float | None = None
        for r in remotes:
            if not r.in_flight or r.rid not in pools:
                continue  # no getMore out on it: nothing to cut short
            if not stream.idle.get(r.rid, True):
                wait = stream.sent_at.get(r.rid, now) + ACTIVE_REQUEST_DELAY_MS / 1000 - now
                if wait > 0:
                    again = wait if again is None else min(again, wait)
                    continue
            addr = r.address or str(r.rid)
            if self.sent.get(addr, -1) >= t:
                continue  # asked already (by any stream): the shard keeps the request
            self.send(pools[r.rid], addr, t, stream)
        return again

    def on_shard_write(self, shard: str, ns: str, op_time: Any) -> None:
        """The router got ``shard``'s reply to a write on ``ns`` (``op_time`` = its
        operationTime, the write's oplog time T; anything but a Timestamp is ignored). For
        every open stream that can see ``ns``, the other remotes that have not promised past T
        are asked right away for a promise past T (no reply awaited, the newest T wins), so
        the idle shards' promises reach the router about when the write's event does, instead
        of a round trip after it (:meth:`ask_watchers`). Called by ``router/writes.py`` for
        every shard write reply: returns at once while no stream is open. Never raises."""
        if not self.streams or not EARLY_PROMISE_REQUESTS or not isinstance(op_time, Timestamp):
            return
        self.ask_watchers(ns, ts_key(op_time), (shard,))

    def before_shard_write(self, shards: Any, ns: str, statements: int) -> None:
        """The router is about to forward a write of ``statements`` statements on ``ns`` to
        ``shards``: for every open stream that can see ``ns``, ask its other remotes (the idle
        shards and the config server), in parallel with the write, for a promise past T' = the
        time the router's clock would tick to now (its cluster time + 1, or the wall clock's
        second: ``HybridLogicalClock.next_tick_key``) + ``statements`` + :data:`EARLY_TICKS`
        ticks, unless already asked for T' or later or promised past it
        (:meth:`ask_watchers`). ``router/writes.py`` calls it from the loop right after the
        write is written to the shard (``loop.call_soon``), so the write leaves first.

        Why it is safe and what it buys: the write carries the router's cluster time to the
        written shard, which stamps it (one tick per statement) with times up to T' while its
        own clock is not ahead of the router's by more than :data:`EARLY_TICKS` ticks (and its
        wall clock not ahead of the router's); an idle shard asked for T' moves its clock to
        T' (gossip, no oplog entry) and so promises past T' honestly, as for any request
        (``shard/change_stream/cursor.py`` ``advance_cluster_time``). Its promise then reaches
        the router about when the write's reply and event do, instead of a round trip after
        the reply (:meth:`on_shard_write`, which still asks when the write's time turns out
        to be past T'). For an unordered write whose lanes to several shards start together,
        ``shards`` is every shard of the round and ``statements`` all of its statements
        (``router/writes.py`` ``Run.promise_round``). Only latency: the merge rule decides what is
        released. Never raises."""
        if not self.streams or not EARLY_PROMISE_REQUESTS:
            return
        self.ask_watchers(ns, self.clock.next_tick_key() + statements + EARLY_TICKS, shards)

    def ask_watchers(self, ns: str, t: int, written: Any) -> None:
        """The write-path promise step shared by :meth:`before_shard_write` and
        :meth:`on_shard_write`: for every open stream that can see ``ns``, ask each remote not
        on a ``written`` shard (a container of shard names) for a promise past the time key
        ``t``, unless its shard address was already asked for ``t`` or later (by any stream)
        or the remote promised past ``t`` already.

        A stream with a remote whose getMore is not out (its last one ended with nothing while
        the client was between getMores) first schedules its remote getMores
        (:meth:`RouterChangeStream.schedule_getmores`, the step the client's next getMore would
        take): a request reaches only a shard cursor with a getMore waiting or to come (the
        shard keeps the request), and without one the event would wait for the client's next
        getMore and a round trip to that remote after it. Never raises."""
        sent = self.sent
        for st in list(self.streams):
            if st.closed or not st.watches(ns):
                continue
            remotes = st.merger.remotes
            for r in remotes:
                if not r.in_flight and not r.closed:
                    st.schedule_getmores()  # polls only remotes with nothing buffered
                    break
            for r in remotes:
                if r.name in written or r.closed or not r.in_flight:
                    continue
                addr = r.address
                if not addr or sent.get(addr, -1) >= t:
                    continue
                if r.promise is not None and (token_ts_key(r.promise[0]) or 0) > t:
                    continue
                self.send(st.pools[r.rid], addr, t)

    # -- sending -------------------------------------------------------------------------------
    def send(self, pool: Any, addr: str, t: int, stream: Any = None) -> None:
        """Ask the shard at ``addr`` (reached through ``pool``'s host/port) for promises past
        the time key ``t``. Sent at once unless a request to ``addr`` is out: then ``t`` is
        remembered and sent (the newest wanted) when its reply is in, and ``stream`` is woken
        then. Nothing is sent when ``addr`` was already asked for ``t`` or later. The reply is
        applied by :meth:`_apply`. Never raises; network errors drop the channel (latency
        only: the getMores report real failures)."""
        if self.sent.get(addr, -1) >= t:
            return
        self.sent[addr] = t
        self._dispatch(pool, addr, t, stream)

    def _dispatch(self, pool: Any, addr: str, t: int, stream: Any) -> None:
        """Send the request for ``t`` to ``addr`` now, or remember it (see :meth:`send`)."""
        if addr in self.pending:
            if self.want.get(addr, -1) < t:
                self.want[addr] = t
            if stream is not None:
                self.deferred.setdefault(addr, set()).add(stream)
            return
        # Written now when the channel is open (the request should reach the shard while the
        # write's event travels to the router); its reply is read by a task.
        conn = self.channels.get(addr)
        if conn is not None and not conn.write_request(self._body(t)):
            conn = None
        self.pending[addr] = asyncio.get_running_loop().create_task(
            self._exchange(pool, addr, t, conn), context=contextvars.Context())

    async def _exchange(self, pool: Any, addr: str, t: int, sent_on: Connection | None) -> None:
        """Read the reply to the request already written on ``sent_on``, or (None) open
        ``addr``'s kept connection first and send it; apply the reply, then send the newest
        time wanted meanwhile. A network error drops the connection and what was wanted."""
        ok = False
        try:
            conn = sent_on
            if conn is None:
                old = self.channels.pop(addr, None)
                if old is not None:
                    old.close()
                conn = self.channels[addr] = Connection(pool.host, pool.port)
                await conn.connect()
                if not conn.write_request(self._body(t)):
                    raise MongoError(9001, f"connection to {addr} closed")
            reply = await conn.read_reply(PROMISE_REPLY_TIMEOUT_S)
            self._apply(addr, bson.decode(reply, codec_options=CODEC))
            ok = True
        except MongoError:
            old = self.channels.pop(addr, None)
            if old is not None:
                old.close()
        except Exception:  # a malformed reply must not leave the address stuck as pending
            log.exception("promise request to %s failed", addr)
        finally:
            self.pending.pop(addr, None)
            want = self.want.pop(addr, None)
            if ok and want is not None:
                self._dispatch(pool, addr, want, None)
            for st in self.deferred.pop(addr, ()):
                st.wake.set()  # look again: a newer event may want a newer promise

    def _apply(self, addr: str, reply: dict[str, Any]) -> None:
        """Apply a promise reply from ``addr`` (``{promises: [{id, batches,
        postBatchResumeToken}]}``): each to the remote of an open stream whose cursor on
        ``addr`` has that id (:meth:`Merger.on_promise`), waking the stream when its promise
        moved. Advances the router's cluster time from the reply's ``$clusterTime``."""
        ct = reply.get("$clusterTime")
        if isinstance(ct, dict) and isinstance(ct.get("clusterTime"), Timestamp):
            self.clock.try_advance(ct["clusterTime"])
        promises = reply.get("promises")
        if not promises:
            return
        by_id = {int(p["id"]): p for p in promises if isinstance(p, dict) and "id" in p}
        for st in list(self.streams):
            if st.closed:
                continue
            for r in st.merger.remotes:
                p = by_id.get(r.cursor_id) if r.address == addr else None
                if p is None:
                    continue
                try:
                    moved = st.merger.on_promise(r, int(p.get("batches", 1 << 62)),
                                                 p["postBatchResumeToken"])
                except (KeyError, TypeError, ValueError, MongoError):
                    continue  # not a usable promise: the remote's getMore still answers
                if moved:
                    st.wake.set()
                    # a remote's backlog may be releasable now: read on while the client is away
                    st.schedule_getmores(prefetch_only=True)

    def _body(self, t: int) -> bytes:
        """The raw BSON of a request for time key ``t``, gossiping the router's cluster time
        (>= ``t``: the router has seen the write at ``t``)."""
        body = {**AdvanceClusterTime(ts_from_key(t), promises=True).to_command(), "$db": "admin"}
        now = self.clock.now()
        if now.time or now.inc:
            body["$clusterTime"] = {"clusterTime": now, "signature": DUMMY_SIGNATURE}
        return bson.encode(body, codec_options=CODEC)

    # -- shutdown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Cancel the requests out and close the request connections (router shutdown)."""
        for task in self.pending.values():
            task.cancel()
        self.pending.clear()
        for conn in self.channels.values():
            conn.close()
        self.channels.clear()
