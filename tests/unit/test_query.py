"""Update application and the ``$v: 2`` oplog diffs (format of ``doc_diff.cpp``)."""

from __future__ import annotations

import pytest
from bson.int64 import Int64

from shardsim.core.errors import MongoError
from shardsim.core.query import distinct_values, matches
from shardsim.core.update import apply_update, update_diff, upsert_seed


def diff_of(pre: dict, update) -> tuple[dict, dict]:
    post = apply_update(pre, update, {"_id": pre.get("_id")})
    return post, update_diff(pre, post, update)


def test_set_new_and_existing_fields():
    post, o = diff_of({"_id": 1, "a": 1}, {"$set": {"a": 2, "b": 3}})
    assert post == {"_id": 1, "a": 2, "b": 3}
    assert o == {"$v": 2, "diff": {"u": {"a": 2}, "i": {"b": 3}}}


def test_dotted_set_gives_subdiff_but_whole_object_set_does_not():
    pre = {"_id": 1, "o": {"x": 1, "y": 2}}
    _, o = diff_of(pre, {"$set": {"o.x": 5}})
    assert o["diff"] == {"so": {"u": {"x": 5}}}
    _, o = diff_of(pre, {"$set": {"o": {"x": 5, "y": 2}}})
    assert o["diff"] == {"u": {"o": {"x": 5, "y": 2}}}


def test_unset_and_rename():
    post, o = diff_of({"_id": 1, "a": 1, "b": {"c": 1, "d": 2}}, {"$unset": {"a": "", "b.c": ""}})
    assert post == {"_id": 1, "b": {"d": 2}}
    assert o["diff"] == {"d": {"a": False}, "sb": {"d": {"c": False}}}
    post, o = diff_of({"_id": 1, "a": 1}, {"$rename": {"a": "z"}})
    assert post == {"_id": 1, "z": 1}
    assert o["diff"] == {"d": {"a": False}, "i": {"z": 1}}
    post, _ = diff_of({"_id": 1, "a": {"b": 1}}, {"$rename": {"a.b": "c.d"}})
    assert post == {"_id": 1, "a": {}, "c": {"d": 1}}


def test_push_logs_appended_elements_pull_logs_whole_array():
    pre = {"_id": 1, "arr": [1, 2]}
    post, o = diff_of(pre, {"$push": {"arr": 3}})
    assert post["arr"] == [1, 2, 3]
    assert o["diff"] == {"sarr": {"a": True, "u2": 3}}
    post, o = diff_of(pre, {"$pull": {"arr": 1}})
    assert post["arr"] == [2]
    assert o["diff"] == {"u": {"arr": [2]}}
    post, o = diff_of(pre, {"$set": {"arr.1": 9}})
    assert o["diff"] == {"sarr": {"a": True, "u1": 9}}


def test_inc_mul_min_max_types():
    post, o = diff_of({"_id": 1, "n": 2, "f": 1.5}, {"$inc": {"n": 3}, "$mul": {"f": 2}})
    assert post == {"_id": 1, "n": 5, "f": 3.0}
    post, _ = diff_of({"_id": 1, "n": 5}, {"$min": {"n": 3}, "$max": {"m": 7}})
    assert post == {"_id": 1, "n": 3, "m": 7}
    post, _ = diff_of({"_id": 1}, {"$mul": {"z": Int64(4)}})
    assert post["z"] == 0 and isinstance(post["z"], Int64)


def test_noop_update_produces_identical_document():
    pre = {"_id": 1, "a": 1}
    post = apply_update(pre, {"$set": {"a": 1}}, {})
    assert post == pre and post is not pre


