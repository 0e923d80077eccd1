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


# -- validate ----------------------------------------------------------------------------------
_VALIDATE_KEYS = ["ns", "uuid", "nInvalidDocuments", "nNonCompliantDocuments", "nrecords",
                  "nIndexes", "keysPerIndex", "indexDetails", "valid", "repaired", "warnings",
                  "errors", "extraIndexEntries", "missingIndexEntries", "corruptRecords", "ok"]


def _fill(coll) -> None:
    coll.insert_many([{"_id": 1, "tags": ["a", "b"]}, {"_id": 2, "tags": "c", "u": 1},
                      {"_id": 3}])
    coll.create_index("tags")
    coll.create_index("u", unique=True, sparse=True)


def test_validate_on_a_shard(first_shard_client):
    db = first_shard_client[_name("val")]
    _fill(db.c)
    res = db.command("validate", "c")
    assert [k for k in res if not k.startswith("$") and k != "operationTime"] == _VALIDATE_KEYS
    assert res["ns"] == f"{db.name}.c" and res["valid"] is True and res["errors"] == []
    assert res["nrecords"] == 3 and res["nIndexes"] == 3
    assert res["keysPerIndex"] == {"_id_": 3, "tags_1": 4, "u_1": 1}
    assert res["indexDetails"] == {n: {"valid": True} for n in ("_id_", "tags_1", "u_1")}
    assert db.command("validate", "c", full=True)["valid"] is True
    assert "readTimestamp" in db.command("validate", "c", background=True)
    with pytest.raises(pymongo.errors.OperationFailure) as exc:
        db.command("validate", "c", full=True, background=True)
    assert exc.value.code == 72
    with pytest.raises(pymongo.errors.OperationFailure) as exc:
        db.command("validate", "missing")
    assert exc.value.code == 26
    assert exc.value.details["errmsg"] == f"Collection '{db.name}.missing' does not exist to validate."
    first_shard_client.drop_database(db.name)


def test_validate_through_the_router(router_client):
    name = _name("valr")
    db = router_client[name]
    _fill(db.c)
    res = db.command("validate", "c")  # unsharded: the primary shard's reply, then raw
    assert res["valid"] is True and res["nrecords"] == 3 and list(res)[:2] == ["ns", "uuid"]
    [(shard, raw)] = res["raw"].items()
    assert raw["keysPerIndex"] == {"_id_": 3, "tags_1": 4, "u_1": 1} and raw["ok"] == 1
    router_client.admin.command("enableSharding", name)
    router_client.admin.command("shardCollection", f"{name}.s", key={"_id": 1})
    router_client.admin.command("split", f"{name}.s", middle={"_id": 10})
    other = next(s["_id"] for s in router_client.admin.command("listShards")["shards"]
                 if s["_id"] != shard)
    router_client.admin.command("moveChunk", f"{name}.s", find={"_id": 10}, to=other)
    db.s.insert_many([{"_id": i} for i in (1, 2, 11)])
    res = db.command("validate", "s")
    assert res["valid"] is True and "nrecords" not in res
    assert {s: r["nrecords"] for s, r in res["raw"].items()} == {shard: 2, other: 1}
    with pytest.raises(pymongo.errors.OperationFailure) as exc:
        db.command("validate", "missing")
    assert exc.value.code == 26
    router_client.drop_database(name)
