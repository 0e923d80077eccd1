"""shardsim/failpoints.py on an in-process Node: modes, predicates, error labels (no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from bson.int64 import Int64

from shardsim.core import failpoints
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.cursors import Batch, Cursor
from shardsim.core.errors import MongoError
from shardsim.core.failpoints import FailPoint
from shardsim.core.node import Node

CLIENT = ConnectionInfo(id=7, peer="127.0.0.1:1", app_name="app-a")
OTHER_APP = ConnectionInfo(id=8, peer="127.0.0.1:2", app_name="app-b")
LOCAL = ConnectionInfo(id=0, peer="internal")


class StreamCursor(Cursor):
    """An endless cursor; ``is_change_stream`` as a change-stream cursor sets it."""

    await_data = True
    tailable = True

    def __init__(self, ns: str, change_stream: bool) -> None:
        super().__init__(ns)
        self.is_change_stream = change_stream
        self.fetches = 0

    async def fetch(self, batch_size: int | None, max_time_ms: int | None, *, first: bool) -> Batch:
        self.fetches += 1
        return Batch([{"n": self.fetches}], False, None, {})


def make_node(test_commands: bool = True) -> Node:
    node = Node(test_commands=test_commands)

    async def insert(req: Request) -> dict[str, Any]:
        return {"n": 1}

    async def aggregate(req: Request) -> dict[str, Any]:
        return {"cursor": {"firstBatch": [], "id": Int64(0), "ns": f"{req.db}.{req.arg}"}}

    node.commands.register("insert", insert)
    node.commands.register("aggregate", aggregate)
    failpoints.install(node)
    return node


def run(node: Node, name: str, body: dict[str, Any] | None = None, *, db: str = "db",
        conn: ConnectionInfo = CLIENT) -> dict[str, Any]:
    body = dict(body or {})
    body.setdefault(name, 1)
    body.setdefault("$db", db)
    return asyncio.run(node.run_command(Request(name, db, body, conn)))


def configure(node: Node, name: str, mode: Any, data: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"configureFailPoint": name, "mode": mode}
    if data is not None:
        body["data"] = data
    return run(node, "configureFailPoint", body, db="admin")


def open_cursor(node: Node, change_stream: bool = True, ns: str = "db.coll") -> Int64:
    return Int64(node.cursors.register(StreamCursor(ns, change_stream)))


def get_more(node: Node, cid: int, coll: str = "coll", conn: ConnectionInfo = CLIENT) -> dict[str, Any]:
    return run(node, "getMore", {"getMore": Int64(cid), "collection": coll, "maxTimeMS": 10}, conn=conn)


# -- modes -----------------------------------------------------------------------------------
def test_times_skip_and_off_modes():
    fp = FailPoint("x")
    assert fp.configure({"times": 2}, {}) == 0
    assert [fp.should_fail() for _ in range(3)] == [True, True, False]
    assert fp.mode == "off"
    assert fp.configure({"skip": 2}, None) == 2  # previous entry count
    assert [fp.should_fail() for _ in range(4)] == [False, False, True, True]
    fp.configure("alwaysOn", {})
    assert all(fp.should_fail() for _ in range(5))
    fp.configure({"times": 0}, {})
    assert not fp.should_fail()
    fp.configure({"activationProbability": 0.0}, {})
    assert not any(fp.should_fail() for _ in range(20))


@pytest.mark.parametrize("mode,data,code", [
    ("sometimes", None, 2), ({"times": -1}, None, 2), ({"times": "1"}, None, 14),
    ({"activationProbability": 2}, None, 2), ({"nth": 1}, None, 2), (3, None, 2),
    ("alwaysOn", [1], 14),
])
def test_bad_modes(mode, data, code):
    with pytest.raises(MongoError) as ei:
        FailPoint("x").configure(mode, data)
    assert ei.value.code == code


def test_configure_command_replies_count_and_rejects_unknown():
    node = make_node()
    assert configure(node, "failCommand", {"times": 1},
                     {"failCommands": ["ping"], "errorCode": 2})["count"] == 0
    assert run(node, "ping")["code"] == 2
    reply = configure(node, "failCommand", "off")
    assert reply["ok"] == 1.0 and reply["count"] == 1 and isinstance(reply["count"], Int64)
    assert configure(node, "noSuchFailPoint", "off")["code"] == 2
    assert run(node, "configureFailPoint", {"configureFailPoint": "failCommand"})["errmsg"] == \
        "Missing mode argument"
    assert run(node, "configureFailPoint", {"configureFailPoint": 1, "mode": "off"})["code"] == 14


def test_no_test_commands_means_command_not_found():
    node = make_node(test_commands=False)
    reply = configure(node, "failCommand", "alwaysOn", {"failCommands": ["ping"], "errorCode": 2})
    assert reply["code"] == 59 and reply["codeName"] == "CommandNotFound"
    assert run(node, "ping")["ok"] == 1.0


# -- failCommand: which commands -------------------------------------------------------------
def test_fail_command_predicates():
    node = make_node()
    configure(node, "failCommand", "alwaysOn", {"failCommands": ["ismaster", "ping"], "errorCode": 11600})
    reply = run(node, "ping")
    assert (reply["ok"], reply["code"], reply["codeName"], reply["errmsg"]) == \
        (0.0, 11600, "InterruptedAtShutdown", "Failing command via 'failCommand' failpoint")
    assert "operationTime" in reply and "$clusterTime" in reply
    assert run(node, "hello")["code"] == 11600  # any alias of a listed command
    assert run(node, "buildInfo")["ok"] == 1.0  # not listed
    assert run(node, "ping", conn=LOCAL)["ok"] == 1.0  # the node's own requests
    assert configure(node, "failCommand", "off")["ok"] == 1.0  # never fails itself

    configure(node, "failCommand", "alwaysOn", {"failCommands": ["ping"], "errorCode": 2, "appName": "app-b"})
    assert run(node, "ping")["ok"] == 1.0
    assert run(node, "ping", conn=OTHER_APP)["code"] == 2

    configure(node, "failCommand", "alwaysOn", {"failCommands": ["insert"], "errorCode": 2,
                                                "namespace": "db.other"})
    assert run(node, "insert", {"insert": "coll"})["ok"] == 1.0
    assert run(node, "insert", {"insert": "other"})["code"] == 2

    configure(node, "failCommand", "alwaysOn", {"failCommands": ["noSuchCommand"], "errorCode": 3})
    assert run(node, "noSuchCommand")["code"] == 59  # CommandNotFound comes first

    configure(node, "failCommand", "alwaysOn", {"failAllCommands": True, "errorCode": 3})
    assert run(node, "buildInfo")["code"] == 3
    configure(node, "failCommand", "alwaysOn", {"failCommands": ["ping"], "errorCode": 3,
                                                "failLocalClients": True})
    assert run(node, "ping", conn=LOCAL)["code"] == 3


def test_times_only_used_by_matching_commands():
    node = make_node()
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["insert"], "errorCode": 2})
    for _ in range(3):
        assert run(node, "ping")["ok"] == 1.0
    assert run(node, "insert", {"insert": "c"})["code"] == 2
    assert run(node, "insert", {"insert": "c"})["ok"] == 1.0


def test_data_without_an_action_never_fires():
    node = make_node()
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["ping"]})
    assert run(node, "ping")["ok"] == 1.0
    assert node.failpoints.points["failCommand"].entered == 0


def test_block_connection_and_close_connection():
    node = make_node()
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["ping"], "blockConnection": True})
    reply = run(node, "ping")
    assert reply["code"] == 72 and "blockTimeMS" in reply["errmsg"]
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["ping"], "blockConnection": True,
                                                  "blockTimeMS": 1})
    assert run(node, "ping")["ok"] == 1.0
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["ping"], "closeConnection": True})
    with pytest.raises(ConnectionError):
        run(node, "ping")
    assert run(node, "ping")["ok"] == 1.0


def test_write_concern_error_is_attached_to_the_reply():
    node = make_node()
    wce = {"code": 91, "errmsg": "Replication is being shut down"}
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["insert"], "writeConcernError": wce,
                                                  "errorLabels": ["RetryableWriteError"]})
    reply = run(node, "insert", {"insert": "c"})
    assert reply["ok"] == 1.0 and reply["n"] == 1 and reply["writeConcernError"] == wce
    assert reply["errorLabels"] == ["RetryableWriteError"]
    assert "writeConcernError" not in run(node, "insert", {"insert": "c"})


# -- failCommand: error labels (error_labels.cpp getErrorLabels) ------------------------------
def test_given_labels_are_exactly_the_reply_labels():
    node = make_node()
    cid = open_cursor(node)
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["getMore"], "errorCode": 50,
                                                  "errorLabels": ["ResumableChangeStreamError"]})
    reply = get_more(node, cid)
    assert reply["code"] == 50 and reply["errorLabels"] == ["ResumableChangeStreamError"]
    # the cursor survives a failCommand error (the failpoint fires before the cursor is checked out)
    assert get_more(node, cid)["ok"] == 1.0
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["getMore"], "errorCode": 280,
                                                  "errorLabels": []})
    reply = get_more(node, cid)
    assert reply["code"] == 280 and "errorLabels" not in reply  # [] suppresses computed labels


def test_computed_labels_without_error_labels():
    node = make_node()
    cid = open_cursor(node)
    # A resumable code on a change-stream getMore: no ResumableChangeStreamError, the cursor's
    # originating command is unknown when failCommand fires.
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["getMore"], "errorCode": 6})
    reply = get_more(node, cid)
    assert reply["code"] == 6 and "errorLabels" not in reply
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["getMore"], "errorCode": 286})
    assert get_more(node, cid)["errorLabels"] == ["NonResumableChangeStreamError"]
    # The aggregate opening a change stream is known: it gets the label.
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["aggregate"], "errorCode": 91})
    reply = run(node, "aggregate", {"aggregate": "coll", "pipeline": [{"$changeStream": {}}], "cursor": {}})
    assert reply["code"] == 91 and reply["errorLabels"] == ["ResumableChangeStreamError"]
    configure(node, "failCommand", {"times": 1}, {"failCommands": ["aggregate"], "errorCode": 91})
    reply = run(node, "aggregate", {"aggregate": "coll", "pipeline": [], "cursor": {}})
    assert reply["code"] == 91 and "errorLabels" not in reply


# -- failGetMoreAfterCursorCheckout ------------------------------------------------------------
def test_fail_get_more_after_cursor_checkout():
    node = make_node()
    cid = open_cursor(node)
    configure(node, "failGetMoreAfterCursorCheckout", {"times": 1}, {"errorCode": 10107})
    reply = get_more(node, cid)
    assert reply["code"] == 10107 and reply["errmsg"] == "Hit the 'failGetMoreAfterCursorCheckout' failpoint"
    assert reply["errorLabels"] == ["ResumableChangeStreamError"]
    assert get_more(node, cid)["code"] == 43  # the failed getMore killed the cursor

    plain = open_cursor(node, change_stream=False)
    configure(node, "failGetMoreAfterCursorCheckout", {"times": 1}, {})
    reply = get_more(node, plain)
    assert reply["code"] == 1 and "errorLabels" not in reply  # InternalError by default

    cid = open_cursor(node)
    configure(node, "failGetMoreAfterCursorCheckout", {"times": 1}, {"errorCode": 91})
    assert get_more(node, Int64(424242))["code"] == 43  # unknown cursor: no activation
    assert get_more(node, cid, coll="other")["code"] == 13  # wrong namespace: no activation
    assert node.failpoints.points["failGetMoreAfterCursorCheckout"].entered == 0
    configure(node, "failGetMoreAfterCursorCheckout", {"times": 1}, {"errorCode": 91, "appName": "app-b"})
    cid = open_cursor(node)
    assert get_more(node, cid)["ok"] == 1.0  # other application
    assert get_more(node, cid, conn=OTHER_APP)["code"] == 91


def test_fail_get_more_on_a_database_stream_cursor():
    node = make_node()
    cid = open_cursor(node, ns="db.$cmd.aggregate")
    configure(node, "failGetMoreAfterCursorCheckout", {"times": 1}, {"errorCode": 6})
    reply = get_more(node, cid, coll="$cmd.aggregate")
    assert reply["code"] == 6 and reply["errorLabels"] == ["ResumableChangeStreamError"]
