"""The router's AsyncResultsMerger for change streams: a pure, sans-IO merge of shard cursors.

Mirrors ``src/mongo/s/query/exec/async_results_merger.cpp`` (ARM) as described in
``shared/reference/server-internals-notes.md`` §1 and §9, plus the two router-side merge stages
that sit above ``$mergeCursors`` on a real mongos:
``DocumentSourceChangeStreamHandleTopologyChange`` (swallow config.shards events, open cursors on
new shards) and ``DocumentSourceChangeStreamEnsureResumeTokenPresent`` (§8.2).

Nothing here does I/O or sleeps. The owner (``router/change_stream.py`` on a real router, or
``router/sim.py`` on a seeded simulated scheduler) feeds it shard replies and asks it what to
release; the same code therefore runs in the simulation and in the router.

Vocabulary:

- a *remote* is one shard cursor (or the config server's ``config.shards`` cursor);
- a *key* is the sort key of a resume token ``{_data, [_typeBits]}``: ``(_data, flag, bytes)``,
  which orders exactly like BSON comparison of the token documents (``_data`` hex string first,
  i.e. memcmp of the KeyString; a token carrying ``_typeBits`` sorts after one without);
- a remote's *promise* is its latest ``postBatchResumeToken`` (it will never return an event
  with a lower key);
- the *high-water mark* (HWM) is the token the router reports as its own postBatchResumeToken.

Ordering rule (§1.5): a buffered event is released only when its key is ``<=`` the minimum
promise over ALL remotes (config cursor included), and only once every remote has promised.
"""

from __future__ import annotations

import heapq
import struct
from collections import deque
from operator import attrgetter
from dataclasses import dataclass, field
from typing import Any, Iterable

from shardsim import resume_token as rt
from shardsim.clock import ts_from_key
from shardsim.errors import MongoError

Key = tuple  # (data_hex: str, has_type_bits: int, type_bits: bytes)

CONFIG_SHARDS_NS = "config.shards"



# ---------------------------------------------------------------------------------------------
# Token helpers
# ---------------------------------------------------------------------------------------------

def token_key(token: Any) -> Key:
    """The sort key of a resume token document (dict or RawBSONDocument ``{_data[, _typeBits]}``).

    Raises MongoError 1 (InternalError) when ``_data`` is not a string, as the ARM cannot sort it.
    """
    try:
        data = token["_data"]
    except (KeyError, TypeError):
        raise MongoError(1, f"Missing field '_data' in sort key {token!r}") from None
    if not isinstance(data, str):
        raise MongoError(1, "sort key field '_data' must be a string")
    try:
        tb = token["_typeBits"]
    except KeyError:
        return (data, 0, b"")
    tb = bytes(tb)
    # BSON BinData compares by length, then subtype, then bytes; the length prefix is enough here.
    return (data, 1, len(tb).to_bytes(4, "big") + tb)


def hwm_data(ts_key_value: int, version: int = 2) -> str:
    """``_data`` of ``makeHighWaterMarkToken(ts, version)`` for a Timestamp given as the 64-bit
    integer ``(secs << 32) | inc`` (see :func:`shardsim.clock.ts_key`)."""
    return hwm_token(ts_key_value, version)["_data"]


def hwm_token(ts_key_value: int, version: int = 2) -> dict[str, Any]:
    """The high-water-mark resume token document ``{_data}`` for a Timestamp key."""
    return rt.make_high_water_mark(ts_from_key(ts_key_value), version)


def is_hwm_data(data: str) -> bool:
    """True when ``_data`` is a high-water-mark token (v1 or v2), i.e. ``isHighWaterMarkToken``."""
    ts = token_ts_key(data)
    return ts is not None and data in (hwm_data(ts, 2), hwm_data(ts, 1))


def token_ts_key(data: str) -> int | None:
    """The clusterTime (as a 64-bit key) encoded at the front of a KeyString token, or None."""
    if len(data) >= 18 and data[:2] in ("82", "82".lower()):
        try:
            return int(data[2:18], 16)
        except ValueError:
            return None
    return None


