"""What drivers met through the router and on shards (issue 31), on one in-process cluster
(``shardsim.testing.ShardedCluster``): each behaviour through the router on a sharded and an
unsharded collection, and directly on a shard, as mongod/mongos 8.0 answer."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure

DB = "drv"


@pytest.fixture(scope="module")
def cluster() -> Any:
    """Two shards; ``drv.sharded`` split on ``k`` at 0 over both, ``drv.plain`` unsharded."""
    from shardsim.testing import ShardedCluster
    with ShardedCluster(shards=2, seed=31) as c:
        client = c.client()
        client.admin.command("enableSharding", DB)
        primary = client.config.databases.find_one({"_id": DB})["primary"]
        other = next(s for s in c.shard_names if s != primary)
        client.admin.command("shardCollection", f"{DB}.sharded", key={"k": 1})
        client.admin.command("split", f"{DB}.sharded", middle={"k": 0})
        client.admin.command("moveChunk", f"{DB}.sharded", find={"k": 0}, to=other)
        c.primary_shard = primary
        yield c


@pytest.fixture(params=["sharded", "plain", "shard"])
def coll(request: Any, cluster: Any) -> Any:
    """A fresh collection of 7 documents ``{_id: i, k: i - 3, t: 100 + i, a: [..]}``: through
    the router (sharded or unsharded), or directly on the database's primary shard."""
    if request.param == "shard":
        client = pymongo.MongoClient(cluster.shard_address(cluster.primary_shard),
                                     directConnection=True)
        c = client[DB]["direct"]
    else:
        client = None
        c = cluster.client()[DB][request.param]
    c.delete_many({})
    c.insert_many([{"_id": i, "k": i - 3, "t": 100 + i, "a": [i, i + 1, i + 2]} for i in range(7)])
    yield c
    if client is not None:
        client.close()


@pytest.mark.parametrize("spec", [{"_id": 1}, {"_id": True}, {"_id": 1.0}])
def test_an_id_only_inclusion_returns_only_the_id(coll, spec):
    """``{_id: 1}`` is an inclusion projection (``projection_parser.cpp`` ``parseAndAnalyze``:
    ``idIncludedEntirely``), not an empty exclusion."""
    assert sorted(d["_id"] for d in coll.find({}, spec)) == list(range(7))
    assert all(set(d) == {"_id"} for d in coll.find({}, spec))
    assert coll.find_one({"_id": 2}, spec) == {"_id": 2}
    # _id with a $slice is still an inclusion; {_id: 1, t: 0} an exclusion
    assert coll.find_one({"_id": 2}, {"_id": 1, "a": {"$slice": 1}}) == {"_id": 2, "a": [2]}
    assert coll.find_one({"_id": 2}, {"_id": 1, "t": 0}) == {"_id": 2, "k": -1, "a": [2, 3, 4]}
    assert list(coll.aggregate([{"$match": {"_id": 2}}, {"$project": {"_id": 1}}])) == [{"_id": 2}]


def test_an_aggregate_with_batch_size_zero_returns_an_empty_first_batch(coll):
    """``cursor: {batchSize: 0}``: no documents in ``firstBatch``, a live cursor, then the
    documents on getMore (``run_aggregate.cpp``; mongos ``cluster_aggregation_planner.cpp``)."""
    db = coll.database
    reply = db.command({"aggregate": coll.name, "pipeline": [{"$sort": {"_id": 1}}],
                        "cursor": {"batchSize": 0}})
    assert reply["cursor"]["firstBatch"] == [] and reply["cursor"]["id"] != 0
    more = db.command({"getMore": reply["cursor"]["id"], "collection": coll.name})
    assert [d["_id"] for d in more["cursor"]["nextBatch"]] == list(range(7))
    assert more["cursor"]["id"] == 0
    # the same through a driver's helper
    assert [d["_id"] for d in coll.aggregate([{"$sort": {"_id": 1}}], batchSize=0)] == list(range(7))
    # an empty result too: an empty first batch and a cursor, exhausted on getMore
    reply = db.command({"aggregate": coll.name, "pipeline": [{"$match": {"_id": -1}}],
                        "cursor": {"batchSize": 0}})
    assert reply["cursor"]["firstBatch"] == [] and reply["cursor"]["id"] != 0
    more = db.command({"getMore": reply["cursor"]["id"], "collection": coll.name})
    assert more["cursor"]["nextBatch"] == [] and more["cursor"]["id"] == 0


@pytest.mark.parametrize("key", [0, 1, "", False, None, "$k", {"a": "$k"}])
def test_group_puts_id_first_and_keeps_a_false_constant_key(coll, key):
    """``$group`` output documents are ``{_id, <accumulators in spec order>}``
    (``DocumentSourceGroup``); a constant key such as ``0`` stays ``0``."""
    docs = list(coll.aggregate([{"$group": {"_id": key, "n": {"$sum": 1}, "t": {"$sum": "$t"}}},
                                {"$sort": {"_id": 1}}]))
    assert all(list(d) == ["_id", "n", "t"] for d in docs)
    if key is None or not isinstance(key, (str, dict)) or key == "":
        assert docs == [{"_id": key, "n": 7, "t": 721}]
        assert type(docs[0]["_id"]) is type(key)
    else:
        assert len(docs) == 7 and sum(d["n"] for d in docs) == 7


