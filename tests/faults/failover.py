"""Failover trials (issue 25, item 7): a sharded cluster of replica-set shards
(:class:`shardsim.testing.ShardedCluster` with ``shards=2, members=3``, in this process) under
the mixed workload of :mod:`.workload` with ``w: "majority"`` (retryable writes through the
router) and a change stream, while a shard's replica set fails over:

* ``stepdown``: ``replSetStepDown`` (force) on a shard primary mid-workload, once or twice
  (the same or the other shard, as the seed picks);
* ``kill-primary``: ``kill -9`` of a shard primary mid-workload (the others elect a new one),
  the dead member restarted after a seeded 0.5-3 s (durable: it recovers from its dbpath,
  rolls back what it had not replicated, and catches up);
* ``partition-rollback``: a primary cut from both other members while a ``w: 1`` writer
  (:class:`W1Writer`) writes to it directly, beside the router's ``w: majority`` writers; the
  majority side elects a new primary, the old one steps down; :meth:`heal` makes it roll back
  its ``w: 1`` writes (the trial waits for ``repl.rollbacks`` to grow);
* ``lagging-secondary``: one secondary cut from its set for a seeded 0.5-3 s (the kit has no
  ``lag(host, ms)`` fault yet: a cut-off secondary is the extreme lag), the stream read with
  ``readPreference`` ``secondary`` or ``primary`` (seeded), and in half the trials a stepdown
  of that set's primary while the secondary is behind.

Checkers: :data:`.checkers.CHECKERS` (lost/doubled acknowledged writes, torn transactions,
lost/duplicated/reordered events) and :data:`.checkers.FAILOVER_CHECKERS`: no event of a
rolled-back write (a ``w: 1`` write that is not in the final documents), and every live
member of every shard holding exactly its primary's documents once the set has settled (read
from each member's own storage).

Seeded: the seed picks the shard, the moment (after a seeded number of acknowledged inserts),
the durations and the variants; replaying a seed repeats the fault schedule, not the thread
interleaving.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pymongo
from pymongo.errors import PyMongoError

from shardsim.core.shard_key import KeyPattern, compare_keys
from shardsim.testing import ShardedCluster
from shardsim.testing.replica_sets import NoPrimary

from .checkers import (CHECKERS, FAILOVER_CHECKERS, WRITER_SPAN, FailoverObserved, Observed, check,
                       check_failover)
from .harness import DB, TrialResult, _expected_events, _retrying, _Watcher

FAILOVER_ROLES = ("stepdown", "kill-primary", "partition-rollback", "lagging-secondary")
W1_BASE = 9 * WRITER_SPAN  # the w:1 writer's _ids (partition-rollback)


def new_cluster(seed: int, durable: bool = True) -> ShardedCluster:
    """The cluster of a failover run: 2 shards of 3 members, seeded, started."""
    return ShardedCluster(shards=2, members=3, seed=seed, durable=durable,
                          timeout=120.0).start()


class W1Writer(threading.Thread):
    """Inserts ``{_id: W1_BASE + k}`` (only ``_id``\\ s whose chunk ``shard`` owns) with
    ``w: 1`` straight into member ``host`` (``directConnection``), as fast as it answers, until
    :meth:`finish`; records each ``_id`` sent (acknowledged or not)."""

    def __init__(self, host: str, coll: str, ids: list[int]) -> None:
        super().__init__(daemon=True)
        self.client: pymongo.MongoClient = pymongo.MongoClient(
            f"mongodb://{host}/", directConnection=True, w=1, retryWrites=False,
            serverSelectionTimeoutMS=2000, socketTimeoutMS=3000)
        self.coll = self.client[DB][coll]
        self.ids = ids
        self.sent: list[int] = []
        self.acked: list[int] = []
        self.errors = 0
        self.stop = False

    def run(self) -> None:
        for _id in self.ids:
            if self.stop:
                break
            self.sent.append(_id)
            try:
                self.coll.insert_one({"_id": _id, "w1": True})
                self.acked.append(_id)
            except PyMongoError:
                self.errors += 1
                time.sleep(0.05)
            time.sleep(0.005)

    def finish(self) -> None:
        self.stop = True
        self.join(15)
        self.client.close()


def _owned_ids(client: pymongo.MongoClient, ns: str, shard: str, n: int) -> list[int]:
    """``n`` ``_id``\\ s from :data:`W1_BASE` up whose chunk ``shard`` owns (config.chunks)."""
    entry = client.config.collections.find_one({"_id": ns})
    pattern = KeyPattern(entry["key"])
    chunks = [(pattern.bound_to_key(c["min"]), pattern.bound_to_key(c["max"]), c["shard"])
              for c in client.config.chunks.find({"uuid": entry["uuid"]})]
    out = []
    i = W1_BASE
    while len(out) < n:
        key = pattern.key_of_doc({"_id": i})
        if any(s == shard and compare_keys(lo, key) <= 0 and compare_keys(key, hi) < 0
               for lo, hi, s in chunks):
            out.append(i)
        i += 1
    return out


async def _docs_of(cluster: ShardedCluster, host: str, db: str, coll: str
                   ) -> dict[Any, Any] | None:
    """The documents of ``db.coll`` in the storage of member ``host`` (None: not running),
    read on the cluster's loop."""
    member = cluster.cluster._member_at(host)
    if not member.running or member.node is None:
        return None
    c = member.node.storage.get(db, coll)
    return {} if c is None else {repr(d["_id"]): dict(d) for d in list(c.docs.values())}


