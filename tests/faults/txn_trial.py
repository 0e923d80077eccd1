"""The ``txn`` fault trial (issue 28, R2): the coordinator shard of a cross-shard transaction is
killed (``kill -9``, durable ``--dbpath``) before or after its commit decision, restarted, and
the client retries ``commitTransaction`` after a delay.

One trial, its schedule drawn from its seed:

* a collection ``faults.x<seed>`` sharded on ``{x: 1}``, split at ``x: 0``, one chunk per
  shard; one document per shard (``_id: -1`` / ``_id: 1``, ``v: 0``);
* a transaction that ``$inc``s ``v`` of both and inserts ``_id: -2`` / ``_id: 2``, started on
  the database's primary shard, which therefore coordinates (the router's first participant);
* the moment, one of :data:`MOMENTS`, held at the coordinator's own fail point: every
  participant prepared and no decision written; the commit decision written and no participant
  told; the coordinator's own participant committed and the other one still prepared;
* ``kill -9`` of the coordinator, ``down_for`` seconds down, restart;
* the client's retry of ``commitTransaction`` ``retry_after`` seconds after the restart (the
  coordination recovered from its document may still run, or be long over);
* then every shard is read directly (:func:`.checkers.read_shard`) and the
  :data:`.checkers.TXN_CHECKERS` run: all or nothing on every shard, nothing twice, the
  client's answer matches the outcome, no transaction left prepared, plain writers not blocked.

Replaying a seed repeats the schedule (moment, down time, retry delay), not the interleaving.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pymongo
from pymongo.errors import OperationFailure, PyMongoError

from shardsim.tools.launcher import Cluster

from .checkers import TxnObserved, check_txn, read_shard
from .harness import DB, TrialResult, _retrying, wait_until

MOMENTS = {
    # name: (the coordinator's fail point, its mode)
    "before-decision": ("hangBeforeWritingDecision", "alwaysOn"),
    "after-decision": ("hangBeforeWaitingForDecisionWriteConcern", "alwaysOn"),
    "after-local-commit": ("hangWhileTargetingRemoteHost", {"skip": 1}),
}


def _direct(proc: Any) -> pymongo.MongoClient:
    return pymongo.MongoClient(proc.host, proc.port, directConnection=True,
                               serverSelectionTimeoutMS=20000, socketTimeoutMS=20000)


def _setup(cluster: Cluster, name: str) -> tuple[str, str]:
    """The trial's collection, one chunk per shard; returns (coordinator, other) shard names."""
    ns = f"{DB}.{name}"
    with pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000) as admin:
        _retrying(lambda: admin[DB].drop_collection(name))
        _retrying(lambda: admin.admin.command("enableSharding", DB))
        primary = admin.config.databases.find_one({"_id": DB})["primary"]
        other = next(p.name for p in cluster.shards if p.name != primary)
        _retrying(lambda: admin.admin.command("shardCollection", ns, key={"x": 1}))
        _retrying(lambda: admin.admin.command("split", ns, middle={"x": 0}))
        _retrying(lambda: admin.admin.command("moveChunk", ns, find={"x": 0}, to=other))
        admin[DB][name].insert_many([{"_id": -1, "x": -1, "v": 0}, {"_id": 1, "x": 1, "v": 0}])
    return primary, other


def _reached(moment: str, ns: str, coord: Any, other: Any) -> bool:
    """Whether the coordination of the trial's transaction (on ``ns``) is held at ``moment``."""
    prepare = {"o.prepare": True, "o.applyOps.ns": ns}
    with _direct(coord) as c, _direct(other) as o:
        mine = c.local["oplog.rs"].find_one(prepare)
        if not (mine and o.local["oplog.rs"].find_one(prepare)):
            return False
        doc = c.config.transaction_coordinators.find_one({})
        if moment == "before-decision":
            return doc is not None
        if moment == "after-decision":
            return doc is not None and doc.get("decision") is not None
        return c.local["oplog.rs"].find_one({"o.commitTransaction": 1,
                                             "prevOpTime.ts": mine["ts"]}) is not None


