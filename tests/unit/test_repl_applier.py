"""A secondary applying the primary's oplog (``shard.replication.applier``) ends up
indistinguishable from the primary: collections (UUIDs, options, indexes, documents in
``$natural`` order), session records, pre-images, snapshot history and the oplog itself (BSON
bytes), in memory and from disk after a restart; entries are refused out of order.

The primary runs generated workloads in-process (every kind of entry a shard writes: CRUD with
``$v: 2`` diffs of many operators, replacements, capped evictions, time series, views, DDL,
transactions unprepared and prepared, retryable writes); its whole oplog, decoded as the
fetcher would receive it, is applied at once and in chunks of random sizes."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import bson
import pytest
from bson import Binary
from bson.int64 import Int64
from hypothesis import given, settings, strategies as st, HealthCheck

from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError
from shardsim.core.node import CODEC
from shardsim.shard.node import ShardNode
from shardsim.shard.replication.applier import apply_entries
from shardsim.shard.sessions import full_lsid, session_key
from shardsim.shard.snapshot import documents_at

OPTS = {"noop_interval_ms": 600000}


def req(name: str, db: str, body: dict[str, Any]) -> Request:
    """A request as a client sends it (``body`` has the command name first)."""
    return Request(name=name, db=db, body={**body, "$db": db},
                   conn=ConnectionInfo(id=7, peer="127.0.0.1:1234"))


def enc(doc: Any) -> bytes:
    return bson.encode(doc, codec_options=CODEC)


def wire(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries as the fetcher decodes them off the wire."""
    return [bson.decode(enc(e), CODEC) for e in entries]


def oplog_of(node: ShardNode) -> list[dict[str, Any]]:
    return list(node.oplog.entries_from(0))


def comparable_sessions(node: ShardNode) -> set[bytes]:
    """The primary's sessions whose newest txnNumber wrote an oplog entry. A retryable
    statement that changed nothing (a delete matching nothing) is remembered by the primary
    without an entry, so no secondary can know it (the server's ``config.transactions`` also
    moves only with writes that are logged): such sessions are left out of the comparison."""
    logged = set()
    LOGGED_STMTS.clear()
    for e in oplog_of(node):
        if "lsid" in e:
            logged.add((session_key(e["lsid"]), int(e["txnNumber"])))
            if "stmtId" in e:
                LOGGED_STMTS.add((session_key(e["lsid"]), int(e["txnNumber"]), e["stmtId"]))
    return {sk for sk, s in node.sessions._sessions.items() if (sk, s.txn_number) in logged}


#: (session key, txnNumber, stmtId) of the primary's entries (set by comparable_sessions)
LOGGED_STMTS: set[tuple[bytes, int, int]] = set()


def state(node: ShardNode, keep: set[bytes] | None = None) -> dict[str, Any]:
    """Everything a member must have as the primary has it (BSON bytes where order matters);
    ``keep``: the sessions to compare (:func:`comparable_sessions`), all when None."""
    colls = {}
    for coll in node.storage.collections():
        history = [(ts, repr(k), enc(old) if old is not None else None)
                   for ts, k, old in coll.history]
        colls[coll.ns] = {
            "uuid": coll.uuid, "options": enc(coll.options),
            "indexes": [enc(i.spec) for i in coll.indexes.values()],
            "unique": sorted((i.name, sorted(map(repr, i.entries.items())))
                             for i in coll.indexes.values() if i.unique and i.name != "_id_"),
            "docs": [(repr(k), enc(d)) for k, d in coll.docs.items()],
            "history": history, "floor": coll.history_floor,
            "prepared": sorted(map(repr, coll.prepared)),
            "capped": (coll.capped, coll.capped_bytes, list(coll.record_ids.values())
                       if coll.capped else None)}
    sessions = {}
    for sk, s in node.sessions._sessions.items():
        rec = s.record()
        if s.txn_number < 0 or (keep is not None and sk not in keep):
            continue
        # results: see test_retries; a statement that wrote nothing has no entry to replicate
        rec["stmts"] = sorted(x["i"] for x in rec["stmts"]
                              if keep is None or (sk, s.txn_number, x["i"]) in LOGGED_STMTS)
        sessions[sk] = enc(rec)
    return {"colls": colls, "dbs": sorted(node.storage.dbs),
            "txns": enc({"r": sorted((r for r in node.sessions.records()
                                      if keep is None or session_key(r["_id"]) in keep),
                                     key=lambda r: session_key(r["_id"]))}),
            "sessions": sessions,
            "preimages": [(k, enc(d)) for k, d in node.pre_images.items()],
            "oplog": [enc(e) for e in oplog_of(node)]}


