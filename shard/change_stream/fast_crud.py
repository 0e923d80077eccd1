"""Fused fast path for plain CRUD events: oplog entry -> encoded event in one step.

A catch-up read spends most of its time on insert/update/replace/delete entries of streams
without per-event extras. For those the general pipeline (:class:`~.transform.Transform` ->
:class:`~.transform.Event` -> ``_emit`` -> ``encode_event``) builds a dict per event and encodes
it again. This module writes the same BSON directly from pieces:

* cached per namespace (and collection UUID): the ``ns`` element, the ``operationType``
  element and the resume token's constant hex middle per operation type
  (:func:`shardsim.resume_token.event_mid_hex`);
* per event: the ``_id`` token document (:func:`shardsim.resume_token.fast_event_token_hex`),
  ``clusterTime`` packed from the scan key, ``wallTime`` (cached per ``datetime`` object: the
  shard's ``wall_now`` hands out one object per millisecond), ``fullDocument`` /
  ``documentKey`` / ``updateDescription`` encoded by bson's C encoder, and with ``needsMerge``
  the trailing ``$sortKey: [<token>]``.

The output is byte-identical to the general path (``tests/unit/test_change_stream_fast_crud.py``
compares the two over many varied entries). Whatever the fast path does not cover it declines
(returns False) and the general path handles the entry: other operations, transactions,
``fromMigrate`` entries, namespaces the stream does not watch plainly (``system.views``), a
documentKey or document that is not a plain ``dict``, an event over the size limit, any encoding
error. Which streams may use it at all: :func:`eligible`; the cursor also keeps it off until the
stream has passed its resume point (:class:`~.cursor.ChangeStreamCursor`).
"""

from __future__ import annotations

import datetime
import struct
from typing import Any, Callable

from bson import _dict_to_bson  # C-accelerated encoder; top_level=False keeps field order
from bson.binary import Binary
from bson.raw_bson import DEFAULT_RAW_BSON_OPTIONS

from shardsim import resume_token as rt
from shard.change_stream.oplog_match import ns_predicate
from shard.change_stream.spec import StreamSpec
from shard.change_stream.transform import update_description

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
_DK_END = b"\x00"
_END = b"\x00"
_END2 = b"\x00\x00"
_OPS = ("insert", "update", "replace", "delete")

Emit = Callable[[int, dict[str, Any]], bool]