class _Txn:
    """Statements of one transaction sent as raw commands (the driver's own transaction API
    would drop the write concern: we send what a driver must not) on one explicit session,
    with transaction numbers above any the driver used on it (its sessions are pooled); the
    session is discarded afterwards (marked dirty), not reused by the driver."""

    _numbers = iter(range(1 << 20, 1 << 30))

    def __init__(self, coll: Any) -> None:
        self.coll = coll
        self.session = coll.database.client.start_session()
        self.number = next(self._numbers)

    def run(self, cmd: dict[str, Any], db: Any = None, **extra: Any) -> Any:
        """The reply of ``cmd`` as a statement, or the OperationFailure."""
        from bson.int64 import Int64
        body = {**cmd, "txnNumber": Int64(self.number), "autocommit": False, **extra}
        try:
            return (self.coll.database if db is None else db).command(body, session=self.session)
        except OperationFailure as exc:
            return exc

    def commit(self, **extra: Any) -> Any:
        return self.run({"commitTransaction": 1}, db=self.coll.database.client.admin, **extra)

    def close(self) -> None:
        self.session._server_session.mark_dirty()
        self.session.end_session()


def test_create_of_an_existing_collection_in_a_transaction_is_namespace_exists(coll):
    """Outside a transaction an identical create is a no-op; inside one mongod (and mongos,
    which surfaces the shard's error) answers NamespaceExists (48) and the transaction is
    aborted (``create_command.cpp``; ``catalog::checkIfNamespaceExists``)."""
    assert coll.database.command({"create": coll.name})["ok"] == 1.0
    txn = _Txn(coll)
    assert txn.run({"insert": coll.name, "documents": [{"_id": 100, "k": 100}]},
                   startTransaction=True)["ok"] == 1.0
    err = txn.run({"create": coll.name})
    assert isinstance(err, OperationFailure) and err.code == 48
    assert err.details["codeName"] == "NamespaceExists"
    assert err.details["errmsg"] == f"Collection {coll.full_name} already exists."
    assert "errorLabels" not in err.details
    # the next statement on the aborted participant (k < 0: the primary shard)
    after = txn.run({"insert": coll.name, "documents": [{"_id": 101, "k": -101}]})
    assert isinstance(after, OperationFailure) and after.code == 251
    commit = txn.commit()
    assert isinstance(commit, OperationFailure) and commit.code == 251
    txn.close()
    assert coll.count_documents({"_id": {"$gte": 100}}) == 0


@pytest.mark.parametrize("statement", ["first", "later"])
def test_a_write_concern_on_a_transaction_statement_is_invalid_options(coll, statement):
    """``validateWriteConcernForTransaction``: only commit/abort may carry a write concern in
    a transaction: InvalidOptions (72), on the first statement as on later ones."""
    txn = _Txn(coll)
    wc = {"writeConcern": {"w": 1}}
    insert = {"insert": coll.name, "documents": [{"_id": 200, "k": 200}]}
    if statement == "first":
        err = txn.run(insert, startTransaction=True, **wc)
    else:
        assert txn.run(insert, startTransaction=True)["ok"] == 1.0
        err = txn.run({"update": coll.name, "updates": [
            {"q": {"_id": 200, "k": 200}, "u": {"$set": {"x": 1}}}]}, **wc)
    assert isinstance(err, OperationFailure) and err.code == 72
    assert err.details["codeName"] == "InvalidOptions"
    assert err.details["errmsg"] == "writeConcern is not allowed within a multi-statement transaction"
    # an empty write concern is no write concern; commit may carry one
    if statement == "later":
        assert txn.run({"find": coll.name, "filter": {"_id": 200}})["ok"] == 1.0
        assert txn.run({"delete": coll.name, "deletes": [{"q": {"_id": 5, "k": 2}, "limit": 1}],
                        "writeConcern": {}})["ok"] == 1.0
        assert txn.commit(writeConcern={"w": "majority"})["ok"] == 1.0
        assert coll.find_one({"_id": 200}) is not None and coll.find_one({"_id": 5}) is None
    txn.close()


