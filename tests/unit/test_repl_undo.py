"""Rollback by refetch (``shard.replication.rollback``): two members share a prefix, diverge (each
takes writes as a primary would), and one undoes its own entries after the common point with a
refetch callback reading the other; after the idempotent catch-up to ``minValid`` both are
the same. Every document version the rollback removed or overwrote is in the rollback files."""

from __future__ import annotations

import asyncio
import glob
import os
import random
from typing import Any

import bson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from shardsim.core.errors import MongoError
from shardsim.core.node import CODEC
from shardsim.shard.node import ShardNode
from shardsim.shard.replication.applier import apply_entries, undo_entries
from shardsim.shard.replication.rollback import answer_refetch, uuid_string

from test_repl_applier import (Workload, comparable_sessions, enc, new_node, oplog_of, req,
                               state, wire)


def source(node: ShardNode):
    async def refetch(keys):
        await asyncio.sleep(0)  # a network round trip
        return {k: (bson.decode(enc(v), CODEC) if v is not None else None)
                for k, v in answer_refetch(node, keys).items()}
    return refetch


def docs_by_key(node: ShardNode) -> dict[tuple[bytes, str], bytes]:
    return {(c.uuid, repr(k)): enc(d) for c in node.storage.collections()
            for k, d in c.docs.items()}


def comparable(node: ShardNode, keep: set[bytes]) -> dict[str, Any]:
    """:func:`state` without what a rollback may legitimately order differently or drop: the
    ``$natural`` order of refetched documents and their storage keys, the index order, the
    snapshot history."""
    st = state(node, keep)
    for c in st["colls"].values():
        c["docs"] = sorted(d for _, d in c["docs"])  # (time-series storage keys are counters)
        c["indexes"] = sorted(c["indexes"])
        c.pop("history")
        c.pop("floor")
        c.pop("capped")
    return st


def diverge(seed: int, *, a_steps: int, b_steps: int, dbpath: str | None = None,
            finish: bool = True, **a_options: Any) -> tuple[ShardNode, ShardNode, Any]:
    """A primary's history applied to A and B, then A and B each run their own workload."""
    primary = new_node()
    asyncio.run(Workload(primary, seed).go(60))
    prefix = wire(oplog_of(primary))
    a = new_node(**({"dbpath": dbpath} if dbpath else {}), **a_options)
    b = new_node()
    apply_entries(a, prefix)
    apply_entries(b, wire(prefix))
    for node, steps, base in ((a, a_steps, 1000), (b, b_steps, 2000)):
        work = Workload(node, seed * 7 + base)
        work.txn_number = base
        asyncio.run(work.go(steps, finish))
    return a, b, prefix[-1]["ts"]


def roll_back(a: ShardNode, b: ShardNode, common: Any) -> Any:
    undo = [e for e in oplog_of(a) if e["ts"] > common][::-1]
    before = docs_by_key(a)
    result = asyncio.run(undo_entries(a, undo, source(b)))
    assert result.common_point_ts == common and result.undone == len(undo)
    assert oplog_of(a)[-1]["ts"] == common
    after = docs_by_key(a)
    changed: dict[str, list[bytes]] = {}
    for (uuid, k), raw in before.items():
        if after.get((uuid, k)) != raw:
            changed.setdefault(uuid_string(uuid), []).append(raw)
    files = {}
    for where, docs in result.files.items():
        name = where if not os.path.isabs(where) else os.path.basename(os.path.dirname(where))
        files.setdefault(name, []).extend(enc(d) for d in docs)
    assert {k: sorted(v) for k, v in files.items()} == \
        {k: sorted(v) for k, v in changed.items()}
    return result


def catch_up(a: ShardNode, b: ShardNode, common: Any, result: Any) -> None:
    rest = [e for e in oplog_of(b) if e["ts"] > common]
    assert not rest or result.min_valid == rest[-1]["ts"]
    rng = random.Random(len(rest))
    i = 0
    while i < len(rest):
        n = rng.randrange(1, 10)
        apply_entries(a, wire(rest[i:i + n]), idempotent=True)
        i += n


def assert_converged(a: ShardNode, b: ShardNode, common: Any) -> None:
    """A is B. Pre-images of the entries applied in the catch-up window (after the common
    point) are made from the refetched documents and options (a document refetched deleted has
    none, a collection whose pre-images were enabled later has them early): only the older
    ones are compared."""
    keep = comparable_sessions(b)
    x, y = comparable(b, keep), comparable(a, keep)
    cut = (common.time << 32) | common.inc
    for st in (x, y):
        st["preimages"] = [(k, v) for k, v in st["preimages"] if k[0] <= cut]
    for part in x:
        assert x[part] == y[part], part


