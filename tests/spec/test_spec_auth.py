"""``shardsim spec --auth``: the runner against an authenticated 2-shard cluster started through
the CLI's own code path (``deployment(..., auth=...)``): official ``auth: true`` tests run (not
skipped) and pass, ``auth: false`` tests are skipped for that reason, and a client entity's own
``uriOptions`` (``authMechanism``) are kept. ~10 s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pymongo
import pytest
from pymongo.errors import OperationFailure

from shardsim.tools.unified.cli import deployment, suite_dir, with_credentials
from shardsim.tools.unified.runner import Runner
from shardsim.tools.unified.uris import _single_host_uri, host_uri, redact_uri

USER, PASSWORD = "spec-root", "p@ss:w/rd"  # needs percent-encoding in the URI


def test_uri_helpers() -> None:
    uri = with_credentials("mongodb://127.0.0.1:1,127.0.0.1:2/", USER, PASSWORD)
    assert uri == "mongodb://spec-root:p%40ss%3Aw%2Frd@127.0.0.1:1,127.0.0.1:2/?authSource=admin"
    assert with_credentials("mongodb://h:1/?directConnection=true", "u", "p") == \
        "mongodb://u:p@h:1/?directConnection=true&authSource=admin"
    assert _single_host_uri(uri) == \
        "mongodb://spec-root:p%40ss%3Aw%2Frd@127.0.0.1:1/?authSource=admin"
    assert host_uri(uri, ("::1", 3)) == "mongodb://spec-root:p%40ss%3Aw%2Frd@[::1]:3/?authSource=admin"
    assert redact_uri(uri) == "mongodb://spec-root:***@127.0.0.1:1,127.0.0.1:2/?authSource=admin"
    assert redact_uri("mongodb://h:1/") == "mongodb://h:1/"


@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[str]:
    with deployment("sharded", None, 2, mongoses=2, auth=(USER, PASSWORD)) as uri:
        yield uri


def _handshake_files() -> list[Path]:
    try:
        return [suite_dir("retryable-writes") / "handshakeError.json",
                suite_dir("retryable-reads") / "handshakeError.json"]
    except Exception:  # click.ClickException: suites not available
        return []


def _own_file(tmp_path: Path) -> Path:
    status = {"name": "runCommand", "object": "db0",
              "arguments": {"commandName": "connectionStatus", "command": {"connectionStatus": 1}},
              "expectResult": {"authInfo": {
                  "authenticatedUsers": [{"user": USER, "db": "admin"}],
                  "authenticatedUserRoles": [{"role": "root", "db": "admin"}]}}}
    doc = {
        "description": "spec-auth", "schemaVersion": "1.4",
        "createEntities": [
            {"client": {"id": "client0", "uriOptions": {"authMechanism": "SCRAM-SHA-1"},
                        "observeEvents": ["commandStartedEvent"]}},
            {"database": {"id": "db0", "client": "client0", "databaseName": "specauth"}}],
        "tests": [
            {"description": "SCRAM-SHA-1 from the test's uriOptions",
             "runOnRequirements": [{"auth": True, "authMechanism": "SCRAM-SHA-1"}],
             "operations": [status],
             "expectEvents": [{"client": "client0", "events": [
                 {"commandStartedEvent": {"commandName": "connectionStatus"}}]}]},
            {"description": "needs no auth", "runOnRequirements": [{"auth": False}],
             "operations": [status]}],
    }
    p = tmp_path / "spec-auth.json"
    p.write_text(json.dumps(doc))
    return p


def test_auth_cluster_runs_auth_tests(auth_cluster: str, tmp_path: Path) -> None:
    # authentication is really on: no credentials, no command
    hosts = auth_cluster.split("@", 1)[1].split("/", 1)[0]
    anon = pymongo.MongoClient(f"mongodb://{hosts}/", serverSelectionTimeoutMS=5000)
    try:
        with pytest.raises(OperationFailure) as info:
            anon.admin.command("listDatabases")
        assert info.value.code == 13
    finally:
        anon.close()
    with Runner(auth_cluster, iterate_timeout=3.0) as runner:
        assert runner.info.auth and runner.info.topology == "sharded"
        assert {"SCRAM-SHA-1", "SCRAM-SHA-256"} <= set(runner.info.auth_mechanisms)
        own = {r.description: r for r in runner.run_paths([_own_file(tmp_path)])}
        official = runner.run_paths(_handshake_files(), "insertOne succeeds")
        official += runner.run_paths(_handshake_files(), "database.aggregate")
    ok = own["SCRAM-SHA-1 from the test's uriOptions"]
    assert ok.status == "passed", ok.reason
    assert own["needs no auth"].status == "skipped"
    assert own["needs no auth"].reason == "needs authentication disabled"
    if not _handshake_files():
        pytest.skip("official suites not available (run `make fetch-specs`)")
    # handshakeError files need `auth: true`: fail points on saslContinue during the handshake
    assert len(official) == 4, [r.name for r in official]
    bad = [f"{r.name}: {r.status} {r.reason}" for r in official if r.status != "passed"]
    assert not bad, "\n".join(bad)