def is_invalidate_data(data: str) -> bool:
    """Does the token ``_data`` decode with ``fromInvalidate: true``? False for anything that is
    not a well-formed token (the shards reject those when the stream is opened)."""
    try:
        return rt.decode({"_data": data}).fromInvalidate
    except MongoError:
        return False


# ---------------------------------------------------------------------------------------------
# Raw event handling (byte surgery; no decode/re-encode of forwarded events)
# ---------------------------------------------------------------------------------------------

_SORTKEY_NAME = b"$sortKey\x00"
_i32 = struct.Struct("<i")

ID_MODIFIED_MSG = (
    "Encountered an event whose _id field, which contains the resume token, was modified by the "
    "pipeline. Modifying the _id field of an event makes it impossible to resume the stream from "
    "that point. Only transformations that retain the unmodified _id field are allowed.")


@dataclass(slots=True)
class Item:
    """One event waiting in a remote's buffer.

    ``key`` — sort key (see :func:`token_key`); ``token`` — the resume token document (dict or
    RawBSONDocument); ``payload`` — what is forwarded to the client (raw BSON bytes on the
    router, anything in the simulation); ``op`` — ``operationType`` when known; ``meta`` —
    extra info (config.shards events: ``shard`` name and ``cluster_time`` key); ``src`` — the
    :class:`Remote` that returned it (set by :meth:`Merger.on_batch`).
    """

    key: Key
    token: Any
    payload: Any
    op: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    src: Any = None


class RawDoc:
    """Raw BSON bytes the reply encoder copies as an embedded document (``bson`` encodes any
    object whose ``_type_marker`` is 101 from its ``raw`` attribute, like a RawBSONDocument),
    without RawBSONDocument's per-object validation: the router's client batches are lists of
    these. ``raw`` — one complete BSON document (bytes)."""

    __slots__ = ("raw",)
    _type_marker = 101

    def __init__(self, raw: bytes) -> None:  # noqa: D107 - see the class docstring
        self.raw = raw

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        import bson
        return f"RawDoc({bson.decode(self.raw)!r})"


def strip_sort_key(raw: bytes, id_raw: bytes | None) -> bytes | None:
    """Remove the trailing ``$sortKey: [<_id>]`` element from an event's raw BSON bytes.

    Shards put ``$sortKey`` as the LAST field (brief "Data contracts"). When ``id_raw`` (the raw
    embedded document of the event's ``_id``) is given, the expected tail is built from it, so a
    match also proves ``_id == $sortKey[0]``. Returns the new bytes (length prefix fixed) or
    None when the tail does not match.
    """
    if id_raw is None:
        return None
    arr_len = 4 + 1 + 2 + len(id_raw) + 1  # int32 + type 0x03 + "0\0" + doc + terminator
    tail = b"\x04" + _SORTKEY_NAME + _i32.pack(arr_len) + b"\x03" + b"0\x00" + id_raw + b"\x00" + b"\x00"
    if not raw.endswith(tail):
        return None
    body = raw[: len(raw) - len(tail)] + b"\x00"
    return _i32.pack(len(body)) + body[4:]


_ID_HEAD = b"\x03_id\x00"
_DATA_HEAD = b"\x02_data\x00"
_TB_HEAD = b"\x05_typeBits\x00"
_OP_HEAD = b"\x02operationType\x00"


_TAIL_HEAD = b"\x04" + _SORTKEY_NAME
_BINARY = None


def _tail_head(id_len: int) -> bytes:
    """``0x04 "$sortKey\\0" int32 0x03 "0\\0"``: the start of the ``$sortKey: [<_id>]`` element
    of an event whose ``_id`` document is ``id_len`` bytes (cached per length)."""
    h = _TAILS.get(id_len)
    if h is None:
        h = _TAILS[id_len] = _TAIL_HEAD + _i32.pack(id_len + 8) + b"\x030\x00"
    return h


_TAILS: dict[int, bytes] = {}


