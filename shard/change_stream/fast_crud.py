"""Fused fast path for plain CRUD events: oplog entries -> encoded events in one step.

**A fused variant of the pipeline's stages** (:mod:`.pipeline`): oplog match
(``$_internalChangeStreamOplogMatch``) + transform (``$_internalChangeStreamTransform``) +
resumability (``$_internalChangeStreamCheckResumability``, a pass-through: the cursor uses this
path only once the stream is past its resume point) + encoding, for plain CRUD entries
(insert/update/replace/delete outside transactions). For those entries, in the streams it
serves (:func:`eligible`), the other stages are identities: nothing to unwind or invalidate, no
topology change, no images, no user stages.

A catch-up read spends most of its time on insert/update/replace/delete entries of streams
without per-event extras. For those the general pipeline (:class:`~.transform.Transform` ->
:class:`~.transform.Event` -> ``ChangeStreamCursor._emit`` -> ``encode_event``) builds a dict
per event and encodes it again. This module writes the same BSON directly from pieces, for a
run of entries at a time:

* cached per namespace (and collection UUID) and operation type: the ``ns`` element, the
  ``operationType`` element and the resume token's constant hex middle
  (:func:`shardsim.core.resume_token.event_mid_hex`), and for a documentKey ``{_id: <positive
  int32 | ObjectId>}`` a template of the whole token document (per byte count of an int id);
* per event: the ``_id`` token document, ``clusterTime`` packed from the scan key,
  ``wallTime`` (cached per equal ``datetime``: the op observer's ``wall_now`` hands out one object
  per millisecond), ``documentKey`` (written here for those ids), ``fullDocument`` /
  ``updateDescription`` (and other documentKeys) encoded by bson's C encoder — one encoder call
  for up to :data:`_RUN` events, which are then cut out of its output — and with
  ``needsMerge`` the trailing ``$sortKey: [<token>]``.

The output is byte-identical to the general path (``tests/unit/test_change_stream_fast_crud.py``
compares the two over many varied entries). Whatever the fast path does not cover it leaves to
the general path (the run stops before that entry): other operations, transactions,
``fromMigrate`` entries, namespaces the stream does not watch plainly (``system.views``), a
documentKey or document that is not a plain ``dict``, an event over the size limit, any encoding
error. Which streams may use it at all: :func:`eligible`; the cursor also keeps it off until the
stream has passed its resume point (:class:`~.cursor.ChangeStreamCursor`).
"""

from __future__ import annotations

import binascii
import datetime
import struct
from typing import Any, Callable

from bson import _dict_to_bson  # C-accelerated encoder; top_level=False keeps field order
from bson.binary import Binary
from bson.objectid import ObjectId
from bson.raw_bson import DEFAULT_RAW_BSON_OPTIONS

from shardsim.core import resume_token as rt
from shardsim.shard.change_stream.oplog_match import ns_predicate
from shardsim.core.change_stream_spec import StreamSpec
from shardsim.shard.change_stream.transform import update_description

# Set False to send every entry through the general path (tests compare the two).
ENABLED = True

_i32 = struct.Struct("<i").pack
_u64 = struct.Struct("<Q").pack
# Encoding ignores document_class (it only matters for decoding), and these options make the C
# encoder's per-call option conversion cheaper than DEFAULT_CODEC_OPTIONS (dict has no
# _type_marker to look up); uuid representation and type registry are the defaults, as in
# the general path's encode_event.
_OPTS = DEFAULT_RAW_BSON_OPTIONS

_ID_HEAD = b"\x03_id\x00"
_TS_HEAD = b"\x11clusterTime\x00"
_DATA_HEAD = b"\x02_data\x00"
_TB_HEAD = b"\x05_typeBits\x00"
_SK_HEAD = b"\x04$sortKey\x00"
_DK_HEAD = b"\x03documentKey\x00"
_FD_HEAD = b"\x03fullDocument\x00"
_UD_HEAD = b"\x03updateDescription\x00"
_DK_END = b"\x00"
_END = b"\x00"
_END2 = b"\x00\x00"
_i32_at = struct.Struct("<i").unpack_from
_hexlify = binascii.hexlify
_UPPER = bytes.maketrans(b"abcdef", b"ABCDEF")
# Events whose documents share one C encoder call (bounds the transient buffer).
_RUN = 64
# Bytes before the first element of {"a": [...]}: length, array type byte, "a\0", array length.
_ARRAY_START = 4 + 1 + 2 + 4

