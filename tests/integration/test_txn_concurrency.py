"""Cross-shard transactions under concurrency: snapshot reads inside transactions, a seeded run
of concurrent transactions (commits and aborts) with plain writers, snapshot readers and a
change-stream watcher, and a coordinator killed between the prepares and its decision."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pymongo
from pymongo.errors import OperationFailure, PyMongoError
from pymongo.read_concern import ReadConcern

from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import read_events, split_over_two_shards
from txn_kit import commit_in_background, hold_prepared

NEG = list(range(-4, 0))
POS = list(range(1, 5))




def test_transaction_reads_one_snapshot_on_every_shard() -> None:
    """A transaction keeps reading the data as of its start on both shards while plain writes
    change it; a write to a document changed after its snapshot is a WriteConflict (112); a
    snapshot transaction reads at the router's atClusterTime."""
    with ShardedCluster(shards=2) as c:
        client = c.client()
        split_over_two_shards(client, "s.c")
        coll = client.s.c
        coll.insert_many([{"_id": -1, "x": -1, "v": 0}, {"_id": 1, "x": 1, "v": 0}])
        for rc in (None, ReadConcern("snapshot")):
            with client.start_session() as s:
                s.start_transaction(read_concern=rc)
                before = {d["_id"]: d["v"] for d in coll.find({}, session=s)}
                coll.update_many({}, {"$inc": {"v": 1}})  # outside the transaction
                again = {d["_id"]: d["v"] for d in coll.find({}, session=s)}
                assert again == before
                try:
                    coll.update_one({"_id": 1, "x": 1}, {"$set": {"w": 1}}, session=s)
                    raise AssertionError("expected a WriteConflict")
                except OperationFailure as exc:
                    assert exc.code == 112
                    assert exc.has_error_label("TransientTransactionError")
            now = {d["_id"]: d["v"] for d in coll.find({})}
            assert now == {k: v + 1 for k, v in before.items()}


def _transfer_worker(client: pymongo.MongoClient, seed: int, rounds: int,
                     outcome: dict[tuple[bytes, int], str], lock: threading.Lock) -> None:
    rnd = random.Random(seed)
    coll = client.bank.acct
    with client.start_session() as s:
        for _ in range(rounds):
            a, b = rnd.choice(NEG), rnd.choice(POS)
            amount = rnd.randint(1, 10)
            s.start_transaction()
            key = (bytes(s.session_id["id"]), s._server_session.transaction_id)
            try:
                coll.update_one({"_id": a, "x": a}, {"$inc": {"bal": -amount}}, session=s)
                coll.update_one({"_id": b, "x": b}, {"$inc": {"bal": amount}}, session=s)
                if rnd.random() < 0.3:
                    s.abort_transaction()
                    result = "aborted"
                else:
                    s.commit_transaction()
                    result = "committed"
            except PyMongoError:
                if s.in_transaction:
                    try:
                        s.abort_transaction()
                    except PyMongoError:
                        pass
                result = "aborted"
            with lock:
                outcome[key] = result