def _members_diverged(cluster: ShardedCluster, name: str, notes: list[str],
                      timeout: float = 30.0) -> list[str]:
    """Every live member of every shard has its primary's documents of ``faults.<name>`` (its
    own storage), within ``timeout`` s of the sets settling."""
    out = []
    for shard in cluster.shard_names:
        try:
            cluster._call(cluster.cluster.settled(shard, 30.0), 40)
        except Exception as exc:  # NoPrimary, timeout
            out.append(f"{shard} did not settle: {exc}")
            continue
        deadline = time.time() + timeout
        while True:
            try:
                primary = cluster.primary_of(shard)
            except NoPrimary:
                if time.time() > deadline:
                    out.append(f"{shard} lost its primary again")
                    break
                continue
            want = cluster._call(_docs_of(cluster, primary, DB, name))
            got = {h: cluster._call(_docs_of(cluster, h, DB, name))
                   for h in cluster.members_of(shard) if h != primary}
            bad = {h: d for h, d in got.items() if d is not None and d != want}
            if not bad:
                break
            if time.time() > deadline:
                for h, d in bad.items():
                    missing = sorted(set(want or {}) - set(d or {}))[:5]
                    extra = sorted(set(d or {}) - set(want or {}))[:5]
                    changed = [k for k in set(want or {}) & set(d or {})
                               if (want or {})[k] != (d or {})[k]][:5]
                    out.append(f"{shard} member {h} differs from primary {primary}: missing "
                               f"{missing} extra {extra} different {changed}")
                break
            time.sleep(0.1)
    return out


