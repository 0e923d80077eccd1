"""The balancer: a task on the config server that evens out each sharded collection's data
size over the shards (``src/mongo/db/s/balancer/balancer.cpp``, ``Balancer::_mainThread``).

Settings, read at the start of every round from ``config.settings`` (as
``BalancerConfiguration`` reads them):

* ``{_id: "balancer", mode: "full" | "off", stopped: bool, activeWindow: {start: "HH:MM",
  stop: "HH:MM"}}`` -- no document means ``mode: "full"`` (on by default, as in 8.0);
  ``balancerStop`` writes ``{mode: "off", stopped: true}``, ``balancerStart`` ``{mode:
  "full", stopped: false}``. Outside the active window (local time) no round runs.
* ``{_id: "chunksize", value: <MB>}`` -- the chunk size, default 128 MB.
* shardsim's own: ``{_id: "balancer", _shardsimRoundIntervalMs: N}`` -- the pause between
  rounds (the server's is 10 s, 1 s after a round that moved something,
  ``kBalanceRoundDefaultInterval``/``kShortBalanceRoundInterval``; tests make it short).
* ``enableAutoMerge`` (default true) and shardsim's ``_shardsimAutoMergerIntervalMs``: the
  auto-merger after the rounds (:mod:`configsvr.auto_merger`).

A round (``Balancer::_doBalanceRound``): skip collections with ``noBalance``,
``permitMigrations: false`` (``setAllowMigrations``), ``unsplittable`` or being resharded; ask
every shard once for the collections' data sizes (``_shardsvrGetStatsForBalancing``); choose
migrations (:mod:`configsvr.balancer_policy`); run each as ``moveRange`` with only ``min``: the
donor gives split points for one chunk size from the range's data (``autoSplitVector``, limit
1), the chunk is split there (``_configsvrSplitChunk``) and the lower piece moved
(``_configsvrMoveChunk``, the same migration as ``moveChunk``: ``fromMigrate`` writes, so change
streams never see it). An idle round costs one local read of the catalog and one small command
per shard; with no sharded collection, no command at all.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import TYPE_CHECKING, Any

from bson.int64 import Int64

from shardsim.configsvr import auto_merger
from shardsim.configsvr.balancer_policy import Migration, first_violation, select_for_collection
from shardsim.core.errors import MongoError
from shardsim.core.shard_key import KeyPattern
from shardsim.core.protocol import shard as shrq
from shardsim.core.protocol import configsvr as csrq

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.balancer")

DEFAULT_CHUNK_MB = 128
DEFAULT_INTERVAL = 10.0
SHORT_INTERVAL = 1.0


def in_window(window: Any, now: datetime.datetime) -> bool:
    """True when ``now`` (local time) is inside ``activeWindow`` ``{start: "HH:MM", stop:
    "HH:MM"}`` (a window over midnight when stop < start); True without a valid window."""
    if not isinstance(window, dict):
        return True
    try:
        start = datetime.time.fromisoformat(str(window["start"]))
        stop = datetime.time.fromisoformat(str(window["stop"]))
    except (KeyError, ValueError):
        return True
    t = now.time()
    if start <= stop:
        return start <= t < stop
    return t >= start or t < stop


class Balancer:
    """The config server's balancer. ``mode`` etc. come from ``config.settings`` each round;
    ``in_round`` and ``rounds`` are what ``balancerStatus`` reports; :meth:`wake` starts a
    round now (``balancerStart``)."""

    def __init__(self, node: ConfigServerNode) -> None:
        self.node = node
        self.in_round = False
        self.rounds = 0
        self.migrations = 0
        self.merges = 0
        self._last_merge = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- settings ---------------------------------------------------------------------------
    async def settings(self) -> dict[str, Any]:
        """``{mode, activeWindow, chunk_size (bytes), interval (s), short (s)}``."""
        docs = {d["_id"]: d for d in await self.node.find_all(
            "settings", {"_id": {"$in": ["balancer", "chunksize"]}})}
        bal = docs.get("balancer", {})
        mode = bal.get("mode", "full")
        if bal.get("stopped") is True:
            mode = "off"
        mb = docs.get("chunksize", {}).get("value", DEFAULT_CHUNK_MB)
        if not isinstance(mb, (int, float)) or mb <= 0:
            mb = DEFAULT_CHUNK_MB
        interval, short = DEFAULT_INTERVAL, SHORT_INTERVAL
        ms = bal.get(csrq.BALANCER_ROUND_INTERVAL_FIELD)
        if isinstance(ms, (int, float)) and ms > 0:
            interval = short = ms / 1000.0
        merge_every, merge_age = auto_merger.DEFAULT_INTERVAL, auto_merger.DEFAULT_MIN_AGE
        ms = bal.get(csrq.AUTO_MERGER_INTERVAL_FIELD)
        if isinstance(ms, (int, float)) and ms > 0:
            merge_every = merge_age = ms / 1000.0
        return {"mode": mode, "activeWindow": bal.get("activeWindow"),
                "auto_merge": bal.get("enableAutoMerge", True) is not False,
                "merge_every": merge_every, "merge_age": merge_age,
                "chunk_size": int(mb * 1024 * 1024), "interval": interval, "short": short}

    async def set_mode(self, mode: str) -> None:
        """Write the balancer document's mode (``"full"`` or ``"off"``) and wake the loop."""
        await self.node.local("update", "config", {"update": "settings", "updates": [
            {"q": {"_id": "balancer"},
             "u": {"$set": {"mode": mode, "stopped": mode == "off"}}, "upsert": True}]})
        self.wake()

    # -- the loop ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the main loop (on config server start-up)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._main())

    async def stop(self) -> None:
        """Stop the main loop (on shutdown); a migration in progress is cancelled."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass

    def wake(self) -> None:
        """Run the next round now."""
        self._wake.set()

    async def _main(self) -> None:
        interval = DEFAULT_INTERVAL
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                settings = await self.settings()
                moved = 0
                if settings["mode"] == "full" and in_window(settings["activeWindow"],
                                                            datetime.datetime.now()):
                    moved = await self.round(settings)
                    await self._maybe_merge(settings)
                interval = settings["short"] if moved else settings["interval"]
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed round is retried next time
                log.warning("balancer round failed: %s", exc)
                interval = DEFAULT_INTERVAL

    # -- one round --------------------------------------------------------------------------
    async def collection_sizes(self, colls: list[dict[str, Any]], shards: list[str]
                               ) -> dict[str, dict[str, int]]:
        """ns -> shard -> data size (bytes), one ``_shardsvrGetStatsForBalancing`` per shard."""
        out: dict[str, dict[str, int]] = {c["_id"]: {} for c in colls}
        req = [{"ns": c["_id"], "UUID": c["uuid"]} for c in colls]
        for shard in shards:
            try:
                reply = await self.node.on_shard(
                    shard, "admin", shrq.GetStatsForBalancing(1, req, scaleFactor=1).to_command())
            except MongoError as exc:
                log.info("no balancing stats from %s: %s", shard, exc)
                continue
            for st in reply.get("stats", []):
                out.setdefault(st["namespace"], {})[shard] = int(st["collSize"])
        return out

    async def candidates(self, chunk_size: int, only: str | None = None
                         ) -> tuple[list[Migration], dict[str, Any]]:
        """The migrations one round would run (for ``only`` one namespace: its first
        violation in the returned dict under ``"violation"``)."""
        node = self.node
        shard_docs = await node.shards()
        shards = [s["_id"] for s in shard_docs]
        draining = {s["_id"] for s in shard_docs if s.get("draining")}
        filt: dict[str, Any] = {"_id": only} if only else {}
        colls = [c for c in await node.find_all("collections", filt)
                 if only or (not c.get("noBalance") and c.get("permitMigrations", True)
                             and not c.get("unsplittable") and c["_id"] not in node.reshardings)]
        if not colls or len(shards) < 2:
            return [], {"violation": None}
        sizes = await self.collection_sizes(colls, shards)
        available = set(shards)
        out: list[Migration] = []
        violation = None
        for c in colls:
            pattern = KeyPattern(c["key"])
            chunks = await node.find_all("chunks", {"uuid": c["uuid"]})
            if only:
                violation = first_violation(pattern, chunks, sizes[c["_id"]], shards,
                                            draining, chunk_size)
                continue
            out.extend(select_for_collection(c["_id"], pattern, chunks, sizes[c["_id"]],
                                             shards, draining, chunk_size, available))
        return out, {"violation": violation}

    async def round(self, settings: dict[str, Any]) -> int:
        """One balancing round; returns the number of migrations it ran."""
        self.in_round = True
        try:
            migrations, _ = await self.candidates(settings["chunk_size"])
            moved = 0
            for m in migrations:
                try:
                    await self.move_range(m, settings["chunk_size"])
                    moved += 1
                except MongoError as exc:
                    log.info("balancer migration of %s %s failed: %s", m.ns, m.chunk["min"], exc)
            self.migrations += moved
            return moved
        finally:
            self.in_round = False
            self.rounds += 1

    async def _maybe_merge(self, settings: dict[str, Any]) -> None:
        """The auto-merger (:mod:`configsvr.auto_merger`) when it is due."""
        now = asyncio.get_running_loop().time()
        if not self._last_merge:
            self._last_merge = now
        if settings["auto_merge"] and now - self._last_merge >= settings["merge_every"]:
            self._last_merge = now
            self.merges += await auto_merger.merge_round(self.node, settings["merge_age"])

    async def move_range(self, m: Migration, chunk_size: int) -> None:
        """``moveRange`` with only ``min``: cut the chunk at about one chunk size from its
        min (``autoSplitVector`` on the donor, limit 1), then migrate the lower piece."""
        db, coll = m.ns.split(".", 1)
        entry = (await self.node.find_all("collections", {"_id": m.ns}))[0]
        reply = await self.node.on_shard(m.donor, db, {
            "autoSplitVector": coll, "keyPattern": entry["key"], "min": m.chunk["min"],
            "max": m.chunk["max"], "maxChunkSizeBytes": Int64(chunk_size), "limit": 1})
        bounds = [m.chunk["min"], m.chunk["max"]]
        if reply.get("splitKeys"):
            middle = reply["splitKeys"][0]
            split = csrq.SplitChunk(m.ns, middle=middle)
            await self.node.local(split.NAME, "admin", split.to_command())
            bounds = [m.chunk["min"], middle]
        move = csrq.MoveChunk(m.ns, bounds=bounds, to=m.to)
        await self.node.local(move.NAME, "admin", move.to_command())
        log.info("balancer moved %s %s from %s to %s (%s)", m.ns, bounds, m.donor, m.to,
                 m.reason)

    def status(self, mode: str) -> dict[str, Any]:
        """The ``balancerStatus`` reply body."""
        return {"mode": mode, "inBalancerRound": self.in_round,
                "numBalancerRounds": Int64(self.rounds), "term": Int64(1)}