def _answer(exc: BaseException | None) -> dict[str, Any]:
    """The client's view of its retried commit: ok, or code/labels/errmsg."""
    if exc is None:
        return {"ok": True}
    out: dict[str, Any] = {"ok": False, "errmsg": str(exc), "type": type(exc).__name__}
    if isinstance(exc, OperationFailure):
        out["code"] = exc.code
        out["labels"] = sorted((exc.details or {}).get("errorLabels", []))
    return out


def run_txn_trial(cluster: Cluster, seed: int) -> TrialResult:
    """One ``txn`` trial on a started durable 2-shard ``cluster`` (module docstring)."""
    rng = random.Random(seed)
    started = time.time()
    moment = rng.choice(sorted(MOMENTS))
    down_for = rng.uniform(0.0, 0.5)
    retry_after = rng.uniform(0.0, 1.5)
    name = f"x{seed}"
    coordinator, other = _setup(cluster, name)
    coord, oth = cluster.shard(coordinator), cluster.shard(other)
    fail_point, mode = MOMENTS[moment]
    with _direct(coord) as d:
        d.admin.command("configureFailPoint", fail_point, mode=mode)
    client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000,
                                 socketTimeoutMS=60000)
    coll = client[DB][name]
    s = client.start_session()
    s.start_transaction()
    coll.update_one({"_id": -1, "x": -1}, {"$inc": {"v": 1}}, session=s)  # coordinator first
    coll.update_one({"_id": 1, "x": 1}, {"$inc": {"v": 1}}, session=s)
    coll.insert_many([{"_id": -2, "x": -2}, {"_id": 2, "x": 2}], session=s)
    first: list[BaseException | None] = []

    def commit() -> None:
        try:
            s.commit_transaction()
            first.append(None)
        except PyMongoError as exc:
            first.append(exc)
    t = threading.Thread(target=commit, daemon=True)
    t.start()
    notes = [f"moment {moment}", f"down {down_for:.2f}s", f"retry after {retry_after:.2f}s"]
    if not wait_until(lambda: _reached(moment, f"{DB}.{name}", coord, oth)):
        notes.append("moment not reached")
    with _direct(coord) as d:
        doc = d.config.transaction_coordinators.find_one({}) or {}
    notes.append("decision " + str((doc.get("decision") or {}).get("decision")))
    coord.kill()
    time.sleep(down_for)
    cluster.restart(coord)
    t.join(120)
    time.sleep(retry_after)  # the client's delayed retry
    try:
        s.commit_transaction()
        retry = _answer(None)
    except PyMongoError as exc:
        retry = _answer(exc)
    s.end_session()
    client.close()
    # the coordination is over once its document is gone; then read every shard directly
    with _direct(coord) as d:
        if not wait_until(lambda: d.config.transaction_coordinators.find_one({}) is None, 60):
            notes.append("coordinator document left")
    o = TxnObserved(retry=retry, first=_answer(first[0]) if first else {"ok": False},
                    shards={p.name: read_shard(p, DB, name) for p in (coord, oth)},
                    blocked=_plain_writes(cluster, name))
    violations = check_txn(o)
    committed = set(o.committed().values())
    notes.append("outcome " + ("commit" if committed == {True} else
                               "abort" if committed == {False} else "split"))
    for which, a in (("first", o.first), ("retry", retry)):
        notes.append(f"{which} " + ("ok" if a["ok"] else str(a.get("code", a.get("type")))))
    return TrialResult(seed=seed, role="txn", victim=coordinator, violations=violations,
                       acked=int(retry["ok"]), ambiguous=int(not retry["ok"]),
                       events=0, seconds=time.time() - started, notes=notes)


def _plain_writes(cluster: Cluster, name: str) -> list[str]:
    """A plain (non-transaction) write of each transaction document through the router, with
    ``maxTimeMS``: the failures (a transaction left prepared holds them)."""
    out = []
    with pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000,
                             socketTimeoutMS=30000) as c:
        for _id, x in ((-1, -1), (1, 1)):
            try:
                c[DB].command("update", name, updates=[{"q": {"_id": _id, "x": x},
                                                        "u": {"$set": {"w": 1}}}],
                              maxTimeMS=10000)
            except PyMongoError as exc:
                out.append(f"plain write of {_id}: {exc}")
    return out
