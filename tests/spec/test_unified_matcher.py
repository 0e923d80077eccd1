"""Pure tests of the unified-format matcher, runOnRequirements and entity map (no server)."""

from __future__ import annotations

import datetime
import uuid

import pytest
from bson import json_util
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from shardsim.tools.unified.entities import CommandRecorder, EntityMap
from shardsim.tools.unified.matcher import MatchError, Matcher, RunnerError, bson_type
from shardsim.tools.unified.requirements import (ServerInfo, check_schema_version, parse_version,
                                           skip_reason)
from shardsim.tools.unified.files import load_test_file
from shardsim.tools.unified.runner import exact_equal
from shardsim.tools.unified.uris import _single_host_uri
from shardsim.tools.unified.cli import summary_line
from shardsim.tools.unified.runner import TestResult as Result

M = Matcher()


def ok(expected, actual, root=True):
    M.match(expected, actual, root=root)


def bad(expected, actual, root=True, match=None):
    with pytest.raises(MatchError, match=match):
        M.match(expected, actual, root=root)


def X(text: str):
    """Parse Extended JSON the way test files are parsed."""
    return json_util.loads(text)


# -- documents, arrays, scalars -------------------------------------------------------------------

def test_root_document_allows_extra_fields_nested_does_not():
    ok({"x": 1}, {"x": 1, "y": 1})
    bad({"x": 1, "y": 1}, {"x": 1}, match="missing")
    bad({"x": {"y": 1}}, {"x": {"y": 1, "z": 1}}, match="unexpected field")
    ok({"x": {"y": 1}}, {"x": {"y": 1}})


def test_key_order_does_not_matter():
    ok({"x": 1, "y": 2}, {"y": 2, "x": 1})
    ok({"a": {"x": 1, "y": 2}}, {"a": {"y": 2, "x": 1}})


def test_arrays_same_length_and_elements_are_nested():
    ok([1, 2, 3], [1, 2, 3])
    bad([1, 2, 3], [1, 2, 3, 4], match="3 element")
    bad([{"x": 1}], [{"x": 1, "y": 2}], match="unexpected field")
    bad([1], {"0": 1}, match="array")


def test_flexible_numbers_but_not_bool_or_strings():
    ok(1, 1.0)
    ok(1, Int64(1))
    ok({"n": Int64(3)}, {"n": 3})
    bad(1, 1.5)
    bad(1, True)
    bad(True, 1)
    bad("1", 1)
    bad(None, 0)
    ok(None, None)


def test_type_sensitive_scalars():
    oid = ObjectId()
    ok(oid, oid)
    bad(oid, str(oid))
    ok(Timestamp(1, 2), Timestamp(1, 2))
    bad(Timestamp(1, 2), Timestamp(1, 3))
    ok(Binary(b"ab", 4), Binary(b"ab", 4))
    bad(Binary(b"ab", 4), Binary(b"ab", 0))


# -- special operators ----------------------------------------------------------------------------

def test_exists():
    ok({"a": {"$$exists": True}}, {"a": None})
    bad({"a": {"$$exists": True}}, {}, match="to exist")
    ok({"a": {"$$exists": False}}, {})
    bad({"a": {"$$exists": False}}, {"a": 1}, match="absent")
    # nested document with $$exists: absence also satisfies "no extra keys"
    ok({"d": {"x": 1, "y": {"$$exists": False}}}, {"d": {"x": 1}})
    bad({"d": {"x": 1, "y": {"$$exists": False}}}, {"d": {"x": 1, "y": 2}})