def assert_same(primary: ShardNode, secondary: ShardNode) -> None:
    keep = comparable_sessions(primary)
    a, b = state(primary, keep), state(secondary, keep)
    assert len(a["sessions"]) == len(b["sessions"])
    for part in a:
        assert a[part] == b[part], part


# -- the workload --------------------------------------------------------------------------
class Workload:
    """Random commands against ``node``; failures (duplicate keys, missing namespaces) are
    part of it: they log nothing."""

    def __init__(self, node: ShardNode, seed: int) -> None:
        self.node = node
        self.rng = random.Random(seed)
        self.txn_number = 0
        self.lsids = [{"id": Binary(bytes([i]) * 16, 4)} for i in range(1, 4)]
        self.prepared: list[tuple[dict[str, Any], int, Any]] = []

    async def run(self, name: str, db: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.node.run_command(req(name, db, body))

    def doc(self, _id: Any) -> dict[str, Any]:
        r = self.rng
        return {"_id": _id, "k": r.randrange(8), "s": {"x": r.randrange(5), "y": [1, 2]},
                "arr": [r.randrange(4) for _ in range(r.randrange(4))],
                "t": r.choice(["a", "b", None])}

    def update_op(self) -> dict[str, Any]:
        r = self.rng
        return r.choice([
            {"$set": {"k": r.randrange(8)}},
            {"$set": {"s.x": r.randrange(9), "s.z.w": 1}},
            {"$inc": {"k": 1, "n": 2}},
            {"$push": {"arr": r.randrange(4)}},
            {"$push": {"arr": {"$each": [7, 8], "$slice": -3}}},
            {"$pull": {"arr": r.randrange(4)}},
            {"$addToSet": {"arr": r.randrange(6)}},
            {"$pop": {"arr": r.choice([1, -1])}},
            {"$unset": {"t": ""}},
            {"$rename": {"t": "t2"}},
            {"$set": {"arr.1": "one"}},
            {"$set": {"s.y.0": {"deep": [1, {"z": 2}]}}},
            {"$max": {"k": 5}, "$currentDate": {"when": True}},
            {"$mul": {"k": 2}, "$setOnInsert": {"new": 1}},
            [{"$set": {"p": {"$add": ["$k", 1]}, "t": "$$REMOVE"}}],
            {"$set": {"s": {"x": 1}}}])

    async def step(self) -> None:
        r = self.rng
        db = r.choice(["d", "d", "e"])
        coll = r.choice(["a", "b", "pi", "cap"])
        kind = r.choices(["insert", "update", "replace", "delete", "fam", "ddl", "txn",
                          "retry", "prepared"], [6, 8, 2, 3, 2, 3, 2, 3, 1])[0]
        _id = r.randrange(12)
        if kind == "insert":
            docs = [self.doc(r.randrange(30)) for _ in range(r.randrange(1, 4))]
            await self.run("insert", db, {"insert": coll, "documents": docs,
                                          "ordered": r.random() < 0.5})
        elif kind == "update":
            await self.run("update", db, {"update": coll, "updates": [
                {"q": {"_id": _id} if r.random() < 0.7 else {"k": {"$lt": 4}},
                 "u": self.update_op(), "upsert": r.random() < 0.3,
                 "multi": r.random() < 0.2}]})
        elif kind == "replace":
            new = self.doc(_id)
            new.pop("_id")
            await self.run("update", db, {"update": coll, "updates": [
                {"q": {"_id": _id}, "u": new, "upsert": r.random() < 0.5}]})
        elif kind == "delete":
            await self.run("delete", db, {"delete": coll, "deletes": [
                {"q": {"_id": _id} if r.random() < 0.7 else {"k": {"$gt": 5}},
                 "limit": r.choice([0, 1])}]})
        elif kind == "fam":
            await self.run("findAndModify", db, {"findAndModify": coll, "query": {"_id": _id},
                                                 "update": self.update_op(),
                                                 "upsert": True, "new": r.random() < 0.5}
                           if r.random() < 0.7 else
                           {"findAndModify": coll, "query": {"_id": _id}, "remove": True})
        elif kind == "ddl":
            await self.ddl(db, coll)
        elif kind == "txn":
            await self.transaction(db, coll, commit=r.random() < 0.8)
        elif kind == "retry":
            await self.retryable(db, coll)
        else:
            await self.prepared_txn(db, coll)

    async def ddl(self, db: str, coll: str) -> None:
        r = self.rng
        choice = r.randrange(12)
        if choice == 0:
            await self.run("createIndexes", db, {"createIndexes": coll, "indexes": [
                {"key": {"k": 1}, "name": "k_1"},
                {"key": {"s.x": -1, "arr": 1}, "name": "sx_arr"}]})
        elif choice == 1:
            await self.run("createIndexes", db, {"createIndexes": coll, "indexes": [
                {"key": {"t": 1}, "name": "t_1", "unique": True, "sparse": True}]})
        elif choice == 2:
            await self.run("createIndexes", db, {"createIndexes": coll, "indexes": [
                {"key": {"k": -1}, "name": "k_-1", "hidden": True}]})
            await self.run("dropIndexes", db, {"dropIndexes": coll,
                                               "index": r.choice(["*", "k_1", "t_1", "k_-1"])})
        elif choice == 3:
            await self.run("drop", db, {"drop": coll})
        elif choice == 4:
            await self.run("create", db, {"create": coll,
                                          "changeStreamPreAndPostImages": {"enabled": True}})
        elif choice == 5:
            await self.run("create", db, {"create": "cap", "capped": True, "size": 4096,
                                          "max": 5})
        elif choice == 6:
            await self.run("renameCollection", "admin", {
                "renameCollection": f"{db}.{coll}", "to": f"{db}.{r.choice(['a', 'b', 'r'])}",
                "dropTarget": r.random() < 0.5})
        elif choice == 7:
            await self.run("collMod", db, {"collMod": coll, "changeStreamPreAndPostImages":
                                           {"enabled": r.random() < 0.5}})
        elif choice == 8:
            await self.run("collMod", db, {"collMod": coll, "validator": {"k": {"$gte": 0}},
                                           "validationLevel": "moderate"})
        elif choice == 9:
            await self.run("create", db, {"create": f"v{r.randrange(2)}", "viewOn": coll,
                                          "pipeline": [{"$match": {"k": 1}}]})
        elif choice == 10 and db == "e":
            await self.run("dropDatabase", db, {"dropDatabase": 1})
        else:
            await self.run("create", db, {"create": "ts", "timeseries": {
                "timeField": "at", "metaField": "m"}})
            await self.run("insert", db, {"insert": "ts", "documents": [
                {"at": __import__("datetime").datetime(2026, 1, 1), "m": r.randrange(3),
                 "v": r.random()}]})

    def session(self) -> tuple[dict[str, Any], int]:
        self.txn_number += 1
        return self.rng.choice(self.lsids), self.txn_number

    async def transaction(self, db: str, coll: str, commit: bool) -> None:
        r = self.rng
        lsid, tn = self.session()
        extra = {"lsid": lsid, "txnNumber": Int64(tn), "autocommit": False}
        await self.run("insert", db, {"insert": coll, "documents": [self.doc(100 + tn)],
                                      **extra, "startTransaction": True})
        for _ in range(r.randrange(3)):
            await self.run("update", db, {"update": coll, "updates": [
                {"q": {"_id": r.randrange(12)}, "u": self.update_op()}], **extra})
        if r.random() < 0.5:
            await self.run("delete", db, {"delete": coll, "deletes": [
                {"q": {"_id": r.randrange(12)}, "limit": 1}], **extra})
        if r.random() < 0.2:  # a collection made inside the transaction
            await self.run("insert", db, {"insert": f"new{tn}", "documents": [{"_id": 1}],
                                          **extra})
        await self.run("commitTransaction" if commit else "abortTransaction", "admin",
                       {"commitTransaction" if commit else "abortTransaction": 1, **extra})

    async def retryable(self, db: str, coll: str) -> None:
        r = self.rng
        lsid, tn = self.session()
        extra = {"lsid": lsid, "txnNumber": Int64(tn)}
        which = r.randrange(4)
        if which == 0:
            body = {"insert": coll, "documents": [self.doc(200 + tn), self.doc(300 + tn)]}
        elif which == 1:
            body = {"update": coll, "updates": [
                {"q": {"_id": r.randrange(12)}, "u": self.update_op(), "upsert": True},
                {"q": {"_id": 400 + tn}, "u": {"$set": {"up": 1}}, "upsert": True}]}
        elif which == 2:
            body = {"delete": coll, "deletes": [{"q": {"_id": r.randrange(30)}, "limit": 1}]}
        else:
            body = r.choice([
                {"findAndModify": coll, "query": {"_id": r.randrange(12)},
                 "update": {"$inc": {"k": 1}}, "new": r.random() < 0.5,
                 "fields": {"k": 1} if r.random() < 0.5 else None},
                {"findAndModify": coll, "query": {"_id": 500 + tn}, "update": {"$set": {"u": 1}},
                 "upsert": True, "new": r.random() < 0.5},
                {"findAndModify": coll, "query": {"_id": r.randrange(12)}, "remove": True}])
            if body.get("fields") is None:
                body.pop("fields", None)
        name = next(iter(body))
        await self.run(name, db, {**body, **extra})
        self.retries.append((name, db, {**body, **extra}))

    retries: list[tuple[str, str, dict[str, Any]]]

    async def prepared_txn(self, db: str, coll: str) -> None:
        """A prepared transaction; one left undecided for a while holds its documents, so it
        writes to ``d.prep``, which nothing else writes (a writer would wait for it)."""
        r = self.rng
        lsid, tn = self.session()
        extra = {"lsid": lsid, "txnNumber": Int64(tn), "autocommit": False}
        held = {i for _, _, _, ids in self.prepared for i in ids}
        free = [i for i in range(6) if i not in held]
        if not free or any(s is lsid for s, _, _, _ in self.prepared):
            return
        ids = r.sample(free, min(len(free), r.randrange(1, 3)))
        first = True
        for _id in ids:
            await self.run("update", "d", {"update": "prep", "updates": [
                {"q": {"_id": _id}, "u": self.update_op(), "upsert": True}], **extra,
                **({"startTransaction": True} if first else {})})
            first = False
        reply = await self.run("prepareTransaction", "admin", {"prepareTransaction": 1, **extra})
        if "prepareTimestamp" not in reply:
            return
        if r.random() < 0.4:  # left prepared for a while: other work goes on
            self.prepared.append((lsid, tn, reply["prepareTimestamp"], ids))
            return
        await self.decide(lsid, tn, reply["prepareTimestamp"])

    async def decide(self, lsid: dict[str, Any], tn: int, prepare_ts: Any,
                     ids: Any = None) -> None:
        extra = {"lsid": lsid, "txnNumber": Int64(tn), "autocommit": False}
        if self.rng.random() < 0.7:
            await self.run("commitTransaction", "admin", {"commitTransaction": 1, **extra,
                                                          "commitTimestamp": prepare_ts})
        else:
            await self.run("abortTransaction", "admin", {"abortTransaction": 1, **extra})

    async def go(self, steps: int, finish: bool = True) -> None:
        self.retries = []
        for name in ("pi", "prep"):
            await self.run("create", "d", {"create": name,
                                           "changeStreamPreAndPostImages": {"enabled": True}})
        for _ in range(steps):
            await self.step()
            if self.rng.random() < 0.05:  # the periodic no-op writer's entry
                self.node.write_noop({"msg": "periodic noop"})
            if self.prepared and self.rng.random() < 0.2:
                await self.decide(*self.prepared.pop(0))
        while finish and self.prepared:
            await self.decide(*self.prepared.pop(0))


def new_node(**options: Any) -> ShardNode:
    return ShardNode(shard_name="s", options={**OPTS, **options})


def primary_after(seed: int, steps: int = 120, finish: bool = True) -> tuple[ShardNode, Workload]:
    node = new_node()
    work = Workload(node, seed)
    asyncio.run(work.go(steps, finish))
    return node, work


def chunks(entries: list[Any], rng: random.Random) -> list[list[Any]]:
    out, i = [], 0
    while i < len(entries):
        n = rng.randrange(1, 12)
        out.append(entries[i:i + n])
        i += n
    return out


# -- the tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_a_secondary_applying_the_whole_oplog_is_the_primary(seed):
    primary, _ = primary_after(seed)
    entries = oplog_of(primary)
    assert len(entries) > 60
    secondary = new_node()
    apply_entries(secondary, wire(entries))
    assert_same(primary, secondary)
    assert secondary.clock.now() == entries[-1]["ts"]  # moved to it, never ticked


@pytest.mark.parametrize("seed", range(6))
def test_chunks_of_random_sizes_with_transactions_left_prepared(seed):
    primary, _ = primary_after(100 + seed, finish=False)
    secondary = new_node()
    rng = random.Random(seed)
    for chunk in chunks(wire(oplog_of(primary)), rng):
        apply_entries(secondary, chunk)
    assert_same(primary, secondary)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), steps=st.integers(1, 60),
       cuts=st.lists(st.integers(1, 30), max_size=8))
