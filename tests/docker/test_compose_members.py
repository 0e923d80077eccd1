"""deploy/docker-compose.members.yml (`make up MEMBERS=3`): the sharded cluster on replica-set
shards, every member its own container reached by its service name, and a member cut off the
network with `docker network disconnect` while a change stream runs through the router.

One compose project for the module (unique name ``shardsim-test-<random>``, the router and all
six members published on free loopback ports, 1 s election timeouts), always taken down with
``down -v``, pass or fail. The image is the session's (``shardsim_image`` in conftest.py, built
once for every compose test). The tests run in file order and skip only when there is no usable
Docker engine.

This file also covers what the plain replica set of deploy/docker-compose.replset.yml was tested
for (election by service name, a ``w: majority`` write on every member, each member answering
on its published port, a restarted initiating member not initiating again), on the sets of the
sharded cluster, so that file needs no bring-up of its own (its config is still checked here).
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any, Iterator

import pymongo
import pytest
from pymongo.errors import DuplicateKeyError, PyMongoError

from conftest import ROOT, ComposeCluster, compose_command, docker_unavailable, running
from shardsim.tools.procs import free_port

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

MEMBERS_FILE = ROOT / "deploy" / "docker-compose.members.yml"
REPLSET_FILE = ROOT / "deploy" / "docker-compose.replset.yml"
SETS = {s: [s, f"{s}-1", f"{s}-2"] for s in ("shard0", "shard1")}
MEMBERS = [m for ms in SETS.values() for m in ms]
MAJORITY = pymongo.WriteConcern("majority", wtimeout=20000)


class MembersCompose(ComposeCluster):
    """A compose project of deploy/docker-compose.members.yml: the router on ``port``, each
    member on its own free loopback port (``member_port[service]``), 1 s election timeouts and
    200 ms heartbeats (a test sees a new primary within a few seconds)."""

    def __init__(self) -> None:
        self.member_port = {m: free_port() for m in MEMBERS}
        env = {"SHARDSIM_ELECTION_TIMEOUT_MS": "1000", "SHARDSIM_HEARTBEAT_INTERVAL_MS": "200",
               "SHARDSIM_HEARTBEAT_TIMEOUT_MS": "2000"}
        for s, members in SETS.items():
            for i, m in enumerate(members):
                env[f"SHARDSIM_{s.upper()}_PORT{i}"] = str(self.member_port[m])
        super().__init__(free_port(), env=env)
        self._cmd = self._cmd[:self._cmd.index("-f")] + ["-f", str(MEMBERS_FILE)]

    def member(self, service: str, **kw: Any) -> pymongo.MongoClient:
        """A direct connection from the host to one member (its published port)."""
        opts = {"serverSelectionTimeoutMS": 5000, "connectTimeoutMS": 3000,
                "socketTimeoutMS": 10000, **kw}
        return pymongo.MongoClient("127.0.0.1", self.member_port[service], directConnection=True,
                                   **opts)

    def hello(self, service: str) -> dict | None:
        """``hello`` of one member, None when it does not answer."""
        try:
            with self.member(service, serverSelectionTimeoutMS=2000) as c:
                return c.admin.command("hello")
        except PyMongoError:
            return None

    def primary_of(self, set_name: str, timeout_s: float = 60, not_: str | None = None) -> str:
        """The service name of ``set_name``'s writable primary (other than ``not_``), waiting."""
        deadline = time.monotonic() + timeout_s
        while True:
            for m in SETS[set_name]:
                if m == not_:
                    continue
                h = self.hello(m)
                if h and h.get("isWritablePrimary"):
                    return m
            if time.monotonic() > deadline:
                raise AssertionError(f"no primary in {set_name} after {timeout_s}s:\n{self.logs()}")
            time.sleep(0.2)

    def member_ids(self, service: str, db: str, coll: str) -> list[Any]:
        """The ``_id``s of ``db.coll`` on one member, in _id order (read on that member)."""
        with self.member(service, readPreference="secondaryPreferred") as c:
            return [d["_id"] for d in c[db][coll].find({}, {"_id": 1}).sort("_id", 1)]

    def oplog_count(self, service: str, query: dict) -> int:
        with self.member(service, readPreference="secondaryPreferred") as c:
            return c.local["oplog.rs"].count_documents(query)

    def network(self, service: str) -> str:
        """The compose network ``service``'s container is attached to."""
        nets = self.inspect(self.container(service))["NetworkSettings"]["Networks"]
        assert len(nets) == 1, nets
        return next(iter(nets))

    def up(self, timeout_s: float = 240) -> None:
        """``up -d``; init has added both sets; each set has a primary."""
        super().up(timeout_s)
        for s in SETS:
            self.primary_of(s, timeout_s)


