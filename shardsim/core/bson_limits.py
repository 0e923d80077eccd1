"""BSON nesting limits, checked without recursion (``src/mongo/bson/bson_depth.h``).

Two limits, as mongod keeps them:

- **Any BSON the server receives** (``validateBSON`` in ``src/mongo/bson/bson_validate.cpp``, run
  on every OP_MSG section by ``Validator<BSONObj>`` in ``src/mongo/rpc/object_check.h``): an
  object may not be begun while ``BSONDepth::getMaxAllowableDepth()`` (200) objects are already
  open, i.e. at most 201 levels counting the outermost document. Beyond: Overflow (15)
  ``BSONObj exceeded maximum nested object depth: 200``.
- **Documents for storage** (``getMaxDepthForUserStorage()`` = 200 - ``kExtraSystemDepthLevels``
  (20) = 180, so the oplog entry and command reply around a stored document still fit): an
  insert deeper than 180 levels of non-empty objects/arrays is refused by
  ``fixDocumentForInsert`` / ``validateDepth`` (``src/mongo/db/ops/insert.cpp``) with Overflow
  (15) ``cannot insert document because it exceeds 180 levels of nesting``; an update whose
  result is deeper by ``storage_validation::storageValid`` with Overflow (15) ``Document exceeds
  maximum nesting depth of 180``. Empty objects and arrays do not count.

Both scans are iterative, so no depth of input can raise RecursionError here, and the raw scan
runs only when a document holds enough object/array type bytes to possibly be that deep. The scope
of a code-with-scope value (BSON type 15) counts as one more level, as ``validateBSON`` descends
into it like an embedded object (``bson_validate.cpp``): nesting inside a scope is no way around
the limit.
"""

from __future__ import annotations

import struct
from typing import Any

from shardsim.core.errors import MongoError

MAX_ALLOWABLE_DEPTH = 200  # BSONDepth::kDefaultMaxAllowableDepth (maxBSONDepth)
EXTRA_SYSTEM_DEPTH_LEVELS = 20  # BSONDepth::kExtraSystemDepthLevels
MAX_USER_STORAGE_DEPTH = MAX_ALLOWABLE_DEPTH - EXTRA_SYSTEM_DEPTH_LEVELS  # 180

_i32 = struct.Struct("<i")
# Fixed value sizes by element type (bytes after the field name); None: variable.
_FIXED = {0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8,
          0x13: 16, 0xFF: 0, 0x7F: 0}


def raw_depth_exceeds(raw: bytes | memoryview, max_open: int = MAX_ALLOWABLE_DEPTH) -> bool:
    """True when the BSON document ``raw`` begins an object while ``max_open`` are open (more
    than ``max_open + 1`` levels). Malformed bytes answer False: the decoder reports them (22)."""
    data = bytes(raw)
    if data.count(3) + data.count(4) + data.count(0x0F) < max_open:  # not deep enough to check
        return False
    ends: list[int] = []  # end offsets of the open documents
    pos, n = 0, len(data)
    try:
        (size,) = _i32.unpack_from(data, 0)
        ends.append(size)
        pos = 4
        while ends:
            if pos >= n:
                return False
            kind = data[pos]
            if kind == 0:  # end of the current document
                pos += 1
                ends.pop()
                continue
            name_end = data.index(b"\x00", pos + 1)
            pos = name_end + 1
            if kind in (0x03, 0x04):
                if len(ends) > max_open:
                    return True
                (size,) = _i32.unpack_from(data, pos)
                if size < 5:
                    return False
                # Every level nested inside it needs a 3/4/0x0F type byte in its bytes: with too
                # few for the limit, skip it whole (a wide document, e.g. an insert's
                # documents array, is then not walked element by element)
                if len(ends) + data.count(3, pos, pos + size) + data.count(4, pos, pos + size) \
                        + data.count(0x0F, pos, pos + size) <= max_open:
                    pos += size
                    continue
                ends.append(pos + size)
                pos += 4
                continue
            fixed = _FIXED.get(kind)
            if fixed is not None:
                pos += fixed
            elif kind in (0x02, 0x0D, 0x0E):  # string, code, symbol
                pos += 4 + _i32.unpack_from(data, pos)[0]
            elif kind == 0x05:  # binary
                pos += 5 + _i32.unpack_from(data, pos)[0]
            elif kind == 0x0B:  # regex: two cstrings
                pos = data.index(b"\x00", data.index(b"\x00", pos) + 1) + 1
            elif kind == 0x0C:  # DBPointer
                pos += 4 + _i32.unpack_from(data, pos)[0] + 12
            elif kind == 0x0F:  # code with scope: its scope is one more open document
                if len(ends) > max_open:
                    return True
                scope_at = pos + 8 + _i32.unpack_from(data, pos + 4)[0]
                (size,) = _i32.unpack_from(data, scope_at)
                if size < 5:
                    return False
                ends.append(scope_at + size)
                pos = scope_at + 4
            else:
                return False
    except (struct.error, ValueError, IndexError):
        return False
    return False


def check_wire_depth(raw: bytes | memoryview) -> None:
    """Raise Overflow (15) like ``validateBSON`` when ``raw`` is nested beyond 201 levels."""
    if raw_depth_exceeds(raw):
        raise MongoError(15, f"BSONObj exceeded maximum nested object depth: "
                             f"{MAX_ALLOWABLE_DEPTH}")


def storage_depth_exceeds(doc: Any, limit: int = MAX_USER_STORAGE_DEPTH) -> bool:
    """True when the decoded document ``doc`` has more than ``limit`` levels of non-empty
    objects/arrays (the document itself is level 1), as ``validateDepth`` counts them."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, level = stack.pop()
        children = value.values() if isinstance(value, dict) else value
        for child in children:
            if isinstance(child, (dict, list)) and child:
                if level >= limit:
                    return True
                stack.append((child, level + 1))
    return False


def check_insert_depth(doc: dict[str, Any]) -> None:
    """Overflow (15) for an insert deeper than 180 levels (``fixDocumentForInsert``)."""
    if storage_depth_exceeds(doc):
        raise MongoError(15, f"cannot insert document because it exceeds "
                             f"{MAX_USER_STORAGE_DEPTH} levels of nesting")


def check_update_depth(doc: dict[str, Any]) -> None:
    """Overflow (15) for an updated document deeper than 180 levels (``storageValid``)."""
    if storage_depth_exceeds(doc):
        raise MongoError(15, f"Document exceeds maximum nesting depth of "
                             f"{MAX_USER_STORAGE_DEPTH}")
