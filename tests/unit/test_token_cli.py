"""``shardsim decode-token`` against the real server vectors (shared/specs, found by the spec
runner's path helper), and ``shardsim tail`` against an in-process cluster."""

from __future__ import annotations

import json
import uuid

import pymongo
import pytest
from click.testing import CliRunner

from shardsim.core import resume_token as rt
from shardsim.testing import ShardedCluster
from shardsim.tools.cli import main
from shardsim.tools.unified.cli import SHARED_SPECS

VECTORS = SHARED_SPECS / "resume-token-vectors.json"


def _vectors() -> list[dict]:
    if not VECTORS.exists():
        pytest.skip(f"resume-token vectors not available at {VECTORS}")
    return json.loads(VECTORS.read_text())["vectors"]


def test_decode_token_json_matches_every_vector() -> None:
    runner = CliRunner()
    for vec in _vectors():
        res = runner.invoke(main, ["decode-token", vec["_data"], "--json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert list(out) == ["clusterTime", "version", "tokenType", "txnOpIndex",
                             "fromInvalidate", "uuid", "eventIdentifier", "fragmentNum"]
        assert out["clusterTime"] == vec["clusterTime"] and out["version"] == 2
        if vec["kind"] == "highWaterMark":
            assert out["tokenType"] == rt.HIGH_WATER_MARK and out["uuid"] is None
            assert out["eventIdentifier"] is None
        else:
            assert out["tokenType"] == rt.EVENT
            assert out["uuid"] == str(uuid.UUID(vec["uuid"]))
            assert out["eventIdentifier"] == vec["eventIdentifier"]
        assert out["txnOpIndex"] == 0 and out["fromInvalidate"] is False
        assert out["fragmentNum"] is None


def test_decode_token_human_form_and_json_document_input() -> None:
    vec = next(v for v in _vectors() if v["kind"] == "event")
    res = CliRunner().invoke(main, ["decode-token", json.dumps({"_data": vec["_data"]})])
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert lines[0] == (f"clusterTime: Timestamp({vec['clusterTime']['t']}, "
                        f"{vec['clusterTime']['i']})")
    assert "tokenType: 128 (event)" in lines and "fragmentNum: -" in lines


def test_decode_token_fragment_and_errors() -> None:
    from bson import Timestamp
    tok = rt.event_token(Timestamp(5, 6), b"\x01" * 16, "update", {"_id": 1}, fragment_num=2,
                         txn_op_index=3)
    res = CliRunner().invoke(main, ["decode-token", tok["_data"], "--json"])
    out = json.loads(res.output)
    assert out["fragmentNum"] == 2 and out["txnOpIndex"] == 3
    bad = CliRunner().invoke(main, ["decode-token", "zz"])
    assert bad.exit_code == 2
    assert "9 FailedToParse: resume token string was not a valid hex string" in bad.output


def test_tail_prints_events_and_their_tokens() -> None:
    with ShardedCluster(shards=3) as kit:
        client = pymongo.MongoClient(kit.uri)
        with client.app.items.watch(max_await_time_ms=50) as stream:
            assert stream.try_next() is None
            start = stream.resume_token
        client.app.items.insert_many([{"_id": 1}, {"_id": 2}])
        client.close()
        res = CliRunner().invoke(main, ["tail", kit.uri, "--ns", "app.items",
                                        "--resume-after", start["_data"], "--max-events", "2"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    events = [json.loads(ln) for ln in lines if ln.startswith("{")]
    assert [e["documentKey"]["_id"] for e in events] == [1, 2]
    tokens = [ln for ln in lines if ln.startswith("  token: ")]
    assert len(tokens) == 2 and all("tokenType=128" in t for t in tokens)
    assert '"operationType": "insert"' in tokens[0]
    assert lines[-1].startswith("last resume token: ")