def _fast_item(buf: bytes, s: int = 0, n: int | None = None) -> Item | None:
    """Parse the common layout without inflating the event: ``_id: {_data[, _typeBits]}`` first,
    ``operationType`` second, ``$sortKey: [<_id>]`` last. The event is ``buf[s:s + n]`` (the
    whole of ``buf`` by default), so a shard reply's batch is parsed in place. The payload is
    the event without ``$sortKey`` (bytes). None when the layout differs."""
    global _BINARY
    unpack = _i32.unpack_from
    if n is None:
        n = unpack(buf, s)[0]
    ids = s + 9
    if not buf.startswith(_ID_HEAD, s + 4) or not buf.startswith(_DATA_HEAD, ids + 4):
        return None
    id_len = unpack(buf, ids)[0]
    id_end = ids + id_len
    p = ids + 15 + unpack(buf, ids + 11)[0]
    data = buf[ids + 15:p - 1].decode()
    token: dict[str, Any] = {"_data": data}
    if buf[p] != 0:
        if not buf.startswith(_TB_HEAD, p):
            return None
        blen = unpack(buf, p + 11)[0]
        tb = buf[p + 16:p + 16 + blen]
        if buf[p + 16 + blen] != 0:
            return None
        if _BINARY is None:
            from bson.binary import Binary as _B
            _BINARY = _B
        token["_typeBits"] = _BINARY(tb, buf[p + 15])
        key: Key = (data, 1, len(tb).to_bytes(4, "big") + tb)
    else:
        key = (data, 0, b"")
    # Expected tail: 0x04 "$sortKey\0" int32 (0x03 "0\0" <_id doc> 0x00) 0x00 — proves
    # _id == $sortKey[0] byte for byte (see strip_sort_key).
    e = s + n
    t = e - id_len - 19
    if (t <= id_end or buf[e - 1] != 0 or buf[e - 2] != 0
            or not buf.startswith(_tail_head(id_len), t)
            or not buf.startswith(buf[ids:id_end], t + 17)):
        return None
    stripped = _i32.pack(t - s + 1) + buf[s + 4:t] + b"\x00"
    if buf.startswith(_OP_HEAD, id_end):
        olen = unpack(buf, id_end + 15)[0]
        return Item(key, token, stripped, buf[id_end + 19:id_end + 18 + olen].decode())
    return Item(key, token, stripped)


# Sizes of fixed-width BSON values by type byte (bsonspec.org).
_FIXED = {1: 8, 7: 12, 8: 1, 9: 8, 10: 0, 6: 0, 16: 4, 17: 8, 18: 8, 19: 16, 127: 0, 255: 0}


def split_cursor(raw: bytes, batch_field: str) -> tuple[dict[str, Any], list[Item]] | None:
    """Split a shard reply's raw ``cursor`` subdocument into its other fields (decoded: ``id``,
    ``ns``, ``postBatchResumeToken``, ...) and the :class:`Item` of every event of
    ``batch_field`` (``firstBatch``/``nextBatch``), parsed in place from the reply's bytes
    (no per-event RawBSONDocument, no decode). None when anything is unusual (an element type
    not handled here, an event in another layout): the caller then takes the general path."""
    import bson
    from shardsim.node import CODEC
    if not isinstance(raw, bytes):
        raw = bytes(raw)  # a memoryview of the wire message: one copy per reply
    end = _i32.unpack_from(raw, 0)[0] - 1
    pos = 4
    rest: list[bytes] = []
    items: list[Item] = []
    want = batch_field.encode()
    unpack = _i32.unpack_from
    while pos < end:
        t = raw[pos]
        k = raw.index(0, pos + 1)
        v = k + 1
        if t in (3, 4):
            size = unpack(raw, v)[0]
        elif t == 2:
            size = 4 + unpack(raw, v)[0]
        elif t == 5:
            size = 5 + unpack(raw, v)[0]
        else:
            size = _FIXED.get(t, -1)
            if size < 0:
                return None
        if t == 4 and raw[pos + 1:k] == want:
            a, stop = v + 4, v + size - 1
            fast = _fast_item
            while a < stop:
                if raw[a] != 3:
                    return None
                d = raw.index(0, a + 1) + 1
                dl = unpack(raw, d)[0]
                it = fast(raw, d, dl)
                if it is None:
                    return None
                items.append(it)
                a = d + dl
        else:
            rest.append(raw[pos:v + size])
        pos = v + size
    body = b"".join(rest)
    meta = bson.decode(_i32.pack(len(body) + 5) + body + b"\x00", CODEC)
    return meta, items


