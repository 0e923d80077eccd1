"""``--dbpath`` shards: every acknowledged write survives SIGKILL and restart, with its oplog
entry, pre-image, catalog (UUIDs, indexes, options) and the clock moving on from the last ts."""

from __future__ import annotations

from pymongo.errors import DuplicateKeyError

import pytest


def test_kill_9_keeps_every_acknowledged_write(tmp_path, shard_process, shard_client):
    dbpath = tmp_path / "s0"
    proc = shard_process("durable0", dbpath)
    client = shard_client(proc)
    db = client.app
    db.create_collection("items", changeStreamPreAndPostImages={"enabled": True})
    db.items.create_index("k", unique=True)
    for start in range(0, 1000, 100):  # several commands, several SQLite transactions
        db.items.insert_many([{"_id": i, "k": f"key{i}", "v": i} for i in range(start, start + 100)])
    db.items.update_one({"_id": 7}, {"$set": {"v": "seven"}})
    db.items.insert_one({"_id": 2000, "k": "extra", "v": 0})
    db.items.delete_one({"_id": 2000})
    uuid_before = next(db.list_collections())["info"]["uuid"]
    last_ts = client.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()["ts"]
    client.close()

    proc.kill()  # SIGKILL: no shutdown hook runs
    assert not proc.alive()

    proc2 = shard_process("durable0", dbpath)
    c2 = shard_client(proc2)
    items = c2.app.items
    docs = list(items.find())
    assert len(docs) == 1000
    assert [d["_id"] for d in docs] == list(range(1000))  # natural order kept
    assert items.find_one({"_id": 7})["v"] == "seven"
    entries = list(c2.local["oplog.rs"].find({"ns": "app.items"}))
    inserted = [e["o"]["_id"] for e in entries if e["op"] == "i"]
    assert inserted == list(range(1000)) + [2000]
    assert [e["op"] for e in entries[-3:]] == ["u", "i", "d"]
    assert next(c2.app.list_collections())["info"]["uuid"] == uuid_before
    # The unique index and the pre-image option came back with the catalog.
    with pytest.raises(DuplicateKeyError):
        items.insert_one({"k": "key1"})
    pre = [p["preImage"] for p in c2.config["system.preimages"].find()]
    assert {"_id": 7, "k": "key7", "v": 7} in pre and {"_id": 2000, "k": "extra", "v": 0} in pre
    # A second process on the same dbpath is refused (mongod's DBPathInUse).
    with pytest.raises(RuntimeError, match="DBPathInUse"):
        shard_process("durable0-twin", dbpath)
    # The clock continues after the newest oplog entry.
    items.insert_one({"_id": 5000, "k": "new"})
    newest = c2.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()
    assert newest["ts"] > last_ts and newest["o"]["_id"] == 5000


def test_ddl_and_transactions_survive_restart(tmp_path, shard_process, shard_client):
    dbpath = tmp_path / "s1"
    proc = shard_process("durable1", dbpath)
    client = shard_client(proc)
    client.a.x.insert_one({"_id": 1})
    client.admin.command("renameCollection", "a.x", to="a.y")
    client.b.gone.insert_one({"_id": 1})
    client.drop_database("b")
    with client.start_session() as s:
        with s.start_transaction():
            client.a.y.insert_one({"_id": 2}, session=s)
            client.a.y.insert_one({"_id": 3}, session=s)
    client.close()
    proc.kill()

    proc2 = shard_process("durable1", dbpath)
    c2 = shard_client(proc2)
    assert c2.a.list_collection_names() == ["y"]
    assert sorted(d["_id"] for d in c2.a.y.find()) == [1, 2, 3]
    assert "b" not in c2.list_database_names()
    [apply_ops] = list(c2.local["oplog.rs"].find({"o.applyOps": {"$exists": True}}))
    assert [o["o"]["_id"] for o in apply_ops["o"]["applyOps"]] == [2, 3]


def _command(proc, db: str, body: dict) -> dict:
    """One OP_MSG round trip on a fresh socket (pymongo would replace a hand-made lsid)."""
    import socket
    import struct

    import bson

    from shardsim.core import wire
    with socket.create_connection((proc.host, proc.port), timeout=10) as sock:
        sock.sendall(wire.encode_op_msg(bson.encode({**body, "$db": db})))
        buf = b""
        while len(buf) < 16 or len(buf) < struct.unpack("<i", buf[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            buf += chunk
        return bson.decode(wire.parse_op_msg(0, buf[16:]).body)


def test_retryable_write_history_survives_kill_9(tmp_path, shard_process, shard_client):
    import uuid

    from bson import Binary
    from bson.int64 import Int64
    dbpath = tmp_path / "s2"
    proc = shard_process("durable2", dbpath)
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
    ins = {"insert": "c", "documents": [{"_id": 1}, {"_id": 2}], "lsid": lsid,
           "txnNumber": Int64(9)}
    assert _command(proc, "r", ins)["n"] == 2
    proc.kill()
    proc2 = shard_process("durable2", dbpath)
    r = _command(proc2, "r", ins)  # the driver's retry after the crash
    assert r["ok"] == 1.0 and r["n"] == 2 and r["retriedStmtIds"] == [0, 1]
    assert "writeErrors" not in r
    c = shard_client(proc2)
    assert c.local["oplog.rs"].count_documents({"ns": "r.c", "op": "i"}) == 2
    assert _command(proc2, "r", {**ins, "txnNumber": Int64(8)})["code"] == 225


def test_users_and_roles_survive_kill_9(tmp_path, shard_process, shard_client):
    """``admin.system.users`` / ``system.roles`` written by the user-management commands (the
    shard's :class:`LocalUserStore`, through ``ShardNode.put_logged``) are durable with their
    oplog entries: a created, an updated (replaced) and a dropped user, and a role."""
    dbpath = tmp_path / "s2"
    proc = shard_process("durable2", dbpath)
    client = shard_client(proc)
    client.admin.command("createUser", "ana", pwd="pw-a", roles=["read"])
    client.admin.command("createUser", "bo", pwd="pw-b", roles=[])
    client.admin.command("updateUser", "ana", roles=["readWrite"])
    client.admin.command("dropUser", "bo")
    client.admin.command("createRole", "auditor", roles=[],
                         privileges=[{"resource": {"db": "app", "collection": ""},
                                      "actions": ["find"]}])
    client.close()
    proc.kill()

    proc2 = shard_process("durable2", dbpath)
    c2 = shard_client(proc2)
    users = c2.admin.command("usersInfo", 1)["users"]
    assert [(u["user"], [r["role"] for r in u["roles"]]) for u in users] == \
        [("ana", ["readWrite"])]
    assert [r["role"] for r in c2.admin.command("rolesInfo", 1)["roles"]] == ["auditor"]
    ops = [(e["op"], e["o"].get("_id", e["o2"]["_id"] if "o2" in e else None))
           for e in c2.local["oplog.rs"].find({"ns": "admin.system.users"})]
    assert ops == [("i", "admin.ana"), ("i", "admin.bo"), ("u", "admin.ana"), ("d", "admin.bo")]
