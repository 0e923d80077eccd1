"""$project / $unset / $addFields / $set after $changeStream: MongoDB's projection rules
(projection_parser.cpp, projection_node.cpp) applied by shard/change_stream/user_stages.py."""

from __future__ import annotations

from typing import Any

import pytest

from shardsim.shard.change_stream.user_stages import compile_stage
from shardsim.core.errors import MongoError

TOKEN = {"_data": "8200000001000000012B0429296E1404"}


def event() -> dict[str, Any]:
    return {
        "_id": dict(TOKEN),
        "operationType": "insert",
        "clusterTime": 1,
        "ns": {"db": "d", "coll": "c"},
        "documentKey": {"_id": 1},
        "fullDocument": {"_id": 1, "a": [1, {"b": 2, "c": 3}, [{"b": 4, "c": 5}]], "x": {"y": 1}, "s": 7},
    }


def run(stage: str, arg: Any, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    fn = compile_stage(stage, arg)
    src = doc if doc is not None else event()
    before = repr(src)
    out = fn(src)
    assert repr(src) == before  # the input event is never modified
    return out


def error(stage: str, arg: Any) -> MongoError:
    with pytest.raises(MongoError) as ei:
        compile_stage(stage, arg)
    return ei.value


# -- dotted computed paths create nested documents ---------------------------------------------
def test_dotted_computed_path_nests_like_mongod():
    out = run("$project", {"operationType": "insert", "ns.viewOn": "db.coll"})
    assert out == {"_id": TOKEN, "ns": {"viewOn": "db.coll"}, "operationType": "insert"}
    assert list(out) == ["_id", "ns", "operationType"]  # projected fields in input order first
    assert "ns.viewOn" not in out


def test_nested_object_spec_is_a_sub_projection():
    out = run("$project", {"ns": {"db": 1, "renamed": "$ns.coll"}, "_id": 0})
    assert out == {"ns": {"db": "d", "renamed": "c"}}


def test_computed_sub_path_replaces_a_scalar_and_maps_over_arrays():
    out = run("$project", {"fullDocument.s.t": {"$literal": 1}, "fullDocument.a.k": "v"})
    fd = out["fullDocument"]
    assert fd["s"] == {"t": 1}  # {"s.t": expr} on {s: 7} gives {s: {t: 1}}
    # inclusion: scalars in the array are dropped by the (empty) projection, documents get k
    assert fd["a"] == [{"k": "v"}, [{"k": "v"}]]


# -- inclusion / exclusion ---------------------------------------------------------------------
def test_inclusion_keeps_id_by_default_and_can_drop_it():
    assert run("$project", {"operationType": 1}) == {"_id": TOKEN, "operationType": "insert"}
    assert run("$project", {"operationType": True, "_id": 0}) == {"operationType": "insert"}
    assert run("$project", {"_id": 1}) == {"_id": TOKEN}


def test_dotted_inclusion_into_arrays():
    out = run("$project", {"fullDocument.a.b": 1, "fullDocument.x.y": 1})
    assert out["fullDocument"] == {"a": [{"b": 2}, [{"b": 4}]], "x": {"y": 1}}


def test_dotted_exclusion_into_arrays_keeps_scalars():
    out = run("$project", {"fullDocument.a.b": 0, "documentKey": 0})
    assert "documentKey" not in out and out["_id"] == TOKEN
    assert out["fullDocument"]["a"] == [1, {"c": 3}, [{"c": 5}]]
    assert out["fullDocument"]["x"] == {"y": 1}


def test_id_only_exclusion_is_an_exclusion_projection():
    out = run("$project", {"_id": 0})
    assert "_id" not in out and out["operationType"] == "insert"


def test_missing_field_paths_leave_the_field_out():
    out = run("$project", {"m": "$nope", "n": "$ns.coll", "arr": ["$ns.db", "$nope"], "r": "$$REMOVE"})
    assert out == {"_id": TOKEN, "n": "c", "arr": ["d", None]}


def test_operators_are_evaluated():
    out = run("$project", {"name": {"$concat": ["$ns.db", ".", "$ns.coll"]}, "one": {"$add": [0, 1]}})
    assert out["name"] == "d.c" and out["one"] == 1


# -- $addFields / $set / $unset ----------------------------------------------------------------
def test_add_fields_merges_into_embedded_documents():
    out = run("$addFields", {"ns": {"viewOn": "v"}, "fullDocument.a.k": 1, "empty": {}})
    assert out["ns"] == {"db": "d", "coll": "c", "viewOn": "v"}
    # every element of the array on the path: documents get the field, scalars become documents
    assert out["fullDocument"]["a"] == [{"k": 1}, {"b": 2, "c": 3, "k": 1}, [{"b": 4, "c": 5, "k": 1}]]
    assert out["empty"] == {}
    assert list(out)[:2] == ["_id", "operationType"]


def test_set_replaces_in_place_and_remove_drops():
    out = run("$set", {"operationType": "changed", "clusterTime": "$$REMOVE", "ns.db": 0})
    assert out["operationType"] == "changed" and "clusterTime" not in out
    assert out["ns"] == {"db": 0, "coll": "c"}  # numbers are values in $set, not inclusion flags
    assert list(out).index("operationType") == 1


def test_unset_is_an_exclusion():
    out = run("$unset", ["ns.db", "fullDocument"])
    assert out["ns"] == {"coll": "c"} and "fullDocument" not in out and out["_id"] == TOKEN
    assert "clusterTime" not in run("$unset", "clusterTime")


# -- parse errors (codes and messages of mongod 8.0) -------------------------------------------
@pytest.mark.parametrize("spec,code,text", [
    ({}, 51272, "projection specification must have at least one field"),
    ({"a": 1, "b": 0}, 31254, "Cannot do exclusion on field b in inclusion projection"),
    ({"a": 0, "b": 1}, 31253, "Cannot do inclusion on field b in exclusion projection"),
    ({"a": 0, "b": "x"}, 31310, 'Cannot use an expression b: "x" in an exclusion projection'),
    ({"a": 0, "b": {"$add": [1, 2]}}, 31252, "Cannot use expression other than $meta in exclusion"),
    ({"b": "x", "a": 0}, 31254, "Cannot do exclusion on field a in inclusion projection"),
    ({"a": 1, "a.b": 1}, 31249, "Path collision at a.b remaining portion b"),
    ({"a.b": 1, "a": 1}, 31250, "Path collision at a"),
    ({"ns": {}}, 51270, "Invalid empty sub-projection: ns"),
    ({"a.$": 1}, 31324, "Cannot use positional projection in aggregation projection"),
    ({"x": {"$foo": 1}}, 31325, "Unknown expression $foo"),
    ({"a..b": 1}, 15998, "FieldPath field names may not be empty strings."),
    ({"a": {"b": 1, "$c": 1}}, 16410, "FieldPath field names may not start with '$'"),
])
def test_project_parse_errors(spec, code, text):
    exc = error("$project", spec)
    assert exc.code == code
    assert exc.errmsg.startswith("Invalid $project :: caused by :: ") and text in exc.errmsg


def test_id_may_be_excluded_in_an_inclusion_and_included_in_an_exclusion():
    assert run("$project", {"_id": 0, "operationType": 1}) == {"operationType": "insert"}
    out = run("$project", {"_id": 1, "fullDocument": 0})
    assert out["_id"] == TOKEN and "fullDocument" not in out


def test_stage_argument_errors():
    assert error("$project", "x").code == 15969
    assert error("$unset", 5).code == 31002
    assert error("$unset", []).code == 31119
    assert error("$unset", ["a", 1]).code == 31120
    exc = error("$set", [1])
    assert exc.code == 40272 and exc.errmsg == "$set specification stage must be an object, got array"
    exc = error("$addFields", {"a": [{"$bogus": 1}]})
    assert exc.code == 168 and exc.errmsg.startswith("Invalid $addFields :: caused by :: ")
