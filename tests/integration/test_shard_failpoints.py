"""``configureFailPoint`` on a real ``python -m shardsim.shard`` process through pymongo: failCommand
errors/labels, pymongo resuming a change stream after failGetMoreAfterCursorCheckout and after
a closed connection, and CommandNotFound with ``--no-test-commands``."""

from __future__ import annotations

import time

import pymongo
import pytest
from pymongo.errors import OperationFailure


def _next(stream, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = stream.try_next()
        if doc is not None:
            return doc
    raise AssertionError("no change event within %.0f s" % timeout)


def test_fail_command_on_a_shard(shard_process, shard_client):
    client = shard_client(shard_process("fp0"))
    admin = client.admin
    reply = admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                           "data": {"failCommands": ["insert"], "errorCode": 2,
                                    "errorLabels": ["RetryableWriteError"]}})
    assert reply["ok"] == 1.0 and reply["count"] == 0
    coll = client.db.coll
    with pytest.raises(OperationFailure) as ei:
        client.db.command({"insert": "coll", "documents": [{"_id": 1}]})
    assert ei.value.code == 2
    assert ei.value.details["errmsg"] == "Failing command via 'failCommand' failpoint"
    assert ei.value.details["errorLabels"] == ["RetryableWriteError"]
    coll.insert_one({"_id": 2})  # times: 1 used up
    assert coll.count_documents({}) == 1

    # Without errorLabels a change-stream getMore gets no ResumableChangeStreamError, so pymongo
    # does not resume (spec "change stream does not resume if error does not contain ...").
    admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                   "data": {"failCommands": ["getMore"], "errorCode": 6}})
    with coll.watch(max_await_time_ms=100) as stream:
        coll.insert_one({"_id": 3})
        with pytest.raises(OperationFailure) as ei:
            _next(stream)
        assert ei.value.code == 6 and "errorLabels" not in ei.value.details
    assert admin.command({"configureFailPoint": "failCommand", "mode": "off"})["count"] == 1


def test_pymongo_resumes_after_shard_fail_points(shard_process, shard_client):
    client = shard_client(shard_process("fp1"))
    coll = client.db.coll

    with coll.watch(max_await_time_ms=100) as stream:
        coll.insert_one({"_id": "a"})
        assert _next(stream)["fullDocument"]["_id"] == "a"
        client.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout",
                              "mode": {"times": 1}, "data": {"errorCode": 10107}})
        coll.insert_one({"_id": "b"})
        assert _next(stream)["fullDocument"]["_id"] == "b"  # resumed: the label was there
        client.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 2},
                              "data": {"failCommands": ["getMore"], "closeConnection": True}})
        coll.insert_one({"_id": "c"})
        assert _next(stream)["fullDocument"]["_id"] == "c"  # resumed after network errors
    count = client.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout",
                                  "mode": "off"})["count"]
    assert count == 1


def test_no_test_commands_shard_has_no_configure_fail_point(shard_process, shard_client):
    client = shard_client(shard_process("fp2", None, "--no-test-commands"))
    with pytest.raises(OperationFailure) as ei:
        client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
    assert ei.value.code == 59
    assert client.admin.command("ping")["ok"] == 1.0
    assert isinstance(client, pymongo.MongoClient)


@pytest.mark.parametrize("module,args", [
    ("shard", ["--shard-name", "fp3"]),
    ("configsvr", []),
    ("router", ["--configdb", "127.0.0.1:1"]),
])
def test_processes_have_no_test_commands_by_default(module, args):
    """enableTestCommands is off unless asked for (mongod/mongos); the flag and mongod's
    --setParameter spelling turn it on."""
    from shardsim.tools.procs import RoleProcess
    for extra, on in (([], False), (["--enable-test-commands"], True),
                      (["--setParameter", "enableTestCommands=1"], True)):
        proc = RoleProcess(module, ["--port", "0", *args, *extra], name=f"{module}-tc")
        try:
            proc.start()
            client = pymongo.MongoClient(
                f"mongodb://{proc.address}/?directConnection=true", serverSelectionTimeoutMS=5000)
            params = client.admin.command("getParameter", 1, enableTestCommands=1)
            assert params["enableTestCommands"] is on
            if on:
                assert client.admin.command({"configureFailPoint": "failCommand",
                                             "mode": "off"})["ok"] == 1.0
            else:
                with pytest.raises(OperationFailure) as ei:
                    client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
                assert ei.value.code == 59
            client.close()
        finally:
            proc.stop()
