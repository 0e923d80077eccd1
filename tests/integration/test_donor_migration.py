"""The donor shard drives a chunk migration (issue 25, item 3(c); :mod:`shard.migration_source`):
the config server sends ``_shardsvrMoveRange`` to the donor's primary, which persists its
coordinator document in its own replica set, clones, catches up, commits on the config server
and completes. On 2 shards x 3 members with a 3-member config server (in process):

* the coordinator document lives on the donor's members while the migration runs (not on the
  config server) and is gone after it;
* the donor's primary stepped down or killed mid-migration: the new primary completes the
  migration it finds in its ``config.migrationCoordinators`` (aborted before the commit,
  committed after it, filtering its orphans meanwhile);
* the commit's reply lost while the config primary fails over: the donor decides from a
  refresh.

Each time every shard's own storage is read (no document lost or doubled) and a change stream
through the router shows every write exactly once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pymongo
import pymongo.errors
import pytest
from bson import ObjectId

from shardsim.testing import ShardedCluster
from shardsim.testing.helpers import split_over_two_shards
from stream_kit import ResumingStream as Stream

pytestmark = pytest.mark.timeout(180)

MAJORITY = pymongo.WriteConcern("majority", wtimeout=15000)
N = 20  # documents, x in 0..N-1 on the donor


@pytest.fixture
def cluster():
    with ShardedCluster(shards=2, members=3, seed=25) as c:
        yield c


def wait_for(cond: Any, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def direct(host: str) -> pymongo.MongoClient:
    return pymongo.MongoClient(host, directConnection=True, serverSelectionTimeoutMS=10000)


def fail_point(host: str, name: str, mode: str) -> int:
    """configureFailPoint on one member; returns how often it was entered."""
    with direct(host) as d:
        return int(d.admin.command("configureFailPoint", name, mode=mode)["count"])


def coordinators(cluster: ShardedCluster, host: str) -> list[dict[str, Any]]:
    """``config.migrationCoordinators`` as member ``host`` has it in its own storage."""
    coll = cluster.member_node(host).storage.get("config", "migrationCoordinators")
    return [] if coll is None else list(coll.docs.values())


def setup(cluster: ShardedCluster, ns: str) -> tuple[Any, str, str]:
    """``ns`` on ``{x: 1}`` with chunks ``[MinKey, 10)`` and ``[10, 1000)`` on the donor and
    ``[1000, MaxKey)`` on the recipient; documents ``x`` in ``0..N-1``. Returns the
    collection, the donor and the recipient."""
    client = cluster.client()
    donor, recipient = split_over_two_shards(client, ns, middle=1000)
    client.admin.command("split", ns, middle={"x": 10})
    db, name = ns.split(".", 1)
    coll = client.get_database(db, write_concern=MAJORITY)[name]
    return coll, donor, recipient


def move_in_background(coll: Any, ns: str, to: str) -> tuple[threading.Thread, list[Any]]:
    errors: list[Any] = []

    def run() -> None:
        try:
            coll.database.client.admin.command("moveChunk", ns, find={"x": 0}, to=to)
        except pymongo.errors.PyMongoError as exc:
            errors.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def move_held_at(coll: Any, ns: str, to: str, primary: str, step: str
                 ) -> tuple[threading.Thread, list[Any]]:
    """Fail point ``step`` on the donor's ``primary``, then :func:`move_in_background` of
    ``ns``'s ``[MinKey, 10)`` to ``to``; returns once the migration has reached ``step``."""
    fail_point(primary, step, "alwaysOn")
    thread, errors = move_in_background(coll, ns, to)
    wait_for(lambda: fail_point(primary, step, "alwaysOn") > 0, what=f"{step} on the donor")
    return thread, errors


def settled(cluster: ShardedCluster) -> bool:
    """No coordinator document or range-deletion task on any shard's primary."""
    for shard in cluster.shard_names:
        with direct(cluster.primary_of(shard)) as d:
            if d.config.migrationCoordinators.count_documents({}) or \
                    d.config.rangeDeletions.count_documents({}):
                return False
    return True