def test_noop_rules_follow_mongod():
    from shardsim.core.update import is_noop
    pre = {"_id": 1, "v": -1}
    # A replacement without _id always writes (ObjectReplaceExecutor compares with _id).
    assert not is_noop(pre, apply_update(pre, {"v": -1}, {}), {"v": -1})
    assert is_noop(pre, apply_update(pre, {"_id": 1, "v": -1}, {}), {"_id": 1, "v": -1})
    assert is_noop(pre, apply_update(pre, {"$set": {"v": -1}}, {}), {"$set": {"v": -1}})
    assert not is_noop(pre, apply_update(pre, {"$set": {"v": -1.0}}, {}), {"$set": {"v": -1.0}})


def test_type_change_is_an_update():
    _, o = diff_of({"_id": 1, "a": 1}, {"$set": {"a": 1.0}})
    assert o["diff"] == {"u": {"a": 1.0}}


def test_replacement_keeps_id_first_and_logs_full_document():
    pre = {"_id": 7, "a": 1}
    post = apply_update(pre, {"b": 2}, {"_id": 7})
    assert list(post) == ["_id", "b"]
    assert update_diff(pre, post, {"b": 2}) == {"_id": 7, "b": 2}


def test_pipeline_update_diff_and_array_truncation():
    pre = {"_id": 1, "arr": [1, 2, 3], "x": 1, "big": "y" * 100}
    pipeline = [{"$set": {"arr": [1, 2], "x": 2}}]
    post, o = diff_of(pre, pipeline)
    assert post["arr"] == [1, 2] and post["x"] == 2
    assert o == {"$v": 2, "diff": {"u": {"x": 2}, "sarr": {"a": True, "l": 2}}}


def test_immutable_id_and_bad_modifiers():
    with pytest.raises(MongoError) as e:
        apply_update({"_id": 1}, {"$set": {"_id": 2}}, {})
    assert e.value.code == 66
    with pytest.raises(MongoError) as e:
        apply_update({"_id": 1}, {"$foo": {"a": 1}}, {})
    assert e.value.code == 9
    with pytest.raises(MongoError) as e:
        apply_update({"_id": 1}, {"$set": {"a": 1}, "b": 2}, {})
    assert e.value.code == 9
    with pytest.raises(MongoError) as e:
        apply_update({"_id": 1}, {"$set": {"a": 1}, "$inc": {"a.b": 2}}, {})
    assert e.value.code == 40 and "would create a conflict at 'a'" in e.value.errmsg


def test_matcher_and_helpers():
    doc = {"_id": 1, "a": [{"b": 1}, {"b": 5}], "s": "hello", "n": None}
    assert matches({"a.b": 5}, doc)
    assert matches({"a": {"$elemMatch": {"b": {"$gt": 3}}}}, doc)
    assert matches({"s": {"$regex": "^he"}}, doc)
    assert matches({"$or": [{"x": 1}, {"n": None}]}, doc)
    assert not matches({"s": {"$type": "int"}}, doc)
    with pytest.raises(MongoError):
        matches({"a": {"$bogus": 1}}, doc)
    assert upsert_seed({"_id": 3, "x": {"$gt": 1}, "y.z": 2}) == {"_id": 3, "y": {"z": 2}}
    assert distinct_values([{"t": [1, 2]}, {"t": 2}, {"t": "a"}], "t") == [1, 2, "a"]


def test_find_projection_semantics():
    from shardsim.core.query import project
    doc = {"_id": 1, "a": [1, 2, 3, 4], "b": {"c": 1, "d": 2}, "e": [{"x": 1, "y": 1}, {"x": 2, "y": 2}], "z": 5}
    assert project([doc], {"b.c": 1}) == [{"_id": 1, "b": {"c": 1}}]
    assert list(project([doc], {"z": 1, "a": {"$slice": [1, 2]}})[0]) == ["_id", "a", "z"]
    assert project([doc], {"z": 1, "a": {"$slice": [1, 2]}})[0]["a"] == [2, 3]
    only_slice = project([doc], {"a": {"$slice": -1}})[0]
    assert only_slice["a"] == [4] and only_slice["z"] == 5  # $slice alone keeps other fields
    assert project([doc], {"e": {"$elemMatch": {"x": 2}}, "_id": 0}) == [{"e": [{"x": 2, "y": 2}]}]
    assert project([doc], {"e.y": 0, "_id": 0})[0]["e"] == [{"x": 1}, {"x": 2}]
    assert project([doc], {"n": {"$add": ["$z", 1]}, "z": 1}) == [{"_id": 1, "z": 5, "n": 6}]
    with pytest.raises(MongoError) as e:
        project([doc], {"a": 1, "z": 0})
    assert e.value.code == 31254
    assert doc["a"] == [1, 2, 3, 4] and doc["e"][0] == {"x": 1, "y": 1}  # input untouched