def test_max_time_ms_on_a_get_more_of_a_non_await_data_cursor_is_bad_value(coll, request):
    """getMore's maxTimeMS is the awaitData wait: on any other cursor BadValue (2), with
    mongod's message on a shard (getmore_cmd.cpp ``validateMaxTimeMS``) and mongos' through
    the router (cluster_find.cpp ``setUpOperationContextStateForGetMore``)."""
    db = coll.database
    cid = db.command({"find": coll.name, "batchSize": 2})["cursor"]["id"]
    with pytest.raises(OperationFailure) as exc:
        db.command({"getMore": cid, "collection": coll.name, "maxTimeMS": 1000})
    assert exc.value.code == 2
    if request.node.callspec.params["coll"] == "shard":
        assert exc.value.details["errmsg"] == \
            "cannot set maxTimeMS on getMore command for a non-awaitData cursor"
    else:
        assert exc.value.details["errmsg"] == \
            "maxTimeMS can only be used with getMore for tailable, awaitData cursors"


def test_a_cursor_reads_within_its_commands_max_time_ms(coll, monkeypatch):
    """The driver's timeoutMS becomes the find's maxTimeMS; mongod and mongos run the cursor's
    getMores within what the find left of it (getmore_cmd.cpp / cluster_find.cpp
    ``getLeftoverMaxTimeMicros``): a to_list() that uses it up ends with MaxTimeMSExpired (50),
    a timeout error for the driver. The accounting clock (in this process: the cluster is)
    moves 40 ms per reading, so a find with maxTimeMS 100 has time for about one getMore."""
    from pymongo.errors import ExecutionTimeout

    from shardsim.core import cursors
    now = [0.0]

    def clock() -> float:
        now[0] += 0.040
        return now[0]

    monkeypatch.setattr(cursors, "clock", clock)
    cursor = coll.find({}, batch_size=1, max_time_ms=100)
    with pytest.raises(ExecutionTimeout) as exc:
        cursor.to_list()
    assert exc.value.code == 50
    assert exc.value.timeout
    monkeypatch.undo()
    assert len(coll.find({}, batch_size=1, max_time_ms=100).to_list()) == 7


def test_an_empty_let_on_write_helpers_is_accepted(coll):
    """``let: {}`` binds no variable: every write helper runs as without it (issue 31 (9)
    reported 40414 "BSON field 'Collation.locale' is missing"; kept as a guard)."""
    from pymongo import UpdateOne
    assert coll.update_one({"_id": 1, "k": -2}, {"$set": {"u": 1}}, let={}).matched_count == 1
    assert coll.update_many({"_id": {"$lt": 3}}, {"$set": {"u": 2}}, let={}).matched_count == 3
    assert coll.replace_one({"_id": 2, "k": -1}, {"k": -1, "r": 1}, let={}).matched_count == 1
    assert coll.find_one_and_update({"_id": 3, "k": 0}, {"$set": {"f": 1}}, let={})["_id"] == 3
    assert coll.bulk_write([UpdateOne({"_id": 4, "k": 1}, {"$set": {"b": 1}})],
                           let={}).matched_count == 1
    assert coll.delete_one({"_id": 6, "k": 3}, let={}).deleted_count == 1
    assert coll.find_one_and_delete({"_id": 5, "k": 2}, let={})["_id"] == 5
    assert coll.delete_many({"_id": {"$gt": 100}}, let={}).deleted_count == 0
    assert coll.count_documents({}) == 5


MIB = 1024 * 1024


@pytest.fixture
def child_batches(monkeypatch) -> list[int]:
    """The encoded size (bytes) of every insert/update/delete child command the router sends
    to a shard in this test (the router runs in this process)."""
    import bson

    from shardsim.router import writes
    sizes: list[int] = []
    original = writes.WriteExecutor._child_command

    def recording(self, run):
        cmd = original(self, run)
        sizes.append(len(bson.encode(cmd)))
        return cmd

    monkeypatch.setattr(writes.WriteExecutor, "_child_command", recording)
    return sizes


def _big_docs(start: int, n: int = 20) -> list[dict[str, Any]]:
    """``n`` documents of 1 MiB each (20 MiB together: one OP_MSG from pymongo, whose limit is
    maxMessageSizeBytes 48,000,000), ``k`` on both sides of the split point."""
    return [{"_id": start + i, "k": (i % 2) * 2 - 1, "s": "x" * MIB} for i in range(n)]


@pytest.mark.parametrize("ordered", [True, False])
def test_an_insert_many_over_16_mib_is_split_into_batches_the_shards_accept(
        coll, ordered, child_batches):
    """pymongo sends 20 MiB of documents in one message (a document sequence up to 48 MB, which
    a shard accepts as mongod does); the router splits them into child batches of at most
    16 MiB of documents (``BatchWriteOp::targetBatch``, ``wouldMakeBatchesTooBig``) so every
    child command fits a shard's 16 MiB + 16 KiB command limit: everything is written."""
    docs = _big_docs(1000)
    assert len(coll.insert_many(docs, ordered=ordered).inserted_ids) == 20
    assert coll.count_documents({"_id": {"$gte": 1000}}) == 20
    assert coll.find_one({"_id": 1019})["s"] == "x" * MIB
    if coll.name != "direct":  # through the router
        assert len(child_batches) >= 2 and max(child_batches) <= 16 * MIB + 16 * 1024
        assert sum(child_batches) > 20 * MIB  # every document went in some child batch
    coll.delete_many({"_id": {"$gte": 1000}})