def check_placement(cluster: ShardedCluster, ns: str, stream: Stream, want: list[int]) -> str:
    """Every document ``_id`` of ``want`` once in the cluster, on the owner of its chunk by
    ``config.chunks`` (read on each shard's primary); then an ``$inc`` on each through the
    router, and the stream shows each insert and each update exactly once. Returns the owner
    of ``[MinKey, 10)``."""
    client = cluster.client()
    db, name = ns.split(".", 1)
    uuid = client.config.collections.find_one({"_id": ns})["uuid"]
    owner = client.config.chunks.find_one({"uuid": uuid, "max": {"x": 10}})["shard"]
    seen: dict[int, str] = {}
    for shard in cluster.shard_names:
        with direct(cluster.primary_of(shard)) as d:
            for doc in d[db][name].find({}):
                assert doc["_id"] not in seen, f"{doc['_id']} on {seen[doc['_id']]} and {shard}"
                seen[doc["_id"]] = shard
                expected = owner if doc["x"] < 10 else \
                    client.config.chunks.find_one({"uuid": uuid, "max": {"x": 1000}})["shard"]
                assert shard == expected, f"{shard} keeps {doc} of {expected}'s chunk"
    assert sorted(seen) == sorted(want)
    coll = client.get_database(db, write_concern=MAJORITY)[name]
    for x in want:
        coll.update_one({"_id": x}, {"$inc": {"n": 1}})
    events = stream.events(2 * len(want))
    keys = [(e["operationType"], e["documentKey"]["_id"]) for e in events]
    assert sorted(keys) == sorted([("insert", x) for x in want] + [("update", x) for x in want])
    assert stream.events(1, timeout=1.0) == []  # nothing of the clean-up, no duplicate
    return owner


def test_the_donor_drives_the_migration_and_keeps_its_coordinator_document(
        cluster: ShardedCluster) -> None:
    """At ``moveChunkHangAtStep4`` (cloned, caught up) the coordinator document is on the
    donor's primary and a majority of its members (replicated before the clone), with its
    range and both shards, and on no config server member; after the migration it is gone
    everywhere, the donor wrote ``moveChunk.commit`` to the config server's changelog with
    the documents it cloned, and the range is on the recipient only."""
    ns = "dm.a"
    coll, donor, recipient = setup(cluster, ns)
    stream = Stream(coll)
    coll.insert_many([{"_id": x, "x": x} for x in range(N)])
    primary = cluster.primary_of(donor)
    thread, errors = move_held_at(coll, ns, recipient, primary, "moveChunkHangAtStep4")
    docs = coordinators(cluster, primary)
    assert len(docs) == 1
    doc = docs[0]
    assert (doc["nss"], doc["donorShardId"], doc["recipientShardId"]) == (ns, donor, recipient)
    assert doc["range"]["max"] == {"x": 10} and "decision" not in doc
    holders = [h for h in cluster.members_of(donor) if coordinators(cluster, h)]
    assert len(holders) >= 2  # written w: majority before anything was cloned
    for host in cluster.members_of("config"):
        assert coordinators(cluster, host) == []
    fail_point(primary, "moveChunkHangAtStep4", "off")
    thread.join(30)
    assert not thread.is_alive() and errors == []
    wait_for(lambda: all(coordinators(cluster, h) == [] for h in cluster.members_of(donor)),
             what="the coordinator document deleted on every donor member")
    assert settled(cluster)
    log = cluster.client().config.changelog.find_one({"what": "moveChunk.commit", "ns": ns,
                                                      "details.max": {"x": 10}})
    assert log["details"]["from"] == donor and log["details"]["to"] == recipient
    assert log["details"]["counts"]["cloned"] == 10
    assert check_placement(cluster, ns, stream, list(range(N))) == recipient


@pytest.mark.parametrize("fault,step", [("kill", "moveChunkHangAtStep5"),
                                        ("stepdown", "moveChunkHangAtStep4")])
