"""Shard keys: BSON value order, the hashed-key hash, key extraction and chunk look-up.

Pure functions, no I/O; used by the router (targeting) and the config server (initial chunks,
``split``/``moveChunk`` bounds).

* :func:`compare` orders BSON values the way ``BSONElement::woCompare`` does: first by canonical
  type (``canonicalizeBSONType`` in ``src/mongo/bson/bsontypes.cpp``: MinKey < null < numbers <
  strings < objects < arrays < binData < ObjectId < bool < date < timestamp < regex < ... < MaxKey),
  then by value.
* :func:`hash64` is ``BSONElementHasher::hash64`` (``src/mongo/db/hasher.cpp``), what a hashed
  index and a hashed shard key store (``convertShardKeyToHashed`` with seed 0): MD5 over the
  little-endian int32 seed, then per element the little-endian int32 canonical type, the field
  name with its NUL (embedded elements only), and the value bytes (numbers squashed to a
  little-endian int64; objects and arrays hashed element by element, ending with EOO). The first
  8 digest bytes read as a little-endian signed int64 are the hash.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
import struct
import uuid
from dataclasses import dataclass, field
from typing import Any, Generator, Iterable, Sequence

import bson
from bson import Binary, Decimal128, MaxKey, MinKey, Regex
from bson.int64 import Int64
from bson.objectid import ObjectId

from shardsim.core.errors import MongoError

# BSON type byte -> canonical type (bsontypes.cpp canonicalizeBSONType).
_CANONICAL_BY_TYPE_BYTE = {
    0x00: 0, 0x06: 0, 0x0A: 5, 0x01: 10, 0x10: 10, 0x12: 10, 0x13: 10, 0x02: 15, 0x0E: 15,
    0x03: 20, 0x04: 25, 0x05: 30, 0x07: 35, 0x08: 40, 0x09: 45, 0x11: 47, 0x0B: 50, 0x0C: 55,
    0x0D: 60, 0x0F: 65, 0xFF: -1, 0x7F: 127,
}
_INT64_MAX = 2 ** 63 - 1
_INT64_MIN = -2 ** 63


def _type_byte(value: Any) -> int:
    return bson.encode({"": value})[4]


def canonical_type(value: Any) -> int:
    """The canonical type number of a BSON value (MinKey -1 ... MaxKey 127)."""
    if value is None:
        return 5
    if isinstance(value, bool):
        return 40
    if isinstance(value, (int, float, Decimal128)):
        return 10
    if isinstance(value, str):
        return 15
    if isinstance(value, MinKey):
        return -1
    if isinstance(value, MaxKey):
        return 127
    if isinstance(value, (list, tuple)):
        return 25
    if isinstance(value, dict) or hasattr(value, "raw"):
        return 20
    return _CANONICAL_BY_TYPE_BYTE.get(_type_byte(value), 0)


def _number(value: Any) -> float | int:
    if isinstance(value, Decimal128):
        d = value.to_decimal()
        if d.is_nan():
            return math.nan
        return float(d) if not d == d.to_integral_value() else int(d)
    return value


def compare(a: Any, b: Any) -> int:
    """-1/0/1: BSON order of two values (woCompare without collation; field names count
    inside objects)."""
    ca, cb = canonical_type(a), canonical_type(b)
    if ca != cb:
        return -1 if ca < cb else 1
    if ca in (-1, 127, 5, 0):
        return 0
    if ca == 10:
        x, y = _number(a), _number(b)
        # NaN sorts before every other number (woCompare's numeric order).
        if isinstance(x, float) and math.isnan(x):
            return 0 if isinstance(y, float) and math.isnan(y) else -1
        if isinstance(y, float) and math.isnan(y):
            return 1
        return (x > y) - (x < y)
    if ca == 15:
        x, y = a.encode(), b.encode()
        return (x > y) - (x < y)
    if ca == 20:
        return _compare_items(list(a.items()), list(b.items()))
    if ca == 25:
        return _compare_items([(str(i), v) for i, v in enumerate(a)],
                              [(str(i), v) for i, v in enumerate(b)])
    if ca == 30:
        x, y = _bin_parts(a), _bin_parts(b)
        return (x > y) - (x < y)
    if ca == 35:
        x, y = a.binary, b.binary
        return (x > y) - (x < y)
    if ca == 40 or ca == 45:
        return (a > b) - (a < b)
    if ca == 47:
        x, y = (a.time, a.inc), (b.time, b.inc)
        return (x > y) - (x < y)
    if ca == 50:
        x, y = (a.pattern, a.flags), (b.pattern, b.flags)
        return (str(x) > str(y)) - (str(x) < str(y))
    x, y = bson.encode({"": a}), bson.encode({"": b})
    return (x > y) - (x < y)


def _bin_parts(v: Any) -> tuple[int, int, bytes]:
    if isinstance(v, uuid.UUID):
        v = Binary.from_uuid(v)
    subtype = v.subtype if isinstance(v, Binary) else 0
    data = bytes(v)
    return (len(data), subtype, data)


def _compare_items(x: list[tuple[str, Any]], y: list[tuple[str, Any]]) -> int:
    for (kx, vx), (ky, vy) in zip(x, y):
        c = canonical_type(vx) - canonical_type(vy)
        if c:
            return -1 if c < 0 else 1
        if kx != ky:
            return -1 if kx.encode() < ky.encode() else 1
        c = compare(vx, vy)
        if c:
            return c
    return (len(x) > len(y)) - (len(x) < len(y))


def compare_keys(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Compare two shard-key tuples field by field."""
    for x, y in zip(a, b):
        c = compare(x, y)
        if c:
            return c
    return 0