def test_type_aliases_and_lists():
    ok({"a": {"$$type": "int"}}, {"a": 5})
    ok({"a": {"$$type": "long"}}, {"a": Int64(5)})
    bad({"a": {"$$type": "int"}}, {"a": Int64(5)}, match="type")
    ok({"a": {"$$type": ["int", "long"]}}, {"a": Int64(5)})
    for v in (1, Int64(2), 2.5, Decimal128("3.1")):
        ok({"a": {"$$type": "number"}}, {"a": v})
    bad({"a": {"$$type": "number"}}, {"a": "1"})
    ok({"a": {"$$type": "object"}}, {"a": {"b": 1}})
    ok({"a": {"$$type": "array"}}, {"a": [1, "x"]})  # elements are not examined
    ok({"a": {"$$type": "objectId"}}, {"a": ObjectId()})
    ok({"a": {"$$type": "date"}}, {"a": datetime.datetime(2020, 1, 1)})
    ok({"a": {"$$type": "binData"}}, {"a": Binary(uuid.uuid4().bytes, 4)})
    ok({"a": {"$$type": "timestamp"}}, {"a": Timestamp(1, 1)})
    ok({"a": {"$$type": "bool"}}, {"a": False})
    bad({"a": {"$$type": "int"}}, {"a": True})
    ok({"a": {"$$type": "null"}}, {"a": None})
    bad({"a": {"$$type": "string"}}, {}, match="missing")
    assert bson_type(2**40) == "long"


def test_unset_or_matches_keeps_rootness():
    ok({"a": {"$$unsetOrMatches": 1}}, {})
    ok({"a": {"$$unsetOrMatches": 1}}, {"a": 1})
    bad({"a": {"$$unsetOrMatches": 1}}, {"a": 2})
    # whole root result: extra fields still allowed under $$unsetOrMatches
    ok({"$$unsetOrMatches": {"insertedId": 1}}, {"insertedId": 1, "extra": True})
    # nested: no extra fields allowed
    bad({"r": {"$$unsetOrMatches": {"x": 1}}}, {"r": {"x": 1, "y": 2}})
    # combined with $$exists (the resume tests' resumeAfter)
    ok({"resumeAfter": {"$$unsetOrMatches": {"$$exists": True}}}, {})
    ok({"resumeAfter": {"$$unsetOrMatches": {"$$exists": True}}}, {"resumeAfter": {"_data": "82"}})


def test_lte():
    ok({"x": {"$$lte": 2}}, {"x": 2})
    ok({"x": {"$$lte": 2}}, {"x": 1.0})
    ok({"x": {"$$lte": Int64(3)}}, {"x": 3})
    bad({"x": {"$$lte": 1}}, {"x": 1.1})
    bad({"x": {"$$lte": 1}}, {"x": "0"})
    bad({"x": {"$$lte": 1}}, {})


def test_match_as_document_and_root():
    ok({"j": {"$$matchAsDocument": {"x": 1, "y": 2}}}, {"j": '{ "x": 1, "y": 2.0 }'})
    bad({"j": {"$$matchAsDocument": {"x": 1}}}, {"j": '{ "x": 1, "y": 2 }'},
        match="unexpected field")
    ok({"j": {"$$matchAsDocument": {"$$matchAsRoot": {"x": 1}}}}, {"j": '{"x": 1, "y": 2}'})
    ok({"j": {"$$matchAsDocument": {"x": {"$$type": "objectId"}}}},
       {"j": '{"x": {"$oid": "57e193d7a9cc81b4027498b5"}}'})
    bad({"j": {"$$matchAsDocument": {"x": 1}}}, {"j": {"x": 1}}, match="Extended JSON string")
    ok({"x": {"$$matchAsRoot": {"y": 2}}}, {"x": {"y": 2, "z": 3}})
    bad({"x": {"$$matchAsRoot": {"y": 2, "w": 1}}}, {"x": {"y": 2, "z": 3}})


def test_matches_hex_bytes():
    ok({"b": {"$$matchesHexBytes": "12AB"}}, {"b": b"\x12\xab"})
    bad({"b": {"$$matchesHexBytes": "12AC"}}, {"b": b"\x12\xab"})
    with pytest.raises(RunnerError):
        M.match({"b": {"$$matchesHexBytes": "1"}}, {"b": b"\x01"})


def test_unknown_operator_is_a_runner_error():
    with pytest.raises(RunnerError, match="unsupported special operator"):
        M.match({"a": {"$$frobnicate": 1}}, {"a": 1})


