"""The deterministic load plan: which operation runs on which document, in what order.

A plan is a pure function of its :class:`PlanSpec` (same seed, same plan, on every machine:
only :class:`random.Random` and integer arithmetic are used). Operation ``seq`` (0-based) is one
``insert``, ``update`` or ``delete`` of one document of collection ``c<k>`` in database
``spec.db``. Documents are never re-inserted after a delete, so each document lives
``insert → update* → delete?`` and its change events must arrive in exactly that order.

Payloads carry the operation's ``seq`` so each change event names the operation it came from:

* insert ``seq`` → ``{_id: id, s: seq, v: 0, pad: "x" * n}``
* update ``seq`` → ``{$set: {s: seq}, $inc: {v: 1}}`` (event ``updatedFields`` = ``{s, v}``)
* delete → ``documentKey`` only; a document has at most one delete, found by ``(coll, _id)``.

``_id`` values are distinct per collection and spread evenly over ``[0, KEY_SPACE)``
(the insert counter times an odd multiplier modulo 2**31, a bijection), so range chunks split
at ``KEY_SPACE * i / n`` get an even share of documents.
"""

from __future__ import annotations

import math
import random
from array import array
from bisect import bisect_right
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Mapping, Sequence

KEY_SPACE = 1 << 31
INSERT, UPDATE, DELETE = 0, 1, 2
KIND_NAMES = ("insert", "update", "delete")
KIND_CODES = {name: code for code, name in enumerate(KIND_NAMES)}
DISTRIBUTIONS = ("uniform", "zipf")
# Fixed BSON overhead of {_id: int64, s: int64, v: int32, pad: ""} (bytes), for --doc-size.
_DOC_OVERHEAD = 4 + (1 + 4 + 8) + (1 + 2 + 8) + (1 + 2 + 4) + (1 + 4 + 4 + 1) + 1


def parse_mix(text: str) -> dict[str, float]:
    """``"insert=60,update=30,delete=10"`` → fractions summing to 1.

    Raises ValueError on unknown kinds, negative weights or an all-zero mix; missing kinds
    weigh 0. Insert weight must be > 0 (nothing to update or delete otherwise).
    """
    weights = {k: 0.0 for k in KIND_NAMES}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in weights:
            raise ValueError(f"bad --mix entry {part!r} (want insert=N,update=N,delete=N)")
        w = float(value)
        if w < 0 or not math.isfinite(w):
            raise ValueError(f"bad --mix weight {part!r}")
        weights[name] = w
    total = sum(weights.values())
    if weights["insert"] <= 0 or total <= 0:
        raise ValueError("--mix needs a positive insert weight")
    return {k: w / total for k, w in weights.items()}


@dataclass(frozen=True)
class PlanSpec:
    """Everything a plan depends on.

    ``ops`` number of operations; ``mix`` fractions per kind (see :func:`parse_mix`);
    ``distribution`` how updates/deletes pick a live document: ``uniform`` or ``zipf``
    (rank r among live documents with P(r) ∝ 1/r, i.e. Zipf s=1: a few hot documents);
    ``collections`` how many collections ``c0..c{n-1}``; ``doc_size`` target BSON size of an
    inserted document in bytes; ``seed`` the random seed; ``db`` the database name.
    """

    ops: int
    seed: int = 1
    mix: Mapping[str, float] = field(default_factory=lambda: parse_mix("insert=60,update=30,delete=10"))
    distribution: str = "uniform"
    collections: int = 1
    doc_size: int = 128
    db: str = "shardsim_load"

    def __post_init__(self) -> None:
        if self.ops < 0:
            raise ValueError("ops must be >= 0")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}")
        if self.collections < 1:
            raise ValueError("collections must be >= 1")
        object.__setattr__(self, "mix", dict(self.mix))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def collection_names(self) -> list[str]:
        return [f"c{k}" for k in range(self.collections)]


