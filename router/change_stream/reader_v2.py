"""The 9.0 v2 change-stream reader on the router ("precise shard targeting"): cursors only on the
shards that own data of the stream's collection or database, retargeted by control events.

Selected when the router's profile has the reader (``ServerProfile.change_stream_reader_v2``:
9.0) and the client asks for ``$changeStream: {version: "v2"}`` (the rollout flag
``featureFlagChangeStreamPreciseShardTargeting`` is opt-in here, as on 9.0.2+ where
SERVER-135099 switched the default back to v1). Collection, database and whole-cluster streams
(``CollectionChangeStreamShardTargeterImpl``, ``DatabaseChangeStreamShardTargeterImpl``,
``AllDatabasesChangeStreamShardTargeterImpl``: the whole cluster's placement, and the
config-server cursor on ``config.databases`` always open; every control event refreshes the
placement, ``AllDatabasesShardTargeterStateEventHandler::handleEvent``).

Mirrors ``src/mongo/s/change_streams/``:

- opening (``ChangeStreamShardTargeterBase::initialize``, strict mode;
  ``startChangeStreamSegment`` with ``ignoreRemovedShards``): the placement of the collection at
  the stream's start time from the config server (``HistoricalPlacementFetcherImpl::fetch`` ->
  ``_configsvrGetHistoricalPlacement``, :mod:`configsvr.placement_history`). ``NotAvailable``
  (a time before the placement history) -> the v1 reader (``kSwitchToV1``). No shards (the
  database does not exist yet) -> one cursor on the config server's ``config.databases``
  (``openCursorOnConfigServer``; the ``DbAbsent`` handler). Otherwise cursors on those shards only
  and no ``config.shards`` monitor. With ``ignoreRemovedShards`` the shards removed since are
  left out (their events are lost by design); without it a removed shard fails the open as
  opening a cursor on it does: ShardNotFound (70).
- control events (``ChangeStreamHandleTopologyChangeV2Stage``, the state event handlers): never
  returned. ``moveChunk`` (``CollectionChangeStreamShardTargeterDbPresentStateEventHandler::
  handleMoveChunk``): a cursor on the recipient from ``clusterTime + 1`` if it has none; the
  donor's closed when ``allCollectionChunksMigratedFromDonor``; on a database stream a placement
  refresh instead (``DatabaseChangeStreamShardTargeterDbPresentStateEventHandler::handleMoveChunk``). ``namespacePlacementChanged`` and
  ``movePrimary`` (``handlePlacementRefresh``): the placement at ``clusterTime``, cursors opened
  from ``clusterTime + 1`` on the new shards and closed on the others
  (``change_streams::updateActiveShardCursors``); no shards -> the config-server cursor. An
  insert into ``config.databases`` (``DatabaseCreatedControlEvent``, ``DbAbsent`` handler): the
  same refresh, and the config-server cursor closed.
- the postBatchResumeToken (``NextHighWaterMarkDeterminingStrategy``, "recognizeControlEvents"):
  a control event moves the high-water mark to ``makeHighWaterMarkToken(clusterTime)`` when its
  clusterTime is past the current mark's, else leaves it.

Not modelled: segments of ``ignoreRemovedShards`` mode (``openCursorAt`` /
``nextPlacementChangedAt``, degraded fetching): removed shards are not targeted, and the shards
owning the collection now are targeted from the start too (a shard that owned it only in between
is missed); the ~1 s wait for the config server's cluster time on opening (SERVER-129623).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.timestamp import Timestamp

from shardsim.core.clock import ts_key
from shardsim.core.errors import MongoError
from shardsim.core.gossip import gossip_command
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.resume_token import hwm_token, token_key, token_ts_key
from shardsim.core.server_version import fcv_key
from shardsim.router.change_stream.handle_topology_change import NewShard
from shardsim.router.change_stream.raw_events import Item

log = logging.getLogger("shardsim.router.change_stream")

# operationType of the shards' control events (shard/change_stream/control_events.py)
CONTROL_OPS = frozenset({"moveChunk", "movePrimary", "namespacePlacementChanged"})


@dataclass(slots=True)
class Retarget:
    """Output of the merge for a control event: cursors to open (``open``: shard names, each
    from ``resumeAfter: HWM(at)``), to close (``close``), a placement refresh at ``refresh_at``
    (a Timestamp key; the cursor computes the open/close sets after fetching it), and whether
    to close the config-server cursor (``close_config``)."""

    at: int
    open: list[str] = field(default_factory=list)
    close: list[str] = field(default_factory=list)
    refresh_at: int | None = None
    close_config: bool = False


def wants_v2(router: Any, spec: dict[str, Any], target: Any) -> bool:
    """Does this stream run the v2 reader? The router's profile has it, the cluster's FCV is 9.0
    (shardsim/core/fcv.py), the client asked for ``version: "v2"``, and it is a collection or
    database stream or a whole-cluster one."""
    return (getattr(router.profile, "change_stream_reader_v2", False)
            and fcv_key(router.fcv) >= (9, 0)  # the feature flag follows the FCV
            and spec.get("version") == "v2")


def _mode(stream: Any) -> str:
    if isinstance(stream.target, str):
        return "collection"
    return "cluster" if stream.spec.get("allChangesForCluster") else "database"


def placement_nss(stream: Any) -> str:
    """The namespace whose placement targets the stream: ``db.coll``, ``db``, or ``""`` (the
    whole cluster)."""
    mode = _mode(stream)
    if mode == "collection":
        return f"{stream.db}.{stream.target}"
    return stream.db if mode == "database" else ""


async def fetch_placement(router: Any, ns: str, at: Timestamp, *,
                          ignore_removed: bool = False) -> tuple[str, list[str]]:
    """``(status, shards)`` of ``ns`` at ``at`` from the config server
    (``HistoricalPlacementFetcherImpl::fetch``)."""
    cmd = csrq.GetHistoricalPlacement(ns, at=at, targetWholeCluster=not ns,
                                      ignoreRemovedShards=ignore_removed).to_command()
    reply = await gossip_command(router.clock, router.config_pool, "admin", cmd)
    hp = reply.get("historicalPlacement") or {}
    return str(hp.get("status", "NotAvailable")), list(hp.get("shards") or [])


class HandleTopologyChangeV2:
    """The router stage's state for one v2 stream: the targeted data shards (``targeted``) and
    whether the config-server cursor is open (``db_absent``). :meth:`process` turns a control
    event into a :class:`Retarget`; :meth:`fix_hwm` applies the control-event rule to the
    merger's high-water mark. Same interface as
    :class:`router.change_stream.handle_topology_change.HandleTopologyChange` for the merge."""

    __slots__ = ("targeted", "db_absent", "known_shards", "mode")

    def __init__(self, targeted: set[str], db_absent: bool, mode: str = "collection") -> None:
        self.targeted = set(targeted)
        self.db_absent = db_absent  # the config-server cursor is open (always, for "cluster")
        self.known_shards = self.targeted  # read by code written for the v1 stage
        self.mode = mode  # "collection" | "database" | "cluster"

    def process(self, item: Item, from_config: bool) -> Retarget | None:
        """The action for a control event (or a config-server event) ``item``. Faked or
        malformed control events: BadValue (2) "failed to convert change event into control
        event" (``control_events.cpp`` ``assertFieldType``)."""
        doc = bson.decode(item.payload)
        ct = doc.get("clusterTime")
        if not isinstance(ct, Timestamp):
            raise MongoError(2, "failed to convert change event into control event: expected "
                                "\"clusterTime\" field to have type timestamp")
        at = ts_key(ct)
        op = doc.get("operationType")
        if from_config:  # DatabaseCreatedControlEvent: an insert into config.databases
            if op == "insert":
                return Retarget(at + 1, refresh_at=at, close_config=self.mode != "cluster")
            return None
        if op == "moveChunk" and self.mode != "collection":
            # DatabaseChangeStreamShardTargeterDbPresentStateEventHandler::handleMoveChunk,
            # AllDatabasesShardTargeterStateEventHandler::handleEvent: a placement refresh
            return Retarget(at + 1, refresh_at=at)
        if op == "moveChunk":
            desc = doc.get("operationDescription")
            if not isinstance(desc, dict) or not isinstance(desc.get("recipient"), str) \
                    or not isinstance(desc.get("donor"), str):
                raise MongoError(2, "failed to convert change event into control event: expected "
                                    "\"operationDescription\" field to have type object")
            act = Retarget(at + 1)
            if desc["recipient"] not in self.targeted:
                act.open.append(desc["recipient"])
            if desc.get("allCollectionChunksMigratedFromDonor") and desc["donor"] in self.targeted:
                act.close.append(desc["donor"])
            return act if act.open or act.close else None
        if op in ("namespacePlacementChanged", "movePrimary"):
            return Retarget(at + 1, refresh_at=at)
        return None

    @staticmethod
    def fix_hwm(merger: Any, prev_key: Any, prev_token: Any, item: Item) -> None:
        """"recognizeControlEvents": undo the move of the HWM to the control event's own token
        and set it to ``HWM(clusterTime)`` when that clusterTime is past the previous mark's."""
        merger.hwm, merger.hwm_token = prev_key, prev_token
        ct = token_ts_key(item.key[0])
        if ct is None:
            return
        prev_ct = token_ts_key(prev_key[0]) if prev_key is not None else None
        if prev_ct is None or ct > prev_ct:
            tok = hwm_token(ct)
            merger.hwm, merger.hwm_token = token_key(tok), tok