def test_sort_uses_bson_order_and_array_min_max():
    from shardsim.core.query import sort_docs
    docs = [{"_id": 1, "a": [5, 1]}, {"_id": 2, "a": 3}, {"_id": 3}, {"_id": 4, "a": []},
            {"_id": 5, "a": "s"}, {"_id": 6, "a": [2, 9]}, {"_id": 7, "a": None}]
    assert [d["_id"] for d in sort_docs(docs, {"a": 1})] == [4, 3, 7, 1, 6, 2, 5]
    assert [d["_id"] for d in sort_docs(docs, {"a": -1})] == [5, 6, 1, 2, 3, 7, 4]
    assert [d["_id"] for d in sort_docs(docs, {"a": 1, "_id": -1})] == [4, 7, 3, 1, 6, 2, 5]
    with pytest.raises(MongoError) as e:
        sort_docs(docs, {"a": 2})
    assert e.value.code == 15975


def test_positional_and_array_filter_updates_expand_to_real_paths():
    from shardsim.core.update import expand_positional
    pre = {"_id": 1, "a": [{"b": 0, "k": "x"}, {"b": 5, "k": "y"}, {"b": 7, "k": "y"}]}
    u = expand_positional(pre, {"$set": {"a.$[].b": 1}}, {})
    assert u == {"$set": {"a.0.b": 1, "a.1.b": 1, "a.2.b": 1}}
    u = expand_positional(pre, {"$inc": {"a.$[el].b": 10}}, {}, [{"el.k": "y"}])
    assert u == {"$inc": {"a.1.b": 10, "a.2.b": 10}}
    post = apply_update(pre, u, {})
    assert [e["b"] for e in post["a"]] == [0, 15, 17]
    assert update_diff(pre, post, u)["diff"] == {"sa": {"a": True, "s1": {"u": {"b": 15}},
                                                        "s2": {"u": {"b": 17}}}}
    u = expand_positional(pre, {"$set": {"a.$.b": 9}}, {"a.k": "y"})
    assert u == {"$set": {"a.1.b": 9}}
    with pytest.raises(MongoError) as e:
        expand_positional(pre, {"$set": {"a.$[zz].b": 1}}, {})
    assert e.value.code == 2
    with pytest.raises(MongoError) as e:
        expand_positional(pre, {"$set": {"a.0.b": 1}}, {}, [{"q": 1}])
    assert e.value.code == 9
    with pytest.raises(MongoError) as e:
        expand_positional(pre, {"$set": {"a.$.b": 1}}, {"_id": 1})
    assert e.value.code == 2


def test_select_by_id_uses_the_id_map():
    from shardsim.core.query import select
    from shardsim.shard.storage import Collection
    c = Collection("d", "c", b"s" * 16)
    for i in [5, 3, 9, 1]:
        c.insert({"_id": i, "v": i})
    assert [d["_id"] for _, d in select(c, {"_id": 3.0})] == [3]
    assert [d["_id"] for _, d in select(c, {"_id": {"$in": [9, 1, 3, 7, 1.0]}})] == [1, 3, 9]
    assert [d["_id"] for _, d in select(c, {"_id": {"$in": [9, 1, 3]}, "v": {"$gt": 2}})] == [3, 9]
    assert [d["_id"] for _, d in select(c, {"v": {"$gte": 3}})] == [5, 3, 9]  # natural order
