"""Server-side cursors: ids, getMore, killCursors (from any connection), idle timeout.

Mirrors mongod's ``CursorManager``/mongos' ``ClusterCursorManager`` semantics: random positive
63-bit ids, ``CursorNotFound`` (43) for an unknown or killed id, cursors reaped after
``cursorTimeoutMillis`` (default 600000 ms) of idleness unless ``noCursorTimeout``.
"""

from __future__ import annotations

import asyncio
import contextvars
import operator
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import bson
from bson.int64 import Int64

from shardsim.core.errors import MongoError

# The running command's time limit: (start, maxTimeMS in seconds) on ``clock``, set by
# ``Node.run_command`` for a command with a non-zero ``maxTimeMS``. A cursor it opens keeps
# what is left of it for its getMores (see :meth:`CursorManager.run_first_batch`).
COMMAND_TIME_LIMIT: contextvars.ContextVar[tuple[float, float] | None] = \
    contextvars.ContextVar("shardsim_command_time_limit", default=None)


def clock() -> float:
    """Monotonic seconds of the maxTimeMS accounting (a module function, so tests replace it)."""
    return time.monotonic()


def time_limit_exceeded() -> MongoError:
    """MaxTimeMSExpired (50) "operation exceeded time limit" (``ErrorCodes::MaxTimeMSExpired``,
    raised by ``OperationContext::checkForInterrupt`` past the deadline)."""
    return MongoError(50, "operation exceeded time limit")


_CURSOR_IDS = random.SystemRandom()  # cursor ids: os.urandom, whatever the global random state
DEFAULT_BATCH_SIZE = 101
BATCH_BYTES_LIMIT = 16 * 1024 * 1024  # a reply batch never exceeds 16 MiB (bytes)
DEFAULT_CURSOR_TIMEOUT_MS = 600_000
# A shard's change-stream cursor reply (``needsMerge``) carries ``{<this>: true}`` when every
# event of its batch has the layout it builds for the router: ``_id: {_data: <ASCII hex>[,
# _typeBits]}`` first (the token, unmodified: the shard raises ChangeStreamFatalError 280
# otherwise), ``$sortKey: [<the same token>]`` last. shardsim's own field between its shards
# and its router, not a MongoDB one (router/change_stream/raw_events.py parse_block).
SORT_KEY_LAYOUT_FIELD = "$_shardsimSortKeyLayout"
# ...with, in this field, BinData of 2 x n little-endian int32: the n events' BSON sizes, then
# the sizes of their ``_id`` documents, so the router finds every event and its ``$sortKey``
# without walking the batch element by element.
SORT_KEY_SIZES_FIELD = "$_shardsimEventSizes"
# The operationType elements (as they follow ``_id``) of the events the router's merge handles one
# by one (``invalidate``, the new-shard event ``kNewShardDetected``/``migrateChunkToNewShard``):
# a batch holding one is not vouched for.
ONE_BY_ONE_OP_ELEMENTS = tuple(b"\x02operationType\x00" + (len(op) + 1).to_bytes(4, "little")
                               + op.encode() + b"\x00"
                               for op in ("invalidate", "kNewShardDetected", "migrateChunkToNewShard",
                                          # the v2 reader's control events
                                          "moveChunk", "movePrimary", "namespacePlacementChanged"))


@dataclass(slots=True)
class Batch:
    """One batch of a cursor: ``docs`` (dicts or RawBSONDocument), ``exhausted`` (cursor id 0
    in the reply), ``post_batch_resume_token`` (``{_data[, _typeBits]}`` for change streams)
    and ``extra`` cursor fields (e.g. ``invalidated``). ``raw_docs``, when not None, is the
    batch already encoded as BSON array elements (``0x03 "0" 0x00 <doc> 0x03 "1" 0x00 ...``,
    the router's forwarded events), as bytes or a list of byte strings to concatenate, and
    replaces ``docs``."""

    docs: list[Any]
    exhausted: bool
    post_batch_resume_token: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    raw_docs: bytes | list[bytes] | None = None
    n_raw: int = 0  # how many documents ``raw_docs`` holds (for $currentOp's nDocsReturned)

    @property
    def count(self) -> int:
        """Documents in the batch."""
        return len(self.docs) if self.raw_docs is None else self.n_raw


def array_header_bytes(lo: int, hi: int) -> int:
    """Bytes of the BSON array element headers (type byte, decimal index, NUL) of indexes
    ``lo .. hi - 1``: what a reply batch's elements cost beyond their documents."""
    total = 2 * (hi - lo)
    low, high, digits = 0, 10, 1
    while low < hi:
        a, b = max(lo, low), min(hi, high)
        if a < b:
            total += digits * (b - a)
        low, high, digits = high, high * 10, digits + 1
    return total