@pytest.fixture(scope="module")
def members(shardsim_image: str) -> Iterator[MembersCompose]:
    yield from running(MembersCompose())


def router_client(c: MembersCompose) -> pymongo.MongoClient:
    return pymongo.MongoClient(c.uri, serverSelectionTimeoutMS=20000, connectTimeoutMS=5000,
                               socketTimeoutMS=60000)


def wait_for(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.5)


def test_router_lists_every_member_and_each_set_elects_by_service_name(members) -> None:
    """listShards names every member by service name; every member answers on its published
    port with its set's ``hosts``; one primary per set; each member's oplog has the set's
    'initiating set' entry once; a ``w: majority`` write through the router is on every member
    of its shard (the replica-set checks of test_compose_replset.py, on the cluster's sets)."""
    c = members
    with router_client(c) as client:
        assert client.admin.command("hello")["msg"] == "isdbgrid"
        shards = {s["_id"]: s["host"] for s in client.admin.command("listShards")["shards"]}
        assert shards == {s: f"{s}/" + ",".join(f"{m}:27017" for m in ms)
                          for s, ms in SETS.items()}
        db = client.get_database("plain", write_concern=MAJORITY)
        db.c.insert_one({"_id": 1})
        home = client.config.databases.find_one({"_id": "plain"})["primary"]
    for s, ms in SETS.items():
        hellos = {m: c.hello(m) for m in ms}
        assert all(h and h["setName"] == s and h["hosts"] == [f"{x}:27017" for x in ms]
                   for h in hellos.values()), hellos
        assert sum(bool(h["isWritablePrimary"]) for h in hellos.values()) == 1, hellos
        for m in ms:
            assert c.oplog_count(m, {"o.msg": "initiating set"}) == 1, m
    # A replicaSet= client inside the compose network finds the set by its service names.
    uri = "mongodb://" + ",".join(f"{m}:27017" for m in SETS["shard1"]) + "/?replicaSet=shard1"
    r = c.exec("shard1-2", "python", "-c", "import pymongo; c = pymongo.MongoClient(%r, "
               "serverSelectionTimeoutMS=30000); c.admin.command('ping'); "
               "print('%%s:%%d' %% c.primary)" % uri, timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in [f"{m}:27017" for m in SETS["shard1"]]
    # w: majority is on a majority at once, and on every member soon after.
    for m in SETS[home]:
        wait_for(lambda: c.member_ids(m, "plain", "c") == [1], 30, f"the write on {m}")
        assert c.oplog_count(m, {"op": "i", "ns": "plain.c"}) == 1


def test_replset_compose_file_is_valid() -> None:
    """deploy/docker-compose.replset.yml (the plain set) still parses with its three members;
    its behaviour is the sets' above."""
    reason = docker_unavailable()
    if reason:
        pytest.skip(f"no usable Docker engine: {reason}")
    r = subprocess.run([*compose_command(), "-f", str(REPLSET_FILE), "config", "--services"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["rs0", "rs0-1", "rs0-2"]


# Run inside the cut-off primary's container: w: 1 inserts straight to it (localhost), one
# line per acknowledged _id, until it is no longer primary or ``secs`` pass. The first error
# ends it: "ERR <_id> <exception> <code> <message>". That insert's outcome is unknown: pymongo
# retries a write once, so a first attempt that was applied but whose reply was late (over the
# 3 s socket timeout on a loaded machine) shows as the retry's NotWritablePrimary, exactly as
# against mongod: the retry's error does not tell whether the first attempt was applied.
W1_WRITER = """
import sys, time, pymongo
c = pymongo.MongoClient("127.0.0.1", 27017, directConnection=True, w=1,
                        serverSelectionTimeoutMS=2000, socketTimeoutMS=3000)
coll = c.partition.c
deadline = time.monotonic() + %(secs)f
i = 0
while time.monotonic() < deadline:
    key = "w1-%(attempt)d-%%05d" %% i
    try:
        coll.insert_one({"_id": key})
    except pymongo.errors.PyMongoError as exc:
        details = getattr(exc, "details", None)
        code = getattr(exc, "code", None) or (details.get("code") if isinstance(details, dict) else None)
        print("ERR", key, type(exc).__name__, code, str(exc)[:200], flush=True)
        break
    print("ACK", key, flush=True)
    i += 1
    time.sleep(0.02)
"""


class StreamReader(threading.Thread):
    """Reads a router change stream (pymongo resumes it on resumable errors) into ``events``
    until ``stop`` is set."""

    def __init__(self, coll: Any) -> None:
        super().__init__(daemon=True)
        self.coll = coll
        self.events: list[dict] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.opened = threading.Event()

    def run(self) -> None:
        try:
            with self.coll.watch(max_await_time_ms=500) as stream:
                self.opened.set()
                while not self.stop.is_set():
                    ev = stream.try_next()
                    if ev is not None:
                        self.events.append(ev)
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.opened.set()

    def ids(self) -> list[Any]:
        return [e["documentKey"]["_id"] for e in self.events]


def insert_acked(coll: Any, doc: dict, timeout_s: float = 120) -> None:
    """Insert ``doc`` with the collection's ``w: majority`` until it is acknowledged: a
    failure (no primary yet, a cut link) is retried; DuplicateKeyError on a retry means an
    earlier attempt was applied and majority-committed (the unique index on the new primary)."""
    deadline = time.monotonic() + timeout_s
    first = True
    while True:
        try:
            coll.insert_one(doc)
            return
        except DuplicateKeyError:
            if first:
                raise
            return
        except PyMongoError:
            if time.monotonic() > deadline:
                raise
            first = False
            time.sleep(0.5)


def test_cut_off_primary_stream_delivers_every_acknowledged_write_once_in_order(members) -> None:
    """2 shards x 3 members; a change stream through the router on a collection split over both
    shards; ``w: majority`` writes through the router on both shards. The primary of one shard
    is cut off with `docker network disconnect` while w: 1 writes go straight to it; another
    member is elected; writes through the router continue; the link comes back (`docker network
    connect` with its service-name alias) and the old primary rejoins as a secondary, rolling
    back its w: 1 writes that no majority had. Then: the stream delivered every write that is on
    the cluster exactly once, in write order per shard; every majority-acknowledged write is on
    every member; a rolled-back w: 1 write is on no member and never in the stream (and the
    old primary saved it in its rollback directory)."""
    c = members
    with router_client(c) as client:
        client.admin.command("enableSharding", "partition")
        home = client.config.databases.find_one({"_id": "partition"})["primary"]
        other = next(s for s in SETS if s != home)
        client.admin.command("shardCollection", "partition.c", key={"_id": 1})
        client.admin.command("split", "partition.c", middle={"_id": 0})
        # _id >= 0 (numbers, then every string: BSON order) on `other`, the shard we cut.
        client.admin.command("moveChunk", "partition.c", find={"_id": 0}, to=other,
                             _waitForDelete=True)
        coll = client.get_database("partition", write_concern=MAJORITY).c
        reader = StreamReader(client.partition.c)
        reader.start()
        assert reader.opened.wait(60) and reader.error is None, reader.error
        acked: list[int] = []

        def write(n: int) -> None:
            for _ in range(n):
                k = len(acked) // 2 + 1
                key = k if len(acked) % 2 else -k  # alternately on `home` and `other`
                insert_acked(coll, {"_id": key})
                acked.append(key)

        write(20)
        earlier: list[str] = []  # an earlier writer's failed first insert: applied or not
        for attempt in range(5):
            # (On a loaded machine an election may come between finding the primary and the
            # writer's first insert: then find it again.)
            old = c.primary_of(other)
            cid, net = c.container(old), c.network(old)
            writer = subprocess.Popen(["docker", "exec", cid, "python", "-c",
                                       W1_WRITER % {"secs": 30, "attempt": attempt}],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            first = writer.stdout.readline()
            if first.startswith("ACK"):
                break
            if first.startswith("ERR"):
                earlier.append(first.split()[1])
            writer.communicate(timeout=60)
        assert first.startswith("ACK"), first + writer.stderr.read()
        subprocess.run(["docker", "network", "disconnect", net, cid], check=True, timeout=60)
        try:
            new = c.primary_of(other, timeout_s=60, not_=old)
            write(20)  # the router finds the new primary of `other`
        finally:
            out, err = writer.communicate(timeout=60)
            subprocess.run(["docker", "network", "connect", "--alias", old, net, cid],
                           check=True, timeout=60)
        w1 = [first.split()[1]] + [line.split()[1] for line in out.splitlines()
                                   if line.startswith("ACK")]
        # The isolated primary stepped down by itself (it cannot see a majority): its local
        # writer got NotWritablePrimary (10107) or InterruptedDueToReplStateChange (11602).
        stop = [line for line in out.splitlines() if line.startswith("ERR")]
        assert stop and stop[0].split()[2:4] in (["NotPrimaryError", "10107"],
                                                 ["NotPrimaryError", "11602"],
                                                 ["OperationFailure", "10107"],
                                                 ["OperationFailure", "11602"]), out + err
        wait_for(lambda: (h := c.hello(old)) is not None and h.get("secondary") is True, 180,
                 f"{old} back as a secondary")
        write(20)

        # Every member of each shard ends with the same documents.
        final: dict[str, list[Any]] = {}
        for s, ms in SETS.items():
            def converged(s: str = s, ms: list[str] = ms) -> bool:
                try:
                    got = [c.member_ids(m, "partition", "c") for m in ms]
                except (pymongo.errors.NotPrimaryError, pymongo.errors.AutoReconnect):
                    # a member in ROLLBACK or RECOVERING answers 13436, as mongod: not yet
                    return False
                final[s] = got[0]
                return all(g == got[0] for g in got)
            wait_for(converged, 180, f"every member of {s} with the same documents")
        on_cluster = final[home] + final[other]
        # No majority-acknowledged write lost or rolled back; nothing that was not written (the
        # writer's last insert, answered with an error, may or may not have been applied).
        last = stop[0].split()[1]
        assert set(acked) <= set(on_cluster)
        assert set(on_cluster) - set(acked) <= set(w1) | set(earlier) | {last}, \
            (set(on_cluster) - set(acked), earlier, out)
        # Those that were applied take their place in write order: an earlier writer's before
        # the cut-off writer's inserts, its last one after them.
        w1 = [k for k in earlier if k in on_cluster] + w1 + ([last] if last in on_cluster else [])
        assert len(on_cluster) == len(set(on_cluster))
        rolled_back = [k for k in w1 if k not in on_cluster]
        wait_for(lambda: len(reader.events) >= len(on_cluster) or reader.error, 180,
                 "the stream to deliver every write on the cluster")
        time.sleep(2)  # nothing more may come
        reader.stop.set()
        reader.join(30)
    assert reader.error is None, reader.error
    got = reader.ids()
    assert sorted(got, key=repr) == sorted(on_cluster, key=repr), \
        (len(got), len(on_cluster), set(got) ^ set(on_cluster))
    assert len(got) == len(set(got)), "an event delivered twice"
    assert not set(rolled_back) & set(got)
    assert all(e["operationType"] == "insert" for e in reader.events)
    # Per shard, events in write order: the router's writes in the order acknowledged, the w: 1
    # writes in theirs.
    assert [k for k in got if isinstance(k, int) and k < 0] == [k for k in acked if k < 0]
    assert [k for k in got if isinstance(k, int) and k > 0] == [k for k in acked if k > 0]
    assert [k for k in got if isinstance(k, str)] == [k for k in w1 if k not in rolled_back]
    # A rollback leaves the undone documents in the old primary's rollback directory.
    if rolled_back:
        r = c.exec(old, "find", "/data/db/rollback", "-name", "removed.*.bson")
        assert r.returncode == 0 and r.stdout.strip(), (r.stdout, r.stderr)
    print(f"\n{old} cut off: {len(w1)} w:1 writes acknowledged, {len(rolled_back)} rolled back; "
          f"{len(acked)} w:majority writes, {len(got)} events; new primary {new}; {stop[0]}")


def test_restarted_initiating_member_does_not_initiate_again(members) -> None:
    """`restart` of the member that initiated the set holding database ``plain`` (shard0 or
    shard1): a primary again, a ``w: majority`` write through the router reaches every member's
    oplog, and each member still has exactly one 'initiating set' entry. (Oplogs, not
    documents: the interim applier keeps a secondary's applied documents in memory only;
    docs/replication.md.)"""
    c = members
    with router_client(c) as client:
        home = client.config.databases.find_one({"_id": "plain"})["primary"]
    c.compose("restart", "-t", "5", home, timeout=120)
    wait_for(lambda: c.hello(home) is not None, 240, f"{home} answering again")
    c.primary_of(home, timeout_s=120)
    with router_client(c) as client:
        insert_acked(client.get_database("plain", write_concern=MAJORITY).c, {"_id": 2})
    for m in SETS[home]:
        wait_for(lambda: c.oplog_count(m, {"op": "i", "ns": "plain.c"}) == 2, 60,
                 f"the write in {m}'s oplog")
        assert c.oplog_count(m, {"o.msg": "initiating set"}) == 1, m


def test_down_removes_containers_networks_and_volumes(members) -> None:
    """`down -v` leaves no container, network or volume of the project behind."""
    before = members.leftovers()
    # configsvr, 6 members, router, init
    assert len(before["containers"]) == 9 and before["volumes"] and before["networks"], before
    members.down()
    assert members.leftovers() == {"containers": [], "networks": [], "volumes": []}