SortKey = functools.cmp_to_key(compare_keys)

_RANK_MIN = (-1,)
_RANK_MAX = (127,)


def _fast_rank(value: Any) -> tuple[Any, ...] | None:
    """A plain Python tuple that orders as :func:`compare` orders ``value`` against any other
    value this accepts, or None: numbers but NaN and Decimal128 (canonical type 10, compared by
    value: Python compares int and float exactly, as woCompare does), strings (15: code point
    order is UTF-8 byte order), ObjectId (35, by bytes), MinKey and MaxKey. What shard keys
    mostly hold; anything else is left to :func:`compare`."""
    t = type(value)
    if t is int or t is Int64:
        return (10, value)
    if t is float:
        return None if value != value else (10, value)
    if t is str:
        return (15, value)
    if t is ObjectId:
        return (35, value.binary)
    if t is MinKey:
        return _RANK_MIN
    if t is MaxKey:
        return _RANK_MAX
    return None


def fast_key_rank(key: Sequence[Any]) -> tuple[Any, ...] | None:
    """:func:`_fast_rank` of every field of a shard key tuple (ordered as
    :func:`compare_keys` orders the keys), or None when a field has another type."""
    out = []
    for v in key:
        r = _fast_rank(v)
        if r is None:
            return None
        out.append(r)
    return tuple(out)


