"""Fault trials of interrupted data movement: ``kill -9`` of the config server, the donor or
the recipient in the middle of a chunk migration (``migration-config``, ``migration-donor``,
``migration-recipient``), and of the config server in the middle of ``reshardCollection``
(``reshard-config``), while a writer sends ``$inc`` updates through the router and a change
stream watches.

A trial is seeded: its seed picks the phase (the donor's fail point ``moveChunkHangAtStep3..6``,
as the donor drives the migration; the config server's
``reshardingPauseCoordinatorBeforeBlockingWrites`` / ``...BeforeCompletion``), how long after
reaching it the victim dies and how long it stays down. After the restart the trial waits for
the recovery, migrates the range once more (the migration scenarios; a stale copy would win
there) or retries the resharding when it was aborted (``reshard-config``: the first retry must
succeed), then reads every shard directly and runs the :data:`checkers.SHARD_CHECKERS`.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pymongo
from pymongo.errors import PyMongoError

from shardsim.tools.launcher import Cluster
from shardsim.core.shard_key import KeyPattern, compare_keys

from .checkers import ShardState, check_shards
from .harness import DB, TrialResult, _retrying, _Watcher, wait_until

SCENARIOS = ("migration-config", "migration-donor", "migration-recipient", "reshard-config")
N = 100  # documents in the migrating range [0, N)
STEPS = {"config": (3, 4, 5, 6), "donor": (3, 4, 5, 6), "recipient": (3, 4, 5, 6)}
RESHARD_POINTS = ("reshardingPauseCoordinatorBeforeBlockingWrites",
                  "reshardingPauseCoordinatorBeforeCompletion")


def _direct(proc: Any) -> pymongo.MongoClient:
    return pymongo.MongoClient(proc.host, proc.port, directConnection=True,
                               serverSelectionTimeoutMS=30000)


def _command(proc: Any, *args: Any, **kw: Any) -> dict[str, Any]:
    with _direct(proc) as c:
        return c.admin.command(*args, **kw)


def _setup(cluster: Cluster, name: str) -> tuple[str, str]:
    """``faults.<name>`` on ``{x: 1}``: ``[MinKey, 0)`` and ``[0, N)`` on one shard (the
    donor), ``[N, MaxKey)`` on the other; documents ``x`` in ``-1..N``."""
    ns = f"{DB}.{name}"
    with pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000) as c:
        _retrying(lambda: c[DB].drop_collection(name))
        _retrying(lambda: c.admin.command("enableSharding", DB))
        c.admin.command("shardCollection", ns, key={"x": 1})
        for mid in (0, N):
            c.admin.command("split", ns, middle={"x": mid})
        donor = _range_owner(c, ns)
        recipient = next(s.name for s in cluster.shards if s.name != donor)
        c.admin.command("moveChunk", ns, find={"x": N}, to=recipient)
        c[DB][name].insert_many([{"_id": x, "x": x, "n": 0} for x in range(-1, N + 1)])
    return donor, recipient


def _range_owner(client: pymongo.MongoClient, ns: str) -> str:
    """The shard owning ``[0, N)`` of ``ns`` by ``config.chunks``."""
    uuid = client.config.collections.find_one({"_id": ns})["uuid"]
    return client.config.chunks.find_one({"uuid": uuid, "min": {"x": 0}})["shard"]


class _Incs(threading.Thread):
    """``$inc`` of ``n`` on documents chosen by the seed, through the router (retryable
    writes), counting the acknowledged and the ambiguous ones per ``_id``."""

    def __init__(self, uri: str, name: str, seed: int, ops: int) -> None:
        super().__init__(daemon=True)
        self.client: pymongo.MongoClient = pymongo.MongoClient(
            uri, retryWrites=True, serverSelectionTimeoutMS=20000, socketTimeoutMS=40000)
        self.coll = self.client[DB][name]
        rng = random.Random(seed)
        self.ids = [rng.randint(-1, N) for _ in range(ops)]
        self.acked: dict[int, int] = {}
        self.ambiguous: dict[int, int] = {}

    def run(self) -> None:
        for i in self.ids:
            try:
                res = self.coll.update_one({"x": i}, {"$inc": {"n": 1}})
                if res.matched_count:
                    self.acked[i] = self.acked.get(i, 0) + 1
            except PyMongoError:
                self.ambiguous[i] = self.ambiguous.get(i, 0) + 1

    def finish(self) -> None:
        self.join(180)
        self.client.close()


def _read_shards(cluster: Cluster, ns: str) -> ShardState:
    """Every shard's own documents, catalog and migration state, read directly."""
    db, coll = ns.split(".", 1)
    st = ShardState()
    with _direct(cluster.config) as c:
        entry = c.config.collections.find_one({"_id": ns})
        st.pattern = KeyPattern(entry["key"])
        st.chunks = [(st.pattern.bound_to_key(ch["min"]), st.pattern.bound_to_key(ch["max"]),
                      ch["shard"]) for ch in c.config.chunks.find({"uuid": entry["uuid"]})]
        st.leftovers += [f"config server: resharding {d['ns']} not finished"
                         for d in c.config.reshardingOperations.find()]
    for proc in cluster.shards:
        with _direct(proc) as d:
            st.docs[proc.name] = list(d[db][coll].find({}))
            st.leftovers += [f"{proc.name}: temporary collection {n}"
                             for n in d[db].list_collection_names()
                             if n.startswith("system.resharding")]
            st.leftovers += [f"{proc.name}: migration coordinator {x['_id']}"
                             for x in d.config.migrationCoordinators.find()]
            st.leftovers += [f"{proc.name}: range deletion {x['range']}"
                             for x in d.config.rangeDeletions.find()]
    return st


