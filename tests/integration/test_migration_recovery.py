"""``kill -9`` of the config server, the donor or the recipient in the middle of a chunk
migration, and of the config server in the middle of ``reshardCollection``, on durable process
clusters (``shardsim.tools.launcher.Cluster``), held at the donor's fail points
(``moveChunkHangAtStep*``: the donor drives the migration, :mod:`shard.migration_source`) and
the config server's (``reshardingPauseCoordinator*``). After the restart every shard is
read directly: no shard keeps a document of a range it does not own, no coordinator document,
range-deletion task or temporary resharding collection is left, a later migration of the
range never lets a stale copy win, every acknowledged ``$inc`` is there, and the change stream
shows no event of the clean-up (``fromMigrate``).

Before the recovery (issue 28: R1, L4) the recipient kept the copies of an interrupted
migration, the next migration's clone skipped the ``_id``s it found there (the stale copies
won, acknowledged updates were lost) and a retried ``reshardCollection`` failed with
CollectionUUIDMismatch (361) on the leftover temporary collection."""

from __future__ import annotations

import threading
import time
from typing import Any

import pymongo
import pytest
from bson import MaxKey, MinKey
from pymongo.errors import PyMongoError

from shardsim.tools.launcher import Cluster
from stream_kit import ResumingStream

pytestmark = pytest.mark.timeout(240)

N = 60  # documents in the migrating range [0, N)


def _direct(proc: Any) -> pymongo.MongoClient:
    return pymongo.MongoClient(proc.host, proc.port, directConnection=True,
                               serverSelectionTimeoutMS=20000)