def _wait(cond: Any, timeout: float) -> bool:
    """Poll ``cond()`` every 50 ms for ``timeout`` s; an exception (NoPrimary) is "not yet"."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if cond():
                return True
        except Exception:
            pass
        time.sleep(0.05)
    return False


async def _picture(cluster: ShardedCluster) -> str:
    """Every member's replication state and the router's view of each shard, one line per
    shard (for a failed trial's notes: what the sets looked like when it gave up).
    ``h: STATE t=term applied=(t, ts) writable catch-up->target src=member`` and
    ``router: primary=host``."""
    lines = []
    router = cluster.cluster.router.node if cluster.cluster.router is not None else None
    for shard in cluster.shard_names:
        parts = []
        for h in cluster.members_of(shard):
            node = cluster.member_node(h)
            if node is None or node.repl is None:
                parts.append(f"{h}: down")
                continue
            core = node.repl.core
            c = core.catch_up
            parts.append(
                f"{h}: {core.state.state_str} t={core.term} applied=({core.applied.t}, "
                f"{core.applied.ts >> 32}:{core.applied.ts & 0xffffffff})"
                f"{' writable' if node.repl.writable else ''}"
                f"{f' catch-up->{c.target}' if c is not None else ''} src={core.sync_source} "
                f"rollbacks={node.repl.rollbacks}")
        mon = router.shards.monitors.get(shard) if router is not None else None
        parts.append(f"router: primary={mon.primary if mon is not None else '?'}")
        lines.append(f"{shard} [" + "; ".join(parts) + "]")
    return " | ".join(lines)


def _rollbacks(cluster: ShardedCluster) -> int:
    total = 0
    for shard in cluster.shard_names:
        for h in cluster.members_of(shard):
            node = cluster.member_node(h)
            if node is not None and node.repl is not None:
                total += node.repl.rollbacks
    return total


def _fault(cluster: ShardedCluster, role: str, rng: random.Random, shard: str, name: str,
           notes: list[str], w1: list[W1Writer]) -> str:
    """Inflict ``role``'s fault on ``shard`` (blocking until it is over and healed); returns
    the victim's description."""
    if role == "stepdown":
        times = rng.choice((1, 2))
        victims = []
        for k in range(times):
            target = shard if k == 0 else rng.choice(cluster.shard_names)
            secs = rng.choice((1, 2, 5))
            victims.append(f"{target}:{cluster.step_down(target, secs)}")
            time.sleep(rng.uniform(0.1, 1.0))
        notes.append(f"stepdowns {times}")
        return " ".join(victims)
    if role == "kill-primary":
        victim = cluster.kill_primary(shard)
        down = rng.uniform(0.5, 3.0)
        time.sleep(down)
        cluster.restart_member(victim)
        notes.append(f"down {down:.1f}s")
        return f"{shard}:{victim}"
    if role == "partition-rollback":
        old = cluster.primary_of(shard)
        with pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=20000) as c:
            ids = _owned_ids(c, f"{DB}.{name}", shard, 5000)
        writer = W1Writer(old, name, ids)
        w1.append(writer)
        writer.start()
        time.sleep(rng.uniform(0.0, 0.3))  # some w:1 writes replicate before the cut
        before = _rollbacks(cluster)
        for h in cluster.members_of(shard):
            if h != old:
                cluster.partition(old, h)
        node = cluster.member_node(old)
        if not _wait(lambda: cluster.primary_of(shard, 0.5) != old and not node.repl.writable,
                     20):
            raise NoPrimary(f"{shard}: no new primary, or the old one still primary, 20 s "
                            f"after the cut")
        time.sleep(rng.uniform(0.0, 1.0))
        writer.finish()
        cluster.heal()
        if not _wait(lambda: _rollbacks(cluster) > before, 20):
            notes.append(f"no rollback in 20 s: {cluster._call(_picture(cluster))}")
        notes.append(f"w1 acked {len(writer.acked)}")
        return f"{shard}:{old}"
    if role == "lagging-secondary":
        primary = cluster.primary_of(shard)
        sec = rng.choice([h for h in cluster.members_of(shard) if h != primary])
        for h in cluster.members_of(shard):
            if h != sec:
                cluster.partition(sec, h)
        behind = rng.uniform(0.5, 3.0)
        time.sleep(behind / 2)
        if rng.random() < 0.5:
            notes.append("stepdown while behind")
            cluster.step_down(shard, 2)
        time.sleep(behind / 2)
        cluster.heal()
        notes.append(f"behind {behind:.1f}s")
        return f"{shard}:{sec}"
    raise ValueError(f"unknown failover role {role!r}")