def test_seeded_concurrent_transactions_atomic_and_streamed_once() -> None:
    """Seeded: 3 sessions in threads run transfers between a document on each shard (commits
    and aborts, conflicts abort), a plain writer inserts, snapshot readers (transactions with
    readConcern snapshot, and snapshot reads outside transactions) always see the total
    unchanged. The watcher sees every committed transaction's two events once, with lsid
    {id, uid} and txnNumber, nothing of an aborted one, tokens strictly increasing. Checked
    against the shards' oplogs: every participant of a transaction committed it at one
    ``commitTimestamp``; on each shard the transaction's events carry the cluster time of
    that shard's ``commitTransaction`` entry (as mongod's unwind stage gives them) and sit
    together, in ``txnOpIndex`` order, in that shard's part of the merged stream."""
    with ShardedCluster(shards=2) as c:
        client = c.client()
        split_over_two_shards(client, "bank.acct")
        coll = client.bank.acct
        coll.insert_many([{"_id": i, "x": i, "bal": 100} for i in NEG + POS])
        outcome: dict[tuple[bytes, int], str] = {}
        lock = threading.Lock()
        stop = threading.Event()
        totals: list[int] = []
        plain: list[int] = []

        def reader() -> None:
            with client.start_session() as s:
                while not stop.is_set():
                    s.start_transaction(read_concern=ReadConcern("snapshot"))
                    totals.append(sum(d["bal"] for d in coll.find({"bal": {"$exists": True}},
                                                                  session=s)))
                    s.commit_transaction()
            with client.start_session(snapshot=True) as s:
                totals.append(sum(d["bal"] for d in coll.find({"bal": {"$exists": True}},
                                                              session=s)))

        def writer() -> None:
            n = 100
            while not stop.is_set():
                n += 1
                coll.insert_one({"_id": n, "x": n if n % 2 else -n})
                plain.append(n)
                time.sleep(0.005)

        with coll.watch() as stream:
            workers = [threading.Thread(target=_transfer_worker,
                                        args=(client, 1500 + i, 8, outcome, lock))
                       for i in range(3)]
            side = [threading.Thread(target=reader), threading.Thread(target=writer)]
            for t in workers + side:
                t.start()
            for t in workers:
                t.join(120)
            stop.set()
            for t in side:
                t.join(30)
            committed = {k for k, v in outcome.items() if v == "committed"}
            assert committed and len(outcome) == 24
            events = read_events(stream, 2 * len(committed) + len(plain))
            assert read_events(stream, 1, timeout=1.0) == []
        assert len(totals) > 3 and all(t == 800 for t in totals), totals
        print("readers", len(totals), "committed", len(committed), "plain", len(plain))
        assert sum(d["bal"] for d in coll.find({"bal": {"$exists": True}})) == 800
        tokens = [e["_id"]["_data"] for e in events]
        assert all(a < b for a, b in zip(tokens, tokens[1:]))
        assert sorted(e["documentKey"]["_id"] for e in events if "lsid" not in e) == plain
        by_txn: dict[tuple[bytes, int], list[int]] = {}
        for pos, e in enumerate(events):
            if "lsid" in e:
                assert set(e["lsid"]) == {"id", "uid"}
                by_txn.setdefault((bytes(e["lsid"]["id"]), int(e["txnNumber"])), []).append(pos)
        assert set(by_txn) == committed  # nothing of the aborted ones
        commits = _commit_entries(c)
        one_time = 0
        for key, positions in by_txn.items():
            assert len(positions) == 2
            entries = commits[key]  # {shard: commitTransaction oplog entry}
            assert len(entries) == 2
            # two-phase commit: one commit timestamp on every participant
            assert len({e["o"]["commitTimestamp"] for e in entries.values()}) == 1
            for pos in positions:
                ev = events[pos]
                entry = entries[_owner(ev)]
                assert ev["clusterTime"] == entry["ts"] >= entry["o"]["commitTimestamp"]
            one_time += len({events[p]["clusterTime"] for p in positions}) == 1
        for shard in ("neg", "pos"):
            # a shard's events of one transaction are adjacent among that shard's events
            mine = [e for e in events if _owner(e) == shard]
            seen: set[tuple[bytes, int]] = set()
            for prev, ev in zip([None] + mine, mine):
                if "lsid" in ev:
                    k = (bytes(ev["lsid"]["id"]), int(ev["txnNumber"]))
                    same = prev is not None and "lsid" in prev and \
                        (bytes(prev["lsid"]["id"]), int(prev["txnNumber"])) == k
                    assert same or k not in seen
                    seen.add(k)
        print("transactions at one cluster time on both shards:", one_time, "of", len(by_txn))


def _owner(event: dict[str, Any]) -> str:
    """The participant an event of bank.acct comes from (chunk x < 0 or x >= 0)."""
    return "neg" if event["documentKey"]["x"] < 0 else "pos"


