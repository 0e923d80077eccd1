"""Raw shard events on the router: parsing shard replies in place and cutting ``$sortKey``.

The router forwards events as bytes (``DESIGN.md``: forward bytes, don't decode what you only
pass on). A shard's change-stream event ends with ``$sortKey: [<_id>]`` (``needsMerge``); the
router checks ``_id == $sortKey[0]`` (``RouterStagePipeline::_validateAndConvertToBSON``,
ChangeStreamFatalError 280), orders events by that key and strips it before replying.

- :class:`Item` — one event (general path: config-server events, unusual layouts, the
  simulation);
- :class:`Block` — a whole run of plain events of one shard batch, kept as offsets into the
  reply's bytes: checked once per batch, ordered by binary search on keys read on demand, and
  written to the client's batch without a per-event object (:func:`parse_block`);
- :func:`split_cursor` — a shard reply's ``cursor`` subdocument as (its other fields, [Block]
  or [Item, ...]).
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardsim.core.cursors import ONE_BY_ONE_OP_ELEMENTS, element_headers
from shardsim.core.cursors import SORT_KEY_LAYOUT_FIELD as LAYOUT_CHECKED_FIELD
from shardsim.core.cursors import SORT_KEY_SIZES_FIELD as SIZES_FIELD
from shardsim.core.errors import MongoError
from shardsim.core.resume_token import token_key

from shardsim.core.resume_token import SortKey as Key  # (data_hex, has_type_bits, type_bits)


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

    @property
    def last(self) -> Key:
        """The key of the last event of this buffer entry (an Item is one event)."""
        return self.key

    @property
    def n(self) -> int:
        """Number of events in this buffer entry (1; see :class:`Block`)."""
        return 1

    @property
    def last_token(self) -> Any:
        """The resume token of the last event of this buffer entry (its own)."""
        return self.token

    @property
    def nbytes(self) -> int:
        """Bytes this entry holds (its payload when it is bytes; 0 in the simulation)."""
        p = self.payload
        return len(p) if isinstance(p, (bytes, bytearray)) else 0


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
    ``operationType`` second when present, ``$sortKey: [<_id>]`` last (an event projected to
    ``{_id}`` alone is ``_id`` then ``$sortKey``). The event is ``buf[s:s + n]`` (the whole of
    ``buf`` by default; bytes, or a memoryview of the wire message, copied once), so a shard
    reply's batch is parsed in place. The payload is the event without ``$sortKey`` (bytes).
    None when the layout differs or the bytes are not what this layout reads (never raises:
    the caller then takes the general path, :func:`item_from_raw_event`)."""
    if type(buf) is not bytes:
        buf = bytes(buf)
    try:
        return _fast_item_unchecked(buf, s, n)
    except (struct.error, IndexError, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def _fast_item_unchecked(buf: bytes, s: int, n: int | None) -> Item | None:
    """:func:`_fast_item` without its guard (out-of-range offsets raise)."""
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
    if (t < id_end or buf[e - 1] != 0 or buf[e - 2] != 0
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


def split_cursor(raw: bytes, batch_field: str) -> tuple[dict[str, Any], list[Any]] | None:
    """Split a shard reply's raw ``cursor`` subdocument into its other fields (decoded: ``id``,
    ``ns``, ``postBatchResumeToken``, ...) and the events of ``batch_field``
    (``firstBatch``/``nextBatch``) parsed in place from the reply's bytes: one :class:`Block`
    for a batch of plain events, else an :class:`Item` per event (no per-event
    RawBSONDocument, no decode). None when anything is unusual (an element type
    not handled here, an event in another layout): the caller then takes the general path."""
    import bson
    from shardsim.core.node import CODEC
    if not isinstance(raw, bytes):
        raw = bytes(raw)  # a memoryview of the wire message: one copy per reply
    end = _i32.unpack_from(raw, 0)[0] - 1
    pos = 4
    rest: list[bytes] = []
    items: list[Item] = []
    array: tuple[int, int] | None = None
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
            array = (v + 4, v + size - 1)
        else:
            rest.append(raw[pos:v + size])
        pos = v + size
    body = b"".join(rest)
    meta = bson.decode(_i32.pack(len(body) + 5) + body + b"\x00", CODEC)
    if array is None:
        return meta, items
    a, stop = array
    if a < stop:
        sizes = meta.pop(SIZES_FIELD, None)
        checked = meta.pop(LAYOUT_CHECKED_FIELD, False) is True
        block = None
        if checked and isinstance(sizes, bytes):
            block = block_from_sizes(raw, a, stop, sizes)
        if block is None:  # not vouched for, or the sizes disagree with the bytes: check it all
            block = parse_block(raw, a, stop)
        if block is not None:
            return meta, [block]
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
    return meta, items


# ---------------------------------------------------------------------------------------------
# Blocks: a shard batch's run of plain events, kept as offsets into the reply's bytes
# ---------------------------------------------------------------------------------------------

class Block:
    """Events ``lo .. hi - 1`` of one shard batch, in the shard's (key) order, not decoded.

    ``raw`` — the reply's ``cursor`` bytes; ``starts[i]`` — offset of event i's document;
    ``cuts[i]`` — offset of its trailing ``$sortKey`` element (the payload forwarded to the
    client is the document up to there, re-terminated); ``key``/``last`` — sort keys (see
    :func:`token_key`) of the first and last event; ``src`` — the remote (set by the merger).
    Built only by :func:`parse_block`, which proved every event's layout (``_id`` token first,
    ``$sortKey: [<_id>]`` last, not ``invalidate``/``kNewShardDetected``). Keys of the events
    in between are read from the bytes on demand (binary search), so a run costs O(log n)
    key reads, not one object per event.
    """

    __slots__ = ("raw", "starts", "cuts", "lo", "hi", "key", "last", "src")

    def __init__(self, raw: bytes, starts: list[int], cuts: list[int], lo: int, hi: int,
                 key: Key | None = None) -> None:  # noqa: D107 - see the class docstring
        self.raw = raw
        self.starts = starts
        self.cuts = cuts
        self.lo = lo
        self.hi = hi
        self.key = self.key_at(lo) if key is None else key
        self.last = self.key_at(hi - 1)
        self.src: Any = None

    @property
    def n(self) -> int:
        """Number of events left in the block."""
        return self.hi - self.lo

    @property
    def last_token(self) -> dict[str, Any]:
        """The resume token of its last event."""
        return self.token_at(self.hi - 1)

    @property
    def nbytes(self) -> int:
        """Bytes of the reply its events span (what holding them costs, roughly)."""
        return self.cuts[self.hi - 1] - self.starts[self.lo]

    def _token_parts(self, i: int) -> tuple[str, bytes | None, int]:
        raw = self.raw
        d = self.starts[i]
        sl = _i32.unpack_from(raw, d + 20)[0]
        try:
            data = raw[d + 24:d + 23 + sl].decode()
        except UnicodeDecodeError:
            raise MongoError(1, "malformed resume token in a shard's event") from None
        p = d + 24 + sl
        if raw[p] == 0:
            return data, None, 0
        blen = _i32.unpack_from(raw, p + 11)[0]
        return data, raw[p + 16:p + 16 + blen], raw[p + 15]

    def key_at(self, i: int) -> Key:
        """The sort key of event ``i`` (an index into ``starts``)."""
        data, tb, _ = self._token_parts(i)
        if tb is None:
            return (data, 0, b"")
        return (data, 1, len(tb).to_bytes(4, "big") + tb)

    def token_at(self, i: int) -> dict[str, Any]:
        """The resume token document ``{_data[, _typeBits]}`` of event ``i``."""
        data, tb, subtype = self._token_parts(i)
        if tb is None:
            return {"_data": data}
        from bson.binary import Binary
        return {"_data": data, "_typeBits": Binary(tb, subtype)}

    def item_at(self, i: int) -> Item:
        """Event ``i`` as an :class:`Item` (for the per-event path)."""
        raw = self.raw
        d = self.starts[i]
        it = _fast_item(raw, d)
        if it is None:  # not expected (the layout was checked); never an assertion to the client
            from bson.raw_bson import RawBSONDocument
            n = _i32.unpack_from(raw, d)[0]
            it = item_from_raw_event(RawBSONDocument(bytes(raw[d:d + n])))
        it.src = self.src
        return it

    def pop_item(self) -> Item:
        """Remove the first event and return it as an :class:`Item` (the block must not be
        left empty by the caller: check :attr:`n` first)."""
        it = self.item_at(self.lo)
        self.lo += 1
        if self.lo < self.hi:
            self.key = self.key_at(self.lo)
        return it

    def count_le(self, bound: Key) -> int:
        """How many of the first events have a key ``<= bound`` (binary search)."""
        return bisect.bisect_right(range(self.lo, self.hi), bound, key=self.key_at)

    def split(self, n: int) -> "Block":
        """Detach and return the first ``n`` events (``0 < n < self.n``) as a new block."""
        head = Block(self.raw, self.starts, self.cuts, self.lo, self.lo + n, self.key)
        head.src = self.src
        self.lo += n
        self.key = self.key_at(self.lo)
        return head

    def payload_bytes(self, n: int) -> int:
        """Total size in bytes of the first ``n`` payloads (documents without ``$sortKey``)."""
        lo = self.lo
        return sum(self.cuts[lo:lo + n]) - sum(self.starts[lo:lo + n]) + n

    def fit(self, n: int, count: int, used: int, budget: int) -> int:
        """How many of the first ``n`` events fit in a reply batch holding ``count`` events of
        ``used`` bytes so far, within ``budget`` bytes (each event costs its payload plus its
        array element header); the first event of a batch always fits."""
        hdr = 2 + len(str(count + n))
        if used + self.payload_bytes(n) + n * hdr <= budget:
            return n
        starts, cuts = self.starts, self.cuts
        k = 0
        for i in range(self.lo, self.lo + n):
            sz = cuts[i] - starts[i] + 1 + len(str(count + k)) + 2
            if (count + k) and used + sz > budget:
                break
            used += sz
            k += 1
        return k

    def write(self, parts: list[bytes], base: int) -> int:
        """Append the BSON array elements of all events, indexes from ``base``, to ``parts``
        (each: header, the document without ``$sortKey`` with its length fixed). Returns the
        index after the last one."""
        pack = _i32.pack
        raw = memoryview(self.raw)  # slices below are views: the one copy is the final join
        lo, hi = self.lo, self.hi
        ext = parts.extend
        for h, s, t in zip(element_headers(base, hi - lo), self.starts[lo:hi], self.cuts[lo:hi]):
            ext((h, pack(t - s + 1), raw[s + 4:t], b"\x00"))
        return base + hi - lo

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Block({self.n} events, {self.key[0]} .. {self.last[0]})"


def _typebits_ok(raw: bytes, p: int, id_end: int) -> bool:
    """Is ``raw[p:id_end]`` exactly ``_typeBits: BinData`` plus the _id document's NUL?"""
    if not raw.startswith(_TB_HEAD, p):
        return False
    return p + 16 + _i32.unpack_from(raw, p + 11)[0] == id_end - 1 and raw[id_end - 1] == 0


_HEADER_LENGTHS = np.zeros(0, dtype=np.int64)  # 2 + len(str(i)): array element header of index i
_TAIL_LEN = len(_TAIL_HEAD) + 7  # the $sortKey element's head (see _tail_head)
_I4 = np.arange(4, dtype=np.int64)
_TAIL_RANGE = np.arange(_TAIL_LEN, dtype=np.int64)


def _header_lengths(n: int) -> np.ndarray:
    global _HEADER_LENGTHS
    if len(_HEADER_LENGTHS) < n:
        _HEADER_LENGTHS = np.array([2 + len(str(i)) for i in range(max(n, 2 * len(_HEADER_LENGTHS)))],
                                   dtype=np.int64)
    return _HEADER_LENGTHS[:n]


# Below this many events a vouched batch is checked event by event: numpy's fixed cost per call
# (~45 us for the whole check) is more than the per-event Python steps (~0.5 us each).
NUMPY_MIN_EVENTS = 100


def block_from_sizes(raw: bytes, a: int, stop: int, sizes: bytes) -> Block | None:
    """A :class:`Block` from the event and ``_id`` sizes the shard sent with a batch it vouched
    for (``SORT_KEY_SIZES_FIELD``): offsets by running sums, then checked against the bytes
    (every document's and ``_id``'s length prefix, each ``$sortKey`` element's head where those
    lengths put it, the array's end): for a batch of ``NUMPY_MIN_EVENTS`` or more as
    whole-array numpy operations, for a smaller one (a live stream's usual batch) event by
    event. None when anything disagrees (the caller then parses the batch itself)."""
    n, odd = divmod(len(sizes), 8)
    if odd or not n or stop > len(raw):
        return None
    if n < NUMPY_MIN_EVENTS:
        return _small_block_from_sizes(raw, a, stop, sizes, n)
    v = np.frombuffer(sizes, dtype="<i4").astype(np.int64)
    lens, ids = v[:n], v[n:]
    # An event is at least: length, "_id" element head, the _id document, the $sortKey element
    # (its head, the _id again, two NULs) and its own NUL; so every offset below stays inside
    # raw[a:stop] once the running sum ends at stop.
    if int(ids.min()) < 5 or bool((lens < 2 * ids + 28).any()):
        return None
    ends = np.cumsum(_header_lengths(n) + lens)
    ends += a
    if int(ends[-1]) != stop:
        return None
    starts = ends - lens
    cuts = ends - ids - 19
    buf = np.frombuffer(raw, dtype=np.uint8)
    if not (np.array_equal(buf[starts[:, None] + _I4].view("<i4").ravel(), lens)
            and np.array_equal(buf[starts[:, None] + (_I4 + 9)].view("<i4").ravel(), ids)):
        return None
    heads = buf[cuts[:, None] + _TAIL_RANGE]  # (n, _TAIL_LEN)
    lengths = np.unique(ids)  # usually one: every _id token of a batch has the same length
    for il in lengths.tolist():
        want = np.frombuffer(_tail_head(il), dtype=np.uint8)
        rows = heads if len(lengths) == 1 else heads[ids == il]
        if not (rows == want).all():
            return None
    return Block(raw, starts.tolist(), cuts.tolist(), 0, n)


def _small_block_from_sizes(raw: bytes, a: int, stop: int, sizes: bytes, n: int) -> Block | None:
    """:func:`block_from_sizes` for a few events: the same checks, one Python step each."""
    v = struct.unpack_from(f"<{2 * n}i", sizes, 0)
    lens, ids = v[:n], v[n:]
    if min(ids) < 5 or any(ln < 2 * il + 28 for ln, il in zip(lens, ids)):
        return None
    hl = _header_lengths(n).tolist()
    starts: list[int] = []
    cuts: list[int] = []
    pos = a
    unpack = _i32.unpack_from
    try:
        for h, ln, il in zip(hl, lens, ids):
            s = pos + h
            pos = s + ln
            cut = pos - il - 19
            if (pos > stop or unpack(raw, s)[0] != ln or unpack(raw, s + 9)[0] != il
                    or not raw.startswith(_tail_head(il), cut)):
                return None
            starts.append(s)
            cuts.append(cut)
    except struct.error:
        return None
    if pos != stop:
        return None
    return Block(raw, starts, cuts, 0, n)


def parse_block(raw: bytes, a: int, stop: int) -> Block | None:
    """The events of a shard batch's array, ``raw[a:stop]`` (its elements), as one
    :class:`Block`; None when the batch is empty or any event needs the per-event path (a
    layout other than the shards' own: ``_id`` token first, ``$sortKey: [<_id>]`` last, equal
    byte for byte — the ``_id`` modification check of ``_validateAndConvertToBSON``; or an
    ``invalidate``/``kNewShardDetected`` event, or array element names not as long as
    0, 1, 2...: names are skipped, not read, as the per-event path ignores them). A batch the
    shard vouched for goes through :func:`block_from_sizes` instead."""
    unpack = _i32.unpack_from
    starts: list[int] = []
    ends: list[int] = []
    add_start, add_end = starts.append, ends.append
    i = 0
    try:
        while a < stop:
            if raw[a] != 3:
                return None
            # the element name is str(i): 1 type byte, the digits, NUL
            d = a + 3 + (i > 9) + (i > 99) + (i > 999) + (i > 9999) if i < 100000 else raw.index(0, a + 1) + 1
            add_start(d)
            a = d + unpack(raw, d)[0]
            add_end(a)
            i += 1
        if a != stop or not starts:
            return None
        ids = [unpack(raw, d + 9)[0] for d in starts]
        cuts = [e - il - 19 for e, il in zip(ends, ids)]
        th = _tail_head
        # invalidate/kNewShardDetected: their operationType follows _id (as _fast_item reads it)
        general = ONE_BY_ONE_OP_ELEMENTS
        # Per event: _id is {_data: <ASCII string>[, _typeBits: BinData]} and nothing else (what
        # Block.key_at and _fast_item read; the string's length says which), and $sortKey comes
        # after it and holds the same document byte for byte, then the two terminators.
        if not all(raw.startswith(_ID_HEAD, d + 4) and raw.startswith(_DATA_HEAD, d + 13)
                   and raw[d + 24:(z := d + 23 + unpack(raw, d + 20)[0])].isascii()
                   and raw[z] == 0 and (il == z - d + 17 - 24 or _typebits_ok(raw, z + 1, d + 9 + il))
                   and t >= d + 9 + il
                   and raw[t:e] == th(il) + raw[d + 9:d + 9 + il] + b"\x00\x00"
                   and not raw.startswith(general, d + 9 + il)
                   for d, e, il, t in zip(starts, ends, ids, cuts)):
            return None
        return Block(raw, starts, cuts, 0, len(starts))
    except (struct.error, IndexError, ValueError, MongoError):
        return None


def item_from_raw_event(event: Any, *, is_config: bool = False) -> Item:
    """Build an :class:`Item` from a shard's event (a RawBSONDocument with ``$sortKey`` last).

    Checks what mongos checks (``RouterStagePipeline::_validateAndConvertToBSON``): the event's
    ``_id`` must equal its sort key, else ChangeStreamFatalError (280). A missing ``$sortKey``
    is InternalError (1) "Missing field '$sortKey' in document" (ARM ``_addBatchToBuffer``).
    Config-server events are decoded (they are few) to learn the added shard's name and time.
    """
    raw: bytes = event.raw
    if type(raw) is not bytes:
        # A RawBSONDocument over a memoryview of the wire message (large replies): bytes once,
        # so every step below (endswith, slicing into the payload) works on bytes.
        from bson.raw_bson import RawBSONDocument
        from shardsim.core.client import RAW_CODEC
        raw = bytes(raw)
        event = RawBSONDocument(raw, RAW_CODEC)
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
        from shardsim.core.client import RAW_CODEC
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
            found_id = document_string(found.get("_id")) if "_id" in found else "{}"
            raise MongoError(280, f"{ID_MODIFIED_MSG} Expected: {{_id: {document_string(sk_tok)}}} "
                                  f"but found: {found_id}")
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


def document_string(value: Any) -> str:
    """``value`` (a token, document or scalar) as the server's ``Document::toString`` prints it
    in error messages: ``{_data: "8263..."}``."""
    if isinstance(value, dict) or hasattr(value, "raw"):
        try:
            items = value.items()
        except Exception:
            return str(value)
        return "{" + ", ".join(f"{k}: {document_string(v)}" for k, v in items) + "}"  # Document::toString
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)
