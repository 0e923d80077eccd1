"""Fixtures for the spec-runner tests: one shard process as a one-member replica set."""

from __future__ import annotations

from typing import Iterator

import pytest

from shardsim.tools.procs import RoleProcess


@pytest.fixture(scope="module")
def single_shard() -> Iterator[str]:
    """URI of one ``python -m shardsim.shard --enable-test-commands`` process (directConnection; the
    spec tests set fail points); always stopped."""
    shard = RoleProcess("shard", ["--port", "0", "--shard-name", "rs0", "--enable-test-commands"],
                        name="shard rs0")
    shard.start()
    try:
        yield f"mongodb://{shard.host}:{shard.port}/?directConnection=true"
    finally:
        shard.stop()