def item_from_raw_event(event: Any, *, is_config: bool = False) -> Item:
    """Build an :class:`Item` from a shard's event (a RawBSONDocument with ``$sortKey`` last).

    Checks what mongos checks (``RouterStagePipeline::_validateAndConvertToBSON``): the event's
    ``_id`` must equal its sort key, else ChangeStreamFatalError (280). A missing ``$sortKey``
    is InternalError (1) "Missing field '$sortKey' in document" (ARM ``_addBatchToBuffer``).
    Config-server events are decoded (they are few) to learn the added shard's name and time.
    """
    raw: bytes = event.raw
    if not is_config:
        fast = _fast_item(raw)
        if fast is not None:
            return fast
    try:
        id_val = event["_id"]
    except KeyError:
        id_val = None
    id_raw = getattr(id_val, "raw", None)
    stripped = strip_sort_key(raw, id_raw)
    if stripped is None:
        # Slow path: find out what is wrong (or handle an unusual field layout) by decoding.
        import bson
        from bson.raw_bson import RawBSONDocument
        from shardsim.client import RAW_CODEC
        try:
            sort_key = event["$sortKey"]
        except KeyError:
            raise MongoError(1, "Missing field '$sortKey' in document") from None
        if isinstance(sort_key, (list, tuple)) and len(sort_key) == 1:
            sk_tok = sort_key[0]
        else:
            sk_tok = sort_key
        sk_raw = getattr(sk_tok, "raw", None)
        if id_raw is None or sk_raw is None or sk_raw != id_raw:
            found = bson.decode(raw)
            found.pop("$sortKey", None)
            raise MongoError(280, f"{ID_MODIFIED_MSG} Expected: {{_id: {_fmt(sk_tok)}}} but found: "
                                  f"{_fmt(found.get('_id')) if '_id' in found else '{}'}")
        # _id is fine but $sortKey was not last: rebuild without it (rare; costs one decode).
        doc = bson.decode(raw, RAW_CODEC)
        stripped = bson.encode({k: doc[k] for k in doc if k != "$sortKey"})
        stripped = RawBSONDocument(stripped).raw
    op = None
    try:
        op = event["operationType"]
    except KeyError:
        pass
    item = Item(token_key(id_val), id_val, stripped, op)
    if is_config:
        import bson
        doc = bson.decode(stripped)
        full = doc.get("fullDocument") or {}
        ns = doc.get("ns") or {}
        ct = doc.get("clusterTime")
        item.meta = {"shard": full.get("_id") if isinstance(full, dict) else None,
                     "host": full.get("host") if isinstance(full, dict) else None,
                     "cluster_time": (ct.time << 32 | ct.inc) if ct is not None else None,
                     "is_shard_insert": op == "insert" and ns.get("db") == "config"
                     and ns.get("coll") == "shards"}
    return item


def _fmt(value: Any) -> str:
    if isinstance(value, dict) or hasattr(value, "raw"):
        try:
            items = value.items()
        except Exception:
            return str(value)
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in items) + "}"  # Document::toString
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


# ---------------------------------------------------------------------------------------------
# The AsyncResultsMerger core
# ---------------------------------------------------------------------------------------------

class Remote:
    """Per-remote state (ARM ``RemoteCursorData``).

    ``name`` — shard id (or ``"config"``); ``ns`` — the remote cursor's namespace;
    ``cursor_id`` — 0 once exhausted; ``buffer`` — events received, not yet released;
    ``promise``/``promise_token`` — latest postBatchResumeToken (key, document);
    ``eligible`` — may set the HWM (§1.4); ``in_flight`` — a getMore is outstanding;
    ``status`` — the first error (MongoError) this remote reported; ``queued`` — how many of
    its events sit in the merger's release queue (taken from ``buffer``, proven ready);
    ``more`` — set by the owner when the remote's last batch was full (it has a backlog), so
    it may be polled while its buffer still holds fewer than ``PREFETCH_EVENTS`` events.
    """

    __slots__ = ("rid", "name", "ns", "is_config", "cursor_id", "buffer", "promise",
                 "promise_token", "eligible", "invalidated", "in_flight", "status", "closed",
                 "last_key", "address", "queued", "more")

    def __init__(self, rid: int, name: str, ns: str, is_config: bool) -> None:
        self.rid = rid
        self.name = name
        self.ns = ns
        self.is_config = is_config
        self.cursor_id = 0
        self.buffer: deque[Item] = deque()
        self.promise: Key | None = None
        self.promise_token: Any = None
        self.eligible = False
        self.invalidated = False
        self.in_flight = False
        self.status: MongoError | None = None
        self.closed = False
        self.last_key: Key | None = None
        self.address = ""
        self.queued = 0
        self.more = False

    @property
    def exhausted(self) -> bool:
        return self.cursor_id == 0

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Remote({self.name}, id={self.cursor_id}, buf={len(self.buffer)}, "
                f"promise={self.promise and self.promise[0]}, eligible={self.eligible})")