def test_property_any_workload_any_chunking(seed, steps, cuts):
    primary, _ = primary_after(seed, steps, finish=bool(seed % 2))
    entries = wire(oplog_of(primary))
    secondary = new_node()
    i = 0
    for n in cuts + [len(entries)]:
        apply_entries(secondary, entries[i:i + n])
        i += n
    assert_same(primary, secondary)


def kinds(entries: list[dict[str, Any]]) -> set[str]:
    out = set()
    for e in entries:
        if e["op"] == "u":
            out.add("u diff" if e["o"].get("$v") == 2 else "u replacement")
        elif e["op"] != "c":
            out.add(e["op"])
        else:
            name = next(iter(e["o"]))
            if name == "applyOps":
                name += " prepare" if e["o"].get("prepare") else ""
                out |= {"applyOps " + op["op"] + (" " + next(iter(op["o"])) if op["op"] == "c"
                                                  else "") for op in e["o"]["applyOps"]}
            out.add(name)
    return out


def test_the_workloads_write_every_kind_of_entry():
    seen: set[str] = set()
    for seed in range(6):
        seen |= kinds(oplog_of(primary_after(seed)[0]))
    assert seen >= {"i", "u diff", "u replacement", "d", "n", "create", "drop",
                    "renameCollection", "createIndexes", "dropIndexes", "collMod",
                    "dropDatabase", "applyOps", "applyOps prepare", "commitTransaction",
                    "abortTransaction", "applyOps i", "applyOps u", "applyOps d",
                    "applyOps c create"}, seen