def test_bulk_writes_over_16_mib_are_split(coll, child_batches):
    """A collection ``bulk_write`` (insert, then update and replace commands) and a client
    ``bulkWrite`` (8.0's command, through the router only) over 16 MiB."""
    from pymongo import InsertOne, ReplaceOne, UpdateOne
    reqs: list[Any] = [InsertOne(d) for d in _big_docs(2000)]
    reqs += [UpdateOne({"_id": 2000 + i, "k": d["k"]}, {"$set": {"s": "y" * MIB}})
             for i, d in enumerate(_big_docs(2000))]
    reqs += [ReplaceOne({"_id": 2000 + i, "k": d["k"]}, {"k": d["k"], "s": "z" * MIB})
             for i, d in enumerate(_big_docs(2000))]
    res = coll.bulk_write(reqs, ordered=False)
    assert (res.inserted_count, res.matched_count, res.modified_count) == (20, 40, 40)
    assert coll.count_documents({"_id": {"$gte": 2000}, "s": "z" * MIB}) == 20
    if coll.name != "direct":
        assert len(child_batches) >= 3 and max(child_batches) <= 16 * MIB + 16 * 1024
    coll.delete_many({"_id": {"$gte": 2000}})
    if coll.name == "direct":
        return
    child_batches.clear()
    client = coll.database.client
    res = client.bulk_write([InsertOne(d, namespace=coll.full_name) for d in _big_docs(3000)])
    assert res.inserted_count == 20
    assert coll.count_documents({"_id": {"$gte": 3000}}) == 20
    assert max(child_batches) <= 16 * MIB + 16 * 1024 and len(child_batches) >= 2
    coll.delete_many({"_id": {"$gte": 3000}})


def test_an_insert_many_over_16_mib_in_a_transaction(coll, child_batches):
    """The same split inside a transaction: every child batch is a statement of it, and the
    commit makes all 20 documents visible at once."""
    client = coll.database.client
    with client.start_session() as s:
        with s.start_transaction():
            coll.insert_many(_big_docs(4000), session=s)
            assert coll.count_documents({"_id": {"$gte": 4000}}) == 0
    assert coll.count_documents({"_id": {"$gte": 4000}}) == 20
    if coll.name != "direct":
        assert len(child_batches) >= 2 and max(child_batches) <= 16 * MIB + 16 * 1024
    coll.delete_many({"_id": {"$gte": 4000}})


def test_a_single_document_over_16_mib_is_refused_alone(coll):
    """A document over 16 MiB (but within the 16 MiB + 16 KiB a command may have) goes to the
    shard alone and is refused there (``fixDocumentForInsert``: BadValue 2 "object to insert
    too large"); the other documents of an unordered insert are written. pymongo would refuse
    it before sending (DocumentTooLarge), so the command is sent as such."""
    huge = {"_id": 5000, "k": 1, "s": "h" * (16 * MIB - 10)}
    import bson
    size = len(bson.encode(huge))
    reply = coll.database.command({"insert": coll.name, "ordered": False,
                                   "documents": [{"_id": 5001, "k": -1}, huge,
                                                 {"_id": 5002, "k": 1}]})
    assert reply["n"] == 2
    assert reply["writeErrors"] == [{"index": 1, "code": 2, "errmsg":
                                     f"object to insert too large. size in bytes: {size}, "
                                     f"max size: {16 * MIB}"}]
    assert coll.count_documents({"_id": {"$gte": 5000}}) == 2
    coll.delete_many({"_id": {"$gte": 5000}})


def _start_on_both_sides(coll) -> _Txn:
    """A transaction with one document on each side of the split point (two participants
    when the collection is sharded)."""
    txn = _Txn(coll)
    assert txn.run({"insert": coll.name, "documents": [{"_id": 300, "k": -300}]},
                   startTransaction=True)["ok"] == 1.0
    assert txn.run({"insert": coll.name, "documents": [{"_id": 301, "k": 301}]})["ok"] == 1.0
    return txn


def _assert_aborted_everywhere(txn: _Txn, coll) -> None:
    """Statements on both participants and the commit get NoSuchTransaction (251) with
    TransientTransactionError; nothing of the transaction was written."""
    for k in (-300, 301):
        after = txn.run({"find": coll.name, "filter": {"k": k}})
        assert isinstance(after, OperationFailure) and after.code == 251, after
        assert after.details["errorLabels"] == ["TransientTransactionError"]
    commit = txn.commit()
    assert isinstance(commit, OperationFailure) and commit.code == 251
    assert "TransientTransactionError" in commit.details["errorLabels"]
    txn.close()
    assert coll.count_documents({"_id": {"$gte": 300, "$lt": 400}}) == 0


