"""Write targeting and batch execution on the router (mongos' ``BatchWriteExec`` /
``ChunkManagerTargeter``, ``src/mongo/s/write_ops/``).

Each statement of an ``insert``/``update``/``delete`` is targeted:

* a document (insert) or a query pinning the full shard key (single update/delete) -> the shard
  owning that key's chunk; an unsharded namespace -> the database's primary shard;
* ``multi: true`` updates and ``limit: 0`` deletes without the full shard key -> every shard
  owning the namespace (broadcast);
* a single update/delete without the full shard key -> the first shard holding a matching
  document (the "without shard key" two-phase protocol of 7.1+); an upsert that cannot be
  targeted fails with ShardKeyNotFound (61).

Ordered batches run as consecutive same-shard runs and stop at the first write error; unordered
batches run one child batch per shard concurrently. The reply merges ``n``/``nModified``/
``upserted``/``writeErrors``/``retriedStmtIds`` with the client's statement indexes; a child
batch that gets no reply fails its statements as write errors (one for an ordered batch, each
for an unordered one: ``BatchWriteOp::noteBatchError``), so a partly applied batch always
reports what was applied. Retryable writes (``lsid``/``txnNumber`` outside a transaction) go to
the shards with their ``lsid``, ``txnNumber`` and ``stmtIds`` (:mod:`router.retryable_writes`);
the shards' session records make a retry exactly-once, the router keeps nothing. An update
the shard answers WouldChangeOwningShard (283) moves its document by a delete and an insert in a
transaction (:mod:`router.shard_key_update`; findAndModify likewise). Statements
inside a transaction register their shard with ``RouterNode.transactions``
(:mod:`router.transactions`).

The ``insert``/``update``/``delete``/``findAndModify`` commands themselves are in
:mod:`router.commands.crud`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import bson
from bson import ObjectId

from shardsim.router.forwarding import forwardable, reply_body
from shardsim.router import retryable_writes as rw
from shardsim.router import shard_key_update as sku
from shardsim.router import shard_versioning as sv
from shardsim.core import max_time
from shardsim.core.commands import Request, check_type
from shardsim.core.errors import MongoError
from shardsim.core.protocol.versions import NETWORK_ERRORS

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

_FIELD = {"insert": "documents", "update": "updates", "delete": "deletes"}
# Batch options forwarded with every child batch.
_BATCH_OPTS = ("bypassDocumentValidation", "writeConcern", "let", "comment", "maxTimeMS",
               "lsid", "txnNumber", "autocommit", "startTransaction", "readConcern")
# One targeted statement: (client index, shards, broadcast).
Target = tuple[int, list[str], bool]

# Child batch limits, as mongos' ``BatchWriteOp::targetBatch`` keeps them
# (``src/mongo/s/write_ops/batch_write_op.cpp`` ``wouldMakeBatchesTooBig`` /
# ``getWriteSizeBytes``; constants of ``src/mongo/db/ops/write_ops.h``): a child batch holds at
# most ``kMaxWriteBatchSize`` statements and its statements' estimated sizes add up to at most
# ``BSONObjMaxUserSize``; the first statement of a batch always fits (an oversized document goes
# alone, and the shard answers for it).
MAX_CHILD_BATCH_OPS = 100_000  # write_ops::kMaxWriteBatchSize
MAX_CHILD_BATCH_BYTES = 16 * 1024 * 1024  # BSONObjMaxUserSize
ARRAY_ELEMENT_OVERHEAD = 7  # kWriteCommandBSONArrayPerElementOverheadBytes
# A request at most this large (its body and document sequences) cannot make a child batch
# reach the limits by size, whatever the split: the statements are not measured.
UNMEASURED_REQUEST_BYTES = 8 * 1024 * 1024
_ADDED_ID_BYTES = 17  # an ObjectId _id element: type, "_id\0", 12 bytes


@dataclass
class Run:
    """A child batch: statements (client indexes ``idx``) sent to ``shards`` together."""

    shards: list[str]
    idx: list[int] = field(default_factory=list)
    ops: list[Any] = field(default_factory=list)
    broadcast: bool = False
    # The routing table the statements were targeted with: its placement versions go with
    # the child batch (mongos sends the version of the ChunkManager it targeted with).
    info: Any = None
    # The first run of a lane of an unordered round to several shards at once: (every shard
    # of the round, its statements in all), for the early promise requests (_send_plain_once)
    promise_round: tuple[tuple[str, ...], int] | None = None


def _is_replacement(u: Any) -> bool:
    return isinstance(u, dict) and not any(str(k).startswith("$") for k in u)


class WriteExecutor:
    """Runs one client write command (``kind``: ``"insert"``, ``"update"`` or ``"delete"``)
    through the router: targets each statement (:meth:`target`), groups the statements into
    child batches (:class:`Run`) and merges the shards' replies (:meth:`execute`). Like mongos'
    ``BatchWriteExec`` (``src/mongo/s/write_ops/batch_write_exec.cpp``)."""

    def __init__(self, router: "RouterNode", req: Request, kind: str,
                 sizes: list[int] | None = None) -> None:
        """``sizes``: the statements' BSON sizes in bytes when the caller knows them (the
        ``bulkWrite`` command from its raw ops); otherwise :meth:`statement_sizes` finds them."""
        self.router = router
        self.req = req
        self.kind = kind
        self.db = req.db
        self.coll = req.arg
        self.ns = f"{self.db}.{self.coll}"
        self.ordered = req.get("ordered", True) is not False
        self.in_txn = req.get("autocommit") is False
        self.retryable = rw.is_retryable(req.body)
        self.batch_size = 0  # the client's statements (execute)
        self._snapshot: Any = None  # the CollectionInfo of the last targeting round
        self.sizes = sizes  # statement sizes (bytes), None: not measured (a small request)
        self._added_ids: set[int] = set()  # inserts given an _id by statements()
        self._sizes: list[int] | None = None  # statement sizes by client index (execute)

    # -- targeting ----------------------------------------------------------------------------
    async def find_owner(self, q: Any, shards: list[str], extra: dict[str, Any]) -> str | None:
        """The first of ``shards`` (in catalog order) holding a document matching filter ``q``
        (one ``find`` with ``limit: 1`` per shard, concurrently; ``collation``/``hint``/``sort``
        of ``extra`` go with it, and the command's ``let``), or None; with a ``sort``, the shard
        whose first match sorts first. Raises what a shard raises (MongoError)."""
        sort = extra.get("sort") if isinstance(extra.get("sort"), dict) else None

        async def probe(shard: str) -> list[dict[str, Any]]:
            cmd: dict[str, Any] = {"find": self.coll, "filter": q, "limit": 1,
                                   "singleBatch": True}
            if not sort:
                cmd["projection"] = {"_id": 1}
            for k in ("collation", "hint", "sort"):
                if k in extra:
                    cmd[k] = extra[k]
            if "let" in self.req.body:
                cmd["let"] = self.req.body["let"]
            reply = await self.router.shard_command(shard, self.db, cmd)
            return list(reply["cursor"]["firstBatch"])
        found = await asyncio.gather(*(probe(s) for s in shards))
        hits = [(shard, docs[0]) for shard, docs in zip(shards, found) if docs]
        if sort and len(hits) > 1:
            from shardsim.core.query import sort_docs
            first = sort_docs([d for _, d in hits], sort)[0]
            return next(shard for shard, d in hits if d is first)
        return hits[0][0] if hits else None

    async def target(self, op: Any) -> tuple[list[str], bool]:
        """``(shards, broadcast)`` for one statement ``op`` (a document for insert, an
        ``{q, u, multi, upsert}`` / ``{q, limit}`` entry for update/delete). May create the
        database (implicit creation on first write). Raises ShardNotFound (70) when there is no
        shard, ShardKeyNotFound (61) for an upsert without the full shard key."""
        router = self.router
        info = self._snapshot
        if info is None:
            if self.kind == "delete":  # inserts/updates ask the config server below
                await router.refresh_on_database_miss(self.db)
            primary = await router.ensure_database(self.db) if self.kind != "delete" \
                else router.read_primary(self.db)
            if primary is None:
                raise MongoError(70, "No shards found")
            return [primary], False
        owners = info.chunks.shards()
        if self.kind == "insert":
            return [info.chunks.shard_for_doc(op)], False
        q = op.get("q", {}) if isinstance(op, dict) else {}
        multi = op.get("multi", False) if self.kind == "update" else op.get("limit", 0) == 0
        key = info.pattern.key_of_query(q)
        if key is not None:
            return [info.chunks.find(key).shard], False
        owners = await max_time.run_steps(info.chunks.shards_for_query_steps(q))
        if multi:
            return owners, True
        if self.kind == "update" and op.get("upsert"):
            raise MongoError(61, f"Failed to target upsert by query :: could not extract exact "
                                 f"shard key from query {q}: the query must contain the full "
                                 f"shard key {info.key}")
        owner = await self.find_owner(q, owners, op if isinstance(op, dict) else {})
        return ([owner] if owner else [owners[0]]), False

    # -- execution ----------------------------------------------------------------------------
    def _child_command(self, run: Run) -> dict[str, Any]:
        cmd: dict[str, Any] = {self.kind: self.coll, _FIELD[self.kind]: run.ops,
                               "ordered": self.ordered}
        for k in _BATCH_OPTS:
            if k in self.req.body:
                cmd[k] = self.req.body[k]
        if self.retryable:
            # The shards' session records make the retry exactly-once (router.retryable_writes).
            cmd["stmtIds"] = [rw.stmt_id_at(self.req.body, i) for i in run.idx]
        if self.req.get("fromMigrate") is True:
            cmd["fromMigrate"] = True
        return cmd

    async def _send(self, run: Run) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Run one child batch; returns (totals, writeErrors with client indexes). A
        WouldChangeOwningShard (283) write error of an update goes to
        :meth:`_would_change_owning_shard`."""
        totals, errors = await self._send_plain(run)
        if self.kind == "update" and any(e.get("code") == sku.WCOS for e in errors):
            return await self._would_change_owning_shard(totals, errors)
        return totals, errors

    async def _would_change_owning_shard(self, totals: dict[str, Any], errors: list[dict[str, Any]]
                                         ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """mongos' ``ClusterWriteCmd::handleWouldChangeOwningShardError`` (legacy path of 8.0,
        :mod:`router.shard_key_update`): a client batch of more than one statement gets
        InvalidOptions (72) instead; in a transaction the document is moved by a delete and an
        insert in it; a retryable write becomes a transaction on its own lsid/txnNumber."""
        if self.batch_size != 1:
            if self.in_txn:
                raise MongoError(72, sku.BATCH_OF_ONE)
            return totals, [{"index": e["index"], "code": 72, "errmsg": sku.BATCH_OF_ONE}
                            if e.get("code") == sku.WCOS else e for e in errors]
        err = next(e for e in errors if e.get("code") == sku.WCOS)
        rest = [e for e in errors if e is not err]
        if self.retryable:
            try:
                reply, commit = await sku.run_converted(self.router, self.req, self._rerun)
            except MongoError as exc:
                extra = {k: exc.extra[k] for k in ("keyPattern", "keyValue") if k in exc.extra}
                return totals, rest + [{"index": err["index"], "code": exc.code, **extra,
                                        "errmsg": exc.errmsg}]
            out = {"n": reply["n"], "nModified": reply.get("nModified", 0),
                   "upserted": list(reply.get("upserted", [])), "retried": []}
            if "writeConcernError" in commit:
                out["writeConcernError"] = commit["writeConcernError"]
            return out, list(reply.get("writeErrors", []))
        if not self.in_txn:
            return totals, errors  # the shard refuses it first (IllegalOperation 20)
        info = {k: err.get(k) for k in ("preImage", "postImage", "shouldUpsert")}
        if not await sku.move_document(self.router, self.req, info):
            return totals, errors
        totals["n"] += 1
        if info["shouldUpsert"]:
            totals["upserted"].append({"index": err["index"], "_id": info["postImage"]["_id"]})
        else:
            totals["nModified"] += 1
        return totals, rest

    async def _rerun(self, txn_fields: dict[str, Any]) -> dict[str, Any]:
        """The client's update again, as a statement of the transaction ``txn_fields``
        (without its write concern and stmtIds): the reply body."""
        body = {k: v for k, v in self.req.body.items()
                if k not in ("writeConcern", "stmtIds", "stmtId")}
        body.update(txn_fields)
        req = sku.internal_request(self.req, self.req.name, self.db, body)
        return await WriteExecutor(self.router, req, self.kind).execute()

    async def _send_plain(self, run: Run, attempt: int = 0
                          ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Run one child batch; a shard's StaleConfig (13388: nothing of the batch was applied
        there) refreshes the routing table and re-targets the batch's statements (a broadcast
        is re-sent to the stale shards), up to ``MAX_STALE_RETRIES`` times (``BatchWriteExec``
        noting stale responses and re-targeting)."""
        generation = self.router.catalog.generation
        final = attempt >= sv.MAX_STALE_RETRIES
        totals, errors, stale = await self._send_plain_once(run, not final)
        if not stale:
            return totals, errors
        await sv.refresh_after_stale(self.router, generation, attempt)
        if run.broadcast:
            owners = set(self.router.catalog.collection(self.ns).chunks.shards()) \
                if self.router.catalog.collection(self.ns) else set(stale)
            again = [s for s in stale if s in owners]
            snapshot = self.router.catalog.collection(self.ns)
            subs = [Run(again, run.idx, run.ops, True, info=snapshot)] if again else []
        else:
            targets, errs = await self._target_all(run.ops)
            errors.extend({**e, "index": run.idx[e["index"]]} for e in errs)
            mapped = [None if t is None else (run.idx[t[0]], t[1], t[2]) for t in targets]
            subs = self._group_targets(run.ops, run.idx, mapped)
        for sub in subs:
            t, errs = await self._send_plain(sub, attempt + 1)
            totals["n"] += t["n"]
            totals["nModified"] += t["nModified"]
            totals["upserted"].extend(t["upserted"])
            totals["retried"].extend(t.get("retried", ()))
            if "writeConcernError" in t:
                totals["writeConcernError"] = t["writeConcernError"]
            errors.extend(errs)
            if errs and self.ordered:
                break
        return totals, errors

    def _group_targets(self, ops: list[Any], idx: list[int], targets: list[Target | None]
                       ) -> list[Run]:
        """Consecutive same-shard runs of re-targeted statements (``idx``: their client
        indexes; ``targets`` carry client indexes) up to the first untargetable one."""
        runs: list[Run] = []
        pos = {i: n for n, i in enumerate(idx)}
        for t in targets:
            if t is None:
                break
            i, shards, broadcast = t
            op = ops[pos[i]]
            if runs and not broadcast and not runs[-1].broadcast and runs[-1].shards == shards:
                runs[-1].idx.append(i)
                runs[-1].ops.append(op)
            else:
                runs.append(Run(shards, [i], [op], broadcast, info=self._snapshot))
        return self._split(runs)

    async def _send_plain_once(self, run: Run, catch_stale: bool = False
                               ) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
        """One attempt of a child batch: ``(totals, writeErrors, stale shards)``; with
        ``catch_stale`` a StaleConfig reply is returned in the stale list instead of becoming
        write errors."""
        cmd = self._child_command(run)
        totals: dict[str, Any] = {"n": 0, "nModified": 0, "upserted": [], "retried": []}
        errors: list[dict[str, Any]] = []
        stale: list[str] = []

        async def one(shard: str) -> dict[str, Any]:
            sent = dict(cmd, shardVersion=sv.version_for(run.info, shard)) \
                if self.db not in sv.UNVERSIONED_DBS else cmd
            try:
                reply = await rw.send_idempotent(
                    lambda: self.router.shard_command(shard, self.db, sent), self.retryable)
            except MongoError as exc:
                exc.shard = shard  # for the write error's "Write results unavailable from"
                raise
            # change streams: ask idle shards for promises past this write
            self.router.promise_requests.on_shard_write(shard, self.ns, reply.get("operationTime"))
            return reply

        # change streams: ask idle shards for promises past this write's time, so their
        # promises travel while the write does (router/change_stream/promise_requests.py);
        # from the loop, once this task has written the write and waits for its reply: the
        # write leaves first (the requests wake three processes on a machine of few cores)
        promises = self.router.promise_requests
        if promises.streams:
            # Lanes to several shards starting together: one request for the round, past all
            # of its statements, and none to the round's own shards (asked for this run's
            # time, a shard written by another lane would move its clock there and then stamp
            # its own write past the request, and every remote would be asked again after it)
            shards, statements = run.promise_round or (run.shards, len(run.ops))
            asyncio.get_running_loop().call_soon(
                promises.before_shard_write, shards, self.ns, statements)
        if len(run.shards) == 1:
            # The common targeted write: awaited in this task (gather would wrap it in a Task,
            # and the client's reply would wait a loop iteration behind whatever else is ready,
            # e.g. the write's change event arriving from the shard).
            try:
                replies: list[Any] = [await one(run.shards[0])]
            except Exception as exc:  # the same outcomes gather(return_exceptions=True) gives
                replies = [exc]
        else:
            replies = await asyncio.gather(*(one(s) for s in run.shards), return_exceptions=True)
        for shard_name, reply in zip(run.shards, replies):
            if catch_stale and sv.is_stale(reply):
                stale.append(shard_name)
                continue
            if isinstance(reply, MongoError):
                if len(run.idx) == 0 or self.in_txn:
                    raise reply  # in a transaction a shard error fails the command
                # No reply, or a command-level error: it fails the child batch's statements
                # (the first of an ordered batch, each of an unordered one; noteBatchError).
                shard = getattr(reply, "shard", None)
                for i in run.idx[:1] if self.ordered else run.idx:
                    errors.append(rw.unavailable_error(i, shard, reply)
                                  if shard is not None and (reply.code in rw.RETRIABLE_CODES
                                                            or reply.code == rw.TARGETING_FAILED)
                                  else {"index": i, "code": reply.code, "errmsg": reply.errmsg})
                continue
            if isinstance(reply, BaseException):
                raise reply
            totals["n"] += int(reply.get("n", 0))
            totals["nModified"] += int(reply.get("nModified", 0))
            for u in reply.get("upserted", []):
                totals["upserted"].append({"index": run.idx[int(u["index"])], "_id": u["_id"]})
            totals["retried"].extend(reply.get("retriedStmtIds", []))
            for e in reply.get("writeErrors", []):
                e = dict(e)
                e["index"] = run.idx[int(e["index"])]
                errors.append(e)
            if "writeConcernError" in reply:
                totals["writeConcernError"] = reply["writeConcernError"]
        return totals, errors, stale

    def statements(self) -> list[Any]:
        """The command's statements (``documents``/``updates``/``deletes``); a document without
        ``_id`` gets an ObjectId here, before targeting, so an ``_id`` shard key can place it
        (mongos does the same). Raises TypeMismatch (14) / IDLFailedToParse (40414) for a bad
        list, InvalidNamespace (73)."""
        ops = self.req.get(_FIELD[self.kind])
        if not isinstance(ops, list):
            check_type(self.req, _FIELD[self.kind], list, "array", required=True)
            ops = []
        if not isinstance(self.coll, str) or not self.coll:
            raise MongoError(73, f"Invalid namespace specified '{self.db}.{self.coll}'")
        if self.kind == "insert":
            fixed = []
            for i, d in enumerate(ops):
                if isinstance(d, dict) and "_id" not in d:
                    d = {"_id": ObjectId(), **d}
                    self._added_ids.add(i)
                fixed.append(d)
            ops = fixed
        return ops

    async def _target_all(self, ops: list[Any]
                          ) -> tuple[list[Target | None], list[dict[str, Any]]]:
        """Target every statement: ``(targets, errors)`` with one ``(index,
        shards, broadcast)`` per targeted statement and None for one that could not be
        targeted (its write error is in ``errors``; an ordered batch stops there). Network
        errors and ShardNotFound (70) are raised. A StaleConfig (13388) met while targeting
        (the owner probe of a statement without the shard key, :meth:`find_owner`) refreshes
        the routing table and targets every statement again with it, up to
        ``MAX_STALE_RETRIES`` times (mongos' write without shard key runs under
        ``shardVersionRetry``)."""
        for attempt in range(sv.MAX_STALE_RETRIES + 1):
            generation = self.router.catalog.generation
            errors: list[dict[str, Any]] = []
            targets: list[Target | None] = []
            self._snapshot = self.router.catalog.collection(self.ns)
            stale = False
            for i, op in enumerate(ops):
                try:
                    shards, broadcast = await self.target(op)
                    targets.append((i, shards, broadcast))
                except MongoError as exc:
                    if exc.code in NETWORK_ERRORS or exc.code == 70:
                        raise
                    if sv.is_stale(exc) and attempt < sv.MAX_STALE_RETRIES:
                        stale = True  # an owner probe told StaleConfig: refresh, target again
                        break
                    errors.append({"index": i, "code": exc.code,
                                   "errmsg": exc.errmsg})
                    targets.append(None)
                    if self.ordered:
                        break
            if not stale:
                return targets, errors
            await sv.refresh_after_stale(self.router, generation, attempt)
        return targets, errors  # pragma: no cover - the last attempt returns above

    def statement_sizes(self, ops: list[Any]) -> list[int] | None:
        """Each statement's BSON size in bytes, for splitting child batches
        (:meth:`_split`): the raw size of a statement from an OP_MSG document sequence (plus
        the ``_id`` :meth:`statements` added), else the encoded size. None when the whole
        request is at most :data:`UNMEASURED_REQUEST_BYTES` (no child batch can reach the size
        limit then, so nothing is measured or encoded)."""
        if self.sizes is not None and len(self.sizes) == len(ops):
            return self.sizes
        raw = self.req.sequences.get(_FIELD[self.kind])
        if raw is not None and len(raw) == len(ops):
            return [len(r) + (_ADDED_ID_BYTES if i in self._added_ids else 0)
                    for i, r in enumerate(raw)]
        total = len(self.req.raw) + sum(len(r) for seq in self.req.sequences.values()
                                        for r in seq)
        if self.req.raw and total <= UNMEASURED_REQUEST_BYTES:
            return None
        return [len(bson.encode(op)) if isinstance(op, dict) else 0 for op in ops]

    def _split(self, runs: list[Run]) -> list[Run]:
        """Split child batches over mongos' limits (``BatchWriteOp::targetBatch`` with
        ``wouldMakeBatchesTooBig``): at most :data:`MAX_CHILD_BATCH_OPS` statements and at most
        :data:`MAX_CHILD_BATCH_BYTES` of estimated statement sizes per batch, each statement
        counted with :data:`ARRAY_ELEMENT_OVERHEAD` (twice plus 4 bytes with ``txnNumber``,
        for its ``stmtIds`` entry). A statement alone in a batch always goes, however large: a
        document over 16 MiB is refused by the shard (BadValue 2, "object to insert too
        large"). The pieces of one batch keep their order."""
        sizes = self._sizes
        out: list[Run] = []
        extra = ARRAY_ELEMENT_OVERHEAD + (ARRAY_ELEMENT_OVERHEAD + 4
                                          if "txnNumber" in self.req.body else 0)
        for run in runs:
            if run.broadcast or (len(run.idx) <= MAX_CHILD_BATCH_OPS and sizes is None):
                out.append(run)
                continue
            piece = Run(run.shards, broadcast=run.broadcast, info=run.info)
            used = 0
            for i, op in zip(run.idx, run.ops):
                size = (sizes[i] if sizes is not None else 0) + extra
                if piece.idx and (len(piece.idx) >= MAX_CHILD_BATCH_OPS
                                  or used + size > MAX_CHILD_BATCH_BYTES):
                    out.append(piece)
                    piece = Run(run.shards, broadcast=run.broadcast, info=run.info)
                    used = 0
                piece.idx.append(i)
                piece.ops.append(op)
                used += size
            out.append(piece)
        return out

    def _group(self, ops: list[Any], targets: list[Target | None]) -> list[Run]:
        """The child batches: for an ordered batch, consecutive statements for the same shard
        (up to the first untargetable one); for an unordered batch, one per shard. Broadcasts
        run alone."""
        runs: list[Run] = []
        if self.ordered:
            for t in targets:
                if t is None:
                    break
                i, shards, broadcast = t
                if runs and not broadcast and not runs[-1].broadcast and runs[-1].shards == shards:
                    runs[-1].idx.append(i)
                    runs[-1].ops.append(ops[i])
                else:
                    runs.append(Run(shards, [i], [ops[i]], broadcast, self._snapshot))
        else:
            by_shard: dict[str, Run] = {}
            for t in targets:
                if t is None:
                    continue
                i, shards, broadcast = t
                if broadcast:
                    runs.append(Run(shards, [i], [ops[i]], True, self._snapshot))
                else:
                    run = by_shard.setdefault(shards[0], Run(shards, info=self._snapshot))
                    run.idx.append(i)
                    run.ops.append(ops[i])
            runs.extend(by_shard.values())
        return self._split(runs)

    async def execute(self) -> dict[str, Any]:
        """Target and run every statement; returns the reply body ``{n, [nModified],
        [upserted], [writeErrors], [retriedStmtIds], [writeConcernError]}`` with the client's
        statement indexes (``BatchWriteOp::buildClientResponse``).

        Raises TypeMismatch (14) / IDLFailedToParse (40414) for a bad statement list,
        InvalidNamespace (73), ShardNotFound (70) and network errors met while targeting;
        inside a transaction a shard's network error fails the command (TransientTransaction-
        Error, ``processErrorResponseFromLocal``); a transaction may span shards
        (:mod:`router.transactions`). Everything else, a shard that is down included, becomes
        ``writeErrors`` next to the counts of what was applied."""
        ops = self.statements()
        self.batch_size = len(ops)
        self._sizes = self.statement_sizes(ops)
        # Untargetable statements become write errors.
        targets, errors = await self._target_all(ops)
        runs = self._group(ops, targets)
        if self.in_txn:
            used = {s for r in runs for s in r.shards}
            self.router.transactions.participant(self.req, used)
        totals: dict[str, Any] = {"n": 0, "nModified": 0, "upserted": [], "retried": []}
        wce = None

        def fold(t: dict[str, Any], errs: list[dict[str, Any]]) -> None:
            nonlocal wce
            totals["n"] += t["n"]
            totals["nModified"] += t["nModified"]
            totals["upserted"].extend(t["upserted"])
            totals["retried"].extend(t.get("retried", ()))
            errors.extend(errs)
            wce = t.get("writeConcernError", wce)

        if self.ordered:
            for run in runs:
                try:
                    t, errs = await self._send(run)
                except MongoError as exc:
                    if self.in_txn:
                        raise
                    errors.append({"index": run.idx[0], "code": exc.code, "errmsg": exc.errmsg})
                    break
                fold(t, errs)
                if errs:
                    break
        else:
            # One lane per shard: a shard's child batches one after another (mongos sends one
            # batch per shard per round), the shards' lanes concurrently; a broadcast alone.
            lanes: dict[Any, list[Run]] = {}
            for n, run in enumerate(runs):
                lanes.setdefault(n if run.broadcast else tuple(run.shards), []).append(run)

            async def lane(batches: list[Run]) -> list[tuple[Run, Any]]:
                done: list[tuple[Run, Any]] = []
                for run in batches:
                    try:
                        done.append((run, await self._send(run)))
                    except MongoError as exc:
                        if self.in_txn:
                            raise
                        done.append((run, exc))
                return done

            if len(lanes) == 1:
                outcome: list[Any] = [await lane(next(iter(lanes.values())))]
            else:
                # the lanes' first runs start together: one early promise request for them all
                # (later runs of a lane, and retries, are runs of their own)
                firsts = [b[0] for b in lanes.values()]
                promise_round = (tuple({s for r in firsts for s in r.shards}),
                                 sum(len(r.ops) for r in firsts))
                for r in firsts:
                    r.promise_round = promise_round
                outcome = await asyncio.gather(*(lane(b) for b in lanes.values()),
                                               return_exceptions=True)
            results: list[tuple[Run, Any]] = []
            for res in outcome:
                if isinstance(res, BaseException):
                    raise res
                results.extend(res)
            for run, res in results:
                if isinstance(res, MongoError):
                    if self.in_txn:
                        raise res
                    for i in run.idx:
                        errors.append({"index": i, "code": res.code, "errmsg": res.errmsg})
                elif isinstance(res, BaseException):
                    raise res
                else:
                    fold(*res)
        return self._reply(totals, errors, wce)

    def _reply(self, totals: dict[str, Any], errors: list[dict[str, Any]],
               wce: Any) -> dict[str, Any]:
        """The client's reply from the folded child-batch results."""
        errors.sort(key=lambda e: e["index"])
        # A broadcast statement failing on several shards is reported once.
        unique: dict[int, dict[str, Any]] = {}
        for e in errors:
            unique.setdefault(e["index"], e)
        errors = list(unique.values())
        if self.ordered and errors:
            errors = errors[:1]  # an ordered batch stops at its first error
        reply: dict[str, Any] = {"n": totals["n"]}
        if self.kind == "update":
            if totals["upserted"]:
                reply["upserted"] = sorted(totals["upserted"], key=lambda u: u["index"])
            reply["nModified"] = totals["nModified"]
        if errors:
            reply["writeErrors"] = errors
        if totals["retried"]:
            reply["retriedStmtIds"] = sorted(set(totals["retried"]))
        if wce is not None:
            reply["writeConcernError"] = wce
        return reply


class NamespaceGate:
    """Writes to one namespace (or database) vs. a chunk migration / movePrimary started
    through this router (the router's share of the migration critical section): writes run
    concurrently with each other; :meth:`block` waits for the writes in flight and holds new
    ones until :meth:`unblock`. One gate per name in ``RouterNode.write_gates``
    (:func:`gate_for`)."""

    def __init__(self) -> None:
        self.active = 0
        self.blocked = 0
        self.cond = asyncio.Condition()

    async def enter(self) -> None:
        """A write starts (waits while the gate is blocked)."""
        if not self.blocked:  # the usual case: no lock round (one loop thread, no await here)
            self.active += 1
            return
        async with self.cond:
            await self.cond.wait_for(lambda: not self.blocked)
            self.active += 1

    async def exit(self) -> None:
        """A write ended. Only :meth:`block` waits on ``active``, and it holds ``blocked`` up
        while it waits: with nothing blocked there is no one to wake."""
        self.active -= 1
        if self.blocked:
            async with self.cond:
                self.cond.notify_all()

    async def block(self) -> None:
        """Hold new writes and wait until the writes in flight have ended."""
        async with self.cond:
            self.blocked += 1
            await self.cond.wait_for(lambda: self.active == 0)

    async def unblock(self) -> None:
        """Let writes run again (after as many unblocks as blocks)."""
        async with self.cond:
            self.blocked -= 1
            self.cond.notify_all()


def gate_for(router: "RouterNode", ns: str) -> NamespaceGate:
    """The write gate of ``ns`` (a ``db.coll`` namespace or a database name), created on first
    use in ``router.write_gates``."""
    gates = router.write_gates
    gate = gates.get(ns)
    if gate is None:
        gate = gates[ns] = NamespaceGate()
    return gate


async def run_write(router: "RouterNode", req: Request, kind: str) -> dict[str, Any]:
    """insert/update/delete (``kind``) through the router: waits at the database's and the
    namespace's :class:`NamespaceGate`, then :meth:`WriteExecutor.execute`. Returns the reply body; raises as
    :meth:`WriteExecutor.execute` does."""
    db_gate, gate = gate_for(router, req.db), gate_for(router, f"{req.db}.{req.arg}")
    await db_gate.enter()
    try:
        await gate.enter()
        try:
            return await WriteExecutor(router, req, kind).execute()
        finally:
            await gate.exit()
    finally:
        await db_gate.exit()


async def find_and_modify(router: "RouterNode", req: Request) -> dict[str, Any]:
    """findAndModify: to the shard owning the query's shard key, else the first shard holding
    a match (behind the same write gates as :func:`run_write`). Returns the shard's reply body
    (``{lastErrorObject, value}``); a retryable findAndModify goes with its ``lsid``/
    ``txnNumber``/``stmtId`` and the shard answers a retry from its session record. An
    untargetable upsert fails with ShardKeyNotFound (61)."""
    db_gate, gate = gate_for(router, req.db), gate_for(router, f"{req.db}.{req.arg}")
    await db_gate.enter()
    try:
        await gate.enter()
        try:
            return await _find_and_modify(router, req)
        finally:
            await gate.exit()
    finally:
        await db_gate.exit()


async def _find_and_modify(router: "RouterNode", req: Request) -> dict[str, Any]:
    db, coll = req.db, req.arg
    ns = f"{db}.{coll}"
    info = router.catalog.collection(ns)
    q = req.get("query") or {}
    if info is None:
        shard = await router.ensure_database(db)
    else:
        k = info.pattern.key_of_query(q)
        if k is None and req.get("upsert") and _is_replacement(req.get("update")):
            try:
                k = info.pattern.key_of_doc(req.get("update"))
            except MongoError:
                k = None
        if k is not None:
            shard = info.chunks.find(k).shard
        elif req.get("upsert"):
            raise MongoError(61, f"Query for sharded findAndModify must contain the shard key "
                                 f"{info.key}")
        else:
            ex = WriteExecutor(router, req, "update")
            owners = info.chunks.shards()
            extra = {k2: req.body[k2] for k2 in ("sort", "collation", "hint") if k2 in req.body}
            shard = await ex.find_owner(q, owners, extra) or owners[0]
    if req.get("autocommit") is False:
        router.transactions.participant(req, {shard})
    body = forwardable(req.body)
    try:
        reply = await rw.send_idempotent(lambda: router.shard_command(shard, db, body),
                                         rw.is_retryable(req.body))
    except MongoError as exc:
        if exc.code != sku.WCOS:
            raise
        return await _fam_would_change_owning_shard(router, req, exc)
    return reply_body(reply)


async def _fam_would_change_owning_shard(router: "RouterNode", req: Request,
                                         exc: MongoError) -> dict[str, Any]:
    """A findAndModify the shard answered WouldChangeOwningShard (283), as mongos 8.0's
    legacy path (``cluster_find_and_modify_cmd.cpp``): in a transaction
    (``handleWouldChangeOwningShardErrorTransactionLegacy``) delete the pre-image and insert the
    post-image in it and answer ``{lastErrorObject: {n, updatedExisting[, upserted]}, value}``
    (``value``: the post-image with ``new: true``, else the pre-image; null for an upsert
    without ``new``); a retryable write
    (``_handleWouldChangeOwningShardErrorRetryableWriteLegacy``) runs the command again in a
    transaction on its own lsid/txnNumber and commits it (:func:`router.shard_key_update.
    run_converted`: errors come back with its context, as command errors)."""
    if rw.is_retryable(req.body):
        async def rerun(txn_fields: dict[str, Any]) -> dict[str, Any]:
            body = {k: v for k, v in req.body.items() if k not in ("writeConcern", "stmtId")}
            body.update(txn_fields)
            return await _find_and_modify(router, sku.internal_request(req, req.name, req.db, body))
        reply, commit = await sku.run_converted(router, req, rerun)
        if "writeConcernError" in commit:
            reply["writeConcernError"] = commit["writeConcernError"]
        return reply
    if req.get("autocommit") is not False:
        raise exc  # the shard refuses it first (IllegalOperation 20)
    info = {k: exc.extra.get(k) for k in ("preImage", "postImage", "shouldUpsert")}
    moved = await sku.move_document(router, req, info)
    upsert = bool(info["shouldUpsert"])
    leo: dict[str, Any] = {"n": 1 if moved else 0, "updatedExisting": moved and not upsert}
    if moved and upsert:
        leo["upserted"] = info["postImage"]["_id"]
    value = None
    if moved:
        value = info["postImage"] if req.get("new") else (None if upsert else info["preImage"])
    return {"lastErrorObject": leo, "value": value}