def test_snapshot_reads_at_every_entry_match(tmp_path):
    primary, _ = primary_after(7, 80)
    secondary = new_node()
    entries = oplog_of(primary)
    apply_entries(secondary, wire(entries))
    for entry in entries[-40:]:
        for coll in primary.storage.collections():
            other = secondary.storage.by_uuid[coll.uuid]
            try:
                want = documents_at(coll, entry["ts"])
            except MongoError as exc:
                with pytest.raises(MongoError) as got:
                    documents_at(other, entry["ts"])
                assert got.value.code == exc.code == 239
                continue
            assert [enc(d) for d in documents_at(other, entry["ts"]).values()] == \
                [enc(d) for d in want.values()]


def test_retries_on_the_secondary_are_answered_from_history_exactly_once():
    """The newest retryable write of every session, retried on the secondary (a new primary
    after a failover), is answered from history as on the primary and logs nothing: inserts,
    updates (upserts too), deletes, findAndModify (from the retry image, with the retry's
    ``new`` and projection)."""
    checked: dict[str, int] = {}
    for seed, steps in itertools.product(range(4), (20, 45, 90)):
        primary, work = primary_after(seed * 10 + steps, steps)
        secondary = new_node()
        apply_entries(secondary, wire(oplog_of(primary)))
        keep = comparable_sessions(primary)
        last = {}
        for name, db, body in work.retries:
            last[session_key(full_lsid(body["lsid"]))] = (name, db, body)
        for sk, (name, db, body) in last.items():
            s = primary.sessions._sessions[sk]
            if sk not in keep or s.txn_number != body["txnNumber"]:
                continue
            before = state(secondary)["oplog"]
            got = asyncio.run(secondary.run_command(req(name, db, dict(body))))
            want = asyncio.run(primary.run_command(req(name, db, dict(body))))
            assert state(secondary)["oplog"] == before, (name, body)  # nothing applied again
            for field in ("ok", "n", "nModified", "upserted", "retriedStmtIds", "code",
                          "lastErrorObject", "value", "retriedStmtId"):
                assert got.get(field) == want.get(field), (field, name, body, got, want)
            checked[name] = checked.get(name, 0) + 1
    assert set(checked) == {"insert", "update", "delete", "findAndModify"}, checked