Run = Callable[[Any, Any, int, int, int], "tuple[int, int]"]
_OPS = ("insert", "update", "replace", "delete")


def eligible(spec: StreamSpec) -> bool:
    """True when no event of ``spec`` needs per-event extras the fast path does not write: no
    user stages (nor ``$changeStreamSplitLargeEvent``), ``fullDocument: "default"``,
    ``fullDocumentBeforeChange: "off"``, no ``showExpandedEvents`` (collectionUUID),
    ``showRawUpdateDescription`` or ``showCommitTimestamp``, version 2 tokens, and no field the
    server-version profile always adds (8.2.0's collectionUUID/commitTimestamp)."""
    return (ENABLED and not spec.user_stages and spec.full_document == "default"
            and spec.full_document_before_change == "off" and not spec.show_expanded
            and not spec.emit_collection_uuid and not spec.emit_commit_ts
            and not spec.show_raw_update and not spec.show_commit_ts and spec.token_version == 2)


def _element(name: str, value: Any) -> bytes:
    """One BSON element ``name: value`` as the C encoder writes it inside a document."""
    return _dict_to_bson({name: value}, False, _OPTS, False)[4:-1]


def token_doc(data: str, tb: bytes | None) -> bytes:
    """The BSON document ``{_data: data[, _typeBits: BinData(0, tb)]}`` (a token's ``_id``)."""
    raw = data.encode()
    body = _DATA_HEAD + _i32(len(raw) + 1) + raw + b"\x00"
    if tb is not None:
        body += _TB_HEAD + _i32(len(tb)) + b"\x00" + tb
    return _i32(len(body) + 5) + body + b"\x00"


def token_from_doc(tok: bytes) -> dict[str, Any]:
    """Inverse of :func:`token_doc`: the token document ``{_data[, _typeBits]}`` (``_typeBits``
    as ``Binary(.., 0)``, as the general path builds it)."""
    n = int.from_bytes(tok[11:15], "little")  # after int32 + 0x02 "_data\0"
    data = tok[15:14 + n].decode()
    pos = 15 + n
    if tok[pos] == 0:
        return {"_data": data}
    pos += len(_TB_HEAD)
    m = int.from_bytes(tok[pos:pos + 4], "little")
    return {"_data": data, "_typeBits": Binary(tok[pos + 5:pos + 5 + m], 0)}


class RawDoc:
    """An embedded document the C encoder copies from ``raw`` (``_type_marker`` 101)."""

    __slots__ = ("raw",)
    _type_marker = 101

    def __init__(self, raw: bytes) -> None:  # noqa: D107 - see the class docstring
        self.raw = raw