@pytest.mark.parametrize("failure", ["command error", "write error"])
def test_a_failed_statement_aborts_the_transaction_on_every_participant(coll, failure):
    """A statement of a transaction that fails aborts the transaction: on a shard, mongod's
    ``invokeWithSessionCheckedOut`` aborts it for any failed statement (reads too); through
    the router, mongos' ``implicitlyAbortTransaction`` (``transaction_router.cpp``, from
    ``invokeInTransactionRouter`` and ``ClusterWriteCmd::runImpl``) sends abortTransaction to
    every participant, so a participant the failure never reached is aborted as well. The
    error keeps its own labels (none for these); later statements and the commit get
    NoSuchTransaction (251) with TransientTransactionError, and nothing is written."""
    txn = _start_on_both_sides(coll)
    if failure == "command error":  # fails on the k < 0 shard only
        err = txn.run({"find": coll.name, "filter": {"k": -300, "$foo": 1}})
        assert isinstance(err, OperationFailure) and err.code == 2
    else:
        err = txn.run({"insert": coll.name, "documents": [{"_id": 0, "k": -3}]})
        assert isinstance(err, OperationFailure) and err.code == 11000
    assert "TransientTransactionError" not in (err.details.get("errorLabels") or [])
    _assert_aborted_everywhere(txn, coll)


def test_a_write_error_of_the_router_aborts_the_transaction(cluster):
    """An upsert the router cannot target (ShardKeyNotFound 61, a write error no shard saw)
    aborts the transaction on both shards: a reply with ``writeErrors`` makes mongos'
    ``ClusterWriteCmd::runImpl`` call ``implicitlyAbortTransaction``."""
    coll = cluster.client()[DB]["sharded"]
    coll.delete_many({})
    txn = _start_on_both_sides(coll)
    reply = txn.run({"update": coll.name, "updates": [
        {"q": {"_id": 302}, "u": {"$set": {"x": 1}}, "upsert": True}]})
    assert reply["ok"] == 1.0 and reply["writeErrors"][0]["code"] == 61
    _assert_aborted_everywhere(txn, coll)


def test_retryable_errors_leave_the_transaction_open():
    """mongos does not abort on the errors it may retry (``invokeInTransactionRouter``: the
    SnapshotError and NeedRetargettingError categories, StaleDbVersion, WouldChangeOwningShard,
    ShardCannotRefreshDueToLocksHeld, ShardInvalidatedForTargeting); any other error aborts."""
    from shardsim.router.commands.transactions import _aborts_transaction
    for code in (13388, 150, 239, 246, 249, 283):
        assert not _aborts_transaction(code), code
    for code in (2, 11000, 61, 50, 112, 251, 6, 9001):
        assert _aborts_transaction(code), code


WORDS = ["b", "A", "a", "B", "ä", "10", "9", "2", "a-b", "ab", "Résumé", "resume"]


@pytest.fixture
def words(coll) -> Any:
    """``coll`` plus documents ``{_id: 500 + i, k: ±i, w}`` for :data:`WORDS` (both sides of
    the split point of the sharded collection)."""
    coll.insert_many([{"_id": 500 + i, "k": i if i % 2 else -i, "w": w}
                      for i, w in enumerate(WORDS)])
    yield coll
    coll.delete_many({"_id": {"$gte": 500}})


def _ws(cursor) -> list[str]:
    return [d["w"] for d in cursor]


def test_icu_collation_orders_and_compares_as_the_locale(words):
    """A collation is an ICU collator (``collator_factory_icu.cpp``): ``en`` sorts lower case
    before upper case and diacritics after the base letter (not code point order), on one
    shard, and merged by the router over two; ``numericOrdering`` compares digit runs as
    numbers; strength 1 and 2 make case (and diacritics) equal; ``alternate: shifted``
    ignores punctuation; ``$regex`` ignores the collation, as mongod's."""
    letters = {"w": {"$in": ["b", "A", "a", "B", "ä"]}}
    en = {"locale": "en"}
    assert _ws(words.find(letters, collation=en).sort("w", 1)) == ["a", "A", "ä", "b", "B"]
    assert _ws(words.find(letters, collation=en).sort("w", -1)) == ["B", "b", "ä", "A", "a"]
    assert _ws(words.find(letters).sort("w", 1)) == ["A", "B", "a", "b", "ä"]  # binary
    assert _ws(words.aggregate([{"$match": letters}, {"$sort": {"w": 1}}], collation=en)) \
        == ["a", "A", "ä", "b", "B"]
    numbers = {"w": {"$in": ["10", "9", "2"]}}
    assert _ws(words.find(numbers, collation={"locale": "en", "numericOrdering": True})
               .sort("w", 1)) == ["2", "9", "10"]
    assert _ws(words.find(numbers, collation=en).sort("w", 1)) == ["10", "2", "9"]
    assert words.count_documents({"w": "a"}, collation={"locale": "en", "strength": 2}) == 2
    assert words.count_documents({"w": "RESUME"}, collation={"locale": "fr", "strength": 1}) == 2
    assert words.count_documents({"w": "RESUME"}, collation={"locale": "fr", "strength": 2}) == 1
    assert words.count_documents({"w": {"$gt": "a", "$lt": "b"}}, collation=en) >= 3  # A, ä, ab
    assert words.count_documents({"w": "ab"}, collation={"locale": "en",
                                                        "alternate": "shifted"}) == 2
    assert words.count_documents({"w": {"$regex": "^a"}}, collation={"locale": "en",
                                                                    "strength": 1}) == 3
    assert sorted(words.distinct("w", {"w": {"$in": ["a", "A", "ä"]}},
                                 collation={"locale": "en", "strength": 1})) in (["a"], ["A"],
                                                                                 ["ä"])
    assert _ws(words.find({"w": {"$in": ["a", "A"]}},
                          collation={"locale": "en", "caseFirst": "upper"}).sort("w", 1)) \
        == ["A", "a"]