def test_entries_not_newer_than_the_last_one_are_refused():
    primary, _ = primary_after(1, 30)
    entries = wire(oplog_of(primary))
    secondary = new_node()
    apply_entries(secondary, entries[:10])
    before = state(secondary)
    for bad in (entries[9:12], entries[5:6], [entries[11], entries[10]]):
        with pytest.raises(MongoError) as exc:
            apply_entries(secondary, bad)
        assert exc.value.code == 152 and exc.value.code_name == "OplogOutOfOrder"
        assert "not newer" in exc.value.errmsg
        assert state(secondary) == before
    apply_entries(secondary, entries[10:])
    assert_same(primary, secondary)


def test_errors_name_the_entry_and_leave_the_batch_prefix_applied():
    primary = new_node()
    asyncio.run(primary.run_command(req("insert", "d", {"insert": "a",
                                                        "documents": [{"_id": 1}]})))
    entries = wire(oplog_of(primary))
    secondary = new_node()
    orphan = dict(entries[1], ui=Binary(b"\x09" * 16, 4))
    with pytest.raises(MongoError) as exc:
        apply_entries(secondary, [entries[0], orphan])
    assert exc.value.code == 26 and "missing collection" in exc.value.errmsg
    assert len(oplog_of(secondary)) == 1
    bad_op = dict(entries[1], op="x")
    with pytest.raises(MongoError) as exc:
        apply_entries(secondary, [bad_op])
    assert exc.value.code == 14825
    bad_cmd = dict(entries[0], o={"frobnicate": "a"})
    bad_cmd["ts"] = entries[1]["ts"]
    with pytest.raises(MongoError) as exc:
        apply_entries(secondary, [bad_cmd])
    assert exc.value.code == 2 and "frobnicate" in exc.value.errmsg
    missing = dict(entries[1], op="d", o={"_id": 99})
    with pytest.raises(MongoError) as exc:
        apply_entries(secondary, [missing])
    assert exc.value.code == 47
    apply_entries(secondary, entries[1:])
    assert_same(primary, secondary)