def test_matches_entity_and_session_lsid():
    ents = EntityMap()
    oid = ObjectId()
    ents.add("id0", "bson", oid)

    class FakeSession:
        session_id = {"id": Binary(b"0123456789abcdef", 4)}

    ents.add("session0", "session", FakeSession())
    m = Matcher(ents.for_matcher)
    m.match({"_id": {"$$matchesEntity": "id0"}}, {"_id": oid})
    with pytest.raises(MatchError):
        m.match({"_id": {"$$matchesEntity": "id0"}}, {"_id": ObjectId()})
    with pytest.raises(RunnerError, match="not defined"):
        m.match({"_id": {"$$matchesEntity": "nope"}}, {"_id": oid})
    m.match({"lsid": {"$$sessionLsid": "session0"}},
            {"lsid": {"id": Binary(b"0123456789abcdef", 4)}})
    with pytest.raises(MatchError):
        m.match({"lsid": {"$$sessionLsid": "session0"}},
                {"lsid": {"id": Binary(b"fedcba9876543210", 4)}})
    with pytest.raises(RunnerError, match="is a bson"):
        m.match({"lsid": {"$$sessionLsid": "id0"}}, {"lsid": {}})


def test_change_stream_expectation_from_the_spec():
    """The pre/post-image expectation shape, against a realistic event."""
    expected = X('''{"operationType": "update", "ns": {"db": "change-stream-tests", "coll": "test"},
                    "updateDescription": {"$$type": "object"},
                    "fullDocumentBeforeChange": {"$$exists": false}}''')
    event = {"_id": {"_data": "82"}, "operationType": "update", "clusterTime": Timestamp(1, 1),
             "ns": {"db": "change-stream-tests", "coll": "test"}, "documentKey": {"_id": 1},
             "updateDescription": {"updatedFields": {"x": 1}, "removedFields": [],
                                   "truncatedArrays": []}}
    ok(expected, event)
    bad(expected, {**event, "fullDocumentBeforeChange": None}, match="absent")
    bad(expected, {**event, "ns": {"db": "change-stream-tests", "coll": "test", "x": 1}},
        match="unexpected field")
    # disambiguatedPaths: index components must be int32, not strings
    exp2 = X('{"updateDescription": {"updatedFields": {"$$exists": true}, "removedFields":'
             ' {"$$exists": true}, "truncatedArrays": {"$$exists": true},'
             ' "disambiguatedPaths": {"a.0.1": ["a", {"$$type": "int"}, "1"]}}}')
    good = {"updateDescription": {"updatedFields": {"a.0.1": 2}, "removedFields": [],
                                  "truncatedArrays": [],
                                  "disambiguatedPaths": {"a.0.1": ["a", 0, "1"]}}}
    ok(exp2, good)
    wrong = {"updateDescription": {**good["updateDescription"],
                                   "disambiguatedPaths": {"a.0.1": ["a", "0", "1"]}}}
    bad(exp2, wrong, match="type")


# -- runOnRequirements ----------------------------------------------------------------------------

def test_parse_version():
    assert parse_version("4.2") == (4, 2, 0)
    assert parse_version("8") == (8, 0, 0)
    assert parse_version("4.9.0-alpha4-271-g7d5cf02") == (4, 9, 0)
    assert parse_version([8, 0, 4, 0]) == (8, 0, 4)
    assert parse_version("4.0.10") > parse_version("4.0.9") > parse_version("3.6")


def info(topology="sharded", version=(8, 0, 4), **kw):
    return ServerInfo(version=version, topology=topology, **kw)


def test_requirements_versions_topologies_and_reasons():
    assert skip_reason(None, info()) is None
    assert skip_reason([{"minServerVersion": "6.0.0", "topologies": ["replicaset", "sharded"],
                         "serverless": "forbid"}], info()) is None
    r = skip_reason([{"minServerVersion": "8.1.0"}], info())
    assert r == "needs server >= 8.1.0 (server is 8.0.4)"
    r = skip_reason([{"maxServerVersion": "4.2.99"}], info())
    assert r == "needs server <= 4.2.99 (server is 8.0.4)"
    r = skip_reason([{"topologies": ["replicaset"]}], info())
    assert r == "needs topology replicaset (deployment is sharded)"
    # any alternative suffices; all failing → all reasons joined
    reqs = [{"minServerVersion": "6.1.0", "maxServerVersion": "8.1.99"},
            {"minServerVersion": "8.2.1"}]
    assert skip_reason(reqs, info()) is None
    assert skip_reason(reqs, info(version=(8, 2, 0))) == (
        "needs server <= 8.1.99 (server is 8.2.0) or needs server >= 8.2.1 (server is 8.2.0)")


