"""The fault-trial runner: one trial kills one process of a durable cluster
(:class:`shardsim.tools.launcher.Cluster` with ``durable=True``) with ``kill -9`` while the mixed
workload (:mod:`.workload`: inserts, updates, deletes, transactions from several writers) and a
change stream run, restarts it, and checks every invariant of :mod:`.checkers`: the router's
view, the stream, and every shard's own documents read directly (orphans, copies on two shards,
stale copies, leftover migration state and temporary collections).

Roles: ``shard``, ``router``, ``config`` (the victim killed at a seeded moment),
``router-bulkwrite`` (the router killed while writer 0 sends ``bulkWrite`` batches), and the
DDL scenarios of :mod:`.ddl_trial` (``shard-createindexes``, ``shard-dropdatabase``: a shard
killed during the command through the router, the client retrying it).

A trial is bounded (``ops`` writes, deadlines on every wait) and seeded: its seed chooses the
victim (which shard), when it dies and how long it stays down. Thread and process timing is
not deterministic, so replaying a seed (``--seed``) repeats the same fault schedule, not the
same interleaving to the microsecond.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pymongo
from pymongo.errors import PyMongoError

from shardsim.tools.launcher import Cluster

from .checkers import Observed, check

# "txn": the coordinator shard of a cross-shard transaction killed before/after its decision,
# the client's commit retried later (tests/faults/txn_trial.py)
ROLES = ("shard", "router", "config", "txn", "router-bulkwrite", "shard-createindexes",
         "shard-dropdatabase")
DDL_ROLES = ("shard-createindexes", "shard-dropdatabase")
DB = "faults"


def needs_test_commands(role: str) -> bool:
    """Whether ``role``'s trials configure fail points (the cluster needs test commands)."""
    return role == "txn" or role in DDL_ROLES or role.startswith(("migration-", "reshard-"))


@dataclass
class TrialResult:
    """One trial: its seed, role and victim, the checkers' violations and what it saw."""

    seed: int
    role: str
    victim: str
    violations: dict[str, list[str]]
    acked: int = 0
    ambiguous: int = 0
    events: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())


class _Watcher(threading.Thread):
    """Reads the trial collection's change stream, resuming after errors from its last token
    (as an application would) until :meth:`finish`."""

    def __init__(self, uri: str, coll: str) -> None:
        super().__init__(daemon=True)
        self.client: pymongo.MongoClient = pymongo.MongoClient(
            uri, serverSelectionTimeoutMS=20000, heartbeatFrequencyMS=500)
        self.coll = self.client[DB][coll]
        self.events: list[dict[str, Any]] = []
        self.ready = threading.Event()
        self.stop = False
        self.token: Any = None
        self.errors = 0

    def run(self) -> None:
        while not self.stop:
            try:
                with self.coll.watch(resume_after=self.token, max_await_time_ms=100) as s:
                    if self.token is None:
                        self.token = s.resume_token
                    self.ready.set()
                    while not self.stop:
                        ev = s.try_next()
                        if ev is not None:
                            self.events.append(ev)
                            self.token = ev["_id"]
                        elif s.resume_token is not None:
                            self.token = s.resume_token
            except PyMongoError:
                self.errors += 1
                time.sleep(0.2)

    def finish(self) -> list[dict[str, Any]]:
        self.stop = True
        self.join(15)
        self.client.close()
        return self.events