def test_a_multi_entry_transaction_applies_at_its_last_entry():
    """``partialTxn`` entries (the server's large transactions; a shard writes one entry)
    change nothing until the entry that ends the chain, which applies them all."""
    primary = new_node()
    asyncio.run(primary.run_command(req("insert", "d", {"insert": "a",
                                                        "documents": [{"_id": 1, "k": 1}]})))
    entries = wire(oplog_of(primary))
    coll = primary.storage.get("d", "a")
    base = entries[-1]
    lsid = {"id": Binary(b"\x05" * 16, 4), "uid": Binary(b"\x00" * 32, 0)}

    def txn_entry(i: int, ops: list[dict[str, Any]], prev: Any, **o: Any) -> dict[str, Any]:
        ts = bson.Timestamp(base["ts"].time, base["ts"].inc + i)
        return {"lsid": lsid, "txnNumber": Int64(4), "op": "c", "ns": "admin.$cmd",
                "o": {"applyOps": ops, **o}, "ts": ts, "t": Int64(1), "v": Int64(2),
                "wall": base["wall"], "prevOpTime": {"ts": prev, "t": Int64(1 if i > 1 else -1)}}

    first = txn_entry(1, [{"op": "i", "ns": "d.a", "ui": coll.ui, "o": {"_id": 2}}],
                      bson.Timestamp(0, 0), partialTxn=True)
    last = txn_entry(2, [{"op": "u", "ns": "d.a", "ui": coll.ui,
                          "o": {"$v": 2, "diff": {"u": {"k": 5}}}, "o2": {"_id": 1}},
                         {"op": "d", "ns": "d.a", "ui": coll.ui, "o": {"_id": 2}}],
                     first["ts"])
    secondary = new_node()
    apply_entries(secondary, entries + [first])
    assert [d["_id"] for d in secondary.storage.get("d", "a").docs.values()] == [1]
    apply_entries(secondary, [last])
    assert list(secondary.storage.get("d", "a").docs.values()) == [{"_id": 1, "k": 5}]
    rec = secondary.sessions.records()[0]
    assert rec["txnNum"] == 4 and rec["state"] == "committed"
    assert rec["lastWriteOpTime"]["ts"] == last["ts"]