class _Op:
    """Pieces of one (namespace, collection UUID, operation type)."""

    __slots__ = ("head", "mid", "int_fmt", "int_sk", "int_sk_ud", "ns_dk_int", "fixed",
                 "int_fixed", "oid_fmt", "oid_sk", "oid_sk_ud", "ns_dk_oid", "oid_fixed")

    def __init__(self, op_type: str, uuid: bytes | None, ns_elem: bytes,
                 needs_merge: bool) -> None:
        # operationType element, then the clusterTime element's type and name.
        self.head = _element("operationType", op_type) + _TS_HEAD
        self.mid = rt.event_mid_hex(uuid, op_type, 0)
        # The token document of a documentKey {_id: v}, v a positive int32, by n (the bytes of
        # v << 1): a template filled with (key, v << 1) giving the document's header, the
        # _data characters, _data's NUL and the document's terminator; and the $sortKey
        # element's head for that token, after the documentKey's terminator.
        self.int_fmt = [b""]
        self.int_sk = [b""]
        for n in range(1, 6):
            chars = len(self.mid) + 36 + 2 * n
            head = _i32(chars + 17) + _DATA_HEAD + _i32(chars + 1)
            self.int_fmt.append(head.replace(b"%", b"%%")
                                + rt.int_id_token_template(self.mid, n).encode() + b"\x00\x00")
            self.int_sk.append(b"\x00" + _SK_HEAD + _i32(chars + 17 + 8) + b"\x030\x00")
        # ns element, then documentKey {_id: int32} up to the int32 value.
        self.ns_dk_int = ns_elem + _DK_HEAD + b"\x0e\x00\x00\x00\x10_id\x00"
        # Event length, _id element head, head and the clusterTime value.
        self.fixed = 4 + len(_ID_HEAD) + len(self.head) + 8
        # ... and, for a documentKey {_id: positive int32} by n, the token(s), the ns and
        # documentKey elements and the terminators: the event's size is this + the wallTime
        # element + the fullDocument / updateDescription element, if any.
        self.int_fixed = [0]
        self.int_sk_ud = [b""]
        for n in range(1, 6):
            lt = len(self.int_fmt[n] % (0, 0))
            size = self.fixed + lt + len(self.ns_dk_int) + 4 + 2
            self.int_fixed.append(size + (lt + 18 if needs_merge else 0))
            self.int_sk_ud.append(self.int_sk[n][1:])
        # The same for a documentKey {_id: <ObjectId>}: the template is filled with (key, the
        # id's bytes in uppercase hex).
        chars = len(self.mid) + 60
        head = _i32(chars + 17) + _DATA_HEAD + _i32(chars + 1)
        self.oid_fmt = (head.replace(b"%", b"%%") + rt.oid_id_token_template(self.mid).encode()
                        + b"\x00\x00")
        self.oid_sk = b"\x00" + _SK_HEAD + _i32(chars + 17 + 8) + b"\x030\x00"
        self.oid_sk_ud = self.oid_sk[1:]
        self.ns_dk_oid = ns_elem + _DK_HEAD + b"\x16\x00\x00\x00\x07_id\x00"
        lt = chars + 17
        size = self.fixed + lt + len(self.ns_dk_oid) + 12 + 2
        self.oid_fixed = size + (lt + 18 if needs_merge else 0)


class _Ns:
    """Cached pieces of one watched namespace (for the collection UUID last seen on it)."""

    __slots__ = ("ui", "ns", "ns_elem", "needs_merge", "i", "u", "r", "d")

    def __init__(self, db: str, coll: str, needs_merge: bool) -> None:
        self.ui: Any = _UNSET
        self.needs_merge = needs_merge
        self.ns = RawDoc(_dict_to_bson({"db": db, "coll": coll}, False, _OPTS, False))
        self.ns_elem = _element("ns", self.ns)

    def set_ui(self, ui: Any) -> None:
        uuid = bytes(ui) if ui is not None else None
        self.ui = ui
        self.i = _Op("insert", uuid, self.ns_elem, self.needs_merge)
        self.u = _Op("update", uuid, self.ns_elem, self.needs_merge)
        self.r = _Op("replace", uuid, self.ns_elem, self.needs_merge)
        self.d = _Op("delete", uuid, self.ns_elem, self.needs_merge)


_UNSET = object()


def build(spec: StreamSpec, append: Callable[[Any], None], make_doc: Callable[[bytes], Any],
          limit: int) -> Run:
    """The fast path of a stream (``eligible(spec)`` must hold):
    ``run(keys, entries, i, stop, need) -> (j, made)`` takes the oplog entries
    ``entries[i:stop]`` (``keys`` their ts keys) in order while the fast path covers them, at
    most ``need`` of them, appends their events ``(make_doc(raw), token, len(raw))`` with
    ``append`` and returns the index ``j`` of the first entry it did not take and the number
    of events made (``j - i``). ``entries[j]`` (if ``j < stop`` and fewer than ``need`` were
    made) is one the general path must handle, including deciding whether it matches.
    ``token`` is the event's ``_id`` as BSON bytes (:func:`token_from_doc` gives the dict).
    ``limit`` is the largest event size (bytes) it may emit; larger events are left to the
    general path (error or split). Never raises: what it cannot do, it leaves."""
    return _Fused(spec, append, make_doc, limit).run


def _encode(docs: list[Any]) -> tuple[bytes, int]:
    """``(BSON of {a: docs}, how many docs it holds)``: all of them, or those before the
    first one the C encoder refuses (none if only the whole array fails: the general path
    then takes the entries one by one)."""
    try:
        return _dict_to_bson({"a": docs}, False, _OPTS, False), len(docs)
    except Exception:
        for k, doc in enumerate(docs):
            try:
                _dict_to_bson(doc, False, _OPTS, False)
            except Exception:
                break
        else:
            return b"", 0
        try:
            return _dict_to_bson({"a": docs[:k]}, False, _OPTS, False), k
        except Exception:
            return b"", 0


