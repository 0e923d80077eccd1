"""The router's child write batches stay within mongos' limits (``BatchWriteOp::targetBatch``:
at most 100,000 statements and 16 MiB of estimated statement sizes per child batch; a
statement alone always goes), whatever the statements' sizes: :meth:`WriteExecutor._split`."""

from __future__ import annotations

import bson
from hypothesis import given, settings, strategies as st

from shardsim.core.commands import ConnectionInfo, Request
from shardsim.router.writes import (ARRAY_ELEMENT_OVERHEAD, MAX_CHILD_BATCH_BYTES,
                                    MAX_CHILD_BATCH_OPS, UNMEASURED_REQUEST_BYTES, Run,
                                    WriteExecutor)

MIB = 1024 * 1024


def _executor(kind: str = "insert", body: dict | None = None, raw: bytes = b"x",
              sequences: dict | None = None, sizes: list[int] | None = None) -> WriteExecutor:
    body = {kind: "c", "$db": "d", **(body or {})}
    req = Request(kind, "d", body, ConnectionInfo(1), raw=raw, sequences=sequences or {})
    return WriteExecutor(None, req, kind, sizes)  # type: ignore[arg-type]


def _check(pieces: list[Run], runs: list[Run], sizes: list[int], extra: int) -> None:
    # the pieces are the runs in order, each run's statements in order, no statement lost
    assert [i for p in pieces for i in p.idx] == [i for r in runs for i in r.idx]
    for p in pieces:
        assert len(p.idx) == len(p.ops) and p.idx
        assert len(p.idx) <= MAX_CHILD_BATCH_OPS
        if len(p.idx) > 1:
            assert sum(sizes[i] + extra for i in p.idx) <= MAX_CHILD_BATCH_BYTES


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 20 * MIB), min_size=1, max_size=60),
       st.integers(1, 4), st.booleans())
def test_pieces_fit_the_limits_and_keep_the_order(sizes, shards, retryable):
    ex = _executor(body={"txnNumber": 1} if retryable else None)
    ex._sizes = sizes
    runs, start = [], 0
    step = max(1, len(sizes) // shards)
    while start < len(sizes):
        idx = list(range(start, min(len(sizes), start + step)))
        runs.append(Run([f"s{len(runs)}"], idx, [{"_id": i} for i in idx]))
        start += step
    pieces = ex._split(runs)
    extra = ARRAY_ELEMENT_OVERHEAD + (ARRAY_ELEMENT_OVERHEAD + 4 if retryable else 0)
    _check(pieces, runs, sizes, extra)
    # a piece is cut only when the next statement would not fit
    for a, b in zip(pieces, pieces[1:]):
        if a.shards == b.shards:
            assert sum(sizes[i] + extra for i in a.idx) + sizes[b.idx[0]] + extra \
                > MAX_CHILD_BATCH_BYTES or len(a.idx) == MAX_CHILD_BATCH_OPS


def test_forty_one_mib_documents_make_three_batches():
    sizes = [MIB + 30] * 40
    ex = _executor()
    ex._sizes = sizes
    pieces = ex._split([Run(["a"], list(range(40)), [{}] * 40)])
    assert [len(p.idx) for p in pieces] == [15, 15, 10]


def test_count_limit_without_sizes():
    ex = _executor()
    ex._sizes = None
    n = MAX_CHILD_BATCH_OPS + 5
    pieces = ex._split([Run(["a"], list(range(n)), [{}] * n)])
    assert [len(p.idx) for p in pieces] == [MAX_CHILD_BATCH_OPS, 5]


def test_a_broadcast_is_never_split():
    ex = _executor("update")
    ex._sizes = [30 * MIB]
    run = Run(["a", "b"], [0], [{"q": {}, "u": {}}], broadcast=True)
    assert ex._split([run]) == [run]


def test_sizes_come_from_the_document_sequence_plus_an_added_id():
    docs = [{"_id": 1, "s": "x" * 100}, {"s": "y" * 200}]
    raw = [bson.encode(d) for d in docs]
    ex = _executor(body={"documents": docs}, sequences={"documents": raw})
    ops = ex.statements()
    assert ex.statement_sizes(ops) == [len(raw[0]), len(raw[1]) + 17]
    assert len(bson.encode(ops[1])) == len(raw[1]) + 17


def test_a_small_request_is_not_measured_and_a_large_body_is():
    docs = [{"_id": i} for i in range(3)]
    assert _executor(body={"documents": docs}).statement_sizes(docs) is None
    big = _executor(body={"documents": docs}, raw=b"x" * (UNMEASURED_REQUEST_BYTES + 1))
    assert big.statement_sizes(docs) == [len(bson.encode(d)) for d in docs]
    # an internal request (no raw body) is measured; sizes given by the caller win
    assert _executor(body={"documents": docs}, raw=b"").statement_sizes(docs) \
        == [len(bson.encode(d)) for d in docs]
    assert _executor(sizes=[5, 6, 7]).statement_sizes(docs) == [5, 6, 7]
