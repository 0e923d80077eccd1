"""Oplog size settings validated as mongod does (issue 17, item 5): ``replSetResizeOplog`` and
``setParameter`` with a bad ``oplogSizeMB`` get mongod's errors (IDL ``ReplSetResizeOplogRequest``
in ``resize_oplog.cpp``: 14 for a non-number, 51024 outside 990 .. 1073741824) and never cut the
history; ``--oplog-size-mb`` works for the config server too."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

from shardsim.tools.procs import RoleProcess


def test_bad_oplog_sizes_are_refused_and_history_is_kept(shard_process, shard_client):
    client = shard_client(shard_process("sizes"))
    client.app.c.insert_many([{"_id": i, "pad": "x" * 100} for i in range(200)])
    oplog = client.local["oplog.rs"]
    before = oplog.count_documents({})
    cases = [(0, 51024, "value must be >= 990, actual value '0'"),
             (-1, 51024, "actual value '-1'"), (0.5, 51024, "actual value '0.5'"),
             (2 * 1073741824, 51024, "value must be <= 1073741824"),
             ("x", 14, "is the wrong type 'string'"), (True, 14, "'bool'")]
    for value, code, text in cases:
        with pytest.raises(OperationFailure) as err:
            client.admin.command({"setParameter": 1, "oplogSizeMB": value})
        assert err.value.code == code and text in str(err.value), (value, err.value)
        assert "setParameter.oplogSizeMB" in str(err.value)
        with pytest.raises(OperationFailure) as err:
            client.admin.command({"replSetResizeOplog": 1, "size": value})
        assert err.value.code == code and "replSetResizeOplog.size" in str(err.value)
    with pytest.raises(OperationFailure) as err:
        client.admin.command({"replSetResizeOplog": 1, "minRetentionHours": -1})
    assert err.value.code == 51024
    with pytest.raises(OperationFailure) as err:
        client.admin.command({"setParameter": 1, "oplogMinRetentionHours": "x"})
    assert err.value.code == 14
    assert oplog.count_documents({}) >= before  # no history was cut
    assert client.admin.command({"replSetResizeOplog": 1, "size": 2048.5})["ok"] == 1
    assert client.admin.command({"getParameter": 1, "oplogSizeMB": 1})["oplogSizeMB"] == 2048
    client.admin.command({"setParameter": 1, "oplogSizeMB": 990})
    assert client.admin.command({"getParameter": 1, "oplogSizeMB": 1})["oplogSizeMB"] == 990
    assert oplog.count_documents({}) >= before


def test_config_server_takes_oplog_size_mb(shard_client):
    proc = RoleProcess("configsvr", ["--port", "0", "--oplog-size-mb", "1500"], name="cfg")
    proc.start()
    try:
        client = shard_client(proc)
        assert client.admin.command({"getParameter": 1, "oplogSizeMB": 1})["oplogSizeMB"] == 1500
    finally:
        proc.stop()
    bad = RoleProcess("configsvr", ["--port", "0", "--oplog-size-mb", "0"], name="cfg0")
    with pytest.raises(RuntimeError):
        bad.start()
