"""``$bucketAuto`` as ``document_source_bucket_auto.cpp`` builds buckets (``populateBuckets``):
sorted by ``groupBy``, about n/buckets documents each, equal values kept together, boundaries
by value, the last bucket taking the rest; mongod's parse errors."""

from __future__ import annotations

import pytest

from shardsim.core import query as q
from shardsim.core.errors import MongoError


def _run(docs, spec):
    return q.run_pipeline([dict(d) for d in docs], [{"$bucketAuto": spec}], None)


def test_even_buckets_with_value_boundaries():
    out = _run([{"x": i} for i in (5, 1, 9, 3, 7, 2, 8, 4, 6, 0)], {"groupBy": "$x",
                                                                    "buckets": 5})
    assert out == [{"_id": {"min": 0, "max": 2}, "count": 2},
                   {"_id": {"min": 2, "max": 4}, "count": 2},
                   {"_id": {"min": 4, "max": 6}, "count": 2},
                   {"_id": {"min": 6, "max": 8}, "count": 2},
                   {"_id": {"min": 8, "max": 9}, "count": 2}]


def test_equal_values_stay_in_one_bucket_and_last_takes_the_rest():
    docs = [{"x": v} for v in (1, 1, 1, 1, 2, 3, 4, 5)]
    out = _run(docs, {"groupBy": "$x", "buckets": 3})
    # round(8 / 3) = 3 per bucket; the fourth 1 joins the first bucket
    assert out == [{"_id": {"min": 1, "max": 2}, "count": 4},
                   {"_id": {"min": 2, "max": 5}, "count": 3},
                   {"_id": {"min": 5, "max": 5}, "count": 1}]


def test_more_buckets_than_documents_and_missing_is_null():
    out = _run([{"x": 2}, {}, {"x": 1}], {"groupBy": "$x", "buckets": 10})
    assert [b["_id"] for b in out] == [{"min": None, "max": 1}, {"min": 1, "max": 2},
                                       {"min": 2, "max": 2}]


def test_output_accumulators_replace_count():
    docs = [{"x": i, "v": i * 10} for i in range(4)]
    out = _run(docs, {"groupBy": "$x", "buckets": 2,
                      "output": {"total": {"$sum": "$v"}, "xs": {"$push": "$x"}}})
    assert out == [{"_id": {"min": 0, "max": 2}, "total": 10, "xs": [0, 1]},
                   {"_id": {"min": 2, "max": 3}, "total": 50, "xs": [2, 3]}]


@pytest.mark.parametrize("spec,code", [
    ("x", 40240), ({"groupBy": "$x"}, 40246), ({"groupBy": "$x", "buckets": 0}, 40243),
    ({"groupBy": "$x", "buckets": "2"}, 40241), ({"groupBy": "$x", "buckets": 1.5}, 40242),
    ({"groupBy": "x", "buckets": 2}, 40239), ({"groupBy": "$x", "buckets": 2, "y": 1}, 40245),
    ({"groupBy": "$x", "buckets": 2, "output": 1}, 40244),
])
def test_parse_errors(spec, code):
    with pytest.raises(MongoError) as exc:
        _run([{"x": 1}], spec)
    assert exc.value.code == code
