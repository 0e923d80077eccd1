"""``DiskOplog`` (durable shards' oplog: SQLite with a bounded cache of the newest entries) reads
exactly what the in-memory ``Oplog`` holds, in every scope, across the disk/cache boundary,
truncation, restart and the first table layout; its cache stays within its size."""

from __future__ import annotations

import random
import sqlite3

import bson
import pytest
from bson import Timestamp

from shardsim.core.clock import ts_key
from shardsim.shard.oplog import Oplog
from shardsim.shard import oplog_disk
from shardsim.shard.oplog_disk import PUT_OPLOG, DiskOplog, migrate, oplog_row

SIZE = 100  # accounted bytes per entry


def _entry(rng: random.Random, t: int) -> dict:
    r = rng.random()
    if r < 0.1:
        e = {"op": "c", "ns": "d.$cmd", "o": {"drop": "c"}}
    elif r < 0.15:
        e = {"op": "n", "ns": "", "o": {"msg": "periodic noop"}}
    else:
        e = {"op": rng.choice("iud"), "ns": rng.choice(["d.c", "d.c", "d.x", "e.c"]),
             "o": {"_id": t, "pad": "x" * rng.randint(0, 40)}}
    e["ts"] = Timestamp(t, 1)
    return e


class Shard:
    """What the shard does around its oplog: journal, commit (rows + truncation), mark durable."""

    def __init__(self, conn: sqlite3.Connection, **kw) -> None:
        self.conn = conn
        self.log = DiskOplog(conn, **kw)
        self.journal: list = []
        self.log.truncated_callbacks.append(lambda key: self.journal.append(("truncate", key)))

    def append(self, entry: dict) -> None:
        size = self.log.append(entry, SIZE)
        self.journal.append(("oplog", entry, size))

    def commit(self) -> None:
        self.conn.execute("BEGIN")
        for rec in self.journal:
            if rec[0] == "oplog":
                self.conn.execute(PUT_OPLOG, oplog_row(rec[1], bson.encode(rec[1]), rec[2]))
            else:
                self.conn.execute("DELETE FROM oplog WHERE ts <= ?", (rec[1],))
        self.conn.execute("COMMIT")
        self.journal = []
        self.log.mark_durable(self.log.latest_key)


def _batches(log, key: int, limit: int, **scope) -> list:
    out = []
    while True:
        keys, entries = log.scoped_batch(key, limit, **scope)
        assert len(keys) == len(entries) <= limit
        out += list(zip(keys, entries))
        if not keys or (len(keys) < limit and not log.short_reads):
            return out
        key = keys[-1] + 1


def _same(ref: Oplog, log: DiskOplog, rng: random.Random, t: int) -> None:
    assert len(log) == len(ref) and log.size_bytes == ref.size_bytes
    assert log.first_ts() == ref.first_ts() and log.latest_key == ref.latest_key
    for scope in ({}, {"ns": "d.c"}, {"db": "d"}, {"ns": "nope.x"}, {"db": "e"}):
        for start in (0, (t - 1500) << 32, (t - 7) << 32, rng.randint(0, t << 32)):
            expect = list(ref.scoped_entries_from(start, **scope))
            for limit in (1, 7, 300):
                assert _batches(log, start, limit, **scope) == expect
            assert list(log.scoped_entries_from(start, **scope)) == expect
    assert list(log.entries_from(0)) == list(ref.entries_from(0))
    assert list(log.entries_reversed()) == list(ref.entries_reversed())
    for e in list(ref.entries_from(0))[::97]:
        assert log.get(ts_key(e["ts"])) == e
    assert log.get(ts_key(ref.first_ts()) - 1) is None


@pytest.fixture
def conn(tmp_path):
    c = sqlite3.connect(tmp_path / "oplog.sqlite", isolation_level=None)
    migrate(c)
    yield c
    c.close()


@pytest.mark.parametrize("read_bytes", [4 << 20, 500])  # 500: disk reads stop after ~5 entries
def test_disk_oplog_reads_like_the_in_memory_oplog(conn, monkeypatch, read_bytes):
    monkeypatch.setattr(oplog_disk, "READ_BYTES", read_bytes)
    rng = random.Random(7)
    cap = SIZE * 4000
    ref = Oplog(max_bytes=cap)
    shard = Shard(conn, max_bytes=cap, cache_bytes=SIZE * 300)
    t = 100
    for n in range(6000):  # commits of 1..50 entries; truncates by size while filling
        t += 1
        e = _entry(rng, t)
        ref.append(e, SIZE)
        shard.append(e)
        if rng.random() < 0.1:
            shard.commit()
    shard.commit()
    log = shard.log
    assert log.cached_bytes <= SIZE * 300 and log.cached_entries == 300
    assert len(log) == 4000 and log.truncated_through == ref.truncated_through
    _same(ref, log, rng, t)
    assert log.disk_rows_read > 0

    # A restart reads the counters and the newest cache_bytes only.
    again = DiskOplog(conn, max_bytes=cap, cache_bytes=SIZE * 300)
    again.load_from_disk()
    assert again.cached_entries == 300 and again.disk_rows_read == 0
    _same(ref, again, rng, t)

    # truncate_before across the disk part and into the cache, as the test kit does.
    cut = list(ref.entries_from(0))[3850]["ts"]
    assert again.truncate_before(ts_key(cut)) == ref.truncate_before(ts_key(cut)) == 3850
    assert again.first_ts() == ref.first_ts() == cut
    _same(ref, again, rng, t)


