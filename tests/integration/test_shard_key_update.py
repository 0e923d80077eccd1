"""Updates that change a document's owning shard, as mongos 8.0 runs them (its default, legacy
path: ``document_shard_key_update_util.cpp``): the shard answers WouldChangeOwningShard (283)
and the router moves the document by a delete and an insert inside a transaction — the
client's own transaction, or for a retryable write one on the write's own lsid/txnNumber —
committed by two-phase commit. See docs/transactions.md, "Shard-key-changing updates"."""

from __future__ import annotations

import asyncio
from typing import Any

import pymongo
import pytest
from bson import Binary, Int64

from shardsim.core import resume_token
from shardsim.core.client import Pool, parse_address
from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import read_events, split_over_two_shards


@pytest.fixture(scope="module")
def cluster() -> Any:
    with ShardedCluster(shards=2) as c:
        yield c


def _collection(c: ShardedCluster, name: str) -> tuple[Any, str, str]:
    """``t.<name>`` sharded on ``{x: 1}``: ``x < 0`` on the primary shard, ``x >= 0`` on the
    other. Returns (collection, primary, other)."""
    client = c.client()
    primary, other = split_over_two_shards(client, f"t.{name}")
    return client.t[name], primary, other


def _on_shard(c: ShardedCluster, shard: str, name: str) -> list[dict[str, Any]]:
    direct = pymongo.MongoClient(f"mongodb://{c.shard_address(shard)}/?directConnection=true")
    try:
        return list(direct.t[name].find())
    finally:
        direct.close()



def _router_address(c: ShardedCluster) -> str:
    return c.uri.split("//", 1)[1].rstrip("/")


def _raw(address: str, cmd: dict[str, Any]) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        pool = Pool(*parse_address(address))
        try:
            return await pool.command("t", cmd, check=False)
        finally:
            pool.close()
    return asyncio.run(run())


def _assert_moved_events(events: list[dict[str, Any]], lsid_id: Any, txn_number: int) -> None:
    """A delete and an insert of one transaction: the client's lsid and txnNumber on both,
    txnOpIndex 0 in each token (one operation per participant), tokens strictly increasing."""
    assert sorted(e["operationType"] for e in events) == ["delete", "insert"]
    for e in events:
        assert e["lsid"]["id"] == lsid_id
        assert e["txnNumber"] == txn_number
        assert resume_token.decode(e["_id"]).txnOpIndex == 0
    tokens = [e["_id"]["_data"] for e in events]
    assert tokens == sorted(tokens) and len(set(tokens)) == 2


def test_retryable_update_moves_the_document_in_one_transaction(cluster: ShardedCluster) -> None:
    coll, primary, other = _collection(cluster, "rw")
    coll.insert_one({"_id": 1, "x": -5, "v": "a"})
    with coll.watch() as stream, coll.database.client.start_session() as s:
        r = coll.update_one({"x": -5}, {"$set": {"x": 5}}, session=s)
        assert (r.matched_count, r.modified_count) == (1, 1)
        events = read_events(stream, 2)
        txn_number = s._server_session.transaction_id
        lsid_id = s.session_id["id"]
    assert list(coll.find()) == [{"_id": 1, "x": 5, "v": "a"}]
    assert _on_shard(cluster, primary, "rw") == []
    assert _on_shard(cluster, other, "rw") == [{"_id": 1, "x": 5, "v": "a"}]
    _assert_moved_events(events, lsid_id, txn_number)
    delete = next(e for e in events if e["operationType"] == "delete")
    insert = next(e for e in events if e["operationType"] == "insert")
    assert delete["documentKey"] == {"x": -5, "_id": 1}
    assert insert["fullDocument"] == {"_id": 1, "x": 5, "v": "a"}


def test_a_retried_statement_is_not_applied_again(cluster: ShardedCluster) -> None:
    coll, primary, other = _collection(cluster, "retry")
    coll.insert_one({"_id": 1, "x": -1})
    lsid = {"id": Binary(b"\x0b" * 16, 4)}
    cmd = {"update": "retry", "updates": [{"q": {"x": -1}, "u": {"$set": {"x": 1}}}],
           "lsid": lsid, "txnNumber": Int64(4), "ordered": True}
    first = _raw(_router_address(cluster), cmd)
    assert first["ok"] == 1 and first["n"] == 1 and first["nModified"] == 1
    # The same statement again: the old owner ran txnNumber 4 as a transaction
    # (TransactionParticipant::_beginOrContinueRetryableWrite).
    again = _raw(_router_address(cluster), cmd)
    assert again["n"] == 0
    assert again["writeErrors"][0]["code"] == 217
    assert "Cannot retry a retryable write that has been converted into a transaction" in \
        again["writeErrors"][0]["errmsg"]
    assert list(coll.find()) == [{"_id": 1, "x": 1}]
    assert _on_shard(cluster, primary, "retry") == []


