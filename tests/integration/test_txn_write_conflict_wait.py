"""Writes and reads outside transactions that meet another transaction's documents wait for it,
as mongod 8.0's ``writeConflictRetry`` and prepare-conflict waits do (shard/write_conflicts.py,
shard/prepare_conflicts.py); statements of transactions still fail at once with WriteConflict."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pymongo.errors import DuplicateKeyError, OperationFailure
from pymongo.read_concern import ReadConcern

from shardsim.testing import ShardedCluster
from txn_kit import hold_prepared


def _later(seconds: float, fn: Any, *args: Any) -> threading.Timer:
    t = threading.Timer(seconds, fn, args=args)
    t.start()
    return t


@pytest.mark.parametrize("end", ["commit", "abort"])
def test_plain_update_waits_for_the_open_transaction(end: str) -> None:
    """A plain update_one of a document an open transaction wrote gets no 112: it waits until the
    transaction ends, then applies to what it left (both increments after a commit)."""
    with ShardedCluster(shards=1) as c:
        client = c.client()
        coll = client.w.c
        coll.insert_many([{"_id": 1, "v": 0}, {"_id": 2, "v": 0}])
        s = client.start_session()
        s.start_transaction()
        coll.update_one({"_id": 1}, {"$inc": {"v": 1}}, session=s)
        # a document the transaction did not write does not wait
        start = time.monotonic()
        assert coll.update_one({"_id": 2}, {"$inc": {"v": 1}}).modified_count == 1
        assert time.monotonic() - start < 0.4
        timer = _later(1.0, s.commit_transaction if end == "commit" else s.abort_transaction)
        start = time.monotonic()
        res = coll.update_one({"_id": 1}, {"$inc": {"v": 10}})
        waited = time.monotonic() - start
        timer.join()
        assert res.modified_count == 1
        assert waited > 0.7
        assert coll.find_one({"_id": 1})["v"] == (11 if end == "commit" else 10)
        # delete_one and find_one_and_update wait the same way
        s2 = client.start_session()
        s2.start_transaction()
        coll.update_one({"_id": 2}, {"$set": {"t": 1}}, session=s2)
        timer = _later(0.8, s2.commit_transaction)
        doc = coll.find_one_and_update({"_id": 2}, {"$inc": {"v": 5}}, return_document=True)
        timer.join()
        assert doc == {"_id": 2, "v": 6, "t": 1}
        s3 = client.start_session()
        s3.start_transaction()
        coll.insert_one({"_id": 3, "v": 0}, session=s3)
        # a read does not see (nor wait for) an uncommitted insert: nothing to delete
        assert coll.delete_one({"_id": 3}).deleted_count == 0
        timer = _later(0.8, s3.commit_transaction)
        start = time.monotonic()
        with pytest.raises(DuplicateKeyError):  # the insert waited for the commit
            coll.insert_one({"_id": 3, "v": 9})
        assert time.monotonic() - start > 0.5
        timer.join()
        assert coll.find_one({"_id": 3}) == {"_id": 3, "v": 0}


def test_plain_update_many_and_max_time_ms() -> None:
    """update_many meeting a document of an open transaction waits for all of it; with maxTimeMS
    the write fails with MaxTimeMSExpired (50) instead of waiting for ever."""
    with ShardedCluster(shards=1) as c:
        client = c.client()
        coll = client.w.c
        coll.insert_many([{"_id": i, "v": 0} for i in range(5)])
        s = client.start_session()
        s.start_transaction()
        coll.update_one({"_id": 3}, {"$inc": {"v": 1}}, session=s)
        start = time.monotonic()
        reply = client.w.command("update", "c", maxTimeMS=400,
                                 updates=[{"q": {"_id": 3}, "u": {"$set": {"x": 1}}}])
        # the shard fails the batch; the router reports it per statement, as mongos does
        assert [e["code"] for e in reply["writeErrors"]] == [50], reply
        assert 0.3 < time.monotonic() - start < 5
        timer = _later(0.8, s.commit_transaction)
        res = coll.update_many({}, {"$inc": {"v": 1}})
        timer.join()
        assert res.modified_count == 5
        assert sorted(d["v"] for d in coll.find()) == [1, 1, 1, 1, 2]
        assert coll.count_documents({"x": 1}) == 0


def test_transaction_statement_still_fails_at_once() -> None:
    """A transaction writing a document another open transaction wrote fails at once with
    WriteConflict (112, TransientTransactionError)."""
    with ShardedCluster(shards=1) as c:
        client = c.client()
        coll = client.w.c
        coll.insert_one({"_id": 1, "v": 0})
        a, b = client.start_session(), client.start_session()
        a.start_transaction()
        coll.update_one({"_id": 1}, {"$inc": {"v": 1}}, session=a)
        b.start_transaction()
        start = time.monotonic()
        with pytest.raises(OperationFailure) as err:
            coll.update_one({"_id": 1}, {"$inc": {"v": 1}}, session=b)
        assert time.monotonic() - start < 0.5
        assert err.value.code == 112
        assert err.value.has_error_label("TransientTransactionError")
        b.abort_transaction()
        a.commit_transaction()
        assert coll.find_one({"_id": 1})["v"] == 1


def test_reads_of_a_prepared_document() -> None:
    """A causally consistent read (afterClusterTime) of a prepared document waits for the
    decision and returns the committed version; a read of an unprepared document of the same
    collection does not wait; a plain local read without afterClusterTime ignores the prepare
    (kIgnoreConflicts) and returns the version from before it at once."""
    with ShardedCluster(shards=2) as c:
        client = c.client()
        coll, primary, t, at = hold_prepared(c, client, extra=({"_id": -2, "x": -2, "v": 0},))
        start = time.monotonic()
        assert coll.find_one({"_id": 1})["v"] == 0  # no afterClusterTime: no wait
        assert coll.find_one({"_id": -2})["v"] == 0
        assert time.monotonic() - start < 0.5
        with client.start_session(causal_consistency=True) as cs:
            cs.advance_cluster_time({"clusterTime": at, "signature": {
                "hash": b"\x00" * 20, "keyId": 0}})
            cs.advance_operation_time(at)
            start = time.monotonic()
            assert coll.find_one({"_id": -2}, session=cs)["v"] == 0  # not prepared: no wait
            assert time.monotonic() - start < 0.5
            timer = _later(1.0, c.configure_fail_point, primary,
                           "hangBeforeWaitingForDecisionWriteConcern", "off")
            start = time.monotonic()
            doc = coll.find_one({"_id": 1}, session=cs)
            waited = time.monotonic() - start
        timer.join()
        t.join(30)
        assert doc["v"] == 1
        assert waited > 0.5


def test_plain_write_of_a_prepared_document_waits() -> None:
    """A plain update of a document of a prepared transaction waits for the decision, then
    applies to the committed version; a linearizable read waits too."""
    with ShardedCluster(shards=2) as c:
        client = c.client()
        coll, primary, t, _at = hold_prepared(c, client, extra=({"_id": -2, "x": -2, "v": 0},))
        timer = _later(1.0, c.configure_fail_point, primary,
                       "hangBeforeWaitingForDecisionWriteConcern", "off")
        start = time.monotonic()
        res = coll.update_one({"_id": 1, "x": 1}, {"$inc": {"v": 10}})
        waited = time.monotonic() - start
        timer.join()
        t.join(30)
        assert res.modified_count == 1
        assert waited > 0.5
        assert coll.find_one({"_id": 1})["v"] == 11
        assert coll.with_options(read_concern=ReadConcern("majority")).find_one(
            {"_id": -1})["v"] == 1