@pytest.mark.parametrize("spec, code, msg", [
    ({"locale": "xx"}, 2, "Field 'locale' is invalid in: { locale: \"xx\" }"),
    ({"locale": "en_XX"}, 2, "Field 'locale' is invalid in: { locale: \"en_XX\" }. "
                             "Did you mean 'en'?"),
    ({"locale": "simple", "strength": 2}, 9, "If locale=simple, no other fields should be "
                                             "present in: { locale: \"simple\", strength: 2 }"),
    ({"locale": "en", "strength": 1, "backwards": True}, 2,
     "'backwards' is invalid with 'strength' of 1 in: "
     "{ locale: \"en\", strength: 1, backwards: true }"),
])
def test_a_bad_collation_is_refused_as_mongod_refuses_it(coll, spec, code, msg):
    """``CollatorFactoryICU::makeFromBSON``: an unknown locale (with the locale ICU would use
    as a hint), ``simple`` with options, options that cannot go together."""
    with pytest.raises(OperationFailure) as exc:
        coll.find_one({"k": 1}, collation=spec)
    assert exc.value.code == code and exc.value.details["errmsg"] == msg


def test_where_runs_javascript_on_each_document(coll):
    """``$where`` (``expression_where.cpp``): a source string is the body of a function
    returning it, a function source is called; ``this`` and ``obj`` are the document; it may
    sit under ``$or``/``$and`` beside other clauses."""
    from bson.code import Code
    assert sorted(d["_id"] for d in coll.find({"$where": "this.t > 104"})) == [5, 6]
    assert sorted(d["_id"] for d in coll.find(
        {"$where": Code("function() { return obj.a.length == 3 && this.k < -1; }")})) == [0, 1]
    assert sorted(d["_id"] for d in coll.find(
        {"$or": [{"_id": 0}, {"$where": "this.t % 2 == 1 && this.k > 0"}]})) == [0, 5]
    assert coll.count_documents({"k": {"$gte": 0}, "$where": "this.t < 104"}) == 1
    assert [d["_id"] for d in coll.find({"$where": "this._id.toString() == '2'"})] == [2]


def test_function_expression_returns_bson(coll):
    """``$function`` (``expression_function.cpp``): ``args`` evaluated per document, numbers
    come back as doubles, dates and ObjectIds as themselves; usable in ``$expr``."""
    import datetime
    out = list(coll.aggregate([
        {"$match": {"_id": {"$lt": 3}}}, {"$sort": {"_id": 1}},
        {"$project": {"d": {"$function": {"body": "function(t, a) { return t * 2 + a.length; }",
                                          "args": ["$t", "$a"], "lang": "js"}},
                      "when": {"$function": {"body": "function(x) { return new Date(x); }",
                                             "args": [86400000], "lang": "js"}}}}]))
    assert out == [{"_id": i, "d": float((100 + i) * 2 + 3),
                    "when": datetime.datetime(1970, 1, 2)} for i in range(3)]
    assert type(out[0]["d"]) is float
    assert sorted(d["_id"] for d in coll.find({"$expr": {"$function": {
        "body": "function(k) { return k == 2 || k == -2; }", "args": ["$k"], "lang": "js"}}})) \
        == [1, 5]


@pytest.mark.parametrize("spec, code", [
    ({"body": "function() { return 1; }", "args": [], "lang": "py"}, 31419),
    ({"body": "function() { return 1; }", "args": []}, 31418),
    ({"args": [], "lang": "js"}, 31261),
    ({"body": 5, "args": [], "lang": "js"}, 31262),
    ({"body": "function() { return 1; }", "args": "$t", "lang": "js"}, 31266),
    ("function() {}", 31260),
])
def test_a_malformed_function_expression_is_refused(coll, spec, code):
    with pytest.raises(OperationFailure) as exc:
        list(coll.aggregate([{"$project": {"x": {"$function": spec}}}]))
    assert exc.value.code == code