class Plan:
    """A generated plan: parallel arrays indexed by ``seq``.

    ``kinds[seq]`` (INSERT/UPDATE/DELETE), ``colls[seq]`` (collection index), ``ids[seq]``
    (the document's ``_id``), ``prev[seq]`` (the previous op on the same document, -1 for its
    insert), ``version[seq]`` (the document's ``v`` after the op). ``deletes`` maps
    ``(coll, _id)`` → the seq of its delete.
    """

    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self.kinds = array("b")
        self.colls = array("h")
        self.ids = array("q")
        self.prev = array("q")
        self.version = array("i")
        self.deletes: dict[tuple[int, int], int] = {}
        self._generate()

    # -- generation ------------------------------------------------------------------------
    def _generate(self) -> None:
        spec = self.spec
        rng = random.Random(spec.seed)
        # per-collection id bijection: (counter * mult + offset) mod 2**31, mult odd
        mults = [rng.randrange(1 << 20, 1 << 30) | 1 for _ in range(spec.collections)]
        offsets = [rng.randrange(KEY_SPACE) for _ in range(spec.collections)]
        counters = [0] * spec.collections
        live: list[list[int]] = [[] for _ in range(spec.collections)]
        pos: list[dict[int, int]] = [{} for _ in range(spec.collections)]
        last: list[dict[int, int]] = [{} for _ in range(spec.collections)]
        vers: list[dict[int, int]] = [{} for _ in range(spec.collections)]
        p_ins = spec.mix["insert"]
        p_upd = p_ins + spec.mix["update"]
        zipf = spec.distribution == "zipf"
        kinds, colls, ids, prev, version = self.kinds, self.colls, self.ids, self.prev, self.version
        rand = rng.random
        ncoll = spec.collections
        for seq in range(spec.ops):
            c = rng.randrange(ncoll) if ncoll > 1 else 0
            u = rand()
            lv = live[c]
            if u < p_ins or not lv:
                kind = INSERT
                _id = (counters[c] * mults[c] + offsets[c]) % KEY_SPACE
                counters[c] += 1
                pos[c][_id] = len(lv)
                lv.append(_id)
                p = -1
                v = 0
            else:
                n = len(lv)
                if zipf:
                    r = min(n - 1, int(math.exp(rand() * math.log(n + 1))) - 1)
                else:
                    r = int(rand() * n)
                _id = lv[r]
                p = last[c][_id]
                if u < p_upd:
                    kind = UPDATE
                    v = vers[c][_id] + 1
                else:
                    kind = DELETE
                    v = vers[c][_id]
                    # swap-remove from the live list: O(1)
                    tail = lv.pop()
                    if tail != _id:
                        lv[r] = tail
                        pos[c][tail] = r
                    del pos[c][_id]
                    self.deletes[(c, _id)] = seq
            last[c][_id] = seq
            vers[c][_id] = v
            kinds.append(kind)
            colls.append(c)
            ids.append(_id)
            prev.append(p)
            version.append(v)

    # -- accessors -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.kinds)

    @property
    def pad(self) -> str:
        return "x" * max(0, self.spec.doc_size - _DOC_OVERHEAD)

    def describe(self, seq: int) -> str:
        """``"op #12 (update c0 _id=123)"`` for messages."""
        return (f"op #{seq} ({KIND_NAMES[self.kinds[seq]]} {self.spec.db}.c{self.colls[seq]} "
                f"_id={self.ids[seq]})")

    def counts(self) -> dict[str, int]:
        """Operations per kind."""
        out = {k: 0 for k in KIND_NAMES}
        for k in self.kinds:
            out[KIND_NAMES[k]] += 1
        return out

    def expected_final(self) -> dict[str, dict[int, dict[str, Any]]]:
        """Collection name → ``{_id: document}`` after every op ran."""
        names = self.spec.collection_names
        out: dict[str, dict[int, dict[str, Any]]] = {n: {} for n in names}
        pad = self.pad
        for seq, kind in enumerate(self.kinds):
            coll = out[names[self.colls[seq]]]
            _id = self.ids[seq]
            if kind == INSERT:
                coll[_id] = {"_id": _id, "s": seq, "v": 0, "pad": pad}
            elif kind == UPDATE:
                doc = coll[_id]
                doc["s"] = seq
                doc["v"] = self.version[seq]
            else:
                del coll[_id]
        return out


@dataclass(frozen=True)
class Chunk:
    """One range chunk ``[lo, hi)`` of collection index ``coll`` (``_id`` shard key) on ``shard``."""

    coll: int
    lo: int
    hi: int
    shard: str


def split_points(nshards: int) -> list[int]:
    """Split points that cut ``[0, KEY_SPACE)`` into ``nshards`` equal ranges."""
    return [KEY_SPACE * i // nshards for i in range(1, nshards)]


class ChunkMap:
    """Routes ``(coll, _id)`` to a shard name from range chunks on ``{_id: 1}``."""

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self.chunks = list(chunks)
        by_coll: dict[int, list[Chunk]] = {}
        for ch in sorted(self.chunks, key=lambda c: (c.coll, c.lo)):
            by_coll.setdefault(ch.coll, []).append(ch)
        self._los = {c: [ch.lo for ch in chs] for c, chs in by_coll.items()}
        self._shards = {c: [ch.shard for ch in chs] for c, chs in by_coll.items()}

    def shard_of(self, coll: int, _id: int) -> str:
        i = bisect_right(self._los[coll], _id) - 1
        return self._shards[coll][max(i, 0)]

    @property
    def shards(self) -> list[str]:
        return sorted({ch.shard for ch in self.chunks})


def partition_by_shard(plan: Plan, chunks: ChunkMap) -> dict[str, array]:
    """Shard name → the seqs (in plan order) of the ops whose document lives on that shard.

    Every op of one document lands in the same list in plan order, so writing each list in
    order keeps every document's history in order whatever the lists' relative timing.
    """
    out: dict[str, array] = {s: array("q") for s in chunks.shards}
    shard_of = chunks.shard_of
    for seq in range(len(plan)):
        out[shard_of(plan.colls[seq], plan.ids[seq])].append(seq)
    return out


def batches(plan: Plan, seqs: Sequence[int], size: int) -> Iterator[dict[int, list[int]]]:
    """Cut ``seqs`` into runs of ``size`` ops; yield each run as coll → seqs ordered for one
    bulk write.

    Inside a run the ops are stably sorted by kind (inserts, then updates, then deletes): a
    document's own ops are always insert → updates → delete in plan order, so the sort keeps
    each document's order and lets the driver send at most three commands per collection.
    """
    kinds, colls = plan.kinds, plan.colls
    for start in range(0, len(seqs), size):
        run: dict[int, list[int]] = {}
        for seq in seqs[start:start + size]:
            run.setdefault(colls[seq], []).append(seq)
        for c in run:
            run[c].sort(key=kinds.__getitem__)
        yield run