class RawBSONParts:
    """An encoded BSON document kept as the pieces whose concatenation it is (``parts``,
    ``size`` bytes in all), so a large reply is copied once, when the server frames the message
    (``shardsim/server.py``), not once per layer. ``raw`` joins them (``bson.encode`` and
    readers of the reply still work)."""

    __slots__ = ("parts", "size", "cursor_id", "n_docs")
    _type_marker = 101

    def __init__(self, parts: list[bytes], size: int, cursor_id: int = 0,
                 n_docs: int = 0) -> None:  # noqa: D107 - see the class docstring
        self.parts = parts
        self.size = size
        # a cursor reply's id and batch length, read without decoding (exhaust_continues)
        self.cursor_id = cursor_id
        self.n_docs = n_docs

    @property
    def raw(self) -> bytes:
        return b"".join(self.parts)

    def __getitem__(self, name: str) -> Any:
        return bson.decode(self.raw)[name]

    def get(self, name: str, default: Any = None) -> Any:
        return bson.decode(self.raw).get(name, default)


def _i32(n: int) -> bytes:
    return n.to_bytes(4, "little", signed=True)


_HEADERS: list[bytes] = []  # b"\x03<i>\x00": the array element header of index i


def element_headers(base: int, n: int) -> list[bytes]:
    """Headers ``0x03 "<i>" 0x00`` (an embedded document's type byte, the decimal index, NUL)
    of BSON array elements ``base .. base + n - 1`` (cached; the list is a copy)."""
    hdr = _HEADERS
    if len(hdr) < base + n:
        hdr.extend(b"\x03%d\x00" % i for i in range(len(hdr), base + n))
    return hdr[base:base + n]


def document_elements(docs: list[Any]) -> list[bytes]:
    """``docs`` (objects with ``.raw`` BSON bytes, e.g. RawBSONDocument) as the pieces of a
    BSON array's elements (header, document, header, ...), for :attr:`Batch.raw_docs`: the
    reply is then one join of byte strings, not an encoder pass over the documents."""
    n = len(docs)
    parts: list[Any] = [None] * (2 * n)
    parts[0::2] = element_headers(0, n)
    parts[1::2] = map(_RAW, docs)
    return parts


_RAW = operator.attrgetter("raw")


def cursor_reply(reply: dict[str, Any], batch_field: str, batch: Batch) -> Any:
    """The ``cursor`` subdocument: ``reply`` (field order kept) with ``batch_field`` set to the
    batch. With ``batch.raw_docs`` the array is spliced in as bytes (a :class:`RawBSONParts`),
    so forwarded events are copied, never decoded."""
    if batch.raw_docs is None:
        reply[batch_field] = batch.docs
        return reply
    reply[batch_field] = []
    enc = bson.encode(reply)
    marker = b"\x04" + batch_field.encode() + b"\x00\x05\x00\x00\x00\x00"
    at = enc.index(marker) + len(marker) - 5  # the empty array's int32 length
    elements = batch.raw_docs
    if isinstance(elements, (bytes, bytearray)):
        elements = [elements]
    n = sum(map(len, elements))
    size = len(enc) + n
    return RawBSONParts([_i32(size), enc[4:at], _i32(n + 5), *elements, b"\x00", enc[at + 5:]], size,
                        int(reply.get("id") or 0), batch.count)


class Cursor:
    """Base class. Subclasses implement :meth:`fetch`; ``ns`` is ``db.coll`` as replied."""

    id: int = 0
    tailable: bool = False
    await_data: bool = False
    no_timeout: bool = False

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.last_used = time.monotonic()
        self.in_use = False
        self.lsid: Any = None
        # What $currentOp reports (shardsim/current_op.py, GenericCursor): wall-clock seconds,
        # counts kept by the CursorManager, the command that opened it (None: not reported).
        self.created_wall = self.last_access_wall = time.time()
        self.getmore_started_wall = 0.0
        self.n_docs_returned = 0
        self.n_batches_returned = 0
        self.op_id = 0
        self.originating_command: Any = None
        # seconds left of the originating command's maxTimeMS (None: no limit); a non-tailable
        # cursor's getMores run within it (getmore_cmd.cpp getLeftoverMaxTimeMicros)
        self.max_time_left: float | None = None

    def current_op_extra(self) -> dict[str, Any]:
        """Fields this cursor adds to its ``$currentOp`` entry (none by default)."""
        return {}

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        """Produce the next batch. ``batch_size`` None means the default (101 first, unlimited after)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release resources (remote cursors for the router)."""