def _commit_entries(c: ShardedCluster) -> dict[tuple[bytes, int], dict[str, dict[str, Any]]]:
    """``{(lsid id, txnNumber): {"neg"|"pos": commitTransaction oplog entry}}`` read from
    each shard's oplog; which side a shard holds is taken from its prepare entry."""
    out: dict[tuple[bytes, int], dict[str, dict[str, Any]]] = {}
    for name in c.shard_names:
        with pymongo.MongoClient(c.shard_address(name), directConnection=True) as direct:
            oplog = direct.local["oplog.rs"]
            for entry in oplog.find({"o.commitTransaction": 1}):
                prepare = oplog.find_one({"ts": entry["prevOpTime"]["ts"]})
                side = "neg" if prepare["o"]["applyOps"][0]["o2"]["x"] < 0 else "pos"
                key = (bytes(entry["lsid"]["id"]), int(entry["txnNumber"]))
                out.setdefault(key, {})[side] = entry
    return out


def test_coordinator_killed_before_decision_commits_everywhere(tmp_path) -> None:
    """kill -9 of the coordinator shard after every participant prepared, before the decision
    is persisted; restarted, it sends the prepares again (``continueCommit`` re-runs phase one
    for a document without a decision; both participants, the restarted one too, still hold
    the transaction prepared) and commits on every participant: no document, no prepared
    transaction left, the transaction's events in the stream, the documents writable again
    (``jstests/sharding/txn_two_phase_commit_failover.js``)."""
    with ShardedCluster(shards=2, dbpath=str(tmp_path)) as c:
        client = c.client()
        primary, other = split_over_two_shards(client, "k.c")
        coll = client.k.c
        coll.insert_many([{"_id": -1, "x": -1, "v": 0}, {"_id": 1, "x": 1, "v": 0}])
        node = c.cluster.node(primary)
        with coll.watch() as stream:
            c.configure_fail_point(primary, "hangBeforeWritingDecision", "alwaysOn")
            s = client.start_session()
            s.start_transaction()
            coll.update_one({"_id": -1, "x": -1}, {"$set": {"v": 1}}, session=s)
            coll.update_one({"_id": 1, "x": 1}, {"$set": {"v": 1}}, session=s)
            t, _errors = commit_in_background(s)  # blocks in the two-phase commit
            deadline = time.monotonic() + 10
            while not (c.cluster.node(primary).sessions.prepared() and
                       c.cluster.node(other).sessions.prepared()):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert not any(d.get("decision") for d in node.coordinators.documents())
            c.kill_shard(primary)
            c.restart_shard(primary)
            t.join(60)
            deadline = time.monotonic() + 20
            while (c.cluster.node(primary).sessions.prepared() or
                   c.cluster.node(other).sessions.prepared()):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert c.cluster.node(primary).coordinators.documents() == []
            assert sorted((d["_id"], d["v"]) for d in coll.find()) == [(-1, 1), (1, 1)]
            coll.update_one({"_id": 1, "x": 1}, {"$set": {"v": 2}})  # no longer locked
            events = read_events(stream, 3)
        got = [(e["documentKey"]["_id"], "lsid" in e) for e in events]
        assert sorted(got) == [(-1, True), (1, False), (1, True)]
        assert events[-1]["updateDescription"]["updatedFields"] == {"v": 2}


def test_snapshot_read_after_prepare_waits_for_the_decision() -> None:
    """A snapshot read (and a transaction's read) at a time after a cross-shard transaction
    prepared waits until the coordinator's decision is delivered, then sees the committed
    documents on both shards: never half of them, never a version that changes later."""
    with ShardedCluster(shards=2) as c:
        client = c.client()
        coll, primary, t, at = hold_prepared(c, client)
        release = threading.Timer(1.5, c.configure_fail_point, args=(
            primary, "hangBeforeWaitingForDecisionWriteConcern", "off"))
        release.start()
        start = time.monotonic()
        with client.start_session(causal_consistency=False) as rs:
            # the router learns the prepare's time through the client's gossip
            rs.advance_cluster_time({"clusterTime": at, "signature": {
                "hash": b"\x00" * 20, "keyId": 0}})
            reply = client.p.command("find", "c", session=rs, readConcern={
                "level": "snapshot", "atClusterTime": at})
        seen = sorted(d["v"] for d in reply["cursor"]["firstBatch"])
        waited = time.monotonic() - start
        t.join(30)
        assert seen == [1, 1]
        assert waited > 0.5  # it waited for the decision to arrive
        plain = sorted(d["v"] for d in coll.find({}))
        assert plain == [1, 1]