# -- hashing -------------------------------------------------------------------------------------
def _safe_long_for_hash(value: Any) -> int:
    """BSONElement::safeNumberLongForHash: NaN -> 0, saturate out-of-range doubles, truncate."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, Decimal128):
        d = value.to_decimal()
        if d.is_nan():
            return 0
        if d.is_infinite():
            return _INT64_MAX if d > 0 else _INT64_MIN
        n = int(d)
    else:
        if math.isnan(value):
            return 0
        if value >= 2.0 ** 63:
            return _INT64_MAX
        if value < -(2.0 ** 63):
            return _INT64_MIN
        n = int(value)
    return max(_INT64_MIN, min(_INT64_MAX, n))


def _hash_element(md5: Any, name: bytes | None, value: Any) -> None:
    raw = bson.encode({"": value})
    type_byte = raw[4]
    md5.update(struct.pack("<i", _CANONICAL_BY_TYPE_BYTE.get(type_byte, 0)))
    if name is not None:
        md5.update(name + b"\x00")
    if type_byte in (0x01, 0x10, 0x12, 0x13):
        md5.update(struct.pack("<q", _safe_long_for_hash(value)))
    elif type_byte in (0x03, 0x04):
        items = value.items() if type_byte == 0x03 else ((str(i), v) for i, v in enumerate(value))
        for k, v in items:
            _hash_element(md5, k.encode(), v)
        md5.update(struct.pack("<i", 0))  # EOO: canonical type 0, empty name, no value
    elif type_byte == 0x0F:
        # Code with scope: the code string bytes, then the scope's elements.
        code = str(value).encode() + b"\x00"
        md5.update(struct.pack("<i", len(code)) + code)
        for k, v in (value.scope or {}).items():
            _hash_element(md5, k.encode(), v)
        md5.update(struct.pack("<i", 0))
    else:
        md5.update(raw[6:-1])  # the element's value bytes (after type byte and empty name)


def hash64(value: Any, seed: int = 0) -> Int64:
    """``BSONElementHasher::hash64(value, seed)`` as an Int64 (the hashed shard-key value)."""
    md5 = hashlib.md5(struct.pack("<i", seed))
    _hash_element(md5, None, value)
    return Int64(struct.unpack("<q", md5.digest()[:8])[0])


# -- shard key patterns --------------------------------------------------------------------------
def get_path(doc: Any, path: str) -> tuple[bool, Any]:
    """(found, value) for a dotted ``path`` in ``doc`` (no array traversal)."""
    cur = doc
    for part in path.split("."):
        if isinstance(cur, dict) or hasattr(cur, "raw"):
            if part not in cur:
                return False, None
            cur = cur[part]
        else:
            return False, None
    return True, cur


@dataclass
class KeyPattern:
    """A shard key pattern like ``{a: 1, b: "hashed"}``; ``fields`` in order."""

    pattern: dict[str, Any]
    fields: list[str] = field(init=False)
    hashed: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.fields = list(self.pattern)
        self.hashed = {f for f, v in self.pattern.items() if v == "hashed"}

    @classmethod
    def parse(cls, key: Any) -> "KeyPattern":
        """Validate like ``ShardKeyPattern``: non-empty, values 1 or "hashed" (at most one)."""
        if not isinstance(key, dict) or not key:
            raise MongoError(2, "Shard key cannot be empty")
        hashed = 0
        for f, v in key.items():
            if v == "hashed":
                hashed += 1
            elif not (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1):
                raise MongoError(2, f"Shard key {key} can contain either a single 'hashed' field "
                                    f"or multiple numerical fields set to a value of 1. Failed to "
                                    f"parse field {f}")
            if not f or f.startswith("$") or ".." in f:
                raise MongoError(2, f"Shard key {key} contains an invalid field name {f}")
        if hashed > 1:
            raise MongoError(2, f"Shard key {key} can contain either a single 'hashed' field or "
                                f"multiple numerical fields set to a value of 1")
        return cls(dict(key))

    @property
    def is_hashed(self) -> bool:
        return bool(self.hashed)

    def global_min(self) -> dict[str, Any]:
        return {f: MinKey() for f in self.fields}

    def global_max(self) -> dict[str, Any]:
        return {f: MaxKey() for f in self.fields}

    def key_of_doc(self, doc: Any) -> tuple[Any, ...]:
        """The key tuple of a document (missing fields count as null, hashed fields are
        hashed). An array in a shard-key field raises BadValue (2), as on the server."""
        out = []
        for f in self.fields:
            found, v = get_path(doc, f)
            if not found:
                v = None
            if isinstance(v, list):
                raise MongoError(2, "Shard key cannot contain array values or array descendants.")
            out.append(hash64(v) if f in self.hashed else v)
        return tuple(out)

    def key_of_query(self, query: Any) -> tuple[Any, ...] | None:
        """The key tuple when ``query`` pins every shard-key field by equality, else None."""
        if not isinstance(query, dict):
            return None
        out = []
        for f in self.fields:
            if f in query:
                v = query[f]
            else:
                found, v = get_path(query, f)
                if not found:
                    return None
            if isinstance(v, dict):
                if len(v) == 1 and "$eq" in v:
                    v = v["$eq"]
                elif any(str(k).startswith("$") for k in v):
                    return None
            if isinstance(v, (list, Regex)) or (isinstance(v, dict) and any(
                    str(k).startswith("$") for k in v)):
                return None
            out.append(hash64(v) if f in self.hashed else v)
        return tuple(out)

    def bound_to_key(self, bound: dict[str, Any]) -> tuple[Any, ...]:
        """A chunk bound document (``{a: MinKey}``) as a key tuple, in pattern order."""
        return tuple(bound.get(f, MinKey()) for f in self.fields)

    def key_to_bound(self, key: Sequence[Any]) -> dict[str, Any]:
        return {f: v for f, v in zip(self.fields, key)}


def hashed_split_points(num_chunks: int) -> list[Int64]:
    """Initial split points of an empty hashed-key collection, evenly spaced over int64
    (``InitialSplitPolicy::calculateHashedSplitPoints``, initial_split_policy.cpp)."""
    if num_chunks <= 1:
        return []
    interval = (_INT64_MAX // num_chunks) * 2
    points: list[int] = []
    current = 0
    if num_chunks % 2 == 0:
        points.append(current)
        current += interval
    else:
        current += interval // 2
    for _ in range((num_chunks - 1) // 2):
        points.append(current)
        points.append(-current)
        current += interval
    return [Int64(p) for p in sorted(points)]


@dataclass
class Chunk:
    """One chunk: ``[min, max)`` as key tuples, owned by ``shard``."""

    min: tuple[Any, ...]
    max: tuple[Any, ...]
    shard: str


TARGETING_STEP = 512  # $in values targeted between two yields of shards_for_query_steps


class ChunkMap:
    """The chunks of one sharded collection, sorted by ``min``; look-up by key in O(log n)."""

    def __init__(self, pattern: KeyPattern, chunks: Iterable[Chunk]) -> None:
        self.pattern = pattern
        self.chunks = sorted(chunks, key=lambda c: SortKey(c.min))
        self._mins = [SortKey(c.min) for c in self.chunks]
        # The same bounds as plain tuples when every one has only fast-rank types (the usual
        # int, hashed, string or ObjectId keys): a routed write looks its chunk up with C
        # tuple comparisons instead of compare_keys per bisection step (~0.5 us each).
        ranks = [fast_key_rank(c.min) for c in self.chunks]
        self._fast_mins = ranks if all(r is not None for r in ranks) else None

    def find(self, key: Sequence[Any]) -> Chunk:
        """The chunk whose ``[min, max)`` contains ``key`` (chunks cover the key space)."""
        rank = fast_key_rank(key) if self._fast_mins is not None else None
        if rank is not None:
            i = bisect.bisect_right(self._fast_mins, rank) - 1
        else:
            i = bisect.bisect_right(self._mins, SortKey(tuple(key))) - 1
        if i < 0:
            raise MongoError(1, f"no chunk contains shard key {key}")
        return self.chunks[i]

    def shard_for_doc(self, doc: Any) -> str:
        return self.find(self.pattern.key_of_doc(doc)).shard

    def covers_key_space(self) -> bool:
        """True when the chunks tile the whole key space: the first starts at MinKey in every
        field, each ends where the next starts, the last ends at MaxKey. A routing table read
        while the config server rewrites a collection's chunks (a resharding's commit) may not
        (mongos' ``RoutingTableHistory`` refuses a chunk map with gaps and refreshes again)."""
        if not self.chunks:
            return False
        if not all(isinstance(v, MinKey) for v in self.chunks[0].min) or \
                not all(isinstance(v, MaxKey) for v in self.chunks[-1].max):
            return False
        return all(compare_keys(a.max, b.min) == 0 for a, b in zip(self.chunks, self.chunks[1:]))

    def shards_for_query(self, query: Any) -> list[str]:
        """Shards whose chunks may hold documents matching ``query`` (mongos'
        ``getShardIdsForQuery``, simplified): the full shard key by equality -> one chunk; an
        equality, ``$in`` or range (``$gt/$gte/$lt/$lte``) on the first key field -> the chunks
        overlapping it; anything else -> every owner. In chunk order."""
        steps = self.shards_for_query_steps(query)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def shards_for_query_steps(self, query: Any) -> Generator[None, None, list[str]]:
        """:meth:`shards_for_query` as a generator that yields (None) every
        :data:`TARGETING_STEP` values of a large ``$in`` and returns the shards, so the router
        can target a ``$in`` of 500,000 values without holding its event loop
        (:func:`shardsim.core.max_time.run_steps`). A single-field key looks each ``$in`` value up
        by bisection and stops once every owning shard is targeted."""
        key = self.pattern.key_of_query(query)
        if key is not None:
            return [self.find(key).shard]
        first = self.pattern.fields[0]
        if not isinstance(query, dict) or first not in query:
            return self.shards()
        cond = query[first]
        hashed = first in self.pattern.hashed
        # (lo, hi, hi_inclusive) on the first key field
        intervals: list[tuple[Any, Any, bool]] = []
        if isinstance(cond, dict) and cond and all(str(k).startswith("$") for k in cond):
            if set(cond) <= {"$in"} and isinstance(cond.get("$in"), list):
                values = cond["$in"]
                if len(self.pattern.fields) == 1 and len(values) > TARGETING_STEP:
                    return (yield from self._shards_for_points(values, hashed))
                for i, v in enumerate(values):
                    if isinstance(v, (dict, list, Regex)):
                        return self.shards()
                    if i % TARGETING_STEP == TARGETING_STEP - 1:
                        yield None
                    p = hash64(v) if hashed else v
                    intervals.append((p, p, True))
            elif not hashed and set(cond) <= {"$gt", "$gte", "$lt", "$lte", "$eq"}:
                lo: Any = MinKey()
                hi: Any = MaxKey()
                hi_incl = True
                for op, v in cond.items():
                    if isinstance(v, (dict, list, Regex)):
                        return self.shards()
                    if op in ("$gt", "$gte", "$eq") and compare(v, lo) > 0:
                        lo = v
                    if op in ("$lt", "$lte", "$eq") and compare(v, hi) <= 0:
                        hi_incl = op != "$lt" if compare(v, hi) < 0 else (hi_incl and op != "$lt")
                        hi = v
                intervals.append((lo, hi, hi_incl))
            else:
                return self.shards()
        elif isinstance(cond, (list, Regex, dict)):
            return self.shards()
        else:
            p = hash64(cond) if hashed else cond
            intervals.append((p, p, True))
        # With a compound key a bound's first field does not split keys exactly: be inclusive.
        exact = len(self.pattern.fields) == 1
        out: dict[str, None] = {}
        for c in self.chunks:
            for i, (lo, hi, hi_incl) in enumerate(intervals):
                if i % TARGETING_STEP == TARGETING_STEP - 1:
                    yield None
                above_lo = compare(c.max[0], lo) > 0 if exact else compare(c.max[0], lo) >= 0
                below_hi = compare(c.min[0], hi) < 0 if (exact and not hi_incl) \
                    else compare(c.min[0], hi) <= 0
                if above_lo and below_hi:
                    out.setdefault(c.shard, None)
                    break
        return list(out) or [self.chunks[0].shard]

    def _shards_for_points(self, values: list[Any],
                           hashed: bool) -> Generator[None, None, list[str]]:
        """The shards owning the chunks of single-field shard-key ``values`` (an ``$in``),
        each found by bisection; every owner: done early."""
        owners = self.shards()
        found: set[str] = set()
        for i, v in enumerate(values):
            if isinstance(v, (dict, list, Regex)):
                return owners
            if i % TARGETING_STEP == TARGETING_STEP - 1:
                yield None
            try:
                found.add(self.find((hash64(v) if hashed else v,)).shard)
            except MongoError:  # chunks that do not start at MinKey: every owner
                return owners
            if len(found) == len(owners):
                break
        return [s for s in owners if s in found] or [self.chunks[0].shard]

    def shards(self) -> list[str]:
        seen: dict[str, None] = {}
        for c in self.chunks:
            seen.setdefault(c.shard, None)
        return list(seen)