def test_a_new_donor_primary_aborts_a_migration_interrupted_before_its_commit(
        cluster: ShardedCluster, fault: str, step: str) -> None:
    """The donor's primary killed in its critical section (or stepped down after the
    catch-up): the moveChunk fails, the new primary finds the coordinator document, reads
    the decision from a refresh (the range is still the donor's: aborted), releases the
    recipient, which deletes its clone, and deletes the document; the donor's writes go on.
    Before deciding, the new primary fenced off the commit (the chunk's version bumped): the
    commit the old primary might still have in flight is refused when it arrives late."""
    ns = f"dm.{fault}"
    coll, donor, recipient = setup(cluster, ns)
    stream = Stream(coll)
    config = cluster.client().config
    uuid = config.collections.find_one({"_id": ns})["uuid"]
    before = config.chunks.find_one({"uuid": uuid, "max": {"x": 10}})
    coll.insert_many([{"_id": x, "x": x} for x in range(N)])
    primary = cluster.primary_of(donor)
    thread, errors = move_held_at(coll, ns, recipient, primary, step)
    with direct(cluster.primary_of(recipient)) as r:  # the recipient holds the clone
        assert r.dm[fault].count_documents({"x": {"$lt": 10}}) == 10
    if fault == "kill":
        cluster.kill_primary(donor)
    else:
        cluster.step_down(donor)
    thread.join(30)
    assert not thread.is_alive() and len(errors) == 1
    assert cluster.primary_of(donor) != primary or fault == "stepdown"
    wait_for(lambda: settled(cluster), what="the migration completed by the new donor primary")
    after = config.chunks.find_one({"uuid": uuid, "max": {"x": 10}})
    assert after["shard"] == donor and after["lastmod"].time > before["lastmod"].time
    late_commit_is_refused(cluster, ns, before, donor, recipient)
    coll.insert_one({"_id": N, "x": 5})  # the donor takes writes of the range again
    assert check_placement(cluster, ns, stream, list(range(N + 1))) == donor


def test_a_new_donor_primary_holds_the_critical_section_until_it_has_decided(
        cluster: ShardedCluster) -> None:
    """The donor's primary killed in its critical section: the section was persisted
    (``config.collectionCriticalSections``, majority-committed on the donor and on the
    recipient), so the next donor primary holds it from its step-up (a routed write of the
    collection cannot land on the donor while a late commit could still give the range away)
    until its completion has decided; here the decision waits because the config server does
    not answer the fencing (failCommand with ShutdownInProgress, 91); once it answers, every
    member's section and document are gone and writes go on."""
    ns = "dm.hold"
    coll, donor, recipient = setup(cluster, ns)
    stream = Stream(coll)
    coll.insert_many([{"_id": x, "x": x} for x in range(N)])
    primary = cluster.primary_of(donor)
    thread, errors = move_held_at(coll, ns, recipient, primary, "moveChunkHangAtStep5")

    def sections(host: str) -> list[dict[str, Any]]:
        c = cluster.member_node(host).storage.get("config", "collectionCriticalSections")
        return [] if c is None else list(c.docs.values())
    holders = [h for h in cluster.members_of(donor) if sections(h)]
    assert len(holders) >= 2 and sections(primary)[0]["_id"] == ns  # majority-committed
    with direct(cluster.primary_of("config")) as c:
        c.admin.command("configureFailPoint", "failCommand", mode="alwaysOn", data={
            "failCommands": ["_configsvrEnsureChunkVersionIsGreaterThan"],
            "errorCode": 91, "failInternalCommands": True})
    try:
        cluster.kill_primary(donor)
        thread.join(30)
        assert not thread.is_alive() and len(errors) == 1
        new = cluster.primary_of(donor)
        wait_for(lambda: cluster.member_node(new).repl.writable, what="the new donor primary")
        assert ns in cluster.member_node(new).sharding.critical  # held from its step-up
        assert [d["_id"] for d in sections(new)] == [ns]
    finally:
        with direct(cluster.primary_of("config")) as c:
            c.admin.command("configureFailPoint", "failCommand", mode="off")
    wait_for(lambda: settled(cluster), what="the migration completed by the new donor primary")
    for shard in (donor, recipient):
        for host in cluster.members_of(shard):
            if host == primary:
                continue  # killed
            wait_for(lambda host=host: sections(host) == [], what=f"{host}'s section document")
            assert ns not in cluster.member_node(host).sharding.critical
    coll.insert_one({"_id": N, "x": 5})
    assert check_placement(cluster, ns, stream, list(range(N + 1))) == donor