def test_javascript_errors_and_limits(coll):
    """A JS exception or syntax error is JSInterpreterFailure (139) with the engine's message
    (a syntax error also on an empty result, at parse time); a function running past
    ``maxTimeMS`` is MaxTimeMSExpired (50); the heap is bounded (139 "out of memory")."""
    from pymongo.errors import ExecutionTimeout
    with pytest.raises(OperationFailure) as exc:
        coll.find_one({"$where": "this.nothing.deeper == 1"})
    assert exc.value.code == 139
    assert exc.value.details["codeName"] == "JSInterpreterFailure"
    assert exc.value.details["errmsg"].startswith("TypeError: cannot read property 'deeper'")
    with pytest.raises(OperationFailure) as exc:
        coll.find_one({"_id": -1, "$where": "function( {"})
    assert exc.value.code == 139 and "SyntaxError" in exc.value.details["errmsg"]
    with pytest.raises(ExecutionTimeout) as exc:
        coll.find_one({"$where": "function() { while (true) {} }"}, max_time_ms=300)
    assert exc.value.code == 50
    with pytest.raises(OperationFailure) as exc:
        list(coll.aggregate([{"$limit": 1}, {"$project": {"x": {"$function": {
            "body": "function() { var a = []; while (true) a.push(new Array(1e5).fill(1)); }",
            "args": [], "lang": "js"}}}}]))
    assert exc.value.code == 139 and "out of memory" in exc.value.details["errmsg"]


def test_with_scripting_off_javascript_is_refused(coll, monkeypatch):
    """``--noscripting`` (``security.javascriptEnabled: false``): ``$where`` is 6108304 "no
    globalScriptEngine in $where parsing" (``JsFunction::_init``), ``$function`` 31264
    (``ExpressionContext::getJsExecWithScope``)."""
    from shardsim.core import javascript
    monkeypatch.setattr(javascript, "_enabled", False)
    with pytest.raises(OperationFailure) as exc:
        coll.find_one({"$where": "true"})
    assert exc.value.code == 6108304
    assert exc.value.details["errmsg"] == "no globalScriptEngine in $where parsing"
    with pytest.raises(OperationFailure) as exc:
        list(coll.aggregate([{"$project": {"x": {"$function": {
            "body": "function() { return 1; }", "args": [], "lang": "js"}}}}]))
    assert exc.value.code == 31264
    assert exc.value.details["errmsg"] == ("Cannot run server-side javascript without the "
                                           "javascript engine enabled")


def test_fsync_on_a_shard_and_through_the_router(cluster):
    """``fsync`` (``fsync.cpp``; mongos' ``cluster_fsync_cmd.cpp``): ``{numFiles: 1}`` on a
    shard, ``{numFiles: <sum>, all: {<shard>: reply}}`` through the router; admin only (13);
    ``lock: true`` is not built (238)."""
    router = cluster.client()
    reply = router.admin.command("fsync")
    assert reply["numFiles"] == len(cluster.shard_names)
    assert sorted(reply["all"]) == sorted(cluster.shard_names)
    assert all(r["numFiles"] == 1 and r["ok"] == 1.0 for r in reply["all"].values())
    with pymongo.MongoClient(cluster.shard_address(cluster.primary_shard),
                             directConnection=True) as shard:
        assert shard.admin.command("fsync")["numFiles"] == 1
        for client in (router, shard):
            with pytest.raises(OperationFailure) as exc:
                client[DB].command("fsync")
            assert exc.value.code == 13
        with pytest.raises(OperationFailure) as exc:
            shard.admin.command("fsync", lock=True)
        assert exc.value.code == 238


def test_what_pymongos_own_tests_met(coll):
    """Fixes from running pymongo's collection/cursor/database/bulk/session/transaction tests
    against the kit: an empty collation is no collation (mongod checks ``isEmpty()``);
    ``$where`` with Code with scope is "$where got bad type" (2, 4.4+); the shell's
    ``sleep()`` exists and ends at maxTimeMS (50); getMore takes a snapshot session's
    readConcern (``getmore_cmd.cpp``: the cursor's own applies); a bad
    ``partialFilterExpression`` is refused (14, 2)."""
    from bson.code import Code
    from pymongo.errors import ExecutionTimeout
    assert coll.count_documents({"k": 0}, collation={}) == 1
    assert coll.delete_many({"_id": -5}, collation={}).deleted_count == 0
    for code in (Code("this.k < 0", {}), Code("this.k < i", {"i": 3})):
        with pytest.raises(OperationFailure) as exc:
            coll.find_one({"$where": code})
        assert exc.value.code == 2 and exc.value.details["errmsg"] == "$where got bad type"
    with pytest.raises(ExecutionTimeout):
        coll.find_one({"$where": "function() { sleep(5000); return true; }"}, max_time_ms=200)
    with coll.database.client.start_session(snapshot=True) as s:
        assert len(list(coll.find({}, batch_size=2, session=s))) == 7
        assert len(list(coll.aggregate([{"$sort": {"_id": 1}}], batchSize=2, session=s))) == 7
    for pfe, code in ((5, 14), ({"x": {"$asdasd": 3}}, 2), ({"$and": 5}, 2)):
        with pytest.raises(OperationFailure) as exc:
            coll.create_index("x", partialFilterExpression=pfe)
        assert exc.value.code == code