def wait_until(cond: Any, timeout: float = 30.0) -> bool:
    """Poll ``cond()`` every 50 ms until it is true (True) or ``timeout`` seconds pass (False);
    a PyMongoError from ``cond`` counts as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return True
        except PyMongoError:
            pass
        time.sleep(0.05)
    return False


def _retrying(fn: Any, deadline_s: float = 30.0) -> Any:
    """``fn()`` again after PyMongoError until it succeeds or the deadline passes."""
    end = time.time() + deadline_s
    while True:
        try:
            return fn()
        except PyMongoError:
            if time.time() > end:
                raise
            time.sleep(0.2)


def _victim(cluster: Cluster, role: str, rng: random.Random) -> Any:
    if role == "shard" or role in DDL_ROLES:
        return rng.choice(cluster.shards)
    if role in ("router", "router-bulkwrite"):
        return cluster.router
    if role == "config":
        return cluster.config
    raise ValueError(f"unknown role {role!r}")


def _write(coll: Any, ops: int, o: Observed) -> None:
    """Writer 0 alone (:func:`.workload.inserts_and_incs`)."""
    from .workload import inserts_and_incs
    inserts_and_incs(coll, ops, o)


def _expected_events(o: Observed) -> set[tuple[str, int]]:
    from .checkers import _applied
    return {w for w, n in _applied(o).items() if n >= 1}


def _shard_checks(cluster: Cluster, name: str, docs: dict[Any, dict[str, Any]],
                  notes: list[str]) -> dict[str, list[str]]:
    """Every shard's documents and migration state read directly (after any migration the
    balancer started has settled), against ``config.chunks`` and the router's ``docs``: the
    :data:`.checkers.KILL_SHARD_CHECKERS`."""
    from .checkers import KILL_SHARD_CHECKERS, SHARD_CHECKERS
    from .migration import _read_shards, _settled, owner
    if not wait_until(lambda: _settled(cluster), 60):
        notes.append("migrations not settled in 60 s")
    st = _read_shards(cluster, f"{DB}.{name}")
    st.owner = lambda doc: owner(st, doc)
    st.ids, st.router_docs = set(docs), docs
    return {c: SHARD_CHECKERS[c](st) for c in KILL_SHARD_CHECKERS}


def run_trial(cluster: Cluster, role: str, seed: int, ops: int = 150) -> TrialResult:
    """Run one trial on a started durable ``cluster``: kill -9 a ``role`` process (one of
    :data:`ROLES`) during ``ops`` writes of writer 0 (and the other writers' share) and a
    watch, restart it, check. The trial's collection is ``faults.t<seed>`` (sharded on hashed
    ``_id``). Role "txn" is the coordinator-kill trial of :mod:`.txn_trial` (``ops`` unused);
    the DDL roles run their command around the kill (:mod:`.ddl_trial`)."""
    if role == "txn":
        from .txn_trial import run_txn_trial  # it builds on this module
        return run_txn_trial(cluster, seed)
    from .workload import BATCH, Workload, bulk_api
    rng = random.Random(seed)
    started = time.time()
    name = f"t{seed}"
    with pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000) as admin:
        _retrying(lambda: admin[DB].drop_collection(name))
        _retrying(lambda: admin.admin.command("enableSharding", DB))
        _retrying(lambda: admin.admin.command("shardCollection", f"{DB}.{name}",
                                              key={"_id": "hashed"}))
    victim = _victim(cluster, role, rng)
    kill_after = rng.uniform(0.05, 0.5)
    down_for = rng.uniform(0.0, 0.6)
    notes: list[str] = []
    api = bulk_api(rng) if role == "router-bulkwrite" else None
    if api:
        notes.append(f"api {api}")
    ddl = None
    if role in DDL_ROLES:
        from .ddl_trial import DDL_SCENARIOS
        ddl = DDL_SCENARIOS[role](cluster, seed, name, victim, rng, notes)
        ddl.prepare()
    watcher = _Watcher(cluster.router_uri, name)
    watcher.start()
    if not watcher.ready.wait(30):
        raise RuntimeError("the change stream did not open")
    o = Observed(batch=BATCH if api else 0)
    work = Workload(cluster.router_uri, DB, name, ops, o, bulk_api=api, notes=notes).start()
    time.sleep(kill_after)
    if ddl is not None:
        ddl.run_with_kill(down_for)
    else:
        victim.kill()
        time.sleep(down_for)
        cluster.restart(victim)
    notes += work.join(120)
    with pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000) as reader:
        docs = _retrying(lambda: list(reader[DB][name].find({})))
    o.docs = {d["_id"]: d for d in docs}
    violations = _shard_checks(cluster, name, o.docs, notes)
    if ddl is not None:
        violations.update(ddl.check())
    expected = _expected_events(o)
    deadline = time.time() + 30
    while time.time() < deadline:
        seen = {(e["operationType"], e["documentKey"]["_id"]) for e in list(watcher.events)}
        if expected <= seen:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # a duplicate would arrive now
    o.events = [e for e in watcher.finish()
                if e["operationType"] in ("insert", "update", "delete")]
    violations.update(check(o))
    return TrialResult(seed=seed, role=role, victim=victim.name, violations=violations,
                       acked=len(o.acked_inserts) + len(o.acked_incs) + len(o.acked_deletes),
                       ambiguous=len(o.ambiguous_inserts) + len(o.ambiguous_incs)
                       + len(o.ambiguous_deletes),
                       events=len(o.events), seconds=time.time() - started, notes=notes)