def test_in_a_transaction_committed_and_aborted(cluster: ShardedCluster) -> None:
    coll, primary, other = _collection(cluster, "txn")
    coll.insert_many([{"_id": 1, "x": -1}, {"_id": 2, "x": -2}])
    client = coll.database.client
    with coll.watch() as stream:
        with client.start_session() as s:
            with s.start_transaction():
                r = coll.update_one({"x": -1}, {"$set": {"x": 1}}, session=s)
                assert (r.matched_count, r.modified_count) == (1, 1)
                # the transaction sees the move
                assert coll.find_one({"_id": 1}, session=s) == {"_id": 1, "x": 1}
                assert coll.find_one({"_id": 1}) == {"_id": 1, "x": -1}  # not outside it
            events = read_events(stream, 2)
            _assert_moved_events(events, s.session_id["id"], s._server_session.transaction_id)
        with client.start_session() as s:
            s.start_transaction()
            coll.update_one({"x": -2}, {"$set": {"x": 2}}, session=s)
            s.abort_transaction()
        assert read_events(stream, 1, timeout=2.0) == []
    assert sorted(coll.find(), key=lambda d: d["_id"]) == [{"_id": 1, "x": 1}, {"_id": 2, "x": -2}]
    assert _on_shard(cluster, other, "txn") == [{"_id": 1, "x": 1}]


def test_find_and_modify_changes_the_shard_key(cluster: ShardedCluster) -> None:
    coll, primary, other = _collection(cluster, "fam")
    coll.insert_one({"_id": 1, "x": -3})
    before = coll.find_one_and_update({"x": -3}, {"$set": {"x": 3}})
    assert before == {"_id": 1, "x": -3}
    after = coll.find_one_and_update({"x": 3}, {"$set": {"x": -4}},
                                     return_document=pymongo.ReturnDocument.AFTER)
    assert after == {"_id": 1, "x": -4}
    with coll.database.client.start_session() as s:
        with s.start_transaction():
            doc = coll.find_one_and_update({"x": -4}, {"$set": {"x": 4}}, session=s,
                                           return_document=pymongo.ReturnDocument.AFTER)
            assert doc == {"_id": 1, "x": 4}
    assert list(coll.find()) == [{"_id": 1, "x": 4}]
    assert _on_shard(cluster, other, "fam") == [{"_id": 1, "x": 4}]


def test_upsert_into_another_shard(cluster: ShardedCluster) -> None:
    coll, primary, other = _collection(cluster, "ups")
    r = coll.update_one({"x": -8}, {"$set": {"x": 8}}, upsert=True)
    assert r.matched_count == 0 and r.upserted_id is not None
    assert _on_shard(cluster, other, "ups") == [{"_id": r.upserted_id, "x": 8}]
    assert _on_shard(cluster, primary, "ups") == []


def test_neither_retryable_nor_in_a_transaction_is_refused(cluster: ShardedCluster) -> None:
    coll, primary, other = _collection(cluster, "plain")
    coll.insert_one({"_id": 1, "x": -6})
    plain = pymongo.MongoClient(cluster.uri, retryWrites=False).t.plain
    with pytest.raises(pymongo.errors.WriteError) as err:
        plain.update_one({"x": -6}, {"$set": {"x": 6}})
    assert err.value.code == 20
    assert err.value.details["errmsg"] == ("Must run update to shard key field in a "
                                           "multi-statement transaction or with retryWrites: true.")
    # also when the document would stay on its shard
    with pytest.raises(pymongo.errors.WriteError) as err:
        plain.update_one({"x": -6}, {"$set": {"x": -7}})
    assert err.value.code == 20
    with pytest.raises(pymongo.errors.WriteError) as err:
        plain.update_one({"x": -9}, {"$set": {"x": 9}}, upsert=True)
    assert err.value.code == 20 and "Cross-shard upserts" in err.value.details["errmsg"]
    assert list(coll.find()) == [{"_id": 1, "x": -6}]


def test_a_batch_of_two_gets_invalid_options(cluster: ShardedCluster) -> None:
    coll, primary, other = _collection(cluster, "batch")
    coll.insert_many([{"_id": 1, "x": -1}, {"_id": 2, "x": -2}])
    with pytest.raises(pymongo.errors.BulkWriteError) as err:
        coll.bulk_write([pymongo.UpdateOne({"x": -1}, {"$set": {"y": 1}}),
                         pymongo.UpdateOne({"x": -2}, {"$set": {"x": 2}})])
    e = err.value.details["writeErrors"][0]
    assert (e["index"], e["code"]) == (1, 72)
    assert "must be sent with write batch of size 1" in e["errmsg"]
    assert sorted(coll.find(), key=lambda d: d["_id"]) == [{"_id": 1, "x": -1, "y": 1},
                                                           {"_id": 2, "x": -2}]