def late_commit_is_refused(cluster: ShardedCluster, ns: str, chunk: dict[str, Any], donor: str,
                           to: str) -> None:
    """The commit an earlier donor primary sent for ``chunk`` (its ``config.chunks`` document
    before the migration), arriving now: ConflictingOperationInProgress (117), nothing moved."""
    epoch = cluster.client().config.collections.find_one({"_id": ns})["lastmodEpoch"]
    with direct(cluster.primary_of("config")) as c:
        with pytest.raises(pymongo.errors.OperationFailure) as err:
            c.admin.command({"_configsvrCommitChunkMigration": ns, "fromShard": donor,
                             "toShard": to, "migratedChunk": {
                                 "min": chunk["min"], "max": chunk["max"],
                                 "lastmod": chunk["lastmod"]},
                             "fromShardCollectionVersion": {"e": epoch, "t": chunk["lastmod"],
                                                            "v": chunk["lastmod"]}})
    assert err.value.code == 117 and "Rejecting migration request because the version of the " \
        "requested chunk" in str(err.value), err.value
    now = cluster.client().config.chunks.find_one({"_id": chunk["_id"]})
    assert now["shard"] == donor


def test_the_fencing_bumps_only_a_chunk_at_or_below_the_given_version(
        cluster: ShardedCluster) -> None:
    """``_configsvrEnsureChunkVersionIsGreaterThan`` (as a new donor primary sends it): the
    chunk at the given version gets the collection's major + 1; a second call with the old
    version, a range that is no chunk, or another epoch changes nothing; a commit carrying the
    old version is then refused, one without a version (an older donor) is not checked."""
    ns = "dm.fence"
    setup(cluster, ns)
    config = cluster.client().config
    entry = config.collections.find_one({"_id": ns})
    chunks = list(config.chunks.find({"uuid": entry["uuid"]}))
    chunk = next(d for d in chunks if d["max"] == {"x": 10})
    top = max(d["lastmod"].time for d in chunks)

    def ensure(lo: dict, hi: dict, v: Any, e: Any = entry["lastmodEpoch"]) -> None:
        with direct(cluster.primary_of("config")) as c:
            c.admin.command({"_configsvrEnsureChunkVersionIsGreaterThan": 1, "minKey": lo,
                             "maxKey": hi, "version": {"e": e, "t": entry["timestamp"], "v": v},
                             "collectionUUID": entry["uuid"], "nss": ns})

    def versions() -> dict[Any, Any]:
        return {d["_id"]: d["lastmod"] for d in config.chunks.find({"uuid": entry["uuid"]})}

    ensure(chunk["min"], chunk["max"], chunk["lastmod"])
    bumped = versions()
    assert bumped[chunk["_id"]].time == top + 1 and bumped[chunk["_id"]].inc == 0
    assert {k: v for k, v in bumped.items() if k != chunk["_id"]} == \
        {d["_id"]: d["lastmod"] for d in chunks if d["_id"] != chunk["_id"]}
    ensure(chunk["min"], chunk["max"], chunk["lastmod"])  # already greater
    ensure({"x": 3}, chunk["max"], bumped[chunk["_id"]])  # not a chunk
    ensure(chunk["min"], chunk["max"], bumped[chunk["_id"]], e=ObjectId())  # another epoch
    assert versions() == bumped
    donor = chunk["shard"]
    to = next(s for s in cluster.shard_names if s != donor)
    late_commit_is_refused(cluster, ns, chunk, donor, to)
    with direct(cluster.primary_of("config")) as c:
        with pytest.raises(pymongo.errors.OperationFailure) as err:
            c.admin.command({"_configsvrEnsureChunkVersionIsGreaterThan": 1,
                             "minKey": chunk["min"], "maxKey": chunk["max"]})
    assert err.value.code == 40414


