"""The runner's own self-tests against one shard: the format's valid-pass examples must pass,
and deliberately wrong expectations must FAIL (a lenient runner would pass them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardsim.tools.unified.cli import SHARED_SPEC_DIR
from shardsim.tools.unified.runner import Runner, TestResult

VALID_PASS = SHARED_SPEC_DIR.parents[2] / "unified-test-format" / "tests" / "valid-pass"
# Every valid-pass example runs ($collStats storage statistics included: shard/coll_stats.py).
OUT_OF_SCOPE: set[str] = set()


def run(uri: str, files: list[Path]) -> list[TestResult]:
    with Runner(uri, iterate_timeout=3.0) as runner:
        return runner.run_paths(files)


@pytest.mark.skipif(not VALID_PASS.is_dir(), reason=f"no valid-pass tests at {VALID_PASS}")
def test_valid_pass_examples(single_shard: str) -> None:
    files = [p for p in sorted(VALID_PASS.glob("*.json")) if p.name not in OUT_OF_SCOPE]
    results = run(single_shard, files)
    failed = [f"{r.name}: {r.reason}" for r in results if r.status == "failed"]
    assert not failed, "\n".join(failed)
    assert sum(r.status == "passed" for r in results) >= 20


def _file(tmp_path: Path, name: str, tests: list[dict], **top) -> Path:
    doc = {
        "description": name, "schemaVersion": "1.7",
        "createEntities": [
            {"client": {"id": "client0", "observeEvents": ["commandStartedEvent"],
                        "ignoreCommandMonitoringEvents": ["killCursors"]}},
            {"database": {"id": "db0", "client": "client0", "databaseName": "selftest"}},
            {"collection": {"id": "coll0", "database": "db0", "collectionName": "c"}},
        ],
        "initialData": [{"databaseName": "selftest", "collectionName": "c", "documents": []}],
        "tests": tests, **top,
    }
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(doc))
    return p


STREAM = {"name": "createChangeStream", "object": "coll0", "arguments": {"pipeline": []},
          "saveResultAsEntity": "cs"}
INSERT = {"name": "insertOne", "object": "coll0", "arguments": {"document": {"_id": 1, "x": 1}}}


def _iter(expect: dict) -> dict:
    return {"name": "iterateUntilDocumentOrError", "object": "cs", "expectResult": expect}


def test_wrong_expectations_fail(single_shard: str, tmp_path: Path) -> None:
    good_event = {"operationType": "insert", "ns": {"db": "selftest", "coll": "c"},
                  "fullDocument": {"_id": 1, "x": 1}, "documentKey": {"_id": 1}}
    tests = [
        {"description": "right", "operations": [STREAM, INSERT, _iter(good_event)],
         "expectEvents": [{"client": "client0", "events": [
             {"commandStartedEvent": {"commandName": "aggregate", "databaseName": "selftest",
                                      "command": {"aggregate": "c",
                                                  "pipeline": [{"$changeStream": {}}]}}},
             {"commandStartedEvent": {"commandName": "insert"}}], "ignoreExtraEvents": True}]},
        {"description": "wrong operationType",
         "operations": [STREAM, INSERT, _iter({**good_event, "operationType": "delete"})]},
        {"description": "extra field in nested doc",
         "operations": [STREAM, INSERT, _iter({**good_event, "fullDocument": {"_id": 1}})]},
        {"description": "field that must be absent",
         "operations": [STREAM, INSERT, _iter({"fullDocument": {"$$exists": False}})]},
        {"description": "int vs string",
         "operations": [STREAM, INSERT, _iter({"documentKey": {"_id": "1"}})]},
        {"description": "expected error but succeeded",
         "operations": [{**INSERT, "expectError": {"isError": True}}]},
        {"description": "wrong error code",
         "operations": [{"name": "runCommand", "object": "db0",
                         "arguments": {"commandName": "noSuchCommand",
                                       "command": {"noSuchCommand": 1}},
                         "expectError": {"errorCode": 1}}]},
        {"description": "extra events not ignored",
         "operations": [INSERT, {**INSERT, "arguments": {"document": {"_id": 2}}}],
         "expectEvents": [{"client": "client0",
                           "events": [{"commandStartedEvent": {"commandName": "insert"}}]}]},
        {"description": "unsupported operation",
         "operations": [{"name": "frobnicate", "object": "coll0"}]},
        {"description": "unsupported argument",
         "operations": [{"name": "insertOne", "object": "coll0",
                         "arguments": {"document": {}, "frob": 1}}]},
        {"description": "needs 99", "runOnRequirements": [{"minServerVersion": "99.0"}],
         "operations": [INSERT]},
    ]
    results = {r.description: r for r in run(single_shard, [_file(tmp_path, "neg", tests)])}
    assert results["right"].status == "passed", results["right"].reason
    assert results["needs 99"].status == "skipped"
    assert results["needs 99"].reason.startswith("needs server >= 99.0")
    for name in ("wrong operationType", "extra field in nested doc", "field that must be absent",
                 "int vs string", "expected error but succeeded", "wrong error code",
                 "extra events not ignored", "unsupported operation", "unsupported argument"):
        assert results[name].status == "failed", (name, results[name])
    assert "unexpected field" in results["extra field in nested doc"].reason
    assert "runner:" in results["unsupported argument"].reason
    assert "expected server error code 1" in results["wrong error code"].reason


def test_cli_table_summary_and_exit_status(single_shard: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shardsim.tools.unified.cli import spec

    good = {"operationType": "insert", "fullDocument": {"_id": 1, "x": 1}}
    path = _file(tmp_path, "cli", [
        {"description": "ok one", "operations": [STREAM, INSERT, _iter(good)]},
        {"description": "bad one", "operations": [STREAM, INSERT,
                                                   _iter({**good, "operationType": "update"})]},
        {"description": "later", "runOnRequirements": [{"topologies": ["sharded"]}],
         "operations": [INSERT]},
    ])
    cli = CliRunner()
    res = cli.invoke(spec, ["--uri", single_shard, "--spec-dir", str(path), "--filter", "one",
                            "-v"])
    lines = res.output.rstrip("\n").splitlines()
    assert res.exit_code == 1, res.output
    assert lines[-1] == "1 passed, 1 failed, 0 skipped"
    assert "actual:" in res.output  # --verbose shows the failure's actual document
    res = cli.invoke(spec, ["--uri", single_shard, "--spec-dir", str(path), "--filter", "ok one"])
    assert res.exit_code == 0, res.output
    assert res.output.rstrip("\n").splitlines()[-1] == "1 passed, 0 failed, 0 skipped"
    res = cli.invoke(spec, ["--uri", single_shard, "--spec-dir", str(path), "--filter", "later"])
    assert res.exit_code == 0
    assert "needs topology sharded (deployment is replicaset)" in res.output
    assert res.output.rstrip("\n").splitlines()[-1] == "0 passed, 0 failed, 1 skipped"


@pytest.mark.parametrize("topology", ["replicaset", "sharded"])
def test_cli_starts_and_stops_its_own_deployment(topology: str, tmp_path: Path) -> None:
    """Without --uri, `shardsim spec` starts the deployment itself and leaves nothing running."""
    from click.testing import CliRunner

    from shardsim.tools.unified.cli import spec

    path = _file(tmp_path, "own", [
        {"description": "insert", "operations": [
            INSERT, {"name": "find", "object": "coll0", "arguments": {"filter": {}},
                     "expectResult": [{"_id": 1, "x": 1}]}]},
        {"description": "topology", "runOnRequirements": [{"topologies": [topology]}],
         "operations": []},
    ])
    res = CliRunner().invoke(spec, ["--topology", topology, "--spec-dir", str(path)])
    assert res.exit_code == 0, res.output
    assert f"topology {topology}" in res.output
    assert res.output.rstrip("\n").splitlines()[-1] == "2 passed, 0 failed, 0 skipped"


def test_with_transaction_callback_errors_reach_with_transaction(single_shard: str,
                                                                  tmp_path: Path) -> None:
    """Unified format, "withTransaction": a callback operation's error propagates to
    withTransaction after its own expectError check (and also under ignoreResultAndError), so
    the driver aborts instead of committing an aborted transaction and retrying for 120 s."""
    session = {"session": {"id": "s0", "client": "client0"}}
    first = {"name": "insertOne", "object": "coll0",
             "arguments": {"session": "s0", "document": {"_id": 1}}}
    dup = {**first, "expectError": {"errorLabelsOmit": ["TransientTransactionError"]}}
    with_txn = {"name": "withTransaction", "object": "s0",
                "arguments": {"callback": [first, dup]},
                "expectError": {"errorContains": "E11000"}}
    ignored = {"name": "withTransaction", "object": "s0",
               "arguments": {"callback": [first, {**first, "ignoreResultAndError": True}]},
               "expectError": {"errorContains": "E11000"}}
    names = {"client": "client0", "events": [
        {"commandStartedEvent": {"commandName": "insert"}},
        {"commandStartedEvent": {"commandName": "insert"}},
        {"commandStartedEvent": {"commandName": "abortTransaction"}}]}
    doc = _file(tmp_path, "withtxn", [
        {"description": "expected error", "operations": [with_txn], "expectEvents": [names],
         "outcome": [{"databaseName": "selftest", "collectionName": "c", "documents": []}]},
        {"description": "ignored error", "operations": [ignored], "expectEvents": [names]},
    ])
    raw = json.loads(doc.read_text())
    raw["createEntities"].append(session)
    raw["schemaVersion"] = "1.9"
    doc.write_text(json.dumps(raw))
    results = {r.description: r for r in run(single_shard, [doc])}
    for name in ("expected error", "ignored error"):
        assert results[name].status == "passed", (name, results[name].reason)
