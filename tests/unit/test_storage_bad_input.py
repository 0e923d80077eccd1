"""Seeded random commands with wrong field types against an in-process ShardNode: every reply
is a MongoDB-style reply (never InternalError from a crash) and encodes as BSON."""

from __future__ import annotations

import asyncio
import random

import bson
from bson import Binary, ObjectId, Timestamp
from bson.int64 import Int64

from shardsim.core.commands import ConnectionInfo, Request
from shardsim.shard.node import ShardNode

VALUES = [None, True, 1, -1, 0, 2.5, "x", "", [], [1], [{}], {}, {"a": 1}, {"$set": 1},
          {"$bogus": {}}, Binary(b"x"), ObjectId(), Int64(5), Timestamp(1, 1),
          [{"q": {}, "u": 5}], [{"q": 5}], [{"q": {}, "limit": "a"}], [{"_id": {"$x": 1}}],
          {"a": {"$in": 5}}, [{"$match": 5}], [{"$group": 1}], [5], {"a": {"$regex": 5}},
          [{"q": {"a": 1}, "u": {"$set": {"a.$[x]": 1}}, "arrayFilters": 5}],
          [{"key": {"a": "bad"}, "name": "a"}], [{"key": {"a": 1}}]]
COMMANDS = {
    "insert": ["documents", "ordered"], "update": ["updates", "ordered"], "delete": ["deletes"],
    "find": ["filter", "sort", "projection", "limit", "skip", "batchSize"],
    "aggregate": ["pipeline", "cursor"], "count": ["query", "limit"], "distinct": ["key", "query"],
    "findAndModify": ["query", "update", "remove", "sort", "fields", "new", "upsert"],
    "createIndexes": ["indexes"], "dropIndexes": ["index"],
    "create": ["capped", "changeStreamPreAndPostImages"],
    "collMod": ["changeStreamPreAndPostImages", "index"], "listCollections": ["filter"],
    "renameCollection": ["to"], "_shardsimEnsureCollection": ["uuid", "shardKey", "options"],
    "_shardsimNoop": ["o2", "ns"], "listIndexes": ["cursor"], "drop": [],
}


def test_random_malformed_commands_get_mongod_errors():
    node = ShardNode(shard_name="fuzz")
    conn = ConnectionInfo(1)
    rng = random.Random(20261122)

    async def main() -> None:
        seen_codes = set()
        for _ in range(2500):
            name = rng.choice(list(COMMANDS))
            body = {name: rng.choice(["c", "c", "d", 5, "", None, {}])}
            for f in COMMANDS[name]:
                if rng.random() < 0.7:
                    body[f] = rng.choice(VALUES)
            body["$db"] = "admin" if name == "renameCollection" else "fz"
            reply = await node.run_command(Request(name=name, db=body["$db"], body=body, conn=conn))
            assert reply.get("code") != 1, (body, reply)
            bson.encode(reply)
            if reply["ok"] == 0:
                assert isinstance(reply["errmsg"], str) and isinstance(reply["codeName"], str)
                seen_codes.add(reply["code"])
        # The node still works afterwards.
        ok = await node.run_command(Request(name="insert", db="fz2", conn=conn,
                                            body={"insert": "c", "documents": [{"_id": 1}], "$db": "fz2"}))
        assert ok["ok"] == 1.0 and ok["n"] == 1
        assert {2, 14}.issubset(seen_codes)

    asyncio.run(main())