class _Fused:
    """One stream's fast path (see :func:`build`): :meth:`run` takes entries in chunks of up to
    :data:`_RUN` events, each in two passes (one call per chunk, none per event)."""

    __slots__ = ("needs_merge", "ns_ok", "cache", "sk_heads", "last_wall", "last_wall_b",
                 "append", "make_doc", "limit")

    def __init__(self, spec: StreamSpec, append: Callable[[Any], None],
                 make_doc: Callable[[bytes], Any], limit: int) -> None:
        self.needs_merge = spec.needs_merge
        self.ns_ok = ns_predicate(spec)
        self.cache: dict[str, _Ns | None] = {}
        self.sk_heads: dict[int, bytes] = {}
        # wallTime element of the last datetime seen (the shard hands out one object per ms).
        self.last_wall: Any = _UNSET
        self.last_wall_b = b""
        self.append = append
        self.make_doc = make_doc
        self.limit = limit

    def _ns_pieces(self, ns: Any) -> _Ns | None:
        """The cached pieces of a namespace, None if the fast path does not cover it."""
        if type(ns) is not str:
            return None
        db, _, coll = ns.partition(".")
        info = (_Ns(db, coll, self.needs_merge)
                if coll and coll != "system.views" and self.ns_ok(ns) else None)
        cache = self.cache
        if len(cache) >= 1024:
            cache.clear()
        cache[ns] = info
        return info

    def run(self, keys: Any, entries: Any, i: int, stop: int, need: int) -> tuple[int, int]:
        """See :func:`build`. Per chunk of up to :data:`_RUN` entries, pass 1 (here) works out
        what each event is made of and collects its document; pass 2 (:meth:`_write`) encodes
        them at once and writes each event around its own. Pass 1 stops at the first entry the
        fast path does not cover."""
        start = i
        last_ns: Any = _UNSET
        last_pieces: _Ns | None = None
        cache = self.cache
        last_wall = self.last_wall
        last_wall_b = self.last_wall_b
        dt = datetime.datetime
        write = self._write
        while i < stop and need > 0:
            staged = []
            docs = []
            end = min(stop, i + (need if need < _RUN else _RUN))
            j = i
            while j < end:
                entry = entries[j]
                try:
                    ns = entry["ns"]
                    if ns is not last_ns:  # the shard's entries share their collection's ns
                        pieces = cache.get(ns, _UNSET)
                        if pieces is _UNSET:
                            pieces = self._ns_pieces(ns)
                        last_ns = ns
                        last_pieces = pieces
                    else:
                        pieces = last_pieces
                    if pieces is None or "txnOpIndex" in entry or entry.get("fromMigrate"):
                        break
                    if entry.get("ui") is not pieces.ui:
                        pieces.set_ui(entry.get("ui"))
                    op = entry["op"]
                    doc = None
                    if op == "i":
                        doc = entry["o"]
                        dk = entry.get("o2")
                        if dk is None:
                            dk = {"_id": doc.get("_id")}
                        if type(doc) is not dict or type(dk) is not dict:
                            break
                        p = pieces.i
                        kind = 0
                    elif op == "u":
                        doc = entry["o"]
                        dk = entry.get("o2")
                        if type(doc) is not dict or type(dk) is not dict:
                            break
                        diff = doc.get("diff")
                        if doc.get("$v") == 2 and isinstance(diff, dict):
                            p = pieces.u
                            doc = update_description(diff, False)
                            kind = 1
                        else:
                            p = pieces.r
                            kind = 0
                    elif op == "d":
                        dk = entry["o"]
                        if type(dk) is not dict:
                            break
                        p = pieces.d
                        kind = 2
                    else:
                        break
                    wall = entry.get("wall")
                    if wall is last_wall or (type(wall) is dt and wall == last_wall):
                        wall_b = last_wall_b
                    else:
                        wall_b = _element("wallTime", wall)
                        if type(wall) is dt:  # equal datetimes encode alike (UTC milliseconds)
                            last_wall = wall
                            last_wall_b = wall_b
                    key = keys[j]
                    v = dk.get("_id") if len(dk) == 1 else None
                    if type(v) is int and 0 < v <= 0x7FFFFFFF:
                        # documentKey {_id: positive int32}: token and documentKey written
                        # here; only fullDocument / updateDescription go to the C encoder.
                        sv = v << 1
                        n = (sv.bit_length() + 7) >> 3
                        tok = p.int_fmt[n] % (key, sv)
                        ns_dk = p.ns_dk_int
                        dkv = _i32(v)
                        sk = p.int_sk[n] if kind == 0 else p.int_sk_ud[n]
                        fixed = p.int_fixed[n]
                    elif type(v) is ObjectId:
                        dkv = v.binary
                        tok = p.oid_fmt % (key, _hexlify(dkv).translate(_UPPER))
                        ns_dk = p.ns_dk_oid
                        sk = p.oid_sk if kind == 0 else p.oid_sk_ud
                        fixed = p.oid_fixed
                    else:
                        # Other documentKeys: ns, documentKey and fullDocument /
                        # updateDescription all go to the C encoder, as one document.
                        if kind == 0:
                            doc = {"fullDocument": doc, "ns": pieces.ns, "documentKey": dk}
                        elif kind == 1:
                            doc = {"ns": pieces.ns, "documentKey": dk, "updateDescription": doc}
                        else:
                            doc = {"ns": pieces.ns, "documentKey": dk}
                        kind = 3
                        data, tb = rt.fast_event_token_hex(key, p.mid, dk)
                        tok = token_doc(data, tb)
                        ns_dk = dkv = sk = None
                        fixed = 0
                except Exception:
                    break  # the general path decides (and raises the real error, if any)
                if doc is not None:
                    docs.append(doc)
                staged.append((key, p, kind, tok, wall_b, ns_dk, dkv, sk, fixed))
                j += 1
            if not staged:
                break
            made = write(staged, docs)
            i += made
            need -= made
            if i < j or j < end:
                break  # entries[i] is the general path's
        self.last_wall = last_wall
        self.last_wall_b = last_wall_b
        return i, i - start

    def _write(self, staged: list[Any], docs: list[Any]) -> int:
        """Pass 2: encode ``docs`` at once, then write and append each staged event around its
        own document. Returns how many were appended: all, or those before the first one over
        the size limit or whose document the encoder refused (the general path's)."""
        needs_merge = self.needs_merge
        limit = self.limit
        append = self.append
        make_doc = self.make_doc
        if docs:
            try:  # the usual case inline; _encode finds how many of them it can encode
                buf = _dict_to_bson({"a": docs}, False, _OPTS, False)
                ok = len(docs)
            except Exception:
                buf, ok = _encode(docs)
        else:
            buf, ok = b"", 0
        pos = _ARRAY_START
        d = 0
        made = 0
        for key, p, kind, tok, wall_b, ns_dk, dkv, sk, fixed in staged:
            if kind != 2:
                if d == ok:
                    break  # its document cannot be encoded: the general path decides
                pos += 3 if d < 10 else (4 if d < 100 else len(str(d)) + 2)
                dlen = _i32_at(buf, pos)[0]
                doc_b = buf[pos:pos + dlen]
                pos += dlen
                d += 1
            if kind == 0:
                size = fixed + len(wall_b) + 14 + dlen
                if size > limit:
                    break
                if needs_merge:
                    raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                    _FD_HEAD, doc_b, ns_dk, dkv, sk, tok, _END2))
                else:
                    raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                    _FD_HEAD, doc_b, ns_dk, dkv, _END2))
            elif kind == 3:
                lt = len(tok)
                size = p.fixed + len(wall_b) + dlen - 5 + lt + 1
                if needs_merge:
                    size += lt + 18
                    if size > limit:
                        break
                    sk = self.sk_heads.get(lt)
                    if sk is None:
                        sk = self.sk_heads[lt] = _SK_HEAD + _i32(lt + 8) + b"\x030\x00"
                    raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                    doc_b[4:-1], sk, tok, _END2))
                else:
                    if size > limit:
                        break
                    raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                    doc_b[4:-1], _END))
            else:
                if kind == 1:
                    ud = _UD_HEAD + doc_b
                    size = fixed + len(wall_b) + 19 + dlen
                else:
                    ud = b""
                    size = fixed + len(wall_b)
                if size > limit:
                    break
                if needs_merge:
                    raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                    ns_dk, dkv, _DK_END, ud, sk, tok, _END2))
                else:
                    raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                    ns_dk, dkv, _DK_END, ud, _END))
            append((make_doc(raw), tok, size))
            made += 1
        return made
