"""Signed cluster time (``src/mongo/db/logical_time_validator.cpp``, ``time_proof_service.cpp``,
``keys_collection_manager.cpp``).

With authentication on, every ``$clusterTime`` a process sends carries ``signature: {hash,
keyId}``: ``hash`` is HMAC-SHA1 under the key ``keyId`` of the time rounded up to the end of
its second (``time | 0xFFFFFFFF`` as a little-endian 64-bit integer, ``TimeProofService::
getProof``). The keys are made by the config server and kept in its ``admin.system.keys``
(``{_id: keyId (long), purpose: "HMAC", key: BinData(20), expiresAt: Timestamp}``); the other
members get them from it (routers read them, shards are sent them).

A ``$clusterTime`` coming in from a client that lacks ``advanceClusterTime`` (every user but
``__system``) is checked when it is ahead of the newest time this process has signed or
validated (``LogicalTimeValidator::validate``): an unknown key gives KeyNotFound (211) "Cache
Reader No keys found for HMAC that is valid for time: { ts: Timestamp(s, i) } with id: <id>", a
wrong hash TimeProofMismatch (204) "Proof does not match the logical time"
(``TimeProofService::checkProof``, ``time_proof_service.cpp``). The command fails and no clock
moves.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
from typing import Any

from bson import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.core.errors import MongoError

_RANGE_MASK = 0xFFFFFFFF
KEY_VALIDITY_S = 90 * 24 * 3600  # keyValidIntervalSecs (90 days)


def _ts_int(ts: Timestamp) -> int:
    return (ts.time << 32) | ts.inc


def proof(key: bytes, ts: Timestamp) -> bytes:
    """The 20-byte HMAC-SHA1 time proof of ``ts`` under ``key``."""
    data = struct.pack("<Q", _ts_int(ts) | _RANGE_MASK)
    return hmac.new(key, data, hashlib.sha1).digest()


def new_key_doc(now: Timestamp) -> dict[str, Any]:
    """A fresh ``admin.system.keys`` document (``KeyGenerator::generateNewKeysIfNeeded``):
    ``_id`` is the cluster time of its creation as a long, 20 random key bytes."""
    return {"_id": Int64(_ts_int(now)), "purpose": "HMAC", "key": Binary(os.urandom(20)),
            "expiresAt": Timestamp(int(time.time()) + KEY_VALIDITY_S, 0)}


class KeyRing:
    """The HMAC keys a process knows (``keyId -> key bytes``) and its validator state."""

    def __init__(self) -> None:
        self.keys: dict[int, bytes] = {}
        self._signing: tuple[int, bytes] | None = None
        self.last_valid = 0  # the newest time signed or validated, as (time << 32 | inc)
        self._cache: tuple[int, int, dict[str, Any]] | None = None

    def load(self, docs: list[dict[str, Any]]) -> None:
        """Take the keys of ``admin.system.keys`` documents; the newest one signs."""
        for d in docs:
            if d.get("purpose", "HMAC") == "HMAC" and "key" in d:
                self.keys[int(d["_id"])] = bytes(d["key"])
        if self.keys:
            kid = max(self.keys)
            self._signing = (kid, self.keys[kid])

    @property
    def has_keys(self) -> bool:
        return self._signing is not None

    def sign(self, ts: Timestamp, dummy: dict[str, Any]) -> dict[str, Any]:
        """``{hash, keyId}`` for ``ts`` (``dummy`` while no key is known); remembers ``ts`` as
        valid. One proof per second is computed (the proof covers the whole second)."""
        t = _ts_int(ts)
        if t > self.last_valid:
            self.last_valid = t
        if self._signing is None:
            return dummy
        kid, key = self._signing
        second = ts.time
        cached = self._cache
        if cached is not None and cached[0] == second and cached[1] == kid:
            return cached[2]
        sig = {"hash": Binary(proof(key, ts)), "keyId": Int64(kid)}
        self._cache = (second, kid, sig)
        return sig

    def validate(self, ct: dict[str, Any]) -> None:
        """Check a client's ``$clusterTime`` document; raises KeyNotFound (211) or
        TimeProofMismatch (204). Times not ahead of :attr:`last_valid` pass unchecked."""
        ts = ct["clusterTime"]
        t = _ts_int(ts)
        if t <= self.last_valid:
            return
        sig = ct.get("signature")
        kid = sig.get("keyId") if isinstance(sig, dict) else None
        key = self.keys.get(int(kid)) if isinstance(kid, int) and not isinstance(kid, bool) else None
        if key is None:
            raise MongoError(211, f"Cache Reader No keys found for HMAC that is valid for time: "
                                  f"{{ ts: Timestamp({ts.time}, {ts.inc}) }} with id: "
                                  f"{int(kid) if isinstance(kid, int) else 0}")
        given = sig.get("hash")
        if not isinstance(given, bytes) or not hmac.compare_digest(bytes(given), proof(key, ts)):
            raise MongoError(204, "Proof does not match the logical time")
        self.last_valid = t