async def establish(stream: Any, spec: dict[str, Any], start: Timestamp) -> bool:
    """Open the v2 stream's cursors (see the module docstring). Returns False when the
    placement history cannot answer for ``start`` (the caller then runs the v1 reader).
    Raises ShardNotFound (70) for a removed shard in strict mode, and the first ``aggregate``
    error (the cursors that did open are killed)."""
    router = stream.router
    ignore_removed = bool(spec.get("ignoreRemovedShards", False))
    status, shards = await fetch_placement(router, placement_nss(stream), start,
                                           ignore_removed=ignore_removed)
    if status != "OK":
        log.info("placement history not available for %s at %s: v1 reader", placement_nss(stream),
                 start)
        return False
    live = {s[0] for s in router.catalog.shards()}
    for s in shards:
        if s not in live:
            raise MongoError(70, f"Shard {s} not found")
    if ignore_removed:
        # Segments, simplified: the data a removed shard handed on before it went reached its
        # new owners with control events on the removed shard, which nobody reads now; target
        # also today's owners (from the start: they have no events of the collection before
        # they received it). The server instead opens each segment's cursors at its
        # ``openCursorAt`` (``startChangeStreamSegment``); the events are the same.
        now_status, now_shards = await fetch_placement(router, placement_nss(stream),
                                                       router.clock.now(), ignore_removed=True)
        if now_status == "OK":
            shards = sorted(set(shards) | {s for s in now_shards if s in live})
    cmd = stream._shard_command(spec)
    import asyncio
    from shardsim.router.change_stream.async_results_merger import Remote
    mode = _mode(stream)
    opens = [stream._open(name, stream.db, cmd) for name in shards]
    if not shards or mode == "cluster":  # a whole-cluster stream always watches new databases
        opens.append(_open_config(stream, start))
    results = await asyncio.gather(*opens, return_exceptions=True)
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        for r in results:
            if isinstance(r, Remote):
                stream._kill_remote(r)
        raise failure
    stream.topology_v2 = HandleTopologyChangeV2(set(shards), not shards or mode == "cluster",
                                                mode)
    return True


