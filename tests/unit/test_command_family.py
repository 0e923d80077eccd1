"""CommandFamily / CommandTable.install: module-level handlers bound to a node."""

import asyncio

import pytest

from shardsim.core.commands import CommandFamily, CommandTable, ConnectionInfo, Request
from shardsim.core.errors import MongoError


def _req(name: str) -> Request:
    return Request(name=name, db="admin", body={name: 1}, conn=ConnectionInfo(id=1))


def test_install_binds_node_and_aliases():
    family = CommandFamily("demo")

    @family.handler("findAndModify", "findandmodify")
    async def find_and_modify(node, req):
        return {"node": node, "cmd": req.name}

    table = CommandTable()
    table.install("the-node", family)
    reply = asyncio.run(table.lookup("findandmodify")(_req("findandmodify")))
    assert reply == {"node": "the-node", "cmd": "findandmodify"}
    assert table.canonical("findandmodify") == "findAndModify"
    # the module-level function is unchanged and callable alone
    assert asyncio.run(find_and_modify(1, _req("x"))) == {"node": 1, "cmd": "x"}


def test_later_family_overrides_earlier():
    common, role = CommandFamily("common"), CommandFamily("role")

    @common.handler("ping")
    async def ping_common(node, req):
        return {"who": "common"}

    @role.handler("ping")
    async def ping_role(node, req):
        return {"who": "role"}

    table = CommandTable()
    table.install(None, common, role)
    assert asyncio.run(table.lookup("ping")(_req("ping"))) == {"who": "role"}
    with pytest.raises(MongoError) as err:
        table.lookup("nosuch")
    assert err.value.code == 59
