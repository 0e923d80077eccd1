"""Every node the change-stream machinery runs on has the whole ChangeStreamHost protocol: the
shard, the config server and the one test fake (so production code reads attributes directly,
never ``getattr(node, ..., None)``)."""

from __future__ import annotations

import typing

import pytest

from shardsim.configsvr.node import ConfigServerNode
from shardsim.shard.change_stream.host import ChangeStreamHost
from shardsim.shard.node import ShardNode
from support.fakes import FakeShardNode

ATTRIBUTES = list(typing.get_type_hints(ChangeStreamHost))
METHODS = ["find_document", "write_noop", "parameters"]


@pytest.mark.parametrize("make", [ShardNode, ConfigServerNode, FakeShardNode],
                         ids=["shard", "configsvr", "fake"])
def test_every_host_has_the_protocol(make):
    node = make()
    missing = [a for a in ATTRIBUTES + METHODS if not hasattr(node, a)]
    assert not missing
    assert all(callable(getattr(node, m)) for m in METHODS)


def test_the_protocol_names_what_the_stages_read():
    assert {"oplog", "pre_images", "clock", "cs_promise_faults", "sharding", "profile"} <= set(ATTRIBUTES)
