"""The fault-trial runner: one trial kills one process of a durable cluster
(:class:`shardsim.tools.launcher.Cluster` with ``durable=True``) with ``kill -9`` while a writer and a
change stream run, restarts it, and checks every invariant of :mod:`.checkers`.

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
ROLES = ("shard", "router", "config", "txn")
DB = "faults"


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
    if role == "shard":
        return rng.choice(cluster.shards)
    if role == "router":
        return cluster.router
    if role == "config":
        return cluster.config
    raise ValueError(f"unknown role {role!r}")


def _write(coll: Any, ops: int, o: Observed) -> None:
    """The trial's writer: insert ``{_id: i, seq: i}`` then ``$inc n`` on it, for each op.
    An acknowledged ``$inc`` that matched no document is noted apart."""
    for i in range(ops):
        try:
            coll.insert_one({"_id": i, "seq": i})
            o.acked_inserts.add(i)
        except PyMongoError:
            o.ambiguous_inserts.add(i)
        try:
            res = coll.update_one({"_id": i}, {"$inc": {"n": 1}})
            # matched nothing: the insert before it was not applied (a shard was down)
            (o.acked_incs if res.matched_count else o.acked_noop_incs).add(i)
        except PyMongoError:
            o.ambiguous_incs.add(i)


def _expected_events(o: Observed) -> set[tuple[str, int]]:
    exp = {("insert", i) for i in o.docs}
    exp |= {("update", i) for i, d in o.docs.items() if d.get("n", 0) >= 1}
    return exp


def run_trial(cluster: Cluster, role: str, seed: int, ops: int = 150) -> TrialResult:
    """Run one trial on a started durable ``cluster``: kill -9 a ``role`` process ("shard",
    "router" or "config") during ``ops`` writes and a watch, restart it, check. The trial's
    collection is ``faults.t<seed>`` (sharded on hashed ``_id``). Role "txn" is the
    coordinator-kill trial of :mod:`.txn_trial` (``ops`` unused)."""
    if role == "txn":
        from .txn_trial import run_txn_trial  # it builds on this module
        return run_txn_trial(cluster, seed)
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
    watcher = _Watcher(cluster.router_uri, name)
    watcher.start()
    if not watcher.ready.wait(30):
        raise RuntimeError("the change stream did not open")
    o = Observed()
    writer_client: pymongo.MongoClient = pymongo.MongoClient(
        cluster.router_uri, retryWrites=True, serverSelectionTimeoutMS=20000,
        socketTimeoutMS=10000, heartbeatFrequencyMS=500)
    writer = threading.Thread(target=_write, args=(writer_client[DB][name], ops, o), daemon=True)
    writer.start()
    time.sleep(kill_after)
    victim.kill()
    time.sleep(down_for)
    cluster.restart(victim)
    writer.join(120)
    writer_client.close()
    notes = [] if not writer.is_alive() else ["writer did not finish in 120 s"]
    with pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000) as reader:
        docs = _retrying(lambda: list(reader[DB][name].find({})))
    o.docs = {d["_id"]: d for d in docs}
    expected = _expected_events(o)
    deadline = time.time() + 30
    while time.time() < deadline:
        seen = {(e["operationType"], e["documentKey"]["_id"]) for e in list(watcher.events)}
        if expected <= seen:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # a duplicate would arrive now
    o.events = [e for e in watcher.finish() if e["operationType"] in ("insert", "update")]
    return TrialResult(seed=seed, role=role, victim=victim.name, violations=check(o),
                       acked=len(o.acked_inserts) + len(o.acked_incs),
                       ambiguous=len(o.ambiguous_inserts) + len(o.ambiguous_incs),
                       events=len(o.events), seconds=time.time() - started, notes=notes)
