"""Reusable fixtures for tests that start real role processes on free loopback ports.

``shard_process(name="shard0", dbpath=None, *extra_args)`` starts ``python -m shardsim.shard
--enable-test-commands`` (fail points; ``--no-test-commands`` in ``extra_args`` wins) and
returns its :class:`shardsim.tools.procs.RoleProcess` (``.address``, ``.port``); every process started
through the factory is stopped when the test ends, pass or fail. ``shard`` is one ready
in-memory shard; ``shard_client(proc)`` gives a ``directConnection`` pymongo client that is
closed at the end.
"""

from __future__ import annotations

from typing import Callable, Iterator

import pymongo
import pytest

from shardsim.tools.procs import RoleProcess


@pytest.fixture
def shard_process() -> Iterator[Callable[..., RoleProcess]]:
    """Factory: ``shard_process(name="shard0", dbpath=None, *extra)`` -> started RoleProcess."""
    started: list[RoleProcess] = []

    def start(name: str = "shard0", dbpath: str | None = None, *extra: str) -> RoleProcess:
        args = ["--port", "0", "--shard-name", name, "--enable-test-commands"]
        if dbpath:
            args += ["--dbpath", str(dbpath)]
        args += list(extra)
        proc = RoleProcess("shard", args, name=name)
        started.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()


@pytest.fixture
def shard_client() -> Iterator[Callable[[RoleProcess], pymongo.MongoClient]]:
    """Factory: a pymongo client with ``directConnection=true`` to a started process."""
    clients: list[pymongo.MongoClient] = []

    def connect(proc: RoleProcess, **kwargs) -> pymongo.MongoClient:
        client = pymongo.MongoClient(f"mongodb://{proc.address}/?directConnection=true",
                                     serverSelectionTimeoutMS=5000, **kwargs)
        clients.append(client)
        return client

    try:
        yield connect
    finally:
        for client in clients:
            client.close()


@pytest.fixture
def shard(shard_process) -> RoleProcess:
    """One in-memory shard named ``shard0``."""
    return shard_process("shard0")
