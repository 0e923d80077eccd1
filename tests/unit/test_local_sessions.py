"""The logical session cache behind ``$listLocalSessions`` (shardsim/local_sessions.py):
records, uids, the spec's filters and its errors, expiry."""

from __future__ import annotations

import datetime
import hashlib
import uuid
from types import SimpleNamespace

import pytest
from bson import Binary

from shardsim.core.errors import MongoError
from shardsim.core.local_sessions import LocalSessionCache, local_sessions_docs

ANON = SimpleNamespace(auth=None)
ALICE = SimpleNamespace(auth=SimpleNamespace(users=[("alice", "admin")]))


def _lsid() -> dict:
    return {"id": Binary(uuid.uuid4().bytes, 4)}


def test_records_and_filters() -> None:
    cache = LocalSessionCache()
    a, b = _lsid(), _lsid()
    cache.vivify(a, ANON)
    cache.vivify(b, ALICE)
    cache.vivify({"not": "a session"}, ANON)
    mine = cache.list({}, ANON)
    assert [r["_id"]["id"] for r in mine] == [a["id"]]
    assert mine[0]["_id"]["uid"] == Binary(hashlib.sha256(b"").digest(), 0)
    assert isinstance(mine[0]["lastUse"], datetime.datetime) and "user" not in mine[0]
    alice = cache.list({}, ALICE)
    assert alice[0]["user"] == {"name": "alice@admin"}
    assert alice[0]["_id"]["uid"] == Binary(hashlib.sha256(b"alice@admin").digest(), 0)
    assert len(cache.list({"allUsers": True}, ANON)) == 2
    assert cache.list({"users": [{"user": "alice", "db": "admin"}]}, ANON) == alice
    assert len(local_sessions_docs(cache, "admin", 1, [{"$listLocalSessions": {}}], ANON)) == 1
    # any database, as long as it is {aggregate: 1} (isCollectionlessAggregateNS)
    assert len(local_sessions_docs(cache, "test", 1, [{"$listLocalSessions": {}}], ANON)) == 1


@pytest.mark.parametrize("db, target, spec, code", [
    ("test", "coll", {}, 73), ("admin", "coll", {}, 73), ("admin", True, {}, 73), ("admin", 1, 5, 9),
    ("admin", 1, {"bogus": 1}, 40415), ("admin", 1, {"allUsers": True, "users": []}, 50705),
    ("admin", 1, {"users": [{"user": 1}]}, 40414)])
def test_errors(db: str, target: object, spec: object, code: int) -> None:
    with pytest.raises(MongoError) as info:
        local_sessions_docs(LocalSessionCache(), db, target, [{"$listLocalSessions": spec}], ANON)
    assert info.value.code == code


def test_unused_sessions_expire() -> None:
    cache = LocalSessionCache(timeout=datetime.timedelta(minutes=30))
    old, kept, new = _lsid(), _lsid(), _lsid()
    cache.vivify(old, ANON)
    cache.vivify(kept, ANON)
    first = next(iter(cache.records.values()))
    first["lastUse"] -= datetime.timedelta(minutes=31)
    cache.vivify(new, ANON)
    assert [r["_id"]["id"] for r in cache.list({"allUsers": True}, ANON)] == \
        [kept["id"], new["id"]]


def test_a_known_session_is_touched_and_moved_last() -> None:
    # vivify reuses a known session's record: lastUse, order, user and the listed copies must
    # come out as if it had been rebuilt
    cache = LocalSessionCache()
    a, b = _lsid(), _lsid()
    cache.vivify(a, ANON)
    cache.vivify(b, ANON)
    listed = cache.list({"allUsers": True}, ANON)
    first = next(iter(cache.records.values()))
    first["lastUse"] -= datetime.timedelta(minutes=5)
    stale = first["lastUse"]
    cache.vivify(a, ANON)
    again = cache.list({"allUsers": True}, ANON)
    assert [r["_id"]["id"] for r in again] == [b["id"], a["id"]]
    assert again[1]["lastUse"] > stale and listed[0]["lastUse"] != stale
    assert list(again[1]) == ["_id", "lastUse"] and list(again[1]["_id"]) == ["id", "uid"]
    # the same session id and uid, now from alice's connection: the record gains its user
    alice_uid = Binary(hashlib.sha256(b"alice@admin").digest(), 0)
    cache.vivify({"id": a["id"], "uid": alice_uid}, ANON)
    cache.vivify({"id": a["id"], "uid": alice_uid}, ALICE)
    rec = cache.list({"users": [{"user": "alice", "db": "admin"}]}, ANON)
    assert len(rec) == 1 and rec[0]["user"] == {"name": "alice@admin"}
    assert list(rec[0]) == ["_id", "lastUse", "user"]
    cache.vivify({"id": a["id"], "uid": alice_uid}, ANON)
    rec = cache.list({"users": [{"user": "alice", "db": "admin"}]}, ANON)
    assert "user" not in rec[0]
