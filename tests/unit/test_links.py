"""``_shardsimCutLinks`` (shardsim/core/links.py): the links a test cut in one process, the
command's shape and errors, and outbound connections to a cut host refused or closed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shardsim.core import links
from shardsim.core.client import Connection
from shardsim.core.commands import ConnectionInfo, Request
from shardsim.core.errors import MongoError


@pytest.fixture(autouse=True)
def _healed() -> Any:
    links.LINKS.heal()
    yield
    links.LINKS.heal()


def _request(body: dict[str, Any]) -> Request:
    return Request(links.COMMAND, "admin", {**body, "$db": "admin"}, ConnectionInfo(id=1))


class _Node:
    repl = None


def _run(body: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(links.cut_links(_Node(), _request(body)))


def test_cut_and_heal_answer_the_hosts_cut_now() -> None:
    assert _run({links.COMMAND: "cut", "hosts": ["LOCALHOST:2", "127.0.0.1:1"]}) == \
        {"cut": ["127.0.0.1:1", "127.0.0.1:2"]}
    assert links.LINKS.is_cut("localhost:1") and not links.LINKS.is_cut("127.0.0.1:3")
    assert _run({links.COMMAND: "heal", "hosts": ["127.0.0.1:1"]}) == {"cut": ["127.0.0.1:2"]}
    assert _run({links.COMMAND: "heal"}) == {"cut": []}


@pytest.mark.parametrize("body, code", [
    ({links.COMMAND: "drop", "hosts": ["h:1"]}, 2),
    ({links.COMMAND: "cut"}, 2),
    ({links.COMMAND: "cut", "hosts": "h:1"}, 14),
    ({links.COMMAND: "cut", "hosts": ["nohost"]}, 14),
])
def test_bad_requests(body: dict[str, Any], code: int) -> None:
    with pytest.raises(MongoError) as info:
        _run(body)
    assert info.value.code == code


def test_a_cut_host_is_not_connected_to_and_open_connections_are_closed() -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            conn = Connection("127.0.0.1", port)
            await conn.connect()
            assert not conn.broken
            links.LINKS.cut_hosts([f"127.0.0.1:{port}"])
            assert conn.broken                       # closed at the cut
            with pytest.raises(MongoError) as info:
                await Connection("127.0.0.1", port).connect()
            assert info.value.code == 6 and links.CUT_REASON in str(info.value)
            links.LINKS.heal()
            again = Connection("127.0.0.1", port)
            await again.connect()                    # healed: connects again
            again.close()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(main())