def test_a_new_donor_primary_finishes_a_committed_migration_and_filters_its_orphans(
        cluster: ShardedCluster) -> None:
    """The donor's primary killed after the commit (``moveChunkHangAtStep6``, set on every
    member): the new primary decides ``committed`` from a refresh and stops at the same fail
    point before its range deletion; meanwhile a routed read returns each document once (the
    orphans it still holds are filtered by its refreshed metadata); released, it deletes them."""
    ns = "dm.c"
    coll, donor, recipient = setup(cluster, ns)
    stream = Stream(coll)
    coll.insert_many([{"_id": x, "x": x} for x in range(N)])
    primary = cluster.primary_of(donor)
    for host in cluster.members_of(donor):
        fail_point(host, "moveChunkHangAtStep6", "alwaysOn")
    thread, errors = move_in_background(coll, ns, recipient)
    wait_for(lambda: fail_point(primary, "moveChunkHangAtStep6", "alwaysOn") > 0,
             what="moveChunkHangAtStep6")
    cluster.kill_primary(donor)
    thread.join(30)
    assert not thread.is_alive()
    new = cluster.primary_of(donor)
    assert new != primary
    wait_for(lambda: fail_point(new, "moveChunkHangAtStep6", "alwaysOn") > 0,
             what="the new primary's completion at moveChunkHangAtStep6")
    with direct(new) as d:  # the orphans are still there
        assert d.dm.c.count_documents({"x": {"$lt": 10}}) == 10
    got = sorted(d["_id"] for d in coll.find({}))
    assert got == list(range(N))  # each once: the new primary filtered its orphans
    fail_point(new, "moveChunkHangAtStep6", "off")
    wait_for(lambda: settled(cluster), what="the range deletion")
    assert check_placement(cluster, ns, stream, list(range(N))) == recipient


@pytest.mark.parametrize("fault", ["kill", "stepdown"])
def test_the_donor_decides_from_a_refresh_when_the_commit_reply_is_lost(
        cluster: ShardedCluster, fault: str) -> None:
    """The commit ran on the config server but its reply is lost
    (``migrationCommitNetworkError``), and the config primary fails over before the donor
    looks (``hangBeforePostMigrationCommitRefresh``): the donor refreshes from the new config
    primary, finds the range on the recipient and completes the migration as committed."""
    ns = f"dm.lost{fault}"
    coll, donor, recipient = setup(cluster, ns)
    stream = Stream(coll)
    coll.insert_many([{"_id": x, "x": x} for x in range(N)])
    primary = cluster.primary_of(donor)
    fail_point(primary, "migrationCommitNetworkError", "alwaysOn")
    fail_point(primary, "hangBeforePostMigrationCommitRefresh", "alwaysOn")
    thread, errors = move_in_background(coll, ns, recipient)
    wait_for(lambda: fail_point(primary, "hangBeforePostMigrationCommitRefresh",
                                "alwaysOn") > 0, what="the lost commit reply")
    if fault == "kill":
        cluster.kill_primary("config")
    else:
        cluster.step_down("config")
    fail_point(primary, "migrationCommitNetworkError", "off")
    fail_point(primary, "hangBeforePostMigrationCommitRefresh", "off")
    thread.join(60)
    assert not thread.is_alive()
    wait_for(lambda: settled(cluster), what="the migration completed by the donor")
    assert check_placement(cluster, ns, stream, list(range(N))) == recipient


def test_a_recipient_that_does_not_answer_leaves_the_completion_to_the_background(
        tmp_path) -> None:
    """A durable one-member recipient killed after the clone (the donor's
    ``moveChunkHangAtStep3``): the catch-up fails, the donor persists ``aborted`` but cannot
    reach the recipient to finish, so moveChunk fails with the coordinator document still on
    the donor; once the recipient is back, the donor's background completion has it delete
    its clone, and the document goes."""
    ns = "dm.gone"
    with ShardedCluster(shards=2, durable=True, dbpath=str(tmp_path)) as cluster:
        coll, donor, recipient = setup(cluster, ns)
        stream = Stream(coll)
        coll.insert_many([{"_id": x, "x": x} for x in range(N)])
        primary = cluster.primary_of(donor)
        thread, errors = move_held_at(coll, ns, recipient, primary, "moveChunkHangAtStep3")
        cluster.kill_shard(recipient)
        fail_point(primary, "moveChunkHangAtStep3", "off")
        thread.join(90)
        assert not thread.is_alive() and len(errors) == 1
        docs = coordinators(cluster, primary)
        assert [d.get("decision") for d in docs] == ["aborted"]
        cluster.restart_shard(recipient)
        wait_for(lambda: settled(cluster), what="the background completion")
        assert check_placement(cluster, ns, stream, list(range(N))) == donor