class Merger:
    """The change-stream half of the ARM (sorted, TailableAndAwaitData).

    Feed it with :meth:`add_remote` (establish-time batch) and :meth:`on_batch` /
    :meth:`on_error` (getMore replies); ask :meth:`ready`, :meth:`next_ready`,
    :meth:`high_water_mark`, :meth:`remotes_to_poll`. Errors: :meth:`next_ready` raises the
    first remote error (MongoError with the remote's code) once any remote failed.

    Releasing is done in runs: when asked, every buffered event at or below the minimum promise
    is moved, k-way merged (``heapq.merge``), into a release queue at once, instead of scanning
    all remotes for every event. The queue is exactly the sequence the per-event rule would
    release (promises only grow; when a remote is added its promise may be lower, so the queue
    is then put back into the buffers). A remote whose events all moved to the queue has an
    empty buffer and is polled again (its next batch is fetched while the queue drains).
    """

    def __init__(self) -> None:
        self.remotes: list[Remote] = []
        self._next_rid = 0
        self.hwm: Key | None = None
        self.hwm_token: Any = None
        self.status: MongoError | None = None
        self._queue: deque[Item] = deque()

    # -- remotes ------------------------------------------------------------------------------
    def add_remote(self, name: str, ns: str, cursor_id: int, first_batch: Iterable[Item],
                   pbrt: Any, *, is_config: bool = False) -> Remote:
        """Add a remote and process its establish-time batch like a getMore reply
        (``_buildRemote`` / ``addNewShardCursors``): its PBRT participates at once."""
        self._unqueue()  # the new remote's promise may be below queued events
        remote = Remote(self._next_rid, name, ns, is_config or ns == CONFIG_SHARDS_NS)
        self._next_rid += 1
        self.remotes.append(remote)
        self.on_batch(remote, list(first_batch), cursor_id, pbrt)
        return remote

    def set_initial_high_water_mark(self) -> None:
        """``_setInitialHighWaterMark``: the lowest promise of an eligible remote (the config
        cursor is never eligible on its first batch)."""
        cands = sorted((r.promise, r.rid, r) for r in self.remotes
                       if r.promise is not None)
        for key, _, r in cands:
            if r.eligible:
                self.hwm, self.hwm_token = key, r.promise_token
                return

    def remove_remote(self, remote: Remote) -> None:
        """``closeShardCursors``: forget a remote; its buffered events are still released."""
        remote.closed = True
        if not remote.buffer and not remote.queued:
            self.remotes.remove(remote)

    # -- responses ----------------------------------------------------------------------------
    def on_batch(self, remote: Remote, items: list[Item], cursor_id: int, pbrt: Any,
                 *, invalidated: bool = False) -> None:
        """Process one reply (``_updateRemoteMetadata`` + ``_addBatchToBuffer``).

        ``items`` in the remote's order; ``pbrt`` the reply's postBatchResumeToken (or None).
        A PBRT lower than the remote's previous promise, or an event below it, is an
        InternalError (1) recorded as the remote's status (the ARM's invariant).
        """
        remote.in_flight = False
        remote.cursor_id = int(cursor_id)
        remote.invalidated = invalidated
        old_promise = remote.promise
        if pbrt is not None:
            new_key = token_key(pbrt)
            eligible = self._check_eligibility(new_key, remote, bool(items))
            if remote.promise is not None and new_key < remote.promise:
                self._fail(remote, MongoError(1, f"postBatchResumeToken from {remote.name} went "
                                                 f"backwards: {new_key[0]} < {remote.promise[0]}"))
                return
            remote.eligible = eligible
            remote.promise, remote.promise_token = new_key, pbrt
        if items and old_promise is not None and items[0].key < old_promise:
            # The remote broke its own promise: releasing would reorder the stream.
            self._fail(remote, MongoError(1, f"{remote.name} returned an event "
                                             f"{items[0].key[0]} below its earlier "
                                             f"postBatchResumeToken {old_promise[0]}"))
            return
        for it in items:
            if remote.last_key is not None and it.key <= remote.last_key:
                self._fail(remote, MongoError(1, f"events from {remote.name} out of order: "
                                                 f"{it.key[0]} after {remote.last_key[0]}"))
                return
            remote.last_key = it.key
            it.src = remote
            remote.buffer.append(it)
        if items and remote.promise is not None and items[-1].key > remote.promise:
            self._fail(remote, MongoError(1, f"postBatchResumeToken from {remote.name} is below "
                                             f"its last event"))

    def on_error(self, remote: Remote, exc: MongoError) -> None:
        """A getMore (or establish) on ``remote`` failed: the first error wins (§1.10)."""
        remote.in_flight = False
        self._fail(remote, exc)

    def _fail(self, remote: Remote, exc: MongoError) -> None:
        if remote.status is None:
            remote.status = exc
        if self.status is None:
            self.status = exc

    def _check_eligibility(self, new_key: Key, remote: Remote, non_empty: bool) -> bool:
        """``_checkHighWaterMarkEligibility`` (§1.4): only the config.shards cursor is special."""
        if not remote.is_config:
            return True
        if self.hwm is not None and new_key < self.hwm:
            return False  # future startAtOperationTime: hold the HWM at the user's start
        if non_empty:
            return False  # a shard-added event will be swallowed; its token is not resumable
        if remote.eligible:
            return True
        return remote.promise is not None and new_key > remote.promise

    # -- readiness ----------------------------------------------------------------------------
    def min_promise(self) -> Remote | None:
        """The remote holding the lowest promise, or None unless every remote has one."""
        best: Remote | None = None
        for r in self.remotes:
            if r.closed:
                continue
            if r.promise is None:
                return None
            if best is None or (r.promise, r.rid) < (best.promise, best.rid):
                best = r
        return best

    def _head(self) -> Remote | None:
        best: Remote | None = None
        for r in self.remotes:
            if r.buffer and (best is None or (r.buffer[0].key, r.rid) < (best.buffer[0].key, best.rid)):
                best = r
        return best

    def _unqueue(self) -> None:
        """Put queued events back at the front of their remotes' buffers (in order)."""
        q = self._queue
        while q:
            it = q.pop()
            it.src.buffer.appendleft(it)
            it.src.queued -= 1

    def _refill(self) -> bool:
        """Move every event that is ready now (key ``<=`` the minimum promise over all
        remotes; everything once only closed remotes are left) into the release queue, in
        merged order (ties: lowest remote id first, as :meth:`_head`). True when it queued any."""
        live = [r for r in self.remotes if r.buffer]
        if not live:
            return False
        mp = self.min_promise()
        if mp is None:
            if not all(r.closed for r in self.remotes):
                return False
            bound = None
        else:
            bound = mp.promise
        runs: list[list[Item]] = []
        for r in live:  # self.remotes is in remote id order
            buf = r.buffer
            if bound is None or buf[-1].key <= bound:
                run = list(buf)
                buf.clear()
            else:
                run = []
                while buf and buf[0].key <= bound:  # type: ignore[operator]
                    run.append(buf.popleft())
            if run:
                r.queued += len(run)
                runs.append(run)
        if not runs:
            return False
        if len(runs) == 1:
            self._queue.extend(runs[0])
        else:
            self._queue.extend(heapq.merge(*runs, key=_KEY))
        return True

    def ready(self) -> bool:
        """``_readySortedTailable``: an error is pending, or the smallest buffered event is
        ``<=`` the minimum promise over all remotes."""
        if self.status is not None:
            return True
        return bool(self._queue) or self._refill()

    def next_ready(self) -> tuple[Item, Remote]:
        """Pop the smallest ready event (``_nextReadySorted``); the HWM follows it when its
        remote is eligible. Raises the pending remote error (MongoError)."""
        if self.status is not None:
            raise self.status
        if not self._queue:
            assert self._refill(), "next_ready() called when not ready"
        item = self._queue.popleft()
        head: Remote = item.src
        head.queued -= 1
        if head.closed and not head.buffer and not head.queued:
            self.remotes.remove(head)
        if head.eligible and (self.hwm is None or item.key > self.hwm):
            self.hwm, self.hwm_token = item.key, item.token
        return item, head

    def high_water_mark(self) -> Any:
        """``getHighWaterMark`` (§1.7): when nothing is ready, advance to the lowest promise if
        its remote is eligible. Returns the token document (or None before any promise)."""
        mp = self.min_promise()
        if mp is not None and not self.ready() and mp.eligible:
            if self.hwm is None or mp.promise > self.hwm:  # type: ignore[operator]
                self.hwm, self.hwm_token = mp.promise, mp.promise_token
        return self.hwm_token

    def invalidated_remote(self) -> Remote | None:
        """``_assertNotInvalidated``: the remote owning the minimum promise when it is
        invalidated and nothing is ready, else None."""
        mp = self.min_promise()
        if mp is not None and mp.invalidated and not self.ready():
            return mp
        return None

    def remotes_to_poll(self) -> list[Remote]:
        """``_scheduleGetMores``: remotes with an empty buffer, a live cursor and no request
        in flight. A remote holding events is polled only when its last batch was full
        (``more``) and it holds fewer than ``PREFETCH_EVENTS`` (prefetch while its buffer
        drains; still at most one request in flight per remote cursor)."""
        if self.status is not None:
            return []
        return [r for r in self.remotes
                if (not r.buffer or (r.more and len(r.buffer) < PREFETCH_EVENTS))
                and r.cursor_id != 0 and not r.in_flight and not r.closed]

    def blocking_remotes(self) -> tuple[Item | None, list[Remote]]:
        """When the smallest buffered event is not ready only because of promises: that event
        and the live remotes whose promise is missing or below its key (they hold it back).
        ``(None, [])`` when nothing is buffered, an event is ready or an error is pending.
        Pure; used by the router to ask exactly those remotes for a newer promise."""
        if self.status is not None:
            return None, []
        head = self._head()
        if head is None or self.ready():
            return None, []
        item = head.buffer[0]
        return item, [r for r in self.remotes
                      if not r.closed and not r.buffer and r.cursor_id != 0
                      and (r.promise is None or r.promise < item.key)]

    def has_in_flight(self) -> bool:
        return any(r.in_flight for r in self.remotes)