def test_uncommitted_entries_stay_cached_until_their_commit(conn):
    shard = Shard(conn, cache_bytes=SIZE * 10)
    rng = random.Random(1)
    for t in range(1, 51):
        shard.append(_entry(rng, t))
    # Nothing is on disk yet: the cache holds all 50 entries, over its size.
    assert shard.log.cached_entries == 50 and shard.log.cached_bytes == 50 * SIZE
    assert len(_batches(shard.log, 0, 8)) == 50
    shard.commit()
    assert shard.log.cached_entries == 10 and len(shard.log) == 50
    assert [k for k, _ in _batches(shard.log, 0, 8)] == [ts_key(Timestamp(t, 1)) for t in range(1, 51)]


def test_retention_by_age_truncates_the_disk_part(conn):
    now = [1000.0]
    shard = Shard(conn, cache_bytes=SIZE * 5, wall=lambda: now[0])
    rng = random.Random(2)
    for t in range(800, 1000):
        shard.append(_entry(rng, t))
        shard.commit()
    assert len(shard.log) == 200 and shard.log.cached_entries == 5
    now[0] = 1050.0
    shard.log.max_age_s = 100  # entries older than 950 are over the age limit
    shard.log.truncate()
    shard.commit()
    assert shard.log.first_ts() == Timestamp(950, 1) and len(shard.log) == 50
    assert conn.execute("SELECT min(ts), count(*) FROM oplog").fetchone() == (
        ts_key(Timestamp(950, 1)), 50)


def test_first_layout_is_migrated(tmp_path):
    c = sqlite3.connect(tmp_path / "old.sqlite", isolation_level=None)
    c.execute("CREATE TABLE oplog (ts INTEGER PRIMARY KEY, entry BLOB NOT NULL)")
    entries = [{"op": "i", "ns": "d.c", "o": {"_id": i}, "ts": Timestamp(10 + i, 1)}
               for i in range(5)] + [{"op": "c", "ns": "d.$cmd", "o": {"drop": "c"},
                                      "ts": Timestamp(20, 1)}]
    for e in entries:
        c.execute("INSERT INTO oplog VALUES (?, ?)", (ts_key(e["ts"]), bson.encode(e)))
    migrate(c)
    log = DiskOplog(c, cache_bytes=1)
    log.load_from_disk()
    assert len(log) == 6 and log.cached_entries == 1
    assert [e for _, e in log.scoped_entries_from(0, ns="d.c")] == entries
    assert [e for _, e in log.scoped_entries_from(0, db="x")] == entries[-1:]
    c.close()


def test_second_layout_gets_a_crc_column_and_disk_reads_verify_checksums(tmp_path):
    from shardsim.core.errors import MongoError
    c = sqlite3.connect(tmp_path / "v2.sqlite", isolation_level=None)
    c.execute("CREATE TABLE oplog (ts INTEGER PRIMARY KEY, cmd INTEGER NOT NULL, ns TEXT, db TEXT,"
              " size INTEGER NOT NULL, entry BLOB NOT NULL)")
    old = {"op": "i", "ns": "d.c", "o": {"_id": 0, "v": "old"}, "ts": Timestamp(10, 1)}
    c.execute("INSERT INTO oplog VALUES (?, 0, 'd.c', 'd', 10, ?)", (ts_key(old["ts"]),
                                                                    bson.encode(old)))
    migrate(c)  # a store of the second layout: the column is added, NULL = not verified
    entries = [{"op": "i", "ns": "d.c", "o": {"_id": i, "v": "value"}, "ts": Timestamp(20 + i, 1)}
               for i in range(5)]
    c.execute("BEGIN")
    for e in entries:
        c.execute(PUT_OPLOG, oplog_row(e, bson.encode(e), SIZE))
    c.execute("COMMIT")
    log = DiskOplog(c, cache_bytes=1)
    log.load_from_disk()
    assert log.get(ts_key(old["ts"])) == old
    assert [e for _, e in log.scoped_entries_from(0, ns="d.c")] == [old] + entries
    # One changed byte in a stored entry (same length, still valid BSON): the read refuses it.
    key = ts_key(entries[1]["ts"])
    raw = c.execute("SELECT entry FROM oplog WHERE ts = ?", (key,)).fetchone()[0]
    c.execute("UPDATE oplog SET entry = ? WHERE ts = ?", (raw.replace(b"value", b"valuf"), key))
    with pytest.raises(MongoError) as bad:
        log.get(key)
    assert bad.value.code == 301 and bad.value.code_name == "DataCorruptionDetected"
    with pytest.raises(MongoError):
        list(log.scoped_entries_from(0, ns="d.c"))
    c.close()