def test_out_and_merge_are_refused_in_a_transaction(coll):
    """``Pipeline::validateCommon``: OperationNotSupportedInTransaction (263) "Stage not
    supported inside of a multi-document transaction: $out"."""
    txn = _Txn(coll)
    assert txn.run({"find": coll.name, "filter": {}}, startTransaction=True)["ok"] == 1.0
    for stage in ({"$out": "out_in_txn"}, {"$merge": {"into": "out_in_txn"}}):
        err = txn.run({"aggregate": coll.name, "pipeline": [stage], "cursor": {}})
        assert isinstance(err, OperationFailure) and err.code == 263
        name = next(iter(stage))
        assert err.details["errmsg"] == \
            f"Stage not supported inside of a multi-document transaction: {name}"
    txn.close()


def test_accumulator_runs_javascript_per_group(coll):
    """``$accumulator`` (``accumulator_js_reduce.cpp``): ``init(...initArgs)`` per group,
    ``accumulate(state, ...accumulateArgs)`` per document, ``finalize(state)``; beside
    mongomock's accumulators in the specification's order; mongod's parse errors."""
    avg = {"init": "function() { return {c: 0, t: 0}; }",
           "accumulate": "function(st, t) { return {c: st.c + 1, t: st.t + t}; }",
           "accumulateArgs": ["$t"],
           "merge": "function(a, b) { return {c: a.c + b.c, t: a.t + b.t}; }",
           "finalize": "function(st) { return st.t / st.c; }", "lang": "js"}
    out = list(coll.aggregate([
        {"$group": {"_id": {"$cond": [{"$lt": ["$k", 0]}, "neg", "pos"]},
                    "n": {"$sum": 1}, "avg": {"$accumulator": avg},
                    "ids": {"$accumulator": {
                        "init": "function(first) { return [first]; }", "initArgs": ["start"],
                        "accumulate": "function(st, i) { st.push(i); return st; }",
                        "accumulateArgs": ["$_id"],
                        "merge": "function(a, b) { return a.concat(b); }", "lang": "js"}}}},
        {"$sort": {"_id": 1}}]))
    assert [list(d) for d in out] == [["_id", "n", "avg", "ids"]] * 2
    assert [(d["_id"], d["n"], d["avg"]) for d in out] == [("neg", 3, 101.0), ("pos", 4, 104.5)]
    assert [sorted(d["ids"][1:]) for d in out] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0, 6.0]]
    assert all(d["ids"][0] == "start" for d in out)
    for spec, code in (("x", 4544703), ({**avg, "lang": "py"}, 4544705),
                       ({**avg, "extra": 1}, 4544706),
                       ({k: v for k, v in avg.items() if k != "merge"}, 4544709),
                       ({k: v for k, v in avg.items() if k != "accumulateArgs"}, 4544710),
                       ({**avg, "accumulateArgs": "$t"}, 4544712)):
        with pytest.raises(OperationFailure) as exc:
            list(coll.aggregate([{"$group": {"_id": None, "a": {"$accumulator": spec}}}]))
        assert exc.value.code == code, spec


def test_map_reduce_inline_and_into_a_collection(coll):
    """``mapReduce``: ``emit`` from ``map`` (``this`` the document), ``reduce`` for keys
    emitted more than once, ``finalize``, ``scope`` globals, ``query``; inline ``{results:
    [{_id, value}]}`` in ``_id`` order or a replaced output collection (``{result}``)."""
    from bson.code import Code
    db = coll.database
    cmd = {"mapReduce": coll.name, "map": Code("function() { emit(this.k < 0, this.t); }"),
           "reduce": Code("function(key, values) { return Array.sum(values); }"),
           "out": {"inline": 1}}
    assert db.command(cmd)["results"] == [{"_id": False, "value": 418.0},
                                          {"_id": True, "value": 303.0}]
    out = db.command({**cmd, "query": {"k": {"$gte": 3}}, "scope": {"bonus": 10},
                      "finalize": "function(key, v) { return v + bonus; }"})["results"]
    assert out == [{"_id": False, "value": 116.0}]  # one emit: not reduced, finalized
    name = f"mr_{coll.name}"
    reply = db.command({**cmd, "out": name})
    assert reply["result"] == name
    assert list(db[name].find().sort("_id", 1)) == [{"_id": False, "value": 418.0},
                                                     {"_id": True, "value": 303.0}]
    assert db.command({**cmd, "out": {"replace": name}})["result"] == name
    assert db[name].count_documents({}) == 2
    db.drop_collection(name)
    with pytest.raises(OperationFailure) as exc:
        db.command({"mapReduce": coll.name, "map": "function() {}", "out": {"inline": 1}})
    assert exc.value.code == 40414
