"""Watchers (the merged change stream through the router) and per-shard samplers.

A *watcher* is a separate process (spawned, so it shares no GIL with the driver or Spark)
that opens ``db.watch()`` on the router before any write, records every event as a compact
:class:`~shardsim.tools.load.verify.Event` with its receive time, and stops once the writers are done
and either every planned op arrived (plus a short grace period, to catch extra events) or the
stream stayed silent for ``idle_timeout`` seconds. It also samples the router's
``postBatchResumeToken`` (the merged high-water mark) over time.

A *sampler* is a driver thread per shard with a direct connection to that shard, watching the
plan database there with a pipeline that matches nothing: its ``postBatchResumeToken`` is the
shard's promise (what the router's merger waits for), sampled over time for the plot and the
promise-lag figures. After the run it counts the run's entries in the shard's oplog.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any

GRACE_S = 0.5


def token_time(token: dict[str, Any] | None) -> tuple[int, int] | None:
    """(seconds, increment) of a resume token's cluster time, from its ``_data`` hex: a
    KeyString Timestamp is type byte 0x82 then 8 big-endian bytes (see
    ``shardsim.core.resume_token``); None if the token has no leading Timestamp."""
    if not token:
        return None
    data = token.get("_data", "")
    if isinstance(data, str) and len(data) >= 18 and data[:2] == "82":
        return int(data[2:10], 16), int(data[10:18], 16)
    return None


@dataclass
class WatcherOutput:
    """What a watcher hands back: ``events`` (list of Event tuples), ``hwm`` samples
    ``(wall_s, secs, inc)`` of the router's postBatchResumeToken, ``opened`` wall time, and
    ``error`` text if the stream failed."""

    events: list[tuple]
    hwm: list[tuple[float, int, int]]
    opened: float
    error: str | None = None


def _watch_main(uri: str, db: str, expected: int, ready: Any, stop: Any, counter: Any,
                out_path: str, idle_timeout: float, batch_size: int) -> None:
    from pymongo import MongoClient

    from shardsim.tools.load.verify import event_from_change

    events: list[tuple] = []
    hwm: list[tuple[float, int, int]] = []
    error = None
    opened = time.time()
    client = MongoClient(uri)
    try:
        with client[db].watch(max_await_time_ms=100, batch_size=batch_size) as stream:
            opened = time.time()
            ready.set()
            last_event = time.time()
            last_hwm = 0.0
            append = events.append
            while True:
                change = stream.try_next()
                now = time.time()
                if change is not None:
                    append(tuple(event_from_change(change, now)))
                    last_event = now
                    if len(events) & 255 == 0:
                        counter.value = len(events)
                else:
                    counter.value = len(events)
                    if stop.is_set():
                        quiet = now - last_event
                        if (len(events) >= expected and quiet >= GRACE_S) or quiet >= idle_timeout:
                            break
                if now - last_hwm >= 0.1:
                    t = token_time(stream.resume_token)
                    if t:
                        hwm.append((now, t[0], t[1]))
                    last_hwm = now
    except Exception as exc:  # noqa: BLE001 - reported by the driver
        error = f"{type(exc).__name__}: {exc}"
        ready.set()
    finally:
        client.close()
        counter.value = len(events)
        with open(out_path, "wb") as f:
            pickle.dump(WatcherOutput(events, hwm, opened, error), f, protocol=5)


class Watcher:
    """One watcher process. ``start()`` returns once the stream is open (or failed)."""

    def __init__(self, uri: str, db: str, expected: int, out_path: str, *,
                 idle_timeout: float = 15.0, batch_size: int = 10000) -> None:
        ctx = mp.get_context("spawn")
        self.out_path = out_path
        self.ready = ctx.Event()
        self.stop_event = ctx.Event()
        self.counter = ctx.Value("q", 0, lock=False)
        self.proc = ctx.Process(target=_watch_main, name="shardsim-watcher", daemon=True, args=(
            uri, db, expected, self.ready, self.stop_event, self.counter, out_path,
            idle_timeout, batch_size))

    def start(self, timeout: float = 60.0) -> "Watcher":
        self.proc.start()
        if not self.ready.wait(timeout):
            self.kill()
            raise RuntimeError("watcher did not open its change stream in time")
        return self

    @property
    def received(self) -> int:
        return int(self.counter.value)

    def finish(self) -> None:
        """Tell the watcher the writers are done (it drains, then exits)."""
        self.stop_event.set()

    def join(self, timeout: float | None = None) -> WatcherOutput:
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.kill()
            raise RuntimeError("watcher did not finish in time")
        try:
            with open(self.out_path, "rb") as f:
                return pickle.load(f)
        except (OSError, EOFError) as exc:
            return WatcherOutput([], [], 0.0, f"watcher exited {self.proc.exitcode} without output ({exc})")

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


@dataclass
class ShardSample:
    """Samples of one shard: ``(wall_s, secs, inc)`` of its postBatchResumeToken, and the
    number of change events of the plan database seen on the shard."""

    shard: str
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    events: int = 0
    error: str | None = None


class ShardSampler(threading.Thread):
    """Watches one shard directly (``directConnection=true``) until ``stop()``.

    The stream's pipeline matches no event, so the shard scans its oplog and answers with
    high-water-mark ``postBatchResumeToken``s only (the promise the router's merger sees)
    without shipping every event a second time. :meth:`count_oplog` then counts the run's
    CRUD entries in the shard's ``local.oplog.rs`` (migration copies excluded).
    """

    def __init__(self, shard: str, host: str, db: str, interval: float = 0.1) -> None:
        super().__init__(name=f"sampler-{shard}", daemon=True)
        self.data = ShardSample(shard)
        self.uri = f"mongodb://{host}/?directConnection=true"
        self.db = db
        self.interval = interval
        self._halt = threading.Event()
        self.opened = threading.Event()

    def run(self) -> None:
        from pymongo import MongoClient

        client = MongoClient(self.uri)
        try:
            with client[self.db].watch([{"$match": {"operationType": "(none: promise samples only)"}}],
                                       max_await_time_ms=int(self.interval * 1000)) as stream:
                self.opened.set()
                while not self._halt.is_set():
                    if stream.try_next() is not None:  # cannot match; counted defensively
                        self.data.events += 1
                    t = token_time(stream.resume_token)
                    if t:
                        self.data.samples.append((time.time(), t[0], t[1]))
        except Exception as exc:  # noqa: BLE001 - shown in the report, not fatal to the run
            self.data.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.opened.set()
            client.close()

    def stop(self) -> None:
        self._halt.set()

    def count_oplog(self, namespaces: list[str]) -> None:
        """Set ``data.events`` to the insert/update/delete oplog entries of ``namespaces``
        on this shard (``fromMigrate`` entries excluded); keeps the error on failure."""
        from pymongo import MongoClient

        try:
            with MongoClient(self.uri) as client:
                # the ``count`` command, not count_documents' $group aggregate: a plain
                # filter scan is several times cheaper on a shard's oplog
                self.data.events = int(client.local.command("count", "oplog.rs", query={
                    "ns": {"$in": namespaces}, "op": {"$in": ["i", "u", "d"]},
                    "fromMigrate": {"$ne": True}})["n"])
        except Exception as exc:  # noqa: BLE001 - informational figure
            self.data.error = f"oplog count: {type(exc).__name__}: {exc}"


class WaitSampler(threading.Thread):
    """Samples, every ``interval`` s until ``stop()``, why the router's change streams on
    ``db`` wait: ``$currentOp`` with ``localOps: true`` through the router (shardsim's
    ``changeStream`` sub-document, router/change_stream/current_op.py). Each sample in which a
    stream holds an event back (``heldEvent`` set) adds ``interval`` seconds to every remote
    named in its ``waitingFor``: ``held_s`` then says, per remote, about how long it held
    delivery back. One small aggregate per interval on the router; a router without the
    sub-document (not shardsim) leaves ``held_s`` empty and sets ``error``."""

    PIPELINE = [{"$currentOp": {"idleCursors": True, "localOps": True}},
                {"$match": {"changeStream": {"$exists": True}}}]

    def __init__(self, uri: str, db: str, interval: float = 0.25) -> None:
        super().__init__(name="sampler-waits", daemon=True)
        self.uri = uri
        self.db = db
        self.interval = interval
        self.held_s: dict[str, float] = {}
        self.samples = 0
        self.error: str | None = None
        self._halt = threading.Event()

    def sample(self, entries: list[dict[str, Any]]) -> None:
        """Account one ``$currentOp`` answer (the entries of :data:`PIPELINE`)."""
        self.samples += 1
        held: set[str] = set()
        for e in entries:
            ns = str(e.get("ns", ""))
            cs = e.get("changeStream") or {}
            if (ns == self.db or ns.startswith(self.db + ".")) and cs.get("heldEvent"):
                held.update(cs.get("waitingFor") or [])
        for name in held:
            self.held_s[name] = self.held_s.get(name, 0.0) + self.interval

    def run(self) -> None:
        from pymongo import MongoClient

        client = MongoClient(self.uri)
        try:
            while not self._halt.wait(self.interval):
                self.sample(list(client.admin.aggregate(self.PIPELINE)))
        except Exception as exc:  # noqa: BLE001 - informational figure
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            client.close()

    def stop(self) -> None:
        self._halt.set()

    def longest(self) -> tuple[str, float] | None:
        """``(remote, seconds)`` of the remote that held delivery back longest, or None."""
        if not self.held_s:
            return None
        name = max(sorted(self.held_s), key=lambda n: self.held_s[n])
        return name, self.held_s[name]