def run_failover_trial(cluster: ShardedCluster, role: str, seed: int,
                       ops: int = 150, transactions: bool = True) -> TrialResult:
    """One ``role`` trial (one of :data:`FAILOVER_ROLES`) on a started 2 x 3 ``cluster``: the
    mixed workload (``ops`` writes of writer 0, ``w: "majority"``) and a change stream on
    ``faults.t<seed>`` (sharded on hashed ``_id``), the fault once a seeded number of inserts
    were acknowledged, then every checker of :data:`.checkers.CHECKERS` and
    :data:`.checkers.FAILOVER_CHECKERS`. ``transactions=False`` leaves the transaction
    writer out."""
    from .workload import Workload
    rng = random.Random(seed)
    started = time.time()
    name = f"t{seed}"
    with pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=30000) as admin:
        _retrying(lambda: admin[DB].drop_collection(name))
        _retrying(lambda: admin.admin.command("enableSharding", DB))
        _retrying(lambda: admin.admin.command("shardCollection", f"{DB}.{name}",
                                              key={"_id": "hashed"}))
    notes: list[str] = []
    for s in cluster.shard_names:  # start from settled sets (a previous trial's member back)
        try:
            cluster._call(cluster.cluster.settled(s, 60.0), 70)
        except Exception as exc:
            notes.append(f"{s} not settled at the start: {type(exc).__name__}")
    shard = rng.choice(cluster.shard_names)
    trigger = rng.randint(3, max(4, ops // 3))
    watcher = _Watcher(cluster.uri, name)
    if role == "lagging-secondary":
        pref = rng.choice(("primary", "secondary"))
        notes.append(f"stream on {pref}")
        if pref == "secondary":
            watcher.coll = watcher.coll.with_options(
                read_preference=pymongo.ReadPreference.SECONDARY)
    watcher.start()
    if not watcher.ready.wait(30):
        raise RuntimeError("the change stream did not open")
    o = Observed()
    uri = cluster.uri + "?w=majority&wtimeoutMS=20000"
    work = Workload(uri, DB, name, ops, o, notes=notes, transactions=transactions).start()
    _wait(lambda: len(o.acked_inserts) >= trigger or
          not any(t.is_alive() for t in work.threads), 60)
    w1: list[W1Writer] = []
    fo = FailoverObserved()
    try:
        victim = _fault(cluster, role, rng, shard, name, notes, w1)
    except Exception as exc:  # NoPrimary from the kit, a timeout: judged, the trial goes on
        victim = shard
        fo.stuck.append(f"{role} on {shard}: {type(exc).__name__}: {exc}; "
                        f"{cluster._call(_picture(cluster))}")
        for writer in w1:
            writer.finish()
        cluster.heal()
    notes += work.join(120)
    try:
        with pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=30000) as reader:
            docs = _retrying(lambda: list(reader[DB][name].find({})))
    except PyMongoError as exc:  # e.g. 133: the router finds no primary for 30 s
        watcher.finish()
        violations = {c: [] for c in CHECKERS}
        violations.update(check_failover(FailoverObserved(
            stuck=[*fo.stuck, f"the router could not read the collection for 30 s: {exc}; "
                              f"{cluster._call(_picture(cluster))}"])))
        return TrialResult(seed=seed, role=role, victim=victim, violations=violations,
                           seconds=time.time() - started, notes=notes)
    o.docs = {d["_id"]: d for d in docs}
    for writer in w1:  # w:1 writes: applied or rolled back, never acknowledged w:majority
        o.ambiguous_inserts.update(writer.sent)
        fo.w1_acked.update(writer.acked)
        fo.w1_sent.update(writer.sent)
    fo.rolled_back = fo.w1_sent - set(o.docs)
    if fo.w1_acked:
        notes.append(f"rolled back {len(fo.w1_acked - set(o.docs))}")
    fo.diverged = _members_diverged(cluster, name, notes)
    expected = _expected_events(o)
    deadline = time.time() + 30
    while time.time() < deadline:
        seen = {(e["operationType"], e["documentKey"]["_id"]) for e in list(watcher.events)}
        if expected <= seen:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # a duplicate, or an event of a rolled-back write, would arrive now
    o.events = [e for e in watcher.finish()
                if e["operationType"] in ("insert", "update", "delete")]
    fo.events = o.events
    if watcher.errors:
        notes.append(f"stream resumed {watcher.errors}x")
    violations = check(o)
    violations.update(check_failover(fo))
    assert set(FAILOVER_CHECKERS) <= set(violations)
    return TrialResult(seed=seed, role=role, victim=victim, violations=violations,
                       acked=len(o.acked_inserts) + len(o.acked_incs) + len(o.acked_deletes),
                       ambiguous=len(o.ambiguous_inserts) + len(o.ambiguous_incs)
                       + len(o.ambiguous_deletes),
                       events=len(o.events), seconds=time.time() - started, notes=notes)
