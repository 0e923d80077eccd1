"""Gossip in: the shape check of a request's ``$clusterTime`` (and ``$configTime``,
``$topologyTime``) before it may move a process's clock.

The server parses these fields with the IDL struct ``GossipedVectorClockComponents``
(``src/mongo/db/vector_clock/vector_clock.idl``, parser context ``VectorClockComponents``) and then
``VectorClock::SignedComponentFormat::in`` (``vector_clock.cpp``) turns the signature's ``hash``
into a SHA-1 block (``SHA1Block::fromBinData``, ``src/mongo/crypto/hash_block.h``). So:

- ``$clusterTime`` not a document -> TypeMismatch (14) ``BSON field
  'VectorClockComponents.$clusterTime' is the wrong type '<t>', expected type 'object'``;
- ``clusterTime`` missing -> IDLFailedToParse (40414); not a Timestamp -> 14;
- ``signature`` optional; if present a document with ``hash`` (BinData subtype 0: another type
  -> 14, another subtype -> 14 "wrong binData type") and ``keyId`` (a number: safeInt64), both
  required (40414); a hash that is not 20 bytes -> UnsupportedFormat (140);
- ``$configTime`` / ``$topologyTime``: Timestamps when present (14).

The times themselves are then checked by :meth:`shardsim.core.clock.HybridLogicalClock.check`
(ClusterTimeFailsRateLimiter 205 beyond ``maxAcceptableLogicalClockDriftSecs``, 40484 past
2**31 - 1). Unknown fields are ignored (``strict: false``).
"""

from __future__ import annotations

from typing import Any, Mapping

from bson import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.core.commands import bson_type_name
from shardsim.core.errors import MongoError

CTX = "VectorClockComponents"
SHA1_LENGTH = 20

# typeName(BinDataType) in src/mongo/bson/bsontypes.cpp
_SUBTYPE_NAMES = {0: "general", 1: "function", 2: "binary(old)", 3: "UUID(old)", 4: "UUID",
                  5: "MD5", 6: "encrypt", 7: "column", 8: "sensitive", 9: "vector",
                  128: "user"}


def _wrong_type(path: str, value: Any, expected: str) -> MongoError:
    return MongoError(14, f"BSON field '{CTX}.{path}' is the wrong type '{bson_type_name(value)}',"
                          f" expected type '{expected}'")


def _missing(path: str) -> MongoError:
    return MongoError(40414, f"BSON field '{CTX}.{path}' is missing but a required field")


def _check_signature(sig: Any) -> None:
    path = "$clusterTime.signature"
    if type(sig) is not dict and not isinstance(sig, Mapping):  # (dict: no ABC check per command)
        raise _wrong_type(path, sig, "object")
    if "hash" not in sig:
        raise _missing(f"{path}.hash")
    h = sig["hash"]
    if not isinstance(h, (bytes, Binary)):
        raise _wrong_type(f"{path}.hash", h, "binData")
    subtype = h.subtype if isinstance(h, Binary) else 0
    if subtype != 0:
        name = _SUBTYPE_NAMES.get(subtype, "user" if subtype >= 128 else str(subtype))
        raise MongoError(14, f"BSON field '{CTX}.{path}.hash' is the wrong binData type "
                             f"'{name}', expected type 'general'")
    if "keyId" not in sig:
        raise _missing(f"{path}.keyId")
    key_id = sig["keyId"]
    if isinstance(key_id, bool) or not isinstance(key_id, (int, float, Int64, Decimal128)):
        raise MongoError(14, f"BSON field '{CTX}.{path}.keyId' is the wrong type "
                             f"'{bson_type_name(key_id)}', expected types "
                             "'[long, int, decimal, double]'")
    if len(h) != SHA1_LENGTH:
        raise MongoError(140, f"Unsupported SHA1Block hash length: {len(h)}")


def parse_gossip(body: Mapping[str, Any]) -> Timestamp | None:
    """The ``$clusterTime.clusterTime`` of a command body after mongod's shape checks, or None
    when the body gossips no cluster time. Raises MongoError (14, 40414, 140) as above."""
    for field in ("$configTime", "$topologyTime"):
        if field in body and not isinstance(body[field], Timestamp):
            raise _wrong_type(field, body[field], "timestamp")
    if "$clusterTime" not in body:
        return None
    ct = body["$clusterTime"]
    if type(ct) is not dict and not isinstance(ct, Mapping):
        raise _wrong_type("$clusterTime", ct, "object")
    if "clusterTime" not in ct:
        raise _missing("$clusterTime.clusterTime")
    ts = ct["clusterTime"]
    if not isinstance(ts, Timestamp):
        raise _wrong_type("$clusterTime.clusterTime", ts, "timestamp")
    if "signature" in ct:
        _check_signature(ct["signature"])
    return ts