_KEY = attrgetter("key")
# A remote with a backlog is asked for its next batch while it holds fewer events than this.
PREFETCH_EVENTS = 4096


# ---------------------------------------------------------------------------------------------
# Router-side stages above the ARM
# ---------------------------------------------------------------------------------------------

# Operation types :meth:`ChangeStreamMerge.take` leaves to :meth:`ChangeStreamMerge.next`.
_GENERAL_OPS = frozenset({"invalidate", "kNewShardDetected"})


@dataclass(slots=True)
class NewShard:
    """Output of :meth:`ChangeStreamMerge.next`: open a cursor on ``shard`` with
    ``resumeAfter: start_token`` (HWM of the addShard event's clusterTime + 1 tick) and add it
    with :meth:`Merger.add_remote` before asking for the next event."""

    shard: str
    start_token: dict[str, str]
    host: str | None = None


class ChangeStreamMerge:
    """The merged stream: ARM + HandleTopologyChange + EnsureResumeTokenPresent + invalidate.

    ``resume_token`` — the client's resumeAfter/startAfter token (dict) or None. When it is an
    event token (not a HWM) the merged stream must contain it: identical tokens are swallowed,
    and the first event past it raises ChangeStreamFatalError 280 unless it was seen (§8.2).
    ``known_shards`` — shard names that already have a cursor (config.shards inserts for
    them are ignored).
    """

    def __init__(self, merger: Merger, *, resume_token: Any = None,
                 known_shards: Iterable[str] = (), start_after: bool = False) -> None:
        self.merger = merger
        self.known_shards = set(known_shards)
        self._resume_key: Key | None = None
        self._resume_seen = False
        self._resume_is_invalidate = False
        if resume_token is not None:
            key = token_key(resume_token)
            if not is_hwm_data(key[0]):
                self._resume_key = key
                self._resume_is_invalidate = is_invalidate_data(key[0])
        self.last_key: Key | None = None
        self.invalidated = False
        self._stashed: Item | None = None

    def take(self, limit: int, budget: int | None, count: int, used: int) -> tuple[list[Any], Any, int]:
        """Fast path of :meth:`next` for a catch-up: pop ready plain events (shard events that
        are not ``invalidate``/``kNewShardDetected``, in strictly increasing order, no resume
        check pending) while fewer than ``limit`` are taken and the reply stays within
        ``budget`` bytes. ``count``/``used`` — events/bytes already in the reply (each event
        costs its size plus its array element header; ``budget`` None = payloads are not bytes,
        no byte limit, as in the simulation). Returns (payloads, token of the last
        one or None, new ``used``). Stops at the first event needing :meth:`next`'s general
        handling, which then takes it; the HWM follows exactly as with :meth:`next`."""
        out: list[Any] = []
        m = self.merger
        if self._stashed is not None or self._resume_key is not None or m.status is not None:
            return out, None, used
        q = m._queue
        last_key = self.last_key
        tok = None
        hwm = m.hwm
        hwm_tok = m.hwm_token
        while len(out) < limit and (q or m._refill()):
            item = q[0]
            r = item.src
            key = item.key
            if r.is_config or item.op in _GENERAL_OPS or (last_key is not None and key <= last_key):
                break
            if budget is not None:
                sz = len(item.payload) + len(str(count)) + 2
                if count and used + sz > budget:
                    break
                used += sz
            q.popleft()
            r.queued -= 1
            if r.closed and not r.buffer and not r.queued:
                m.remotes.remove(r)
            if r.eligible and (hwm is None or key > hwm):
                hwm, hwm_tok = key, item.token
            last_key = key
            out.append(item.payload)
            tok = item.token
            count += 1
        m.hwm, m.hwm_token = hwm, hwm_tok
        self.last_key = last_key
        return out, tok, used

    def push_back(self, item: Item) -> None:
        """Return ``item`` again from the next :meth:`next` (a batch was full, 16 MiB)."""
        self._stashed = item

    def next(self) -> Item | NewShard | None:
        """The next event to return (an :class:`Item`), a :class:`NewShard` action, or None
        when nothing is ready. Raises MongoError for a remote error or a failed resume check."""
        if self._stashed is not None:
            item, self._stashed = self._stashed, None
            return item
        m = self.merger
        while m.ready():
            item, remote = m.next_ready()
            if remote.is_config:
                # HandleTopologyChange: config.shards events are swallowed; inserts add shards.
                meta = item.meta
                if meta.get("is_shard_insert") and meta.get("shard") and meta["shard"] not in self.known_shards:
                    ct = meta.get("cluster_time")
                    if ct is None:
                        ct = token_ts_key(item.key[0]) or 0
                    self.known_shards.add(meta["shard"])
                    return NewShard(meta["shard"], hwm_token(ct + 1), meta.get("host"))
                continue
            if item.op == "kNewShardDetected":
                continue  # legacy signal, swallowed by mongos 4.4+
            if self.last_key is not None and item.key <= self.last_key:
                if item.key == self.last_key:
                    continue  # the same event from two shards (identical token): return it once
                raise MongoError(1, f"change stream merge out of order: {item.key[0]} after "
                                    f"{self.last_key[0]}")
            if self._resume_key is not None:
                if item.key < self._resume_key:
                    continue
                if item.key == self._resume_key:
                    self._resume_seen = True
                    continue
                if not self._resume_seen and not self._resume_is_invalidate:
                    raise MongoError(280, "cannot resume stream; the resume token was not found. "
                                          f"{_fmt(item.token)}")
                self._resume_key = None
            self.last_key = item.key
            if item.op == "invalidate":
                self.invalidated = True
            return item
        return None