def test_requirements_serverless_auth_csfle_params():
    assert skip_reason([{"serverless": "forbid"}], info()) is None
    assert skip_reason([{"serverless": "require"}], info()) == "needs Atlas Serverless"
    assert skip_reason([{"serverless": "forbid"}], info(serverless=True))
    assert skip_reason([{"auth": True}], info()) == "needs authentication enabled"
    assert skip_reason([{"auth": False}], info()) is None
    assert "encryption" in skip_reason([{"csfle": True}], info())
    assert skip_reason([{"csfle": False}], info()) is None
    params = {"enableTestCommands": True, "x": 1}

    def get(name):
        return params[name]

    i = info(get_parameter=get)
    assert skip_reason([{"serverParameters": {"enableTestCommands": True}}], i) is None
    assert skip_reason([{"serverParameters": {"x": 1.0}}], i) is None  # flexible numerics
    assert "not supported" in skip_reason([{"serverParameters": {"missing": 1}}], i)
    assert "is 1" in skip_reason([{"serverParameters": {"x": 2}}], i)
    # sharded-replicaset needs replica-set shards
    assert skip_reason([{"topologies": ["sharded-replicaset"]}], info()) is None
    assert skip_reason([{"topologies": ["sharded-replicaset"]}],
                       info(shards_are_replica_sets=False))


def test_schema_version_gate():
    check_schema_version("1.0")
    check_schema_version("1.28")
    with pytest.raises(ValueError):
        check_schema_version("1.29")
    with pytest.raises(ValueError):
        check_schema_version("2.0")


# -- entities, events, helpers --------------------------------------------------------------------

def test_entity_map_uniqueness_and_types():
    ents = EntityMap()
    ents.add("client0", "client", object())
    with pytest.raises(RunnerError, match="already defined"):
        ents.add("client0", "client", object())
    with pytest.raises(RunnerError, match="not defined"):
        ents.get("client1")
    with pytest.raises(RunnerError, match="expected session"):
        ents.get("client0", "session")
    assert ents.kind("client0") == "client"


class _Ev:
    def __init__(self, name, command=None):
        self.command_name = name
        self.command = command if command is not None else {name: 1}
        self.reply = {"ok": 1}


def test_command_recorder_filters():
    rec = CommandRecorder(["commandStartedEvent"], ["killCursors"], False)
    for name in ("aggregate", "killCursors", "configureFailPoint", "saslStart", "getMore"):
        rec.started(_Ev(name))
    rec.started(_Ev("hello", {"hello": 1, "speculativeAuthenticate": {}}))
    rec.succeeded(_Ev("aggregate"))  # not observed
    assert [e.event.command_name for e in rec.events] == ["aggregate", "getMore"]
    rec.enabled = False
    rec.started(_Ev("insert"))
    assert len(rec.events) == 2


def test_exact_equal_is_type_sensitive_and_order_insensitive():
    assert exact_equal({"_id": 1, "x": {"a": 1, "b": 2}}, {"x": {"b": 2, "a": 1}, "_id": 1})
    assert not exact_equal({"_id": 1}, {"_id": 1.0})
    assert not exact_equal({"_id": 1}, {"_id": 1, "y": 2})


def test_single_host_uri_and_summary_line():
    assert _single_host_uri("mongodb://a:1,b:2/?w=1") == "mongodb://a:1/?w=1"
    assert _single_host_uri("mongodb://a:1/") == "mongodb://a:1/"
    rs = [Result("f", "a", "passed"), Result("f", "b", "failed"), Result("f", "c", "skipped"),
          Result("f", "d", "passed")]
    assert summary_line(rs) == "2 passed, 1 failed, 1 skipped"


def test_test_files_load_as_extended_json(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"schemaVersion": "1.0", "tests": [], "x": {"$numberLong": "3"},'
                 ' "d": {"$numberDouble": "2.5"}}')
    doc = load_test_file(p)
    assert isinstance(doc["x"], Int64) and doc["d"] == 2.5
