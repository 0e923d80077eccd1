"""Indexes that exist: every plain index kept as a sorted list of KeyString keys.

mongod keeps each index as a sorted table of ``KeyString(index key) + RecordId``
(``sorted_data_interface.h``, keys built by ``BtreeKeyGenerator::getKeys`` in
``btree_key_generator.cpp``). Here an :class:`IndexedDocs` (the ``docs`` mapping of a
:class:`shard.storage.Collection`) updates every index's :class:`SortedKeys` on each
``__setitem__``/``__delitem__``/``pop``, so inserts, updates, deletes, migrations (fromMigrate
writes use the same :class:`Collection` methods), range deletion, transaction commit, durable
reload and the durable undo of a failed commit (:mod:`shard.durable_undo` assigns ``docs``
items directly or transplants a freshly loaded collection with its own ``IndexedDocs``) can
never leave an index out of step.

An entry is ``(key bytes, record id, storage key)``: ``key bytes`` is the concatenation of each
field's KeyString V1 (:func:`shardsim.core.keystring.encode_keystring`) with the bytes of a
descending field inverted, as ``KeyString::Builder`` does for ``Ordering`` bits, so the sorted
order is mongod's index order with no Python comparison code; ``record id`` is the document's
insertion sequence (``$natural`` order), which breaks ties like mongod's RecordId.

Keys per document follow ``btree_key_generator.cpp``: a missing field is null, an array
contributes each distinct element (the index becomes *multikey*), an empty array is
``undefined``; a dotted path walks through arrays of subdocuments. Only ascending/descending
key patterns without numeric path components are kept (hashed, text, 2d/2dsphere, wildcard and
``a.0``-style paths stay catalog entries: the planner never uses them).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable

from sortedcontainers import SortedList

from shardsim.core.keystring import encode_keystring

_INVERT = bytes(range(255, -1, -1))  # descending fields: every byte inverted
_UNDEFINED_KEY = b"\x0f"  # CType::kUndefined: the key of an empty array
_NULL_KEY = b"\x14"  # CType::kNullish: the key of a missing field
_MISSING = object()


_CACHE: dict[tuple[type, Any], bytes] = {}
_CACHE_MAX = 1 << 16
_CACHED_TYPES = (int, str, float, bool)


def encode_value(value: Any) -> bytes:
    """The KeyString V1 bytes of one value (no end byte), ascending; ints, strings, floats and
    booleans come from a bounded cache (index keys repeat)."""
    t = type(value)
    if t in _CACHED_TYPES:
        ck = (t, value)
        kb = _CACHE.get(ck)
        if kb is None:
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.clear()
            kb = _CACHE[ck] = encode_keystring([value])[0][:-1]
        return kb
    return encode_keystring([value])[0][:-1]


def path_values(doc: Any, parts: list[str]) -> tuple[list[Any], bool]:
    """``(values, through_array)``: the values ``doc`` has at the dotted path ``parts``, walking
    arrays of subdocuments (``[]`` when missing); ``through_array`` when an array was met."""
    cur = [doc]
    arr = False
    for part in parts:
        nxt = []
        for v in cur:
            if isinstance(v, dict):
                if part in v:
                    nxt.append(v[part])
            elif isinstance(v, list):
                arr = True
                for x in v:
                    if isinstance(x, dict) and part in x:
                        nxt.append(x[part])
        cur = nxt
        if not cur:
            return [], arr
    return cur, arr


def has_nan(v: Any) -> bool:
    """True when ``v`` is or holds a float NaN (the in-memory sort orders NaN unlike BSON)."""
    if type(v) is float:
        return v != v
    if isinstance(v, dict):
        return any(has_nan(x) for x in v.values())
    if isinstance(v, list):
        return any(has_nan(x) for x in v)
    return False


def field_keys(doc: Any, parts: list[str]) -> tuple[list[bytes], bool, bool]:
    """``(keys, found, multikey)`` of one index field: distinct KeyString bytes of the values
    at the path (array elements unwound one level, ``[]`` as undefined, missing as null)."""
    values, multikey = path_values(doc, parts)
    if not values:
        return [_NULL_KEY], False, multikey
    out: list[bytes] = []
    for v in values:
        if isinstance(v, list):
            multikey = True
            if not v:
                out.append(_UNDEFINED_KEY)
            for x in v:
                out.append(encode_value(x))
        else:
            out.append(encode_value(v))
    if len(out) > 1:
        out = list(dict.fromkeys(out))
    return out, True, multikey


def plain_pattern(key: dict[str, Any]) -> list[tuple[list[str], bool]] | None:
    """``[(path parts, descending)]`` for an ascending/descending key pattern the index
    structure supports, else None (hashed, text, geo, wildcard, numeric path components)."""
    out = []
    for field, direction in key.items():
        if isinstance(direction, bool) or not isinstance(direction, (int, float)) or \
                direction == 0 or "$" in field:
            return None
        parts = field.split(".")
        if any(p.isdigit() or not p for p in parts):
            return None
        out.append((parts, direction < 0))
    return out


class SortedKeys:
    """One index's sorted entries ``(key bytes, record id, storage key)`` and whether any
    document gave it more than one key (``multikey``, as mongod's multikey flag: set once,
    never cleared) or a NaN (``nan``)."""

    __slots__ = ("fields", "sparse", "partial", "entries", "multikey", "nan")

    def __init__(self, pattern: list[tuple[list[str], bool]], sparse: bool,
                 partial: dict[str, Any] | None) -> None:
        self.fields = pattern
        self.sparse = sparse
        self.partial = partial
        self.entries: SortedList = SortedList()
        self.multikey = False
        self.nan = False  # a key held NaN: the index never gives a sort (set once)

    def keys_of(self, doc: dict[str, Any]) -> list[bytes]:
        """The key bytes ``doc`` has in this index (``[]``: the index skips it)."""
        per: list[list[bytes]] = []
        found_any = False
        for parts, desc in self.fields:
            keys, found, multi = field_keys(doc, parts)
            found_any |= found
            if multi:
                self.multikey = True
            if not self.nan and b"\x1e" in b"".join(keys):
                found_v, _ = path_values(doc, parts)
                self.nan = any(has_nan(v) for v in found_v)
            per.append([k.translate(_INVERT) for k in keys] if desc else keys)
        if self.sparse and not found_any:
            return []
        if self.partial is not None:
            from shardsim.core.query import matches
            if not matches(self.partial, doc):
                return []
        if len(per) == 1:
            return per[0]
        return [b"".join(c) for c in itertools.product(*per)]

    def add(self, doc: dict[str, Any], rid: int, key: Any) -> None:
        for kb in self.keys_of(doc):
            self.entries.add((kb, rid, key))

    def remove(self, doc: dict[str, Any], rid: int, key: Any) -> None:
        for kb in self.keys_of(doc):
            self.entries.discard((kb, rid, key))

    def scan(self, start: bytes, stop: bytes | None,
             reverse: bool = False) -> Iterable[tuple[bytes, int, Any]]:
        """Entries with ``start <= key bytes < stop`` (``stop`` None: no upper bound) in key
        order, ties by record id (``reverse``: descending)."""
        entries = self.entries
        lo = entries.bisect_left((start,))
        hi = len(entries) if stop is None else entries.bisect_left((stop,))
        if hi <= lo:
            return ()
        return entries.islice(lo, hi, reverse=reverse)


def successor(prefix: bytes) -> bytes | None:
    """The smallest byte string above every string starting with ``prefix`` (None: none)."""
    p = prefix.rstrip(b"\xff")
    if not p:
        return None
    return p[:-1] + bytes([p[-1] + 1])


class IndexedDocs(dict):
    """A collection's ``id_key -> document`` map in ``$natural`` order that keeps the sorted
    keys of every index of ``indexes`` (the collection's ``name -> Index`` dict, shared) and
    each document's record id (``rids``) in step with every assignment and removal."""

    __slots__ = ("indexes", "rids", "_next")

    def __init__(self, indexes: dict[str, Any]) -> None:
        super().__init__()
        self.indexes = indexes
        self.rids: dict[Any, int] = {}
        self._next = 0

    def _sorted(self) -> list[SortedKeys]:
        return [i.sorted for i in self.indexes.values() if i.sorted is not None]

    def __setitem__(self, key: Any, doc: dict[str, Any]) -> None:
        old = dict.get(self, key, _MISSING)
        indexes = self._sorted()
        new_keys = [sk.keys_of(doc) for sk in indexes]  # errors before anything changes
        if old is _MISSING:
            rid = self._next = self._next + 1
            self.rids[key] = rid
        else:
            rid = self.rids[key]
            for sk in indexes:
                sk.remove(old, rid, key)
        dict.__setitem__(self, key, doc)
        for sk, keys in zip(indexes, new_keys):
            add = sk.entries.add
            for kb in keys:
                add((kb, rid, key))

    def __delitem__(self, key: Any) -> None:
        old = dict.__getitem__(self, key)
        rid = self.rids.pop(key)
        for sk in self._sorted():
            sk.remove(old, rid, key)
        dict.__delitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        old = dict.__getitem__(self, key)
        del self[key]
        return old

    def popitem(self) -> Any:
        key = next(reversed(self))
        return key, self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)

    def update(self, *args: Any, **kw: Any) -> None:
        for k, v in dict(*args, **kw).items():
            self[k] = v

    def clear(self) -> None:
        dict.clear(self)
        self.rids.clear()
        for sk in self._sorted():
            sk.entries.clear()

    def build(self, sk: SortedKeys) -> None:
        """Fill a new index's keys from the documents already stored (createIndexes)."""
        rids = self.rids
        entries = []
        for key, doc in dict.items(self):
            rid = rids[key]
            entries.extend((kb, rid, key) for kb in sk.keys_of(doc))
        sk.entries.update(entries)

    def __reduce__(self) -> Any:  # copies are plain dicts (snapshots, pickles)
        return (dict, (dict(self),))