def owner(st: ShardState, doc: dict[str, Any]) -> str | None:
    """The shard owning ``doc``'s chunk by ``config.chunks``."""
    key = st.pattern.key_of_doc(doc)
    for lo, hi, shard in st.chunks:
        if compare_keys(lo, key) <= 0 and compare_keys(key, hi) < 0:
            return shard
    return None


def _settled(cluster: Cluster) -> bool:
    for proc in cluster.shards:
        with _direct(proc) as d:
            if d.config.migrationCoordinators.count_documents({}) or \
                    d.config.rangeDeletions.count_documents({}):
                return False
    with _direct(cluster.config) as c:
        return c.config.reshardingOperations.count_documents({}) == 0


def _kill_at(cluster: Cluster, where: Any, victim: Any, fail_point: str, rng: random.Random,
             notes: list[str]) -> None:
    """Wait for ``fail_point`` on process ``where`` (the donor, or the config server for a
    resharding), kill -9 ``victim`` after a seeded delay, let the operation go on into the
    dead process (when ``where`` survives), restart it."""
    if not wait_until(lambda: _command(where, "configureFailPoint", fail_point,
                                       mode="alwaysOn")["count"] > 0, 60):
        notes.append(f"{fail_point} not reached")
    time.sleep(rng.uniform(0.0, 0.2))  # the fault schedule, not a synchronisation
    victim.kill()
    if victim is not where:
        _command(where, "configureFailPoint", fail_point, mode="off")
    time.sleep(rng.uniform(0.0, 0.5))
    cluster.restart(victim)


def run_migration_trial(cluster: Cluster, scenario: str, seed: int, ops: int = 150
                        ) -> TrialResult:
    """One ``migration-<victim>`` trial (module docstring) on a started durable cluster."""
    rng = random.Random(seed)
    started = time.time()
    role = scenario.split("-", 1)[1]
    name = f"m{seed}"
    ns = f"{DB}.{name}"
    donor, recipient = _setup(cluster, name)
    step = f"moveChunkHangAtStep{rng.choice(STEPS[role])}"
    victim = {"config": cluster.config, "donor": cluster.shard(donor),
              "recipient": cluster.shard(recipient)}[role]
    watcher = _Watcher(cluster.router_uri, name)
    watcher.start()
    notes: list[str] = []
    if not watcher.ready.wait(30):
        raise RuntimeError("the change stream did not open")
    _command(cluster.shard(donor), "configureFailPoint", step, mode="alwaysOn")
    writer = _Incs(cluster.router_uri, name, seed, ops)
    writer.start()
    mover = threading.Thread(target=_move, args=(cluster, ns, recipient, notes), daemon=True)
    mover.start()
    _kill_at(cluster, cluster.shard(donor), victim, step, rng, notes)
    mover.join(120)
    writer.finish()
    if not wait_until(lambda: _settled(cluster), 60):
        notes.append("recovery did not finish in 60 s")
    with _direct(cluster.config) as c:  # the later migration of the range
        now = _range_owner(c, ns)
    _move(cluster, ns, recipient if now == donor else donor, notes)
    wait_until(lambda: _settled(cluster), 60)
    return _finish(cluster, scenario, seed, victim.name, ns, writer, watcher, started, notes)


