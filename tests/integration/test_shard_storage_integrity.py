"""A durable shard's storage tells the truth (audit issue 28, R3 and R4).

* Disk full: a write whose commit SQLite refuses (SQLITE_FULL, from ``PRAGMA max_page_count``
  through the test command ``_shardsimStorageFull``) gets OutOfDiskSpace (14031) and leaves no
  trace: not in ``find``, the oplog, pre-images, a change stream, the retryable-write history,
  nor after a restart; the process keeps serving and writes succeed once space is back.
* Corruption: one changed byte in the WAL (SQLite silently drops that frame and every later
  one), a changed value in the main file, a damaged page: the shard refuses to start with one
  line on stderr naming the file, and exit code 14, instead of serving old, empty or wrong data.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
import bson
from bson import Binary
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from shardsim.core import wire
from shardsim.core.protocol.shard import StorageFull

BIG = "x" * 20000  # a document that needs new pages of the SQLite file


def _command(proc, db: str, body: dict) -> dict:
    """One OP_MSG round trip on a fresh socket (pymongo would replace a hand-made lsid)."""
    import socket
    import struct
    with socket.create_connection((proc.host, proc.port), timeout=10) as sock:
        sock.sendall(wire.encode_op_msg(bson.encode({**body, "$db": db})))
        buf = b""
        while len(buf) < 16 or len(buf) < struct.unpack("<i", buf[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            buf += chunk
        return bson.decode(wire.parse_op_msg(0, buf[16:]).body)


def _full(client, on: bool) -> None:
    client.admin.command(StorageFull(on).to_command())


def test_disk_full_write_is_rolled_back_everywhere(tmp_path, shard_process, shard_client):
    dbpath = tmp_path / "full"
    proc = shard_process("full0", dbpath, "--noop-interval-ms", "600000")
    client = shard_client(proc)
    db = client.app
    db.create_collection("items", changeStreamPreAndPostImages={"enabled": True})
    db.items.insert_many([{"_id": i, "v": i} for i in range(5)])
    stream = db.items.watch(full_document_before_change="whenAvailable")

    _full(client, True)
    with pytest.raises(OperationFailure) as failed:
        db.items.insert_one({"_id": 100, "big": BIG})
    assert failed.value.code == 14031
    assert failed.value.details["codeName"] == "OutOfDiskSpace"
    assert "No space left on device" in failed.value.details["errmsg"]
    assert "Traceback" not in failed.value.details["errmsg"]
    with pytest.raises(OperationFailure) as failed_update:  # an update with a pre-image
        db.items.update_one({"_id": 3}, {"$set": {"big": BIG}})
    assert failed_update.value.code == 14031
    # A retryable insert (lsid + txnNumber) fails the same way and is not remembered.
    lsid = {"id": Binary(os.urandom(16), 4)}
    retry = {"insert": "items", "documents": [{"_id": 200, "big": BIG}], "lsid": lsid,
             "txnNumber": Int64(1)}
    reply = _command(proc, "app", retry)
    assert reply["ok"] == 0 and reply["code"] == 14031, reply

    # Nothing of them is readable, in the oplog, or a pre-image; reads keep working.
    assert db.items.find_one({"_id": 100}) is None
    assert db.items.find_one({"_id": 200}) is None
    assert db.items.find_one({"_id": 3}) == {"_id": 3, "v": 3}
    assert db.items.count_documents({}) == 5
    oplog = list(client.local["oplog.rs"].find({"ns": "app.items"}))
    assert [e["o"].get("_id") for e in oplog if e["op"] == "i"] == [0, 1, 2, 3, 4]
    assert not [e for e in oplog if e["op"] == "u"]
    assert list(client.config["system.preimages"].find()) == []

    # Space is back: writes succeed again, and the retry of the failed retryable insert runs
    # (it is not answered from a history that was never written).
    _full(client, False)
    db.items.insert_one({"_id": 101, "v": "after"})
    reply = _command(proc, "app", retry)
    assert reply["ok"] == 1 and reply["n"] == 1, reply
    assert db.items.find_one({"_id": 200})["big"] == BIG

    # The change stream shows the acknowledged writes only.
    seen = []
    while len(seen) < 2:
        change = stream.try_next()
        if change is not None:
            seen.append(change["documentKey"]["_id"])
    assert seen == [101, 200]
    stream.close()
    client.close()

    proc.kill()  # nothing flushed beyond what was committed
    proc2 = shard_process("full0", dbpath)
    c2 = shard_client(proc2)
    assert sorted(d["_id"] for d in c2.app.items.find()) == [0, 1, 2, 3, 4, 101, 200]
    assert c2.app.items.find_one({"_id": 3}) == {"_id": 3, "v": 3}
    inserted = [e["o"]["_id"] for e in c2.local["oplog.rs"].find({"ns": "app.items", "op": "i"})]
    assert inserted == [0, 1, 2, 3, 4, 101, 200]


def test_disk_full_under_a_write_loop_acked_equals_streamed_equals_restarted(
        tmp_path, shard_process, shard_client):
    """The audit's measurement: writes in a loop while the disk is full (small ones still fit
    in the file's free space, large ones do not). Acknowledged, streamed and kept after a
    restart must be the same set."""
    dbpath = tmp_path / "loop"
    proc = shard_process("loop0", dbpath, "--noop-interval-ms", "600000")
    client = shard_client(proc)
    coll = client.app.loop
    coll.insert_one({"_id": -1})
    stream = coll.watch()
    _full(client, True)
    acked, failed = [], []
    for i in range(60):
        doc = {"_id": i, "pad": BIG if i % 3 == 0 else "s"}
        try:
            coll.insert_one(doc)
            acked.append(i)
        except OperationFailure as exc:
            assert exc.code == 14031, exc.details
            failed.append(i)
    _full(client, False)
    coll.insert_one({"_id": "end"})
    assert failed and acked  # both happened
    streamed = []
    while not streamed or streamed[-1] != "end":
        change = stream.try_next()
        if change is not None:
            streamed.append(change["documentKey"]["_id"])
    assert streamed == acked + ["end"]
    assert sorted(d["_id"] for d in coll.find({"_id": {"$type": "int"}})) == [-1] + acked
    stream.close()
    client.close()
    proc.kill()
    c2 = shard_client(shard_process("loop0", dbpath))
    assert sorted(d["_id"] for d in c2.app.loop.find({"_id": {"$type": "int"}})) == [-1] + acked
    oplog_ids = [e["o"]["_id"] for e in c2.local["oplog.rs"].find({"ns": "app.loop", "op": "i"})]
    assert oplog_ids == [-1] + acked + ["end"]


def test_disk_full_ddl_is_rolled_back(tmp_path, shard_process, shard_client):
    proc = shard_process("full1", tmp_path / "ddl", "--noop-interval-ms", "600000")
    client = shard_client(proc)
    client.app.keep.insert_one({"_id": 1, "big": BIG})
    _full(client, True)
    # A create whose implicit collection and documents do not fit: no collection is left.
    with pytest.raises(OperationFailure) as failed:
        client.app.fresh.insert_many([{"_id": i, "big": BIG} for i in range(3)])
    assert failed.value.code == 14031
    assert "fresh" not in client.app.list_collection_names()
    # A drop is a delete of pages, it fits; its rename counterpart as well: space is not needed
    # to shrink. The collection that stayed is intact.
    assert client.app.keep.find_one({"_id": 1})["big"] == BIG
    _full(client, False)
    client.app.fresh.insert_one({"_id": 9})
    assert [d["_id"] for d in client.app.fresh.find()] == [9]


# -- corruption: the shard refuses to start --------------------------------------------------

def _start_refused(dbpath) -> subprocess.CompletedProcess:
    """Start a shard on ``dbpath`` expecting a refusal (bounded: a shard that starts instead
    is killed by the timeout and the assertions fail)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        return subprocess.run([sys.executable, "-m", "shard", "--port", "0", "--dbpath",
                               str(dbpath)], capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired as exc:  # pragma: no cover - the failure being tested
        pytest.fail(f"the shard started on a corrupt store: {exc.stdout!r}")


def _assert_refused(result, *needles: str) -> str:
    assert result.returncode == 14, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("shardsim shard: DataCorruptionDetected: ")
    for needle in needles:
        assert needle in line, line
    assert "ready" not in result.stdout
    return line


def _fill(shard_process, shard_client, dbpath, n: int = 3000) -> None:
    proc = shard_process("corrupt", dbpath, "--noop-interval-ms", "600000")
    client = shard_client(proc)
    for start in range(0, n, 500):  # several commits, several WAL frames each
        client.app.items.insert_many([{"_id": i, "v": f"value-{i:06d}"}
                                      for i in range(start, start + 500)])
    client.close()
    proc.kill()  # kill -9: the WAL is not checkpointed


def test_a_changed_wal_frame_refuses_start(tmp_path, shard_process, shard_client):
    dbpath = tmp_path / "wal"
    _fill(shard_process, shard_client, dbpath)
    wal = dbpath / "shard.sqlite-wal"
    with open(dbpath / "shard.sqlite", "rb") as f:
        page_size = int.from_bytes(f.read(100)[16:18], "big")
    size = wal.stat().st_size
    frames = (size - 32) // (24 + page_size)
    assert frames > 4
    # One byte in the page of a frame in the middle: SQLite ignores that frame and all after it.
    offset = 32 + (frames // 2) * (24 + page_size) + 24 + 200
    with open(wal, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    line = _assert_refused(_start_refused(dbpath), str(wal), "acknowledged commit(s) are missing")
    assert "shard.ack" in line


def test_a_deleted_wal_refuses_start(tmp_path, shard_process, shard_client):
    dbpath = tmp_path / "nowal"
    _fill(shard_process, shard_client, dbpath, 1000)
    os.remove(dbpath / "shard.sqlite-wal")
    _assert_refused(_start_refused(dbpath), "acknowledged commit(s) are missing")


def _checkpoint(dbpath) -> None:
    """Move everything into the main file (what SQLite's own recovery does), counters intact."""
    conn = sqlite3.connect(dbpath / "shard.sqlite")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def test_a_changed_value_in_the_main_file_refuses_start(tmp_path, shard_process, shard_client):
    dbpath = tmp_path / "value"
    _fill(shard_process, shard_client, dbpath, 1000)
    _checkpoint(dbpath)
    main = dbpath / "shard.sqlite"
    data = main.read_bytes()
    at = data.index(b"value-000777")
    with open(main, "r+b") as f:  # value-000777 -> value-000778: still valid BSON
        f.seek(at + len("value-00077"))
        f.write(b"8")
    _assert_refused(_start_refused(dbpath), str(main), "checksum mismatch in table docs")


def test_a_changed_oplog_entry_in_the_main_file_refuses_start(tmp_path, shard_process,
                                                               shard_client):
    dbpath = tmp_path / "oplog"
    proc = shard_process("corrupt", dbpath, "--noop-interval-ms", "600000")
    client = shard_client(proc)
    client.app.items.insert_one({"_id": 1, "v": "needle-in-the-oplog"})
    client.app.items.delete_one({"_id": 1})  # the document row is gone, its oplog entry stays
    client.close()
    proc.kill()
    _checkpoint(dbpath)
    main = dbpath / "shard.sqlite"
    data = main.read_bytes()
    at = data.index(b"needle-in-the-oplog")
    with open(main, "r+b") as f:
        f.seek(at)
        f.write(b"N")
    _assert_refused(_start_refused(dbpath), str(main), "checksum mismatch in table oplog")


def test_a_damaged_page_refuses_start(tmp_path, shard_process, shard_client):
    dbpath = tmp_path / "page"
    _fill(shard_process, shard_client, dbpath, 1000)
    _checkpoint(dbpath)
    main = dbpath / "shard.sqlite"
    with open(main, "rb") as f:
        page_size = int.from_bytes(f.read(100)[16:18], "big")
    pages = main.stat().st_size // page_size
    with open(main, "r+b") as f:  # the b-tree page header of a page in the middle
        f.seek((pages // 2) * page_size)
        f.write(b"\x07\xff\xff\xff")
    _assert_refused(_start_refused(dbpath), str(main))


def test_an_intact_store_starts_after_kill_and_after_clean_stop(tmp_path, shard_process,
                                                                 shard_client):
    dbpath = tmp_path / "fine"
    _fill(shard_process, shard_client, dbpath, 1000)
    proc = shard_process("fine", dbpath)
    client = shard_client(proc)
    assert client.app.items.count_documents({}) == 1000
    client.app.items.insert_one({"_id": "last"})
    client.close()
    proc.stop()  # SIGTERM: checkpoint and close
    proc = shard_process("fine", dbpath)
    assert shard_client(proc).app.items.count_documents({}) == 1001


def test_a_refused_store_is_left_as_it_was_found(tmp_path, shard_process, shard_client):
    dbpath = tmp_path / "untouched"
    _fill(shard_process, shard_client, dbpath, 1000)
    os.remove(dbpath / "shard.sqlite-wal")  # every commit was in it: the main file is empty
    kept = ("shard.sqlite", "shard.ack")  # (SQLite may recreate its -wal and -shm files)
    before = {name: (dbpath / name).read_bytes() for name in kept}
    _assert_refused(_start_refused(dbpath), "acknowledged commit(s) are missing")
    _assert_refused(_start_refused(dbpath), "acknowledged commit(s) are missing")  # and again
    assert {name: (dbpath / name).read_bytes() for name in kept} == before


def test_the_config_server_refuses_a_damaged_store_too(tmp_path):
    from shardsim.tools.procs import RoleProcess
    dbpath = tmp_path / "cfg"
    proc = RoleProcess("configsvr", ["--port", "0", "--dbpath", str(dbpath),
                                     "--noop-interval-ms", "600000"], name="cfg")
    try:
        proc.start()
        client = pymongo_client(proc)
        client.app.items.insert_many([{"_id": i} for i in range(100)])
        client.close()
    finally:
        proc.kill()
    os.remove(dbpath / "shard.sqlite-wal")
    result = subprocess.run([sys.executable, "-m", "configsvr", "--port", "0", "--dbpath",
                             str(dbpath)], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert result.returncode == 14, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("shardsim configsvr: DataCorruptionDetected: ")
    assert "acknowledged commit(s) are missing" in line


def pymongo_client(proc):
    import pymongo
    return pymongo.MongoClient(f"mongodb://{proc.address}/?directConnection=true",
                               serverSelectionTimeoutMS=5000)
