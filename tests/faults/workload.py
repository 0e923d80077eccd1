"""The mixed workload of the kill trials (issue 28): several writers through the router at
once, each on its own ``_id`` range (writer ``k`` writes ``k * WRITER_SPAN + i``), recording
what was acknowledged and what is ambiguous in one :class:`.checkers.Observed`:

* writer 0, :func:`inserts_and_incs`: ``insert {_id: i, seq: i}`` then ``$inc n`` on it; or,
  in the ``router-bulkwrite`` role, :func:`bulk_inserts_and_incs`: the same writes in ordered
  batches, through ``bulkWrite`` (``MongoClient.bulk_write``) or ``insert``/``update``
  commands (``Collection.bulk_write``) as the seed chooses;
* writer 1, :func:`inserts_and_deletes`: inserts, and deletes every other document it
  inserted;
* writer 2, :func:`transactions`: small transactions inserting two documents (the hashed
  ``_id`` puts them on two shards about half the time), one commit each.

Every client uses retryable writes (the driver retries a failed write once, with the same
``lsid``/``txnNumber``: the cluster must apply it at most once).
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pymongo
from pymongo import InsertOne, UpdateOne, monitoring
from pymongo.errors import BulkWriteError, PyMongoError

from .checkers import WRITER_SPAN, Observed

DELETER = 1 * WRITER_SPAN
TRANSACTOR = 2 * WRITER_SPAN
BATCH = 20  # writes of each kind in one bulk of the router-bulkwrite role


def inserts_and_incs(coll: Any, ops: int, o: Observed) -> None:
    """Writer 0: for each ``i < ops``, insert then ``$inc``; an acknowledged ``$inc`` that
    matched no document is noted apart."""
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


def _bulk(client: pymongo.MongoClient, coll: Any, ids: list[int], api: str) -> int:
    """One ordered bulk: insert each of ``ids``, then ``$inc`` each; returns matched count."""
    if api == "bulkWrite":
        from pymongo.operations import InsertOne as CInsert, UpdateOne as CUpdate
        ns = coll.full_name
        models: list[Any] = [CInsert(namespace=ns, document={"_id": i, "seq": i}) for i in ids]
        models += [CUpdate(namespace=ns, filter={"_id": i}, update={"$inc": {"n": 1}})
                   for i in ids]
        return client.bulk_write(models, ordered=True).matched_count
    reqs: list[Any] = [InsertOne({"_id": i, "seq": i}) for i in ids]
    reqs += [UpdateOne({"_id": i}, {"$inc": {"n": 1}}) for i in ids]
    return coll.bulk_write(reqs, ordered=True).matched_count


def bulk_inserts_and_incs(client: pymongo.MongoClient, coll: Any, ops: int, o: Observed,
                          api: str, notes: list[str]) -> None:
    """Writer 0 of ``router-bulkwrite``: ``ops`` documents in ordered batches of
    :data:`BATCH` inserts then :data:`BATCH` ``$inc``\\ s (``api``: ``"bulkWrite"`` or
    ``"insert_many"``). A batch that raised (after the driver's own retry) leaves its writes
    ambiguous; the client then inserts the batch's documents once more with ``ordered:
    false``: a duplicate key there means the first attempt applied it (so the document is
    known to be there: acknowledged), any other error leaves it ambiguous. Its ``$inc``\\ s
    are not re-sent (they stay ambiguous: at most once)."""
    for start in range(0, ops, BATCH):
        ids = list(range(start, min(ops, start + BATCH)))
        try:
            matched = _bulk(client, coll, ids, api)
            o.acked_inserts.update(ids)
            # each $inc matches its just-inserted document: fewer means some were not applied
            (o.acked_incs if matched == len(ids) else o.ambiguous_incs).update(ids)
            continue
        except PyMongoError as exc:
            notes.append(f"batch {start}: {type(exc).__name__}")
            if any(e.get("code") == 11000 for e in _write_errors(exc)):
                notes.append("duplicate key in a retried batch")
        o.ambiguous_incs.update(ids)
        try:
            coll.insert_many([{"_id": i, "seq": i} for i in ids], ordered=False)
            o.acked_inserts.update(ids)
        except BulkWriteError as exc:
            failed = {ids[e["index"]] for e in exc.details.get("writeErrors", [])
                      if e.get("code") != 11000}
            o.acked_inserts.update(set(ids) - failed)
            o.ambiguous_inserts.update(failed)
        except PyMongoError:
            o.ambiguous_inserts.update(ids)


def _write_errors(exc: BaseException) -> list[dict[str, Any]]:
    details = getattr(exc, "details", None) or {}
    errs = details.get("writeErrors") if isinstance(details, dict) else None
    return list(errs or getattr(exc, "write_errors", None) or [])


def inserts_and_deletes(coll: Any, ops: int, o: Observed) -> None:
    """Writer 1: insert ``DELETER + i``; delete it again when ``i`` is even."""
    for i in range(ops):
        _id = DELETER + i
        try:
            coll.insert_one({"_id": _id, "seq": i})
            o.acked_inserts.add(_id)
        except PyMongoError:
            o.ambiguous_inserts.add(_id)
        if i % 2:
            continue
        try:
            res = coll.delete_one({"_id": _id})
            (o.acked_deletes if res.deleted_count else o.acked_noop_deletes).add(_id)
        except PyMongoError:
            o.ambiguous_deletes.add(_id)


def transactions(client: pymongo.MongoClient, coll: Any, ops: int, o: Observed) -> None:
    """Writer 2: ``ops`` transactions, each inserting ``TRANSACTOR + 2i`` and ``+ 2i + 1``
    and committing once (the driver retries the commit itself). Committed: both
    acknowledged; any error: the pair is ambiguous (all or nothing)."""
    for i in range(ops):
        pair = (TRANSACTOR + 2 * i, TRANSACTOR + 2 * i + 1)
        try:
            with client.start_session() as s:
                s.start_transaction()
                for _id in pair:
                    coll.insert_one({"_id": _id, "seq": i}, session=s)
                s.commit_transaction()
            o.acked_txns.append(pair)
            o.acked_inserts.update(pair)
        except PyMongoError:
            o.ambiguous_txns.append(pair)
            o.ambiguous_inserts.update(pair)


class FailedAttempts(monitoring.CommandListener):
    """Counts writer 0's write commands that failed on the wire (each one the driver then
    retried, or reported): the evidence that a kill landed in the middle of a batch."""

    def __init__(self) -> None:
        self.count = 0

    def started(self, event: Any) -> None:
        pass

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:  # type: ignore[override]
        if event.command_name in ("insert", "update", "bulkWrite"):
            self.count += 1


class Workload:
    """The writers of one trial on ``faults.<name>`` through ``uri``: :meth:`start` them,
    :meth:`join` them (bounded). ``bulk_api`` (``"bulkWrite"``/``"insert_many"``) turns writer
    0 into the batch writer. Writers 1 and 2 write ``ops // 3`` and ``ops // 10`` times;
    ``transactions=False`` leaves writer 2 out."""

    def __init__(self, uri: str, db: str, name: str, ops: int, o: Observed,
                 bulk_api: str | None = None, notes: list[str] | None = None,
                 transactions: bool = True) -> None:
        self.attempts = FailedAttempts()
        self.notes = notes if notes is not None else []
        self.bulk_api = bulk_api
        self.clients = [pymongo.MongoClient(uri, retryWrites=True, serverSelectionTimeoutMS=20000,
                                            socketTimeoutMS=10000, heartbeatFrequencyMS=500,
                                            event_listeners=[self.attempts] if k == 0 else [])
                        for k in range(3)]
        colls = [c[db][name] for c in self.clients]
        first: tuple[Any, ...] = (inserts_and_incs, colls[0], ops, o)
        if bulk_api:
            first = (bulk_inserts_and_incs, self.clients[0], colls[0], ops, o, bulk_api,
                     notes if notes is not None else [])
        self.threads = [
            threading.Thread(target=first[0], args=first[1:], daemon=True),
            threading.Thread(target=inserts_and_deletes, args=(colls[1], max(1, ops // 3), o),
                             daemon=True),
            threading.Thread(target=globals()["transactions"],
                             args=(self.clients[2], colls[2], max(1, ops // 10), o),
                             daemon=True)]
        if not transactions:  # writer 2 left out (its client stays unused)
            self.threads.pop()

    def start(self) -> "Workload":
        for t in self.threads:
            t.start()
        return self

    def join(self, timeout_s: float = 120.0) -> list[str]:
        """Wait for every writer (``timeout_s`` in all); the notes of those still running."""
        import time
        end = time.time() + timeout_s
        for t in self.threads:
            t.join(max(0.0, end - time.time()))
        for c in self.clients:
            c.close()
        if self.bulk_api:
            self.notes.append(f"failed batch commands {self.attempts.count}")
        return [f"writer {k} did not finish in {timeout_s:.0f} s"
                for k, t in enumerate(self.threads) if t.is_alive()]


def bulk_api(rng: random.Random) -> str:
    """The batch API of a ``router-bulkwrite`` trial."""
    return rng.choice(("bulkWrite", "insert_many"))