def _wait(cond: Any, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _in_chunk(x: Any, chunk: dict[str, Any]) -> bool:
    lo, hi = chunk["min"]["x"], chunk["max"]["x"]
    return (isinstance(lo, MinKey) or lo <= x) and (isinstance(hi, MaxKey) or x < hi)


def _settled(cluster: Cluster) -> bool:
    """No coordinator document and no range-deletion task on any shard."""
    for proc in cluster.shards:
        with _direct(proc) as d:
            if d.config.migrationCoordinators.count_documents({}) or \
                    d.config.rangeDeletions.count_documents({}):
                return False
    return True


def _check_shards(cluster: Cluster, ns: str, want_n: int) -> None:
    """Read every shard directly: each document sits on the shard owning its chunk (by
    ``config.chunks``), exactly once in the cluster, with ``n == want_n``; no temporary
    resharding collection is left."""
    db, coll = ns.split(".", 1)
    with _direct(cluster.config) as c:
        uuid = c.config.collections.find_one({"_id": ns})["uuid"]
        chunks = list(c.config.chunks.find({"uuid": uuid}))
    seen: dict[Any, str] = {}
    for proc in cluster.shards:
        with _direct(proc) as d:
            temps = [n for n in d[db].list_collection_names() if n.startswith("system.resharding")]
            assert temps == [], f"{proc.name} keeps {temps}"
            for doc in d[db][coll].find({}):
                owner = next(ch["shard"] for ch in chunks if _in_chunk(doc["x"], ch))
                assert owner == proc.name, f"{proc.name} keeps {doc} of {owner}'s chunk"
                assert doc["_id"] not in seen, f"{doc['_id']} on {seen[doc['_id']]} and {proc.name}"
                seen[doc["_id"]] = proc.name
                assert doc.get("n") == want_n, f"{proc.name}: {doc} (lost $inc)"
    assert len(seen) == N + 2


def _setup(client: pymongo.MongoClient, ns: str) -> tuple[str, str]:
    """``ns`` sharded on ``{x: 1}``: chunks ``[MinKey, 0)`` and ``[0, N)`` on the donor,
    ``[N, MaxKey)`` on the recipient; documents ``x`` in ``-1, 0..N-1, N``. Returns (donor,
    recipient)."""
    db, coll = ns.split(".", 1)
    client.admin.command("enableSharding", db)
    client.admin.command("shardCollection", ns, key={"x": 1})
    for mid in (0, N):
        client.admin.command("split", ns, middle={"x": mid})
    donor = client.config.chunks.find_one({"min": {"x": 0}})["shard"]
    shards = sorted(s["_id"] for s in client.config.shards.find())
    recipient = next(s for s in shards if s != donor)
    client.admin.command("moveChunk", ns, find={"x": N}, to=recipient)
    client[db][coll].insert_many([{"_id": x, "x": x, "n": 0} for x in range(-1, N + 1)])
    return donor, recipient


def _background(fn: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except PyMongoError as exc:
            errors.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def _hit(proc: Any, fail_point: str) -> bool:
    """True once ``fail_point`` of process ``proc`` was reached (configureFailPoint answers
    how often it was entered; it stays on)."""
    with _direct(proc) as c:
        return c.admin.command("configureFailPoint", fail_point, mode="alwaysOn")["count"] > 0


def _fail_point(proc: Any, fail_point: str, mode: str) -> None:
    with _direct(proc) as c:
        c.admin.command("configureFailPoint", fail_point, mode=mode)


@pytest.mark.parametrize("victim,step", [
    ("config", "moveChunkHangAtStep4"),   # cloned and caught up: the recipient has copies
    ("config", "moveChunkHangAtStep5"),   # in the donor's critical section
    ("config", "moveChunkHangAtStep6"),   # committed on the config server
    ("donor", "moveChunkHangAtStep4"),
    ("recipient", "moveChunkHangAtStep3"),
])
def test_kill9_mid_migration_leaves_no_orphan_and_no_stale_copy(tmp_path, victim: str,
                                                                  step: str) -> None:
    ns = "k.c"
    with Cluster(shards=2, base_dir=str(tmp_path), durable=True, test_commands=True) as cluster:
        client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000)
        donor, recipient = _setup(client, ns)
        coll = client.k.c
        stream = ResumingStream(coll)
        _fail_point(cluster.shard(donor), step, "alwaysOn")
        moving, _ = _background(lambda: client.admin.command("moveChunk", ns, find={"x": 1},
                                                             to=recipient))
        _wait(lambda: _hit(cluster.shard(donor), step), what=step)
        with _direct(cluster.shard(recipient)) as r:  # the recipient holds the clone
            assert r.k.c.count_documents({"x": {"$gte": 0, "$lt": N}}) == N
        proc = {"config": cluster.config, "donor": cluster.shard(donor),
                "recipient": cluster.shard(recipient)}[victim]
        proc.kill()  # SIGKILL
        if victim == "recipient":  # let the migration run on into the dead shard
            _fail_point(cluster.shard(donor), step, "off")
        cluster.restart(proc)
        if victim == "config":  # the donor goes on and commits on the restarted server
            _fail_point(cluster.shard(donor), step, "off")
        moving.join(60)
        _wait(lambda: _settled(cluster), what="the migration recovery")
        _check_shards(cluster, ns, 0)  # no orphan, nothing lost
        for x in range(-1, N + 1):  # acknowledged $inc on every document
            coll.update_one({"x": x}, {"$inc": {"n": 1}})
        owner = client.config.chunks.find_one({"min": {"x": 0}})["shard"]
        client.admin.command("moveChunk", ns, find={"x": 1},
                             to=recipient if owner == donor else donor)
        _wait(lambda: _settled(cluster), what="the range deletion")
        _check_shards(cluster, ns, 1)  # the later migration let no stale copy win
        assert sorted(d["n"] for d in coll.find()) == [1] * (N + 2)
        events = stream.events(N + 2)
        assert [e["operationType"] for e in events] == ["update"] * (N + 2)
        assert stream.events(1, timeout=1.0) == []  # no event of the clean-up
        stream.stream.close()
        client.close()


@pytest.mark.parametrize("fail_point,outcome", [
    ("reshardingPauseCoordinatorBeforeBlockingWrites", "aborted"),
    ("reshardingPauseCoordinatorBeforeCompletion", "committed"),
])
def test_kill9_config_server_mid_reshard(tmp_path, fail_point: str, outcome: str) -> None:
    ns = "k.r"
    with Cluster(shards=2, base_dir=str(tmp_path), durable=True, test_commands=True) as cluster:
        client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=30000)
        _setup(client, ns)
        coll = client.k.r
        with _direct(cluster.config) as c:
            c.admin.command("configureFailPoint", fail_point, mode="alwaysOn")
        resharding, _ = _background(
            lambda: client.admin.command("reshardCollection", ns, key={"x": "hashed"}))
        _wait(lambda: _hit(cluster.config, fail_point), what=fail_point)
        assert any(_temps(cluster))
        cluster.config.kill()
        cluster.restart(cluster.config)
        resharding.join(60)

        def cleaned() -> bool:
            with _direct(cluster.config) as c:
                if c.config.reshardingOperations.count_documents({}):
                    return False
            return not any(_temps(cluster))
        _wait(cleaned, what="the resharding recovery")
        key = client.config.collections.find_one({"_id": ns})["key"]
        assert key == ({"x": "hashed"} if outcome == "committed" else {"x": 1})
        for x in range(-1, N + 1):
            coll.update_one({"x": x}, {"$inc": {"n": 1}})
        if outcome == "aborted":  # the first retry succeeds
            client.admin.command("reshardCollection", ns, key={"x": "hashed"})
        assert sorted(d["n"] for d in coll.find()) == [1] * (N + 2)
        total = 0
        for proc in cluster.shards:
            with _direct(proc) as d:
                assert not [n for n in d.k.list_collection_names()
                            if n.startswith("system.resharding")]
                total += d.k.r.count_documents({})
        assert total == N + 2  # every document once, on one shard
        client.close()


def _temps(cluster: Cluster) -> list[bool]:
    """Per recipient shard: does it hold a temporary resharding collection?"""
    out = []
    for proc in cluster.shards:
        with _direct(proc) as d:
            out.append(any(n.startswith("system.resharding") for n in d.k.list_collection_names()))
    return out