class ListCursor(Cursor):
    """A cursor over documents computed up front (find, aggregate, listCollections, ...)."""

    def __init__(self, ns: str, docs: Iterator[Any] | list[Any]) -> None:
        super().__init__(ns)
        self._it = iter(docs)
        self._peek: list[Any] = []

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        """The next batch: ``batch_size`` documents (a getMore's 0 or None: no count limit;
        the first batch's None: 101) within 16 MiB. A first batch of ``batchSize: 0`` is empty
        and leaves the cursor open, even when there is nothing to return (mongod and mongos
        register the cursor without running the query: ``run_aggregate.cpp`` /
        ``cluster_aggregation_planner.cpp``, ``find_cmd.cpp``); the documents come on getMore."""
        if first and batch_size == 0:
            return Batch([], exhausted=False)
        limit = batch_size if batch_size else (DEFAULT_BATCH_SIZE if first else 1 << 62)
        out: list[Any] = []
        size = 0
        while len(out) < limit:
            if self._peek:
                doc = self._peek.pop()
            else:
                doc = next(self._it, _END)
                if doc is _END:
                    return Batch(out, exhausted=True)
            # Count the array element's header too (type byte, index key, NUL): with many small
            # documents it adds ~10 %, and the whole reply must stay a legal BSON document.
            doc_size = _approx_size(doc) + len(str(len(out))) + 2
            if out and size + doc_size > BATCH_BYTES_LIMIT:
                self._peek.append(doc)
                break
            out.append(doc)
            size += doc_size
        # Peek one to report exhaustion in the same batch, as mongod does for a finished scan.
        if not self._peek:
            nxt = next(self._it, _END)
            if nxt is _END:
                return Batch(out, exhausted=True)
            self._peek.append(nxt)
        return Batch(out, exhausted=False)


_END = object()


def _approx_size(doc: Any) -> int:
    raw = getattr(doc, "raw", None)
    if raw is not None:
        return len(raw)
    import bson
    return len(bson.encode(doc))


