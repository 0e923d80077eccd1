"""``Oplog.scoped_batch`` returns exactly what ``scoped_entries_from`` yields, in slices:
every scope, commands between the namespace's entries, truncation and index compaction."""

from __future__ import annotations

import random

import pytest
from bson import Timestamp

from shardsim.shard.oplog import Oplog


def _fill(log: Oplog, rng: random.Random, n: int, start: int) -> int:
    t = start
    for _ in range(n):
        t += 1
        r = rng.random()
        if r < 0.1:
            e = {"op": "c", "ns": "d.$cmd", "o": {"drop": "c"}}
        elif r < 0.15:
            e = {"op": "n", "ns": "", "o": {"msg": "periodic noop"}}
        else:
            e = {"op": rng.choice("iud"), "ns": rng.choice(["d.c", "d.c", "d.x", "e.c"]),
                 "o": {"_id": t}}
        e["ts"] = Timestamp(t, 1)
        log.append(e, 100)
    return t


def _via_batches(log: Oplog, key: int, limit: int, **scope) -> list:
    out = []
    while True:
        keys, entries = log.scoped_batch(key, limit, **scope)
        assert len(keys) == len(entries) <= limit
        out += list(zip(keys, entries))
        if len(keys) < limit:
            return out
        key = keys[-1] + 1


@pytest.mark.parametrize("scope", [{}, {"ns": "d.c"}, {"db": "d"}, {"ns": "nope.x"},
                                   {"db": "e"}])
@pytest.mark.parametrize("limit", [1, 2, 7, 32, 1000])
def test_scoped_batch_matches_scoped_entries_from(scope, limit):
    rng = random.Random(limit)
    log = Oplog(max_bytes=100 * 2000, min_retention_s=0)  # truncates and compacts while filling
    t = _fill(log, rng, 6000, 100)
    for start in (0, (t - 1500) << 32, (t - 7) << 32, rng.randint(0, t << 32), (t + 5) << 32):
        expect = list(log.scoped_entries_from(start, **scope))
        assert _via_batches(log, start, limit, **scope) == expect
    assert log._base > 0  # the positions were compacted: indices differ from positions