@pytest.mark.parametrize("seed", range(10))
def test_the_rolled_back_member_converges_on_its_source(seed):
    a, b, common = diverge(seed, a_steps=40, b_steps=[0, 10, 40][seed % 3],
                           finish=seed % 2 == 0)
    result = roll_back(a, b, common)
    catch_up(a, b, common, result)
    assert_converged(a, b, common)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), a_steps=st.integers(1, 60), b_steps=st.integers(0, 60),
       finish=st.booleans())
def test_property_any_divergence_converges(seed, a_steps, b_steps, finish):
    a, b, common = diverge(seed, a_steps=a_steps, b_steps=b_steps, finish=finish)
    result = roll_back(a, b, common)
    catch_up(a, b, common, result)
    assert_converged(a, b, common)


def test_a_durable_member_writes_rollback_files_and_restarts_rolled_back(tmp_path):
    path = str(tmp_path / "a")
    a, b, common = diverge(4, a_steps=60, b_steps=20, dbpath=path)
    result = roll_back(a, b, common)
    assert result.files
    for file, docs in result.files.items():
        rel = os.path.relpath(file, path).split(os.sep)
        assert rel[0] == "rollback" and len(rel) == 3
        assert rel[2].startswith("removed.") and rel[2].endswith(".bson")
        with open(file, "rb") as f:
            assert [enc(d) for d in bson.decode_all(f.read(), CODEC)] == [enc(d) for d in docs]
    assert sorted(glob.glob(os.path.join(path, "rollback", "*", "removed.*.bson"))) == \
        sorted(result.files)
    catch_up(a, b, common, result)
    assert_converged(a, b, common)
    keep = comparable_sessions(b)
    in_memory = comparable(a, keep)
    a.durable.close()
    again = new_node(dbpath=path)
    try:  # the restarted member is what it was before (time-series keys aside: a reload's)
        x = comparable(again, keep)
        for part in ("dbs", "txns", "sessions", "oplog", "preimages"):
            assert x[part] == in_memory[part], part
        for ns, want in in_memory["colls"].items():
            got = x["colls"][ns]
            assert want["uuid"] == got["uuid"] and want["indexes"] == got["indexes"]
            assert want["docs"] == got["docs"]
    finally:
        again.durable.close()


def test_a_rollback_past_the_oplog_cache_deletes_the_disk_rows(tmp_path):
    """A durable member whose oplog cache holds only its newest entries: the entries to undo
    are read from disk, and truncated there in the rollback's commit."""
    path = str(tmp_path / "a")
    a, b, common = diverge(9, a_steps=60, b_steps=10, dbpath=path, oplog_cache_mb=0.002)
    assert a.oplog.cached_entries < len([e for e in oplog_of(a) if e["ts"] > common])
    result = roll_back(a, b, common)
    assert a.oplog.last_ts() == common and a.oplog.latest_key == \
        (common.time << 32) | common.inc
    assert len(a.oplog) == len([e for e in oplog_of(b) if e["ts"] <= common])
    catch_up(a, b, common, result)
    assert_converged(a, b, common)
    a.durable.close()
    again = new_node(dbpath=path)
    try:
        assert [enc(e) for e in oplog_of(again)] == [enc(e) for e in oplog_of(b)]
    finally:
        again.durable.close()


