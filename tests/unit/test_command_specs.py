"""Commands declare their properties where they are defined (``CommandFamily.handler(...,
versioned=..., snapshot=..., reads=..., retryable_write=...)``); the old central tables are views
over those declarations, the same on every role that has the command."""

from __future__ import annotations

import asyncio

import pytest

from shardsim.core.commands import CommandFamily, CommandTable, Request
from shardsim.core.errors import MongoError
from shardsim.core.read_concern import parse
from shardsim.router.node import RouterNode
from shardsim.shard.node import ShardNode
from bson.timestamp import Timestamp

VERSIONED = {"insert", "update", "delete", "findAndModify", "find", "count", "distinct", "aggregate",
             "mapReduce"}


@pytest.fixture(scope="module")
def tables():
    router = RouterNode(configdb="127.0.0.1:1")
    shard = ShardNode()
    yield router.commands, shard.commands
    router.config_pool.close()


def test_router_and_shard_declare_the_same_properties(tables):
    router, shard = tables
    for prop in ("versioned", "snapshot", "reads", "retryable_write"):
        assert router.with_property(prop) == shard.with_property(prop), prop
    assert router.with_property("versioned") == VERSIONED
    # Command::supportsReadConcern: snapshot outside a transaction for these three only
    assert router.with_property("snapshot") == {"find", "aggregate", "distinct"}
    assert router.with_property("retryable_write") == {"insert", "update", "delete", "findAndModify"}
    assert shard.with_property("reads") == {"find", "count", "distinct", "aggregate", "mapReduce"}


def test_aliases_and_case_find_the_declaration(tables):
    router, _ = tables
    assert router.spec("findandmodify").versioned and router.spec("findandmodify").retryable_write
    assert not router.spec("noSuchCommand").versioned


def test_a_declaration_reaches_the_table():
    fam = CommandFamily("t")

    @fam.handler("probe", "PROBE", snapshot=True)
    async def probe(node, req):
        return {}

    table = CommandTable()
    table.install(object(), fam)
    assert table.spec("PROBE").snapshot and not table.spec("probe").versioned
    assert asyncio.run(table.lookup("probe")(Request("probe", "d", {"probe": 1}, None))) == {}


def test_snapshot_outside_a_transaction_follows_the_declaration():
    body = {"count": "c", "readConcern": {"level": "snapshot"}}
    with pytest.raises(MongoError) as err:
        parse(body, "count", Timestamp(10, 1), snapshot_ok=False)
    assert err.value.code == 72
    assert parse({"find": "c", "readConcern": {"level": "snapshot"}}, "find", Timestamp(10, 1),
                 snapshot_ok=True).snapshot
