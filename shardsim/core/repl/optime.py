"""OpTimes, the null optime and the PV1 ``electionId`` (sans-IO, pure values).

An OpTime is the position of an oplog entry: its timestamp ``ts`` and the ``t`` (term) of the
primary that wrote it. The server orders OpTimes by term first, then timestamp
(src/mongo/db/repl/optime.h ``OpTime::operator<``, ``std::tie(_term, _timestamp)``); so does
this tuple, whose fields are declared in that order. ``ts`` is any totally ordered value: an
int in the simulation, ``(secs << 32) | inc`` for a BSON Timestamp (:func:`ts_int`).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from bson import ObjectId, Timestamp


class OpTime(NamedTuple):
    """``(t, ts)``: compares term first, then timestamp, like the server's ``OpTime``.

    Build it with keywords, ``OpTime(ts=5, t=1)``; :data:`NULL_OPTIME` sorts before every real
    entry (term -1, the server's ``OpTime::kUninitializedTerm``)."""

    t: int
    ts: int

    def __repr__(self) -> str:
        return f"OpTime(ts={self.ts}, t={self.t})"

    def to_doc(self) -> dict:
        """``{ts: Timestamp, t: long}`` as the server writes an OpTime (``OpTime::toBSON``)."""
        return {"ts": Timestamp(self.ts >> 32, self.ts & 0xFFFFFFFF), "t": self.t}


NULL_OPTIME = OpTime(t=-1, ts=0)


def ts_int(ts: Any) -> int:
    """A BSON ``Timestamp`` (or an int) as one int that sorts like it: ``secs << 32 | inc``."""
    if isinstance(ts, Timestamp):
        return (ts.time << 32) | ts.inc
    return int(ts)


def optime_of(entry: Mapping[str, Any]) -> OpTime:
    """The OpTime of an oplog entry ``{ts, t, ...}`` (``ts`` a Timestamp or an int)."""
    return OpTime(t=int(entry["t"]), ts=ts_int(entry["ts"]))


def election_id(term: int) -> ObjectId:
    """The PV1 ``electionId`` of ``term``: ``OID::fromTerm`` (src/mongo/bson/oid.cpp; checked by
    oid_test.cpp ``Basic.FromTerm``): the 4 bytes ``7fffffff`` then the term as a big-endian
    8-byte integer. Drivers compare it to spot stale primaries (SDAM)."""
    if term < 0:
        raise ValueError(f"term must be >= 0, got {term}")
    return ObjectId(b"\x7f\xff\xff\xff" + int(term).to_bytes(8, "big"))


def format_optime(op: OpTime) -> str:
    """An OpTime the way the server's messages print it: ``{ ts: Timestamp(s, i), t: T }``."""
    return f"{{ ts: Timestamp({op.ts >> 32}, {op.ts & 0xFFFFFFFF}), t: {op.t} }}"