def test_a_durable_secondary_restarts_with_everything(tmp_path):
    primary, _ = primary_after(11, 150, finish=False)
    path = str(tmp_path / "sec")
    secondary = new_node(dbpath=path)
    rng = random.Random(5)
    for chunk in chunks(wire(oplog_of(primary)), rng):
        apply_entries(secondary, chunk)
    assert_same(primary, secondary)
    secondary.durable.close()
    again = new_node(dbpath=path)
    try:
        keep = comparable_sessions(primary)
        a, b = state(primary, keep), state(again, keep)
        for part in ("dbs", "txns", "sessions", "preimages", "oplog"):
            assert a[part] == b[part], part
        for ns, want in a["colls"].items():  # the snapshot history is memory only
            got = b["colls"][ns]
            for part in ("uuid", "options", "indexes", "unique", "prepared"):
                assert want[part] == got[part], (ns, part)
            # (a reload keys time-series measurements by _id: shard.durable's, not ours)
            assert [d for _, d in want["docs"]] == [d for _, d in got["docs"]], ns
        assert again.clock.now() >= oplog_of(primary)[-1]["ts"]
    finally:
        again.durable.close()


def events(node: ShardNode, start: Any) -> list[bytes]:
    """Every change event (with its resume token) of a whole-cluster stream with expanded events
    and pre-images, from ``start``, as BSON."""
    from shardsim.shard.change_stream import open_cursor
    cur = open_cursor(node, "admin", 1, [{"$changeStream": {
        "allChangesForCluster": True, "startAtOperationTime": start, "showExpandedEvents": True,
        "fullDocumentBeforeChange": "whenAvailable", "fullDocument": "whenAvailable"}}])

    async def drain() -> list[bytes]:
        out: list[bytes] = []
        await cur.fetch(0, None, first=True)
        while True:
            batch = await cur.fetch(500, 10, first=False)
            out += [enc(d) for d in batch.docs]
            if not batch.docs:
                return out
    return asyncio.run(drain())


def test_change_streams_on_the_secondary_give_the_primary_s_events_and_tokens():
    primary, _ = primary_after(21, 120)
    entries = oplog_of(primary)
    secondary = new_node()
    apply_entries(secondary, wire(entries))
    want = events(primary, entries[0]["ts"])
    assert len(want) > 50
    assert events(secondary, entries[0]["ts"]) == want
