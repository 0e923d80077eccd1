"""Placement versions and the network errors every role treats alike.

A placement (shard) version travels as ``{e: ObjectId epoch, t: Timestamp, v: Timestamp}``
(``ChunkVersion``/``ShardVersion`` in ``src/mongo/s/chunk_version.h``, ``shard_version.h``).
"""

from __future__ import annotations

from typing import Any

from bson.objectid import ObjectId
from bson.timestamp import Timestamp

# ShardVersion::UNSHARDED(): what a router attaches for a collection it knows unsharded.
UNSHARDED_EPOCH = ObjectId("000000000000000000000000")


def unsharded() -> dict[str, Any]:
    """A fresh ``{e, t, v}`` of an unsharded collection (``ShardVersion::UNSHARDED()``)."""
    return {"e": UNSHARDED_EPOCH, "t": Timestamp(0, 0), "v": Timestamp(0, 0)}


# Errors of the network, not of the command: the request may not have arrived, or its reply
# was lost (HostUnreachable 6, HostNotFound 7, NetworkTimeout 89, SocketException 9001;
# ErrorCodes::isNetworkError in src/mongo/base/error_codes.yml).
NETWORK_ERRORS = frozenset({6, 7, 89, 9001})