class CursorManager:
    """Owns every open cursor of one process."""

    def __init__(self, timeout_ms: int = DEFAULT_CURSOR_TIMEOUT_MS) -> None:
        self._cursors: dict[int, Cursor] = {}
        self.timeout_ms = timeout_ms
        self._reaper: asyncio.Task | None = None
        # Checks run on a getMore's cursor once it is found, before it is checked out; one that
        # raises MongoError fails the getMore and kills the cursor (the fail points add one).
        self.get_more_checks: list[Callable[[Cursor], None]] = []
        self._op_seq = 0  # opid of the getMores ($currentOp)

    def __len__(self) -> int:
        return len(self._cursors)

    def register(self, cursor: Cursor) -> int:
        """Give ``cursor`` a fresh id and keep it; returns the id.

        Ids come from the operating system's randomness (:data:`_CURSOR_IDS`), like mongod's
        ``SecureRandom``-seeded cursor ids, never from the global ``random`` module: a process
        that seeds it (a test using the in-process kit, hypothesis, which reseeds it for every
        example) would otherwise give a shard's new cursor the id of one it just killed, and a
        late reply about the old cursor (a router's promise reply names cursors by id) would be
        taken for the new one's (a postBatchResumeToken "went backwards", InternalError 1)."""
        while True:
            cid = _CURSOR_IDS.getrandbits(62) + 1
            if cid not in self._cursors:
                break
        cursor.id = cid
        self._cursors[cid] = cursor
        return cid

    def get(self, cursor_id: int) -> Cursor:
        """The open cursor ``cursor_id``; raises CursorNotFound (43)."""
        cursor = self._cursors.get(int(cursor_id))
        if cursor is None:
            raise MongoError(43, f"cursor id {int(cursor_id)} not found")
        return cursor

    def all(self) -> list[Cursor]:
        return list(self._cursors.values())

    async def run_first_batch(self, cursor: Cursor, batch_size: int | None,
                              max_time_ms: int | None = None) -> dict[str, Any]:
        """Fetch the first batch; register the cursor if it is not exhausted. Returns the
        ``cursor`` reply subdocument ``{firstBatch, [postBatchResumeToken], id, ns}``.

        Under the running command's ``maxTimeMS`` (:data:`COMMAND_TIME_LIMIT`) a non-tailable
        cursor fails with MaxTimeMSExpired (50) when the command has used it up, and keeps the
        rest for its getMores (``ClientCursor::setLeftoverMaxTimeMicros``, find_cmd.cpp /
        run_aggregate.cpp; mongos ``ClusterCursorManager``)."""
        batch = await cursor.fetch(batch_size, max_time_ms, first=True)
        limit = COMMAND_TIME_LIMIT.get()
        if limit is not None and not cursor.tailable:
            left = limit[0] + limit[1] - clock()
            if left <= 0:
                await cursor.close()
                raise time_limit_exceeded()
            cursor.max_time_left = left
        cursor.n_docs_returned += batch.count
        cursor.n_batches_returned += 1
        cid = 0
        if not batch.exhausted:
            cid = self.register(cursor)
        else:
            await cursor.close()
        reply: dict[str, Any] = {"firstBatch": None}
        if batch.post_batch_resume_token is not None:
            reply["postBatchResumeToken"] = batch.post_batch_resume_token
        reply.update(batch.extra)
        reply["id"] = Int64(cid)
        reply["ns"] = cursor.ns
        return cursor_reply(reply, "firstBatch", batch)

    async def get_more(self, cursor_id: int, collection: str, batch_size: int | None,
                       max_time_ms: int | None) -> dict[str, Any]:
        """Run a getMore; returns ``{id, ns, nextBatch, [postBatchResumeToken]}``.

        Raises CursorNotFound (43), or Unauthorized-style 13 when ``collection`` names another
        namespace (mongod: "Requested getMore on namespace 'x', but cursor belongs to 'y'");
        MaxTimeMSExpired (50) when a non-tailable cursor's time left (``max_time_left``) is used
        up before or during this getMore (the cursor is then killed, as after any failed
        getMore).
        """
        cursor = self.get(cursor_id)
        if cursor.ns.split(".", 1)[1] != collection and not cursor.ns.endswith("$cmd.aggregate"):
            raise MongoError(13, f"Requested getMore on namespace '{cursor.ns.split('.', 1)[0]}."
                                 f"{collection}', but cursor belongs to a different namespace {cursor.ns}")
        if cursor.in_use:
            raise MongoError(43, f"cursor id {int(cursor_id)} is already in use")
        for check in self.get_more_checks:  # e.g. failGetMoreAfterCursorCheckout
            try:
                check(cursor)
            except MongoError:
                await self.kill([cursor_id])  # a failed getMore kills its cursor
                raise
        cursor.in_use = True
        self._op_seq += 1
        cursor.op_id = self._op_seq
        cursor.getmore_started_wall = time.time()
        started = clock()
        left = None if cursor.tailable else cursor.max_time_left
        try:
            if left is not None and left <= 0:
                raise time_limit_exceeded()
            batch = await cursor.fetch(batch_size, max_time_ms, first=False)
            if left is not None:
                # the getMore runs within what its cursor's command left (getmore_cmd.cpp:
                # setDeadlineAfterNowBy(getLeftoverMaxTimeMicros(), MaxTimeMSExpired)); the
                # time between getMores does not count
                left -= clock() - started
                if left <= 0:
                    raise time_limit_exceeded()
                cursor.max_time_left = left
        except BaseException:
            # A failed getMore kills the cursor, as on mongod.
            self._cursors.pop(cursor.id, None)
            cursor.in_use = False
            await cursor.close()
            raise
        cursor.in_use = False
        cursor.last_used = time.monotonic()
        cursor.last_access_wall = time.time()
        cursor.n_docs_returned += batch.count
        cursor.n_batches_returned += 1
        cid = cursor.id
        if batch.exhausted:
            self._cursors.pop(cid, None)
            await cursor.close()
            cid = 0
        reply: dict[str, Any] = {"id": Int64(cid), "ns": cursor.ns, "nextBatch": None}
        if batch.post_batch_resume_token is not None:
            reply["postBatchResumeToken"] = batch.post_batch_resume_token
        reply.update(batch.extra)
        return cursor_reply(reply, "nextBatch", batch)

    async def kill(self, cursor_ids: list[int]) -> dict[str, list[Int64]]:
        """killCursors: the reply's four lists."""
        killed, not_found = [], []
        for cid in cursor_ids:
            cursor = self._cursors.pop(int(cid), None)
            if cursor is None:
                not_found.append(Int64(cid))
            else:
                killed.append(Int64(cid))
                await cursor.close()
        return {"cursorsKilled": killed, "cursorsNotFound": not_found,
                "cursorsAlive": [], "cursorsUnknown": []}

    async def kill_all(self) -> None:
        ids = list(self._cursors)
        await self.kill(ids)

    def start_reaper(self, interval_s: float = 30.0) -> None:
        """Kill cursors idle for longer than ``timeout_ms`` (unless noCursorTimeout)."""
        async def reap() -> None:
            while True:
                await asyncio.sleep(interval_s)
                deadline = time.monotonic() - self.timeout_ms / 1000
                stale = [c.id for c in self._cursors.values()
                         if not c.no_timeout and not c.in_use and c.last_used < deadline]
                if stale:
                    await self.kill(stale)
        self._reaper = asyncio.get_running_loop().create_task(reap())

    def stop_reaper(self) -> None:
        """Cancel the idle-cursor reaper of :meth:`start_reaper` (if running)."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