def eligible(spec: StreamSpec) -> bool:
    """True when no event of ``spec`` needs per-event extras the fast path does not write: no
    user stages (nor ``$changeStreamSplitLargeEvent``), ``fullDocument: "default"``,
    ``fullDocumentBeforeChange: "off"``, no ``showExpandedEvents`` (collectionUUID),
    ``showRawUpdateDescription`` or ``showCommitTimestamp``, version 2 tokens."""
    return (ENABLED and not spec.user_stages and spec.full_document == "default"
            and spec.full_document_before_change == "off" and not spec.show_expanded
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

    __slots__ = ("head", "mid", "int_fmt", "int_sk", "ns_dk_int", "fixed", "int_fixed")

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
        # element + the encoded fullDocument / updateDescription document (5 bytes if none;
        # its int32 header and terminator are not copied).
        self.int_fixed = [0]
        for n in range(1, 6):
            lt = len(self.int_fmt[n] % (0, 0))
            size = self.fixed + lt + len(self.ns_dk_int) + 4 + 2 - 5
            self.int_fixed.append(size + (lt + 18 if needs_merge else 0))


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
          limit: int) -> Emit:
    """The fast emitter of a stream (``eligible(spec)`` must hold): ``emit(key, entry)`` for an
    oplog entry whose ts key is ``key`` either appends ``(make_doc(raw), token, len(raw))`` with
    ``append`` and returns True, or returns False (nothing appended; the general path must
    handle the entry, including deciding whether it matches). ``token`` is the event's ``_id``
    as BSON bytes (:func:`token_from_doc` gives the dict). ``limit`` is the largest event size
    (bytes) it may emit; larger events go to the general path (error or split)."""
    needs_merge = spec.needs_merge
    ns_ok = ns_predicate(spec)
    cache: dict[str, _Ns | None] = {}
    sk_heads: dict[int, bytes] = {}
    dt = datetime.datetime
    last_wall: Any = _UNSET
    last_wall_b = b""

    def ns_pieces(ns: Any) -> _Ns | None:
        if type(ns) is not str:
            return None
        db, _, coll = ns.partition(".")
        info = _Ns(db, coll, needs_merge) if coll and coll != "system.views" and ns_ok(ns) else None
        if len(cache) >= 1024:
            cache.clear()
        cache[ns] = info
        return info

    def wall_element(wall: Any) -> bytes:
        nonlocal last_wall, last_wall_b
        elem = _element("wallTime", wall)
        if type(wall) is dt:  # equal datetimes encode alike (UTC milliseconds)
            last_wall = wall
            last_wall_b = elem
        return elem

    def sk_head(n: int) -> bytes:
        h = sk_heads[n] = _SK_HEAD + _i32(n + 8) + b"\x030\x00"
        return h

    def emit(key: int, entry: dict[str, Any]) -> bool:
        try:
            pieces = cache.get(entry["ns"], _UNSET)
            if pieces is _UNSET:
                pieces = ns_pieces(entry["ns"])
            if pieces is None or "txnOpIndex" in entry or entry.get("fromMigrate"):
                return False
            if entry.get("ui") is not pieces.ui:
                pieces.set_ui(entry.get("ui"))
            op = entry["op"]
            ud = None
            if op == "i":
                o = entry["o"]
                dk = entry.get("o2")
                if dk is None:
                    dk = {"_id": o.get("_id")}
                if type(o) is not dict or type(dk) is not dict:
                    return False
                p = pieces.i
            elif op == "u":
                o = entry["o"]
                dk = entry.get("o2")
                if type(o) is not dict or type(dk) is not dict:
                    return False
                diff = o.get("diff")
                if o.get("$v") == 2 and isinstance(diff, dict):
                    p = pieces.u
                    ud = update_description(diff, False)
                    o = None
                else:
                    p = pieces.r
            elif op == "d":
                dk = entry["o"]
                if type(dk) is not dict:
                    return False
                p = pieces.d
                o = None
            else:
                return False
            wall = entry.get("wall")
            if wall is last_wall or (type(wall) is dt and wall == last_wall):
                wall_b = last_wall_b
            else:
                wall_b = wall_element(wall)
            v = dk.get("_id") if len(dk) == 1 else None
            if type(v) is int and 0 < v <= 0x7FFFFFFF:
                # documentKey {_id: positive int32}: token and documentKey written here, only
                # fullDocument / updateDescription go through the C encoder.
                s = v << 1
                n = (s.bit_length() + 7) >> 3
                tok = p.int_fmt[n] % (key, s)
                if o is not None:
                    enc = _dict_to_bson({"fullDocument": o}, False, _OPTS, False)
                    size = p.int_fixed[n] + len(wall_b) + len(enc)
                    if size > limit:
                        return False
                    if needs_merge:
                        raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                        enc[4:-1], p.ns_dk_int, _i32(v), p.int_sk[n], tok,
                                        _END2))
                    else:
                        raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                        enc[4:-1], p.ns_dk_int, _i32(v), _END2))
                else:
                    if ud is not None:
                        body = _dict_to_bson({"updateDescription": ud}, False, _OPTS, False)[4:-1]
                    else:
                        body = b""
                    size = p.int_fixed[n] + len(wall_b) + len(body) + 5
                    if size > limit:
                        return False
                    if needs_merge:
                        raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                        p.ns_dk_int, _i32(v), _DK_END, body, p.int_sk[n][1:],
                                        tok, _END2))
                    else:
                        raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                        p.ns_dk_int, _i32(v), _DK_END, body, _END))
            else:
                if o is not None:
                    var = {"fullDocument": o, "ns": pieces.ns, "documentKey": dk}
                elif ud is not None:
                    var = {"ns": pieces.ns, "documentKey": dk, "updateDescription": ud}
                else:
                    var = {"ns": pieces.ns, "documentKey": dk}
                enc = _dict_to_bson(var, False, _OPTS, False)
                data, tb = rt.fast_event_token_hex(key, p.mid, dk)
                tok = token_doc(data, tb)
                lt = len(tok)
                size = p.fixed + len(wall_b) + len(enc) - 5 + lt + 1
                if needs_merge:
                    size += lt + 18
                    if size > limit:
                        return False
                    sk = sk_heads.get(lt)
                    if sk is None:
                        sk = sk_head(lt)
                    raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                    enc[4:-1], sk, tok, _END2))
                else:
                    if size > limit:
                        return False
                    raw = b"".join((_i32(size), _ID_HEAD, tok, p.head, _u64(key), wall_b,
                                    enc[4:-1], _END))
        except Exception:
            return False  # the general path decides (and raises the real error, if any)
        append((make_doc(raw), tok, size))
        return True

    return emit