def _open_config(stream: Any, at: Timestamp) -> Any:
    """The config-server cursor of a stream whose database does not exist yet: inserts into
    ``config.databases`` from ``at`` (``openCursorOnConfigServer``)."""
    cmd = {"aggregate": "databases",
           "pipeline": [{"$changeStream": stream._v1_tokens(
               {"startAtOperationTime": at, "allowToRunOnConfigDB": True})}],
           "needsMerge": True, "fromRouter": True, "cursor": {"batchSize": 0}}
    return stream._open(None, "config", cmd)


async def apply(stream: Any, act: Retarget) -> None:
    """Carry out ``act`` on ``stream``: refresh the placement if asked, close cursors (their
    buffered events are still returned, ``closeShardCursors``), open the new ones from
    ``resumeAfter: HWM(act.at)`` (before anything later is released)."""
    topo: HandleTopologyChangeV2 = stream.topology_v2
    router = stream.router
    if act.refresh_at is not None:
        ignore_removed = bool(stream.spec.get("ignoreRemovedShards", False))
        at = Timestamp(act.refresh_at >> 32, act.refresh_at & 0xFFFFFFFF)
        status, shards = await fetch_placement(router, placement_nss(stream), at,
                                               ignore_removed=ignore_removed)
        if status != "OK":
            # kSwitchToV1 mid-stream (the history was cleared by an FCV downgrade): shardsim ends
            # the stream with RetryChangeStream (234, resumable); the driver resumes it, with
            # the v1 reader below FCV 9.0. (The server switches the open stream to v1.)
            from shardsim.router.change_stream.cursor import _labelled
            stream.close()
            raise _labelled(MongoError(234, "change stream reader v2 cannot continue: placement "
                                            "history not available; resume the stream"),
                            "getMore", router.profile)
        if status == "OK":
            act.open = [s for s in shards if s not in topo.targeted]
            act.close = [s for s in topo.targeted if s not in shards]
            if topo.mode == "cluster":
                pass  # its config-server cursor stays open
            elif not shards and not topo.db_absent:
                await _open_config(stream, Timestamp(act.at >> 32, act.at & 0xFFFFFFFF))
                topo.db_absent = True
            elif shards and topo.db_absent:
                act.close_config = True
    for name in act.close:
        for r in list(stream.merger.remotes):
            if r.name == name and not r.is_config and not r.closed:
                stream.merger.remove_remote(r)
                stream._kill_remote(r)
        topo.targeted.discard(name)
    if act.close_config and topo.db_absent and topo.mode != "cluster":
        for r in list(stream.merger.remotes):
            if r.is_config and not r.closed:
                stream.merger.remove_remote(r)
                stream._kill_remote(r)
        topo.db_absent = False
    for name in act.open:
        topo.targeted.add(name)
        await stream.open_new_shard(NewShard(name, hwm_token(act.at)))