def _move(cluster: Cluster, ns: str, to: str, notes: list[str]) -> None:
    try:
        with pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000) as c:
            c.admin.command("moveChunk", ns, find={"x": 1}, to=to)
    except PyMongoError as exc:
        notes.append(f"moveChunk to {to}: {type(exc).__name__}")


def run_reshard_trial(cluster: Cluster, seed: int, ops: int = 150) -> TrialResult:
    """One ``reshard-config`` trial: the config server killed in ``reshardCollection`` to
    ``{x: "hashed"}``; the first retry of an aborted one must succeed."""
    rng = random.Random(seed)
    started = time.time()
    name = f"r{seed}"
    ns = f"{DB}.{name}"
    _setup(cluster, name)
    point = rng.choice(RESHARD_POINTS)
    watcher = _Watcher(cluster.router_uri, name)
    watcher.start()
    notes: list[str] = []
    if not watcher.ready.wait(30):
        raise RuntimeError("the change stream did not open")
    _command(cluster.config, "configureFailPoint", point, mode="alwaysOn")
    writer = _Incs(cluster.router_uri, name, seed, ops)
    writer.start()

    def reshard() -> None:
        try:
            with pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000) as c:
                c.admin.command("reshardCollection", ns, key={"x": "hashed"})
        except PyMongoError:
            pass
    t = threading.Thread(target=reshard, daemon=True)
    t.start()
    _kill_at(cluster, cluster.config, cluster.config, point, rng, notes)
    t.join(120)
    writer.finish()
    if not wait_until(lambda: _settled(cluster), 60):
        notes.append("recovery did not finish in 60 s")
    retry_error: list[str] = []
    with pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000) as c:
        if c.config.collections.find_one({"_id": ns})["key"] != {"x": "hashed"}:
            try:
                c.admin.command("reshardCollection", ns, key={"x": "hashed"})
            except PyMongoError as exc:
                retry_error.append(f"the first retry of reshardCollection failed: {exc}")
    res = _finish(cluster, "reshard-config", seed, "configsvr", ns, writer, watcher, started,
                  notes)
    res.violations["leftover"] += retry_error
    return res


def _finish(cluster: Cluster, scenario: str, seed: int, victim: str, ns: str, writer: _Incs,
            watcher: _Watcher, started: float, notes: list[str]) -> TrialResult:
    """Read every shard, wait for the stream's events, run the shard checkers."""
    st = _read_shards(cluster, ns)
    st.owner = lambda doc: owner(st, doc)
    st.acked, st.ambiguous, st.ids = writer.acked, writer.ambiguous, set(range(-1, N + 1))
    applied = sum(int(d.get("n", 0)) for docs in st.docs.values() for d in docs)
    wait_until(lambda: sum(e["operationType"] == "update" for e in watcher.events) >= applied, 30)
    time.sleep(0.5)  # a clean-up event or a duplicate would arrive now
    st.events = list(watcher.finish())
    return TrialResult(seed=seed, role=scenario, victim=victim, violations=check_shards(st),
                       acked=sum(writer.acked.values()),
                       ambiguous=sum(writer.ambiguous.values()), events=len(st.events),
                       seconds=time.time() - started, notes=notes)


def run_scenario(cluster: Cluster, scenario: str, seed: int, ops: int = 150) -> TrialResult:
    """One trial of ``scenario`` (one of :data:`SCENARIOS`)."""
    if scenario == "reshard-config":
        return run_reshard_trial(cluster, seed, ops)
    return run_migration_trial(cluster, scenario, seed, ops)
