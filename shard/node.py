"""The shard process (``mongod --shardsvr`` as a one-member replica-set primary).

:class:`ShardNode` owns the storage (:mod:`shard.storage`), the oplog and pre-images
(:mod:`shard.oplog`), transactions and retryable-write history (:mod:`shard.sessions`), and
the optional SQLite store (:mod:`shard.durable`). The command handlers are module-level
functions in :mod:`shard.commands`, one family per module (crud, reads, ddl, catalog,
transactions, internal), installed by ``ShardNode.__init__``.

Every write goes through :meth:`ShardNode.log_op`: tick the clock (never behind gossiped
``$clusterTime``, see ``Node.gossip_in``), build the oplog entry in mongod's field order, append
it and the pre-image. In a transaction the operation is buffered and the commit writes one
``applyOps`` entry (``transaction_participant.cpp``). Durable shards commit the command's
documents, catalog changes, oplog entries and pre-images in one SQLite transaction before the
reply leaves (``run_command``).
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

from bson import Binary, ObjectId
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.core.values import id_key
from shardsim.core import failpoints, update_ops
from shardsim.core.commands import Request
from shardsim.core.errors import MongoError
from shardsim.core.node import Node
from shardsim.shard import noop_writer, oplog_settings, uncommitted_catalog
from shardsim.shard import commands as shard_commands
from shardsim.shard.change_stream import cursor as cs_cursor
from shardsim.shard.change_stream import promise_faults
from shardsim.shard.auth_store import LocalUserStore
from shardsim.shard import durable_undo
from shardsim.shard.durable import DurableStore
from shardsim.shard.prepare_conflicts import wait_for_prepared
from shardsim.core.auth import user_commands
from shardsim.shard.op_observer import TERM, OpObserver
from shardsim.shard.oplog import Oplog, PreImages
from shardsim.shard.oplog_disk import DEFAULT_CACHE_BYTES, DiskOplog
from shardsim.shard.read_concern import run_with_read_concern
from shardsim.shard.range_deleter import CRITICAL_SECTIONS, RangeDeleter
from shardsim.shard.migration_source import MigrationSource
from shardsim.core.query import select
from shardsim.shard.sessions import Sessions, full_lsid
from shardsim.shard.sharding_runtime import ShardingRuntime
from shardsim.shard.transaction_coordinator import Coordinators
from shardsim.shard.storage import (CURRENT_TXN, WRITE_SCOPE, Collection, Journal, Storage, WriteScope,
                           new_uuid, validate_collection_name, validate_db_name)
from shardsim.shard.write_context import NO_CONTEXT, WriteContext

ID_INDEX_SPEC = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
ELECTION_ID = ObjectId("7fffffff0000000000000001")


# Errors after which a transaction statement leaves the transaction open on a shard:
# CommandOnShardedViewNotSupportedOnMongod (169) and WouldChangeOwningShard (283).
_KEEPS_TXN_OPEN = (169, 283)

class ShardNode(Node):
    """A shard. ``options``: ``shard_name``, ``dbpath`` (None = in memory),
    ``noop_interval_ms``, ``promise_mode`` (``clock``|``mongod``), ``oplog_size_mb``,
    ``oplog_min_retention_hours``, ``oplog_max_age_s``, ``oplog_cache_mb`` (durable shards: MiB
    of newest oplog entries kept in memory, default 64), ``snapshot_history_mb`` (MiB of document
    history kept for snapshot reads, default 32: :mod:`shard.snapshot`), ``sync``
    (``normal``|``full``)."""

    role = "shard"

    def __init__(self, *, shard_name: str = "shard0", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard_name = shard_name
        self.options.setdefault("shard_name", shard_name)
        # the replica-set name (hello setName, replSetGetConfig _id): the shard's name unless
        # the options say otherwise (a config server's set, ``--set-name``)
        self.set_name = str(self.options.get("set_name") or shard_name)
        size_mb = float(self.options.get("oplog_size_mb") or 1024)
        min_ret_h = float(self.options.get("oplog_min_retention_hours") or 0)
        max_age = self.options.get("oplog_max_age_s")
        self.storage = Storage()
        history_mb = float(self.options.get("snapshot_history_mb") or 32)
        self.storage.history.max_bytes = int(history_mb * 2**20)
        retention = {"max_bytes": int(size_mb * 1024 * 1024), "min_retention_s": min_ret_h * 3600,
                     "max_age_s": float(max_age) if max_age else None}
        dbpath = self.options.get("dbpath")
        self.durable = None
        if dbpath:  # the oplog on disk with a bounded cache of its newest entries
            self.durable = DurableStore(dbpath, sync=self.options.get("sync") or "normal")
            cache_mb = float(self.options.get("oplog_cache_mb") or DEFAULT_CACHE_BYTES / 2**20)
            self.oplog: Oplog = DiskOplog(self.durable.conn, cache_bytes=int(cache_mb * 2**20),
                                          **retention)
        else:
            self.oplog = Oplog(**retention)
        self.pre_images = PreImages()
        # Replica-set members of more than one node (shard/replication/): the coordinator, the
        # term new oplog entries carry, and the oplog change streams read (committed only).
        self.repl: Any = None
        self.oplog_term = TERM
        self.stream_oplog: Any = self.oplog
        # What every write does once applied: tick, append, pre-image, journal (op_observer.py).
        self.op_observer = OpObserver(self)
        self.oplog.truncated_callbacks.append(self.op_observer.on_oplog_truncated)
        self._unflushed: list[tuple] = []  # oplog truncations of failed commits, retried first
        self._scopes: set[WriteScope] = set()  # the commands running (see flush)
        self.command_depth = 0
        self._req_txn: dict[int, Any] = {}
        self.sessions = Sessions(self)
        # Two-phase commits this shard coordinates (shard/transaction_coordinator.py).
        self.coordinators = Coordinators(self)
        # Filtering metadata, critical sections, transfer mods (shard/sharding_runtime.py).
        self.sharding = ShardingRuntime(self)
        self.range_deleter = RangeDeleter(self)  # config.rangeDeletions, migration coordinators
        # the migrations this shard donates (_shardsvrMoveRange, shard/migration_source.py)
        self.migration_source = MigrationSource(self)
        # Promise requests from the router (_shardsimAdvanceClusterTime) and the change-stream
        # cursors waiting for them (shard/change_stream/cursor.py).
        self.cs_promise_waiters = cs_cursor.PromiseWaiters()
        # Test faults on those promises and the clock pin (shard/change_stream/promise_faults.py).
        self.cs_promise_faults = promise_faults.PromiseFaults(self)
        # The periodic no-op writer's asyncio task once started (shard/noop_writer.py).
        self.noop_writer_task: Any = None
        if self.durable is not None:
            self.storage.journal = Journal()
            self.durable.load(self)
        self.commands.install(self, *shard_commands.FAMILIES,  # after the common family
                              user_commands.commands,
                              cs_cursor.commands)  # _shardsimAdvanceClusterTime (promise requests)
        self.security.store = LocalUserStore(self)  # shard-local admin.system.users/roles
        failpoints.install(self)  # configureFailPoint, with test commands only
        promise_faults.install(self)  # shardsimStallPromise, shardsimDelayPromise
        self.coordinators.install_fail_points()  # hangBeforeWritingDecision, ...
        self.migration_source.install_fail_points()  # moveChunkHangAtStep3..6, ...
        if self.test_commands:
            # _shardsimTruncateOplog, _shardsimSetClusterTime
            self.commands.install(self, shard_commands.testing.commands)

    # -- identity -----------------------------------------------------------------------------
    def hello(self, req: Request) -> dict[str, Any]:
        """A member of more than one node answers from its replication state
        (:func:`shard.replication.commands.hello_fields`); a one-member shard as a one-member
        replica-set primary of 8.0 (no ``topologyVersion``)."""
        if self.repl is not None:
            from shardsim.shard.replication.commands import hello_fields
            return hello_fields(self)
        last = self.oplog.last_ts() or self.clock.now()
        last_date = datetime.datetime.fromtimestamp(last.time, datetime.timezone.utc).replace(tzinfo=None)
        op_time = {"ts": last, "t": TERM}
        return {
            "hosts": [self.address],
            "setName": self.set_name,
            "setVersion": 1,
            "secondary": False,
            "primary": self.address,
            "me": self.address,
            "electionId": ELECTION_ID,
            "lastWrite": {"opTime": op_time, "lastWriteDate": last_date,
                          "majorityOpTime": op_time, "majorityWriteDate": last_date},
        }

    def parameters(self) -> dict[str, Any]:
        """getParameter values: the common ones plus shardName, oplogSizeMB,
        oplogMinRetentionHours, transactionLifetimeLimitSeconds, periodicNoopIntervalSecs."""
        params = super().parameters()
        params.update({
            "shardName": self.shard_name,
            "oplogSizeMB": Int64(self.oplog.max_bytes // (1024 * 1024)),
            "oplogMinRetentionHours": self.oplog.min_retention_s / 3600,
            "transactionLifetimeLimitSeconds": self.sessions.lifetime_s,
            "periodicNoopIntervalSecs": _noop_secs(self.options.get("noop_interval_ms")),
        })
        return params

    def set_parameter(self, name: str, value: Any) -> None:
        """setParameter: oplogSizeMB and oplogMinRetentionHours (validated like replSetResizeOplog;
        truncating at once), transactionLifetimeLimitSeconds; others as :meth:`Node.set_parameter`."""
        if name == "oplogSizeMB":  # validated like replSetResizeOplog's size
            size_mb = oplog_settings.check_size_mb(value, "setParameter.oplogSizeMB")
            self.oplog.max_bytes = int(size_mb * 1024 * 1024)
            self.oplog.truncate()
        elif name == "transactionLifetimeLimitSeconds":
            self.sessions.lifetime_s = int(value)
        elif name == "periodicNoopIntervalSecs" and self.test_commands:
            self._set_noop_interval(value)
        elif name == "oplogMinRetentionHours":
            hours = oplog_settings.check_min_retention_hours(value,
                                                             "setParameter.oplogMinRetentionHours")
            self.oplog.min_retention_s = hours * 3600
            self.oplog.truncate()
        else:
            super().set_parameter(name, value)

    def _set_noop_interval(self, value: Any) -> None:
        """``periodicNoopIntervalSecs`` at runtime (shardsim, test commands only; mongod sets it
        at startup): a positive number of seconds, fractions allowed; the writer restarts with
        it. BadValue (2) otherwise."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise MongoError(2, f"periodicNoopIntervalSecs must be a positive number, not {value!r}")
        self.options["noop_interval_ms"] = max(1, int(round(float(value) * 1000)))
        noop_writer.stop(self)
        noop_writer.start(self)

    def parsed_options(self) -> dict[str, Any]:
        """getCmdLineOpts ``parsed``: clusterRole shardsvr, replSet, dbPath."""
        out: dict[str, Any] = {"sharding": {"clusterRole": "shardsvr"},
                               "replication": {"replSet": self.set_name}}
        if self.options.get("dbpath"):
            out["storage"] = {"dbPath": self.options["dbpath"]}
        return out

    def server_status(self) -> dict[str, Any]:
        """serverStatus with the ``repl``, ``oplog``, ``oplogTruncation`` and ``storageEngine``
        sections. ``oplogTruncation`` as WiredTiger's oplog truncate markers report it
        (``{totalTimeProcessingMicros, processingMethod, oplogMinRetentionHours?,
        totalTimeTruncatingMicros, truncateCount}``; ``oplogMinRetentionHours`` only when set,
        as mongod): Estuary's connector reads ``oplogMinRetentionHours``."""
        st = super().server_status()
        first, last = self.oplog.first_ts(), self.oplog.last_ts()
        if self.repl is not None:
            from shardsim.shard.replication.commands import hello_fields
            hello = hello_fields(self)
            st["repl"] = {k: hello[k] for k in ("topologyVersion", "hosts", "setName",
                                                "setVersion", "isWritablePrimary", "secondary",
                                                "primary", "me", "electionId", "lastWrite")
                          if k in hello}
            st["repl"]["rbid"] = self.repl.core.durable.rbid
        else:
            st["repl"] = {"setName": self.set_name, "isWritablePrimary": True,
                          "secondary": False, "hosts": [self.address], "primary": self.address,
                          "me": self.address}
        st["oplog"] = {"entries": Int64(len(self.oplog)), "sizeBytes": Int64(self.oplog.size_bytes),
                       "earliestOptime": first, "latestOptime": last}
        if isinstance(self.oplog, DiskOplog):  # shardsim's own: the in-memory part
            st["oplog"].update({"cacheMaxBytes": Int64(self.oplog.cache_bytes),
                                "cachedBytes": Int64(self.oplog.cached_bytes),
                                "cachedEntries": Int64(self.oplog.cached_entries),
                                "diskEntriesRead": Int64(self.oplog.disk_rows_read)})
        trunc: dict[str, Any] = {"totalTimeProcessingMicros": Int64(0),
                                 "processingMethod": "scanning"}
        if self.oplog.min_retention_s > 0:
            trunc["oplogMinRetentionHours"] = self.oplog.min_retention_s / 3600
        trunc.update({"totalTimeTruncatingMicros": Int64(0),
                      "truncateCount": Int64(1 if self.oplog.truncated_through else 0)})
        st["oplogTruncation"] = trunc
        st["storageEngine"] = {"name": "sqlite" if self.durable else "inMemory",
                               "persistent": bool(self.durable)}
        return st

    # -- dispatch -----------------------------------------------------------------------------
    async def execute(self, req: Request) -> dict[str, Any]:
        """Run a command; a durable shard commits what it wrote before replying. A commit that
        fails turns the reply into the storage error (:meth:`flush`). A command with ``lsid``
        and ``txnNumber`` first checks its session out
        (:meth:`shard.sessions.Sessions.checkout`): a retry waits for the attempt still
        running."""
        if req.body.get("txnNumber") is not None and isinstance(req.body.get("lsid"), dict) \
                and req.name != "coordinateCommitTransaction":  # it prepares this very session
            async with self.sessions.checkout(req.body["lsid"]):
                reply = await self._run_command(req)
        else:
            reply = await self._run_command(req)
        if self.repl is not None and "writeConcern" in req.body and type(reply) is dict:
            await self._wait_for_write_concern(req, reply)
        return reply

    async def _wait_for_write_concern(self, req: Request, reply: dict[str, Any]) -> None:
        """A member of a set: wait for the command's ``writeConcern`` once it ran (a failed
        command waits too, as mongod waits for the no-op write of an error), and report a
        failure as ``writeConcernError`` (``RetryableWriteError`` for a retryable write)."""
        if not self.repl.writable and self.repl.core.role != "leader":
            return
        wce = await self.repl.write_concern_error(req.body.get("writeConcern"))
        if wce is None or "writeConcernError" in reply:
            return
        reply["writeConcernError"] = wce
        if wce["code"] in (189, 11602, 91, 10107) and req.body.get("txnNumber") is not None \
                and req.body.get("autocommit") is None \
                and self.commands.spec(req.name).retryable_write:
            labels = reply.setdefault("errorLabels", [])
            if "RetryableWriteError" not in labels:
                labels.append("RetryableWriteError")

    async def _run_command(self, req: Request) -> dict[str, Any]:
        if req.body.get("autocommit") is False and \
                self.commands.canonical(req.name) not in ("commitTransaction", "abortTransaction",
                                                          "prepareTransaction",
                                                          "coordinateCommitTransaction"):
            # Any statement (read or write) may start or continue a transaction.
            try:
                self.gossip_in(req)
                txn = self._req_txn[id(req)] = self.sessions.transaction_for(req)
            except MongoError as exc:
                exc.labels = self.error_labels(req, exc)
                reply = exc.to_reply()
                self.cluster_time_fields(req, reply)
                return reply
            # a statement reading at the transaction's snapshot waits for the prepared
            # transactions it would meet (shard.prepare_conflicts); MaxTimeMSExpired (50) while
            # waiting aborts the transaction, as any failed statement
            try:
                await wait_for_prepared(self, req, txn.read_ts, own=txn)
            except MongoError as exc:
                self.sessions.abort_on_error(req)
                self._req_txn.pop(id(req), None)
                exc.labels = self.error_labels(req, exc)
                reply = exc.to_reply()
                self.cluster_time_fields(req, reply)
                return reply
        versioned_write = None
        if "shardVersion" in req.body and self.commands.spec(req.name).versioned:
            try:  # a routed request: checked against this shard's version (13388)
                ns = f"{req.db}.{req.arg}"
                if await self.sharding.check(ns, self.commands.canonical(req.name),
                                             req.body["shardVersion"]):
                    versioned_write = ns
            except MongoError as exc:
                reply = exc.to_reply()
                self.cluster_time_fields(req, reply)
                return reply
        self.command_depth += 1
        # the transaction's uncommitted collections are visible to its statements only
        token = CURRENT_TXN.set(self._req_txn.get(id(req)))
        scope = scope_token = None
        if self.durable is not None:  # what this command journals (see flush)
            scope = WriteScope()
            self._scopes.add(scope)
            scope_token = WRITE_SCOPE.set(scope)
        try:
            reply = await super().execute(req)
            if self.durable is not None and (self.storage.journal or self._unflushed):
                try:
                    self.flush()
                except MongoError:
                    pass  # scope.lost says whether this command's writes were in it
        finally:
            if scope is not None:
                WRITE_SCOPE.reset(scope_token)
                self._scopes.discard(scope)
            CURRENT_TXN.reset(token)
            self.command_depth -= 1
            self._req_txn.pop(id(req), None)
            if versioned_write is not None:
                self.sharding.done(versioned_write)
        if scope is not None and scope.lost is not None:  # one that wrote nothing keeps its reply
            reply = scope.lost.to_reply()
            self.cluster_time_fields(req, reply)
        return reply

    async def invoke(self, handler: Any, req: Request) -> dict[str, Any]:
        """The handler under the request's readConcern (:mod:`shard.read_concern`), with
        ``$currentDate: {$type: "timestamp"}`` ticking this shard's clock."""
        update_ops.set_timestamp_source(self.clock.tick)
        if id(req) in self._req_txn:
            async def in_transaction(r: Request) -> dict[str, Any]:
                # mongod's invokeWithSessionCheckedOut (service_entry_point_common.cpp): a
                # statement whose command fails aborts the transaction (the scope guard's
                # abortActiveUnpreparedOrStashPreparedTransaction), reads included; a view for
                # the router to resolve (169) and WouldChangeOwningShard (283) leave it open.
                # Errors of the checks before the command runs (writeConcern, readConcern,
                # request shape: ExecCommandDatabase::_initiateCommand) do not abort.
                try:
                    return await handler(r)
                except MongoError as exc:
                    if exc.code not in _KEEPS_TXN_OPEN:
                        self.sessions.abort_on_error(r)
                    raise
            return await run_with_read_concern(self, in_transaction, req)
        return await run_with_read_concern(self, handler, req)

    def flush(self) -> None:
        """Write the pending journal to SQLite in one transaction (durable shards).

        A failed commit (:class:`shard.durable.DurableWriteError`: OutOfDiskSpace 14031, or
        UnknownError 8) leaves nothing behind, as an aborted WiredTiger transaction: SQLite
        rolled it back, and :func:`shard.durable_undo.undo` takes its documents, catalog
        changes, oplog entries, pre-images and session records back out of memory. Every
        running command that had journaled records (its :class:`~shard.storage.WriteScope`)
        gets the error as its reply; then this raises it. Only oplog truncations (deletes of
        old rows) are kept for the next commit. The process keeps serving: reads answer, and
        writes succeed again once a commit does (space freed)."""
        if self.durable is not None and (self.storage.journal or self._unflushed):
            journal = self._unflushed + self.storage.journal
            self.storage.journal = Journal()
            self._unflushed = []
            try:
                self.durable.commit(journal)
            except MongoError as exc:
                self._unflushed = [r for r in journal if r[0] == "truncate"]
                for scope in self._scopes:
                    if scope.wrote:
                        scope.lost = exc
                self._undo(journal)
                logging.getLogger("shardsim.shard").error(
                    "durable commit failed, its %d records were rolled back: %s", len(journal),
                    exc.errmsg)
                raise
            for scope in self._scopes:
                scope.wrote = False  # everything journaled so far is on disk
            self.oplog.mark_durable(self.oplog.latest_key)  # the cache may let them go now

    def _undo(self, journal: list[tuple]) -> None:
        """:func:`shard.durable_undo.undo`; if memory cannot be put back (the store cannot even
        be read) the process stops rather than serve writes that are not on disk (mongod's
        fatal assertion on a storage failure it cannot recover from)."""
        try:
            durable_undo.undo(self, journal)
        except Exception:
            logging.getLogger("shardsim.shard").critical(
                "a failed durable commit could not be rolled back in memory; exiting",
                exc_info=True)
            os._exit(14)

    # -- the write path -----------------------------------------------------------------------
    def write_context(self, req: Request) -> WriteContext:
        """The session/transaction/fromMigrate context of a write command."""
        from_migrate = req.body.get("fromMigrate") is True
        lsid = req.body.get("lsid")
        txn_number = req.body.get("txnNumber")
        txn = self._req_txn.get(id(req)) if req.body.get("autocommit") is False else None
        return WriteContext(full_lsid(lsid) if txn_number is not None else None, txn_number,
                            from_migrate, txn)

    def txn_of(self, req: Request) -> Any:
        """The transaction a request runs in (``autocommit: false``), or None."""
        return self._req_txn.get(id(req))

    # The write path lives in the op observer (shard/op_observer.py); these are its names on the
    # node, for the command handlers, the transaction code and the config server.
    def make_entry(self, op: str, ns: str, ui: Binary | None, o: dict[str, Any],
                   o2: dict[str, Any] | None = None, *, ctx: WriteContext = NO_CONTEXT,
                   ts: Timestamp | None = None) -> dict[str, Any]:
        """:meth:`OpObserver.make_entry`."""
        return self.op_observer.make_entry(op, ns, ui, o, o2, ctx=ctx, ts=ts)

    def append_entry(self, entry: dict[str, Any], size: int | None = None) -> None:
        """:meth:`OpObserver.append`."""
        self.op_observer.append(entry, size)

    def log_op(self, op: str, coll: Collection, o: dict[str, Any], o2: dict[str, Any] | None = None,
               *, ctx: WriteContext = NO_CONTEXT, pre_image: dict[str, Any] | None = None,
               size: int | None = None) -> Timestamp | None:
        """:meth:`OpObserver.on_insert` / ``on_update`` / ``on_delete`` by ``op`` (i/u/d)."""
        return self.op_observer.on_crud(op, coll, o, o2, ctx=ctx, pre_image=pre_image, size=size)

    def put_pre_image(self, uuid: bytes, ts: Timestamp, index: int, doc: dict[str, Any]) -> None:
        """:meth:`OpObserver.put_pre_image`."""
        self.op_observer.put_pre_image(uuid, ts, index, doc)

    def log_command(self, db: str, o: dict[str, Any], ui: Binary | None = None,
                    o2: dict[str, Any] | None = None, *, ctx: WriteContext = NO_CONTEXT) -> Timestamp:
        """:meth:`OpObserver.on_command`."""
        return self.op_observer.on_command(db, o, ui, o2, ctx=ctx)

    def write_noop(self, o: dict[str, Any], o2: dict[str, Any] | None = None, ns: str = "",
                   ui: Binary | None = None) -> Timestamp:
        """:meth:`OpObserver.on_noop`."""
        return self.op_observer.on_noop(o, o2, ns, ui)

    async def wait_for_majority(self, wtimeout_ms: int = 0) -> None:
        """On a replica-set member: wait until this member's newest write is majority-committed
        (``w: "majority"``, at most ``wtimeout_ms`` ms when not 0), as the server writes its
        recoverable documents (coordinator documents, critical sections). Raises the
        ``writeConcernError`` as a MongoError: PrimarySteppedDown 189 after a stepdown,
        WriteConcernFailed 64 after the timeout. Nothing to wait for on a one-member shard."""
        if self.repl is not None:
            wc: dict[str, Any] = {"w": "majority"}
            if wtimeout_ms:
                wc["wtimeout"] = wtimeout_ms
            err = await self.repl.write_concern_error(wc)
            if err is not None:
                raise MongoError(int(err["code"]), str(err["errmsg"]))

    def put_logged(self, coll: Collection, doc: dict[str, Any]) -> None:
        """Insert or replace ``doc`` (by ``_id``) in an internal collection with its oplog entry
        (``i``, or ``u`` with the whole document), so secondaries and the next primary have it;
        a durable node commits it before returning. Raises NotWritablePrimary (10107) from the
        oplog on a member that may not write (:meth:`ReplicationCoordinator.may_log`)."""
        key = id_key(doc["_id"])
        if key in coll.docs:
            coll.replace(key, doc)
            self.log_op("u", coll, doc, {"_id": doc["_id"]})
        else:
            coll.insert(doc)
            self.log_op("i", coll, doc)
        self.storage.note_doc(coll, key, doc)
        self.flush()

    # -- catalog helpers ----------------------------------------------------------------------
    def create_collection(self, db: str, name: str, options: dict[str, Any] | None = None, *,
                          uuid: bytes | None = None, shard_key: dict[str, Any] | None = None,
                          ctx: WriteContext = NO_CONTEXT) -> Collection:
        """Create a collection and log ``{create: name, <options>, idIndex}``."""
        validate_db_name(db)
        validate_collection_name(db, name)
        if db not in self.storage.dbs:
            for other in self.storage.dbs:
                if other.lower() == db.lower():
                    raise MongoError(13297, f"db already exists with different case already have: "
                                            f"[{other}] trying to create [{db}]")
        coll = Collection(db, name, uuid or new_uuid(), options, shard_key)
        self.storage.add(coll)
        o = {"create": name}
        o.update(coll.options)
        if "clusteredIndex" not in coll.options and "timeseries" not in coll.options:
            o["idIndex"] = dict(ID_INDEX_SPEC)  # oplog.cpp: no idIndex when clustered
        self.log_command(db, o, coll.ui, ctx=ctx)
        return coll

    def ensure_collection(self, db: str, name: str, ctx: WriteContext = NO_CONTEXT) -> Collection:
        """The collection, created implicitly (as an insert/upsert/createIndexes does); inside a
        transaction (``ctx.txn``) as an uncommitted collection (:mod:`shard.uncommitted_catalog`)."""
        coll = self.storage.get(db, name)
        if coll is None:
            if db in ("local", "admin", "config") and name.startswith("system."):
                raise MongoError(73, f"cannot write to '{db}.{name}'")
            if db == "local" and name == "oplog.rs":
                raise MongoError(73, "cannot write to 'local.oplog.rs'")
            if ctx.txn is not None:  # visible to the transaction only, until it commits
                return uncommitted_catalog.create(self, ctx.txn, db, name, implicit=True)
            coll = self.create_collection(db, name, ctx=WriteContext(from_migrate=ctx.from_migrate))
        return coll

    def find_document(self, ns: str, document_key: dict[str, Any]) -> dict[str, Any] | None:
        """The current document matching ``document_key`` in ``ns`` (updateLookup), or None."""
        db, _, name = ns.partition(".")
        coll = self.storage.get(db, name)
        if coll is None:
            return None
        for _, doc in select(coll, document_key):
            return doc
        return None

    # -- lifecycle ----------------------------------------------------------------------------
    async def startup(self) -> None:
        """Start the periodic no-op writer and the transaction reaper."""
        await super().startup()
        hosts = self.options.get("repl_hosts")
        if hosts and len(hosts) > 1 and self.repl is None:
            self.start_replication(list(hosts))
        noop_writer.start(self)  # periodic no-ops (change streams)
        self.sessions.start_reaper()  # abort transactions past transactionLifetimeLimitSeconds
        if self.repl is None:
            self.on_became_writable_primary()

    def on_became_writable_primary(self) -> None:
        """What a new primary does before it takes writes (a one-member shard: at start-up):
        forget its filtering metadata, so that each namespace's is recovered by a refresh from
        the config server at the first routed request naming a sharded version (whatever it
        knew as a secondary, or as an earlier primary, may be behind: the config server pushes
        only to the primary of the moment; mongod clears a namespace's metadata on step-up
        where a migration may have changed it, ``migrationutil::
        resumeMigrationCoordinationsOnStepUp`` -> ``CollectionShardingRuntime::
        clearFilteringMetadata``, and its secondaries keep theirs in step with the primary's
        through the replicated ``config.cache.*`` collections); finish the two-phase commits
        decided before, the range deletions made ready and the chunk migrations this shard
        donated (``ReplicationCoordinatorExternalStateImpl::onTransitionToPrimary``,
        ``migrationutil::resumeMigrationCoordinationsOnStepUp``)."""
        self.sharding.clear_metadata()  # recovered by refresh (shard/sharding_runtime.py)
        # a migration's critical sections held when the last primary stopped: held again
        # before any write is taken (ShardingRecoveryService::recoverStates)
        for doc in self.range_deleter.documents(CRITICAL_SECTIONS):
            self.sharding.hold_critical_section(doc["_id"], bool(doc.get("blockReads")))
        self.coordinators.recover()  # finish the two-phase commits decided before a restart
        self.range_deleter.resume()  # range deletions made ready before a restart
        self.migration_source.resume()  # migrations a failover or a restart interrupted

    def on_lost_writable_primary(self) -> None:
        """This member stopped being the writable primary (a stepdown, a newer term, a lost
        majority): interrupt the two-phase commits it coordinates, which must not write their
        documents here any more; the next primary recovers them from its copy of
        ``config.transaction_coordinators`` (``ReplicationCoordinatorExternalStateImpl::
        onStepDownHook`` -> ``TransactionCoordinatorService::onStepDown``). The config server
        also stops its primary-only jobs (``Balancer::onStepDownFromPrimary``). The chunk
        migrations it donates stop too (the next primary completes them)."""
        self.coordinators.on_step_down()
        self.migration_source.on_step_down()

    def start_replication(self, hosts: list[str]) -> None:
        """Make this shard a member of the replica set of ``hosts`` (every member's
        ``host:port``, this one's included; order gives the members' ``_id``): the
        replication coordinator (:mod:`shard.replication.coordinator`) starts as SECONDARY
        and an election follows. Settings from the options: ``election_timeout_ms``,
        ``heartbeat_interval_ms``, ``heartbeat_timeout_ms``, ``catch_up_timeout_ms``,
        ``priorities``, ``seed``. Change streams then read committed entries only and use
        the ``mongod`` promise mode (a promise never passes the commit point)."""
        from shardsim.core.topology_version import TopologyVersion
        from shardsim.shard.replication import commands as repl_commands
        from shardsim.shard.replication.coordinator import ReplicationCoordinator
        from shardsim.shard.replication.hook import LinkHook, ReplicationHook
        settings = {k: self.options.get(k) for k in (
            "election_timeout_ms", "heartbeat_interval_ms", "heartbeat_timeout_ms",
            "catch_up_timeout_ms", "priorities", "seed", "stall_tolerant")}
        self.topology_version = TopologyVersion()
        self.repl = ReplicationCoordinator(self, self.set_name, hosts, settings)
        self.options["repl_hosts"] = list(hosts)
        self.options["promise_mode"] = "mongod"
        self.stream_oplog = self.repl.committed
        self.commands.install(self, repl_commands.commands)
        # links first, then the fail points, then the member's state (shard/replication/hook.py)
        self.command_hooks.insert(0, LinkHook(self))
        self.command_hooks.append(ReplicationHook(self))
        self.repl.start()

    async def shutdown(self) -> None:
        """Stop the no-op writer and the transaction reaper, close cursors, then flush and
        close the durable store."""
        noop_writer.stop(self)
        self.sessions.stop_reaper()
        if self.repl is not None:
            await self.repl.stop()
        await super().shutdown()
        self.coordinators.close()
        self.range_deleter.close()
        self.migration_source.close()
        self.sharding.close()
        if self.durable is not None:
            try:
                self.flush()
            except MongoError:
                pass  # not durable: like an unacknowledged write at kill -9
            self.durable.close()

    def crash(self) -> None:
        """``kill -9`` (see :meth:`Node.crash`): no-op writer and reapers stopped, and the
        durable store let go without a checkpoint or a flush (every acknowledged write is
        committed already; the WAL is replayed on restart), its dbpath lock released."""
        super().crash()
        noop_writer.stop(self)
        self.sessions.stop_reaper()
        self.migration_source.close()  # a dead donor's migration runs no further step
        if self.repl is not None:
            self.repl.crash()
        if self.durable is not None:
            self.durable.crash()
            self.durable = None


def _noop_secs(ms: Any) -> Any:
    """``periodicNoopIntervalSecs`` of a no-op interval in ms: whole seconds as an int (as
    mongod reports it), a fraction as a double (shardsim's sub-second intervals)."""
    ms = int(ms or 1000)
    return ms // 1000 if ms % 1000 == 0 else ms / 1000
