"""What drivers see beyond the spec suites (issue 31), with pymongo against the shared cluster,
through the router and directly on a shard: OP_COMPRESSED with each compressor, ``validate``,
capped collections that evict and tailable/awaitData cursors, exhaust cursors."""

from __future__ import annotations

import uuid
from typing import Iterator

import pymongo
import pytest

from shardsim.core import compression


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["router", "shard"])
def target(request, cluster) -> Iterator[str]:
    """The address of the router or of the first shard (directConnection)."""
    if request.param == "router":
        yield cluster.router_uri
    else:
        yield f"mongodb://{cluster.shards[0].address}/?directConnection=true"


@pytest.mark.parametrize("name,cid", [("zlib", 2), ("snappy", 1), ("zstd", 3)])
def test_compressors_negotiated_and_used(target, name, cid):
    client = pymongo.MongoClient(target, compressors=name, serverSelectionTimeoutMS=10000)
    try:
        coll = client[_name("cmp")]["c"]
        coll.insert_many([{"_id": i, "pad": "x" * 500} for i in range(50)])
        assert sorted(d["_id"] for d in coll.find()) == list(range(50))
        hello = client.admin.command("hello", compression=["lz4", name, "zlib"])
        assert hello["compression"] == [name, "zlib"]
        # The pooled connection negotiated it: pymongo compressed every request after hello.
        pool = next(iter(client._topology._servers.values())).pool  # noqa: SLF001
        conns = list(pool.conns)
        assert conns and all(c.compression_context is not None for c in conns)
        assert {c.compression_context.compressor_id for c in conns} == {cid}
        coll.drop()
    finally:
        client.close()


def test_unsupported_compressor_only_gives_no_compression(target):
    client = pymongo.MongoClient(target, serverSelectionTimeoutMS=10000)
    try:
        hello = client.admin.command("hello", compression=["lz4"])
        assert "compression" not in hello
        assert set(compression.SUPPORTED) == {"snappy", "zlib", "zstd"}
    finally:
        client.close()