def test_each_kind_of_change_is_undone():
    """Hand-picked: a drop restored from the source, a rename undone, an index and an option
    change undone, a created collection dropped into the rollback file, a prepared transaction
    and a retryable write undone (the retry then runs again: once overall)."""
    a, b = new_node(), new_node()
    lsid = {"id": bson.Binary(b"\x0a" * 16, 4)}

    async def run(node, name, db, body):
        reply = await node.run_command(req(name, db, body))
        assert reply.get("ok") == 1.0, reply
        return reply

    async def prefix(node):
        await run(node, "insert", "d", {"insert": "keep", "documents": [{"_id": i, "v": i}
                                                                         for i in range(3)]})
        await run(node, "insert", "d", {"insert": "gone", "documents": [{"_id": 1}]})
        await run(node, "insert", "d", {"insert": "moved", "documents": [{"_id": 1}]})
        await run(node, "create", "d", {"create": "pi",
                                        "changeStreamPreAndPostImages": {"enabled": True}})

    asyncio.run(prefix(b))
    apply_entries(a, wire(oplog_of(b)))
    common = oplog_of(a)[-1]["ts"]

    async def diverged(node):
        await run(node, "drop", "d", {"drop": "gone"})
        await run(node, "renameCollection", "admin", {"renameCollection": "d.moved",
                                                      "to": "d.there"})
        await run(node, "createIndexes", "d", {"createIndexes": "keep", "indexes": [
            {"key": {"v": 1}, "name": "v_1", "unique": True}]})
        await run(node, "collMod", "d", {"collMod": "keep", "validator": {"v": {"$gte": 0}}})
        await run(node, "insert", "d", {"insert": "fresh", "documents": [{"_id": "f"}]})
        await run(node, "update", "d", {"update": "keep", "updates": [
            {"q": {"_id": 1}, "u": {"$set": {"v": 10}}}], "lsid": lsid,
            "txnNumber": bson.Int64(1)})
        await run(node, "update", "d", {"update": "pi", "updates": [
            {"q": {"_id": 5}, "u": {"$set": {"p": 1}}, "upsert": True}], "lsid": lsid,
            "txnNumber": bson.Int64(2), "autocommit": False, "startTransaction": True})
        await run(node, "prepareTransaction", "admin", {
            "prepareTransaction": 1, "lsid": lsid, "txnNumber": bson.Int64(2),
            "autocommit": False})

    asyncio.run(diverged(a))
    assert a.pre_images.items() and a.sessions.prepared()
    undo = [e for e in oplog_of(a) if e["ts"] > common][::-1]
    result = asyncio.run(undo_entries(a, undo, source(b)))
    assert result.undone == len(undo) == 8 and result.min_valid == common
    assert sorted(c.ns for c in a.storage.collections()) == \
        ["d.gone", "d.keep", "d.moved", "d.pi"]
    assert [d for d in a.storage.get("d", "gone").docs.values()] == [{"_id": 1}]
    keep = a.storage.get("d", "keep")
    assert sorted(keep.indexes) == ["_id_"] and "validator" not in keep.options
    assert [d for d in keep.docs.values() if d["_id"] == 1] == [{"_id": 1, "v": 1}]
    assert not a.sessions.prepared() and not a.storage.get("d", "pi").prepared
    assert not list(a.pre_images.items())
    fresh_docs = [d for docs in result.files.values() for d in docs]
    assert {"_id": "f"} in fresh_docs and {"_id": 1, "v": 10} in fresh_docs
    assert a.sessions.records() == b.sessions.records() == []
    assert_converged(a, b, common)
    # the retryable write was rolled back: its retry applies it (once overall)
    again = asyncio.run(a.run_command(req("update", "d", {"update": "keep", "updates": [
        {"q": {"_id": 1}, "u": {"$set": {"v": 10}}}], "lsid": lsid,
        "txnNumber": bson.Int64(1)})))
    assert again["nModified"] == 1 and "retriedStmtIds" not in again


def test_an_undo_list_that_is_not_the_oplog_tail_is_refused():
    a, b, common = diverge(2, a_steps=10, b_steps=0)
    undo = [e for e in oplog_of(a) if e["ts"] > common][::-1]
    before = state(a)
    for bad in (undo[1:], undo[::-1], undo[:-1] + [undo[0]]):
        if not bad or bad == undo:
            continue
        with pytest.raises(MongoError) as exc:
            asyncio.run(undo_entries(a, bad, source(b)))
        assert exc.value.code == 127 and exc.value.code_name == "UnrecoverableRollbackError"
        assert state(a) == before

    async def broken(keys):
        raise MongoError(6, "HostUnreachable: the sync source went away")
    with pytest.raises(MongoError) as exc:
        asyncio.run(undo_entries(a, undo, broken))
    assert exc.value.code == 6 and state(a) == before


def test_an_oplog_that_moves_while_refetching_is_refused():
    a, b, common = diverge(6, a_steps=10, b_steps=0)
    undo = [e for e in oplog_of(a) if e["ts"] > common][::-1]

    async def racing(keys):
        a.write_noop({"msg": "a write during the refetch"})
        return answer_refetch(b, keys)
    with pytest.raises(MongoError) as exc:
        asyncio.run(undo_entries(a, undo, racing))
    assert exc.value.code == 127 and "changed while refetching" in exc.value.errmsg
    assert oplog_of(a)[-1]["o"] == {"msg": "a write during the refetch"}


def test_a_transaction_the_source_prepared_after_the_common_point_is_prepared_by_the_catch_up():
    """The source's session record is newer than the common point: a transaction it prepared
    after that point is not restored by the rollback (its locks would refuse the source's
    earlier entries on the same documents during the catch-up) but by the catch-up applying
    its prepare entry (the case hypothesis found: seed 78420, one local step, 52 on the
    source, the last transaction left prepared)."""
    a, b, common = diverge(78420, a_steps=1, b_steps=52, finish=False)
    result = roll_back(a, b, common)
    assert not any(getattr(c, "prepared", None) for c in a.storage.collections())
    catch_up(a, b, common, result)
    assert_converged(a, b, common)
    held = {c.ns: {k: t.txn_number for k, t in c.prepared.items()}
            for c in a.storage.collections() if c.prepared}
    assert held == {c.ns: {k: t.txn_number for k, t in c.prepared.items()}
                    for c in b.storage.collections() if c.prepared} and held
