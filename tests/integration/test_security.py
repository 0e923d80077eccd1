"""Security against real processes: SCRAM-SHA-256/SHA-1 through the router and straight to a
shard, Unauthorized (13) for what a ``read`` user may not do (change streams included), signed
cluster time (a forged or unsigned future ``$clusterTime`` moves no clock), TLS-only clusters,
and the findings of the security audit (issue 28): no privilege escalation through
updateUser/createRole (S1, S2), no other user's credentials (S5), sessions bound to their user
(S3), no test-only commands by default (S4), checkMetadataConsistency for root (L3).
"""

from __future__ import annotations

import datetime
import os
from typing import Iterator

import pymongo
import pytest
from bson import Binary, Int64, Timestamp
from pymongo.errors import OperationFailure

from shardsim.tools.launcher import Cluster

ROOT = ("root", "rootpw")


@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[Cluster]:
    c = Cluster(shards=2, auth=ROOT)
    c.start()
    try:
        root = pymongo.MongoClient(c.router_uri, **c.client_options())
        root.admin.command("enableSharding", "sec")
        root.admin.command("shardCollection", "sec.orders", key={"_id": "hashed"})
        root.sec.orders.insert_many([{"_id": i} for i in range(10)])
        root.other.things.insert_one({"_id": 1})
        root.sec.command("createUser", "reader", pwd="readpw", roles=["read"])
        root.admin.command("createUser", "anyreader", pwd="anypw", roles=["readAnyDatabase"])
        root.sec.command("createUser", "secadmin", pwd="sapw", roles=["userAdmin"])
        root.close()
        yield c
    finally:
        c.stop()


def _client(c: Cluster, user: str, pwd: str, source: str, mech: str | None = None,
            **kw) -> pymongo.MongoClient:
    if mech:
        kw["authMechanism"] = mech
    return pymongo.MongoClient(c.router_uri, username=user, password=pwd, authSource=source,
                               serverSelectionTimeoutMS=10000, **kw)


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-1", None])
def test_scram_through_router(auth_cluster: Cluster, mech: str | None) -> None:
    with _client(auth_cluster, "reader", "readpw", "sec", mech) as cl:
        status = cl.sec.command("connectionStatus", showPrivileges=True)["authInfo"]
        assert status["authenticatedUsers"] == [{"user": "reader", "db": "sec"}]
        assert status["authenticatedUserRoles"] == [{"role": "read", "db": "sec"}]
        privs = {(p["resource"]["db"], p["resource"]["collection"]): p["actions"]
                 for p in status["authenticatedUserPrivileges"]}
        assert "changeStream" in privs[("sec", "")] and "insert" not in privs[("sec", "")]
        assert sorted(d["_id"] for d in cl.sec.orders.find()) == list(range(10))


def test_wrong_password_and_unknown_user_give_18(auth_cluster: Cluster) -> None:
    for user, pwd in (("reader", "nope"), ("nobody", "x")):
        with _client(auth_cluster, user, pwd, "sec") as cl:
            with pytest.raises(OperationFailure) as info:
                cl.sec.command("ping")
            assert info.value.code == 18
            assert info.value.details["errmsg"] == "Authentication failed."


def test_unauthenticated_client(auth_cluster: Cluster) -> None:
    with pymongo.MongoClient(auth_cluster.router_uri) as cl:
        assert cl.admin.command("ping")["ok"] == 1.0  # requiresAuth() == false
        assert cl.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"] == []
        with pytest.raises(OperationFailure) as info:
            cl.sec.orders.find_one()
        assert info.value.code == 13
        assert info.value.details["errmsg"] == "Command find requires authentication"
        with pytest.raises(OperationFailure) as info:  # no localhost exception once users exist
            cl.admin.command("createUser", "sneaky", pwd="x", roles=["root"])
        assert info.value.code == 13


def test_read_user_privileges_and_change_streams(auth_cluster: Cluster) -> None:
    with _client(auth_cluster, "reader", "readpw", "sec") as cl:
        with cl.sec.orders.watch(full_document="updateLookup") as cs:
            assert cs.try_next() is None
        with cl.sec.watch() as cs:  # a whole-database stream of the user's database
            assert cs.try_next() is None
        denied = [
            lambda: cl.other.things.find_one(),
            lambda: cl.other.things.watch().close(),
            lambda: cl.other.watch().close(),
            lambda: cl.watch().close(),  # the whole cluster needs any normal resource
            lambda: cl.sec.orders.insert_one({"_id": 100}),
            lambda: cl.sec.orders.delete_many({}),
            lambda: cl.sec.orders.update_one({"_id": 1}, {"$set": {"x": 1}}),
            lambda: cl.other.things.insert_one({"_id": 2}),
            lambda: cl.admin.command("listShards"),
            lambda: cl.admin.command("addShard", "127.0.0.1:1"),
        ]
        for op in denied:
            with pytest.raises(OperationFailure) as info:
                op()
            assert info.value.code == 13
            assert info.value.details["errmsg"].startswith("not authorized on ")
        with pytest.raises(OperationFailure) as info:  # user_management_commands_common.cpp
            cl.sec.command("createUser", "x", pwd="y", roles=[])
        assert info.value.code == 13
        assert info.value.details["errmsg"] == "Not authorized to create users on db: sec"
    with _client(auth_cluster, "anyreader", "anypw", "admin") as cl:
        with cl.watch() as cs:  # readAnyDatabase: changeStream + find on any normal resource
            assert cs.try_next() is None
        with pytest.raises(OperationFailure) as info:
            cl.sec.orders.insert_one({"_id": 101})
        assert info.value.code == 13


def test_user_management(auth_cluster: Cluster) -> None:
    with pymongo.MongoClient(auth_cluster.router_uri, **auth_cluster.client_options()) as root:
        root.sec.command("createRole", "ordersWriter",
                         privileges=[{"resource": {"db": "sec", "collection": "orders"},
                                      "actions": ["insert"]}], roles=[])
        root.sec.command("createUser", "writer", pwd="wpw", roles=["read"])
        with pytest.raises(OperationFailure) as info:
            root.sec.command("createUser", "writer", pwd="wpw", roles=["read"])
        assert info.value.code == 51003
        with _client(auth_cluster, "writer", "wpw", "sec") as w:
            with pytest.raises(OperationFailure):
                w.sec.orders.insert_one({"_id": 200})
            root.sec.command("grantRolesToUser", "writer", roles=["ordersWriter"])
            w.sec.orders.insert_one({"_id": 200})  # the router dropped its user cache
            info_ = root.sec.command("usersInfo", "writer", showPrivileges=True)["users"][0]
            assert {"role": "ordersWriter", "db": "sec"} in info_["roles"]
            assert info_["mechanisms"] == ["SCRAM-SHA-1", "SCRAM-SHA-256"]
            # a user may look at itself without viewUser
            assert w.sec.command("usersInfo", "writer")["users"][0]["user"] == "writer"
            root.sec.command("revokeRolesFromUser", "writer", roles=["ordersWriter"])
            with pytest.raises(OperationFailure):
                w.sec.orders.insert_one({"_id": 201})
        roles = root.sec.command("rolesInfo", "ordersWriter", showPrivileges=True)["roles"]
        assert roles[0]["privileges"][0]["actions"] == ["insert"]
        root.sec.command("dropUser", "writer")
        with pytest.raises(OperationFailure) as info:
            root.sec.command("dropUser", "writer")
        assert info.value.code == 11


def _raw_command(c: Cluster, cmd: dict, user=("reader", "readpw", "sec")) -> dict:
    """Run ``cmd`` as-is (pymongo would replace our $clusterTime with its own)."""
    import socket
    import bson
    from shardsim.core import wire
    from shardsim.core.auth.scram import SCRAM_SHA_256, ClientConversation
    host, port = c.router.host, c.router.port
    s = socket.create_connection((host, port))

    def run(body):
        s.sendall(wire.encode_op_msg(bson.encode(body)))
        header = s.recv(16, socket.MSG_WAITALL)
        length = int.from_bytes(header[:4], "little")
        payload = s.recv(length - 16, socket.MSG_WAITALL)
        return bson.decode(payload[5:])

    try:
        conv = ClientConversation(SCRAM_SHA_256, user[0], user[1])
        first = run({"saslStart": 1, "mechanism": SCRAM_SHA_256, "payload": conv.first(),
                     "options": {"skipEmptyExchange": True}, "$db": user[2]})
        run({"saslContinue": 1, "conversationId": 1,
             "payload": conv.final(bytes(first["payload"])), "$db": user[2]})
        return run(cmd)
    finally:
        s.close()


def test_forged_cluster_time_moves_no_clock(auth_cluster: Cluster) -> None:
    future = Timestamp(int(datetime.datetime.now().timestamp()) + 10 * 365 * 86400, 1)
    forged = {"clusterTime": future, "signature": {"hash": Binary(os.urandom(20)),
                                                   "keyId": Int64(1)}}
    unsigned = {"clusterTime": future, "signature": {"hash": Binary(b"\0" * 20),
                                                     "keyId": Int64(0)}}
    reply = _raw_command(auth_cluster, {"find": "orders", "$db": "sec", "$clusterTime": forged})
    assert reply["ok"] == 0 and reply["code"] == 211
    reply = _raw_command(auth_cluster, {"find": "orders", "$db": "sec", "$clusterTime": unsigned})
    assert reply["code"] == 211 and "with id: 0" in reply["errmsg"]
    # a real key id with a wrong hash: TimeProofMismatch
    good = _raw_command(auth_cluster, {"ping": 1, "$db": "admin"})["$clusterTime"]
    wrong = {"clusterTime": future, "signature": {"hash": Binary(os.urandom(20)),
                                                  "keyId": good["signature"]["keyId"]}}
    reply = _raw_command(auth_cluster, {"find": "orders", "$db": "sec", "$clusterTime": wrong})
    assert reply["code"] == 204 and reply["codeName"] == "TimeProofMismatch"
    assert reply["errmsg"] == "Proof does not match the logical time"
    # no clock moved, no process died: the router and the shards still answer with today
    with pymongo.MongoClient(auth_cluster.router_uri, **auth_cluster.client_options()) as root:
        after = root.admin.command("ping")["$clusterTime"]["clusterTime"]
        assert after.time < future.time - 86400
        root.sec.orders.insert_one({"_id": 300})
    for proc in auth_cluster.processes:
        assert proc.proc.poll() is None
    # the router's own signed time goes back in fine
    reply = _raw_command(auth_cluster, {"find": "orders", "$db": "sec", "$clusterTime": good})
    assert reply["ok"] == 1.0


def test_scram_directly_to_a_shard(auth_cluster: Cluster) -> None:
    """A shard keeps its own users (created here through its localhost exception)."""
    shard = auth_cluster.shards[0]
    uri = f"mongodb://{shard.address}/?directConnection=true"
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000) as anon:
        anon.admin.command("createUser", "shardroot", pwd="spw", roles=["root"])
        with pytest.raises(OperationFailure) as info:
            anon.sec.orders.find_one()
        assert info.value.code == 13
    for mech in ("SCRAM-SHA-256", "SCRAM-SHA-1"):
        with pymongo.MongoClient(uri, username="shardroot", password="spw", authMechanism=mech,
                                 serverSelectionTimeoutMS=10000) as cl:
            assert cl.sec.orders.count_documents({}) > 0
    with pymongo.MongoClient(uri, username="shardroot", password="bad",
                             serverSelectionTimeoutMS=10000) as cl:
        with pytest.raises(OperationFailure) as info:
            cl.admin.command("ping")
        assert info.value.code == 18


def test_audit_no_privilege_escalation_through_user_admin(auth_cluster: Cluster) -> None:
    """S1, S2, S5: userAdmin on one database grants nothing outside it and sees no other
    database's users (user_management_commands_common.cpp)."""
    with _client(auth_cluster, "secadmin", "sapw", "sec") as ua:
        attempts = [
            lambda: ua.sec.command("updateUser", "secadmin",
                                   roles=[{"role": "root", "db": "admin"},
                                          {"role": "__system", "db": "admin"}]),
            lambda: ua.sec.command("createUser", "evil", pwd="e",
                                   roles=[{"role": "root", "db": "admin"}]),
            lambda: ua.sec.command("grantRolesToUser", "secadmin",
                                   roles=[{"role": "root", "db": "admin"}]),
            lambda: ua.sec.command("createRole", "god",
                                   privileges=[{"resource": {"anyResource": True},
                                                "actions": ["anyAction"]}], roles=[]),
            lambda: ua.sec.command("usersInfo", {"user": "root", "db": "admin"},
                                   showCredentials=True),
            lambda: ua.sec.command("rolesInfo", {"role": "root", "db": "admin"}),
        ]
        for op in attempts:
            with pytest.raises(OperationFailure) as info:
                op()
            assert info.value.code == 13, info.value.details
        status = ua.sec.command("connectionStatus")["authInfo"]
        assert status["authenticatedUserRoles"] == [{"role": "userAdmin", "db": "sec"}]
        # what userAdmin on sec may do, it does
        ua.sec.command("createRole", "secReader", roles=["read"],
                       privileges=[{"resource": {"db": "sec", "collection": ""},
                                    "actions": ["find"]}])
        ua.sec.command("grantRolesToUser", "secadmin", roles=["secReader"])
        assert ua.sec.command("usersInfo", 1)["users"]
        ua.sec.command("revokeRolesFromUser", "secadmin", roles=["secReader"])
        ua.sec.command("dropRole", "secReader")


def test_audit_no_test_commands_by_default(auth_cluster: Cluster) -> None:
    """S4: enableTestCommands is off unless asked for: configureFailPoint does not exist
    (CommandNotFound 59), for a read-only user and for root alike."""
    fp = {"configureFailPoint": "failCommand", "mode": "alwaysOn",
          "data": {"failCommands": ["insert", "find"], "errorCode": 2}}
    with _client(auth_cluster, "reader", "readpw", "sec") as cl:
        with pytest.raises(OperationFailure) as info:
            cl.admin.command(fp)
        assert info.value.code == 59 and info.value.details["codeName"] == "CommandNotFound"
    with pymongo.MongoClient(auth_cluster.router_uri, **auth_cluster.client_options()) as root:
        with pytest.raises(OperationFailure) as info:
            root.admin.command(fp)
        assert info.value.code == 59
        assert root.admin.command("getParameter", 1, enableTestCommands=1)[
            "enableTestCommands"] is False
        root.sec.orders.insert_one({"_id": 400})
        assert root.sec.orders.find_one({"_id": 400}) == {"_id": 400}


def test_audit_sessions_are_bound_to_their_user(auth_cluster: Cluster) -> None:
    """S3: one session id used by two users is two sessions (lsid.uid, on the router and on
    the shards); $listLocalSessions {allUsers} and another user's uid are refused."""
    import hashlib
    import uuid as uuid_mod
    lsid = {"id": Binary(uuid_mod.uuid4().bytes, 4)}
    root_user = ("root", "rootpw", "admin")

    def insert(doc_id: int, txn: int) -> dict:
        return _raw_command(auth_cluster, {"insert": "orders", "documents": [{"_id": doc_id}],
                                           "lsid": lsid, "txnNumber": Int64(txn),
                                           "$db": "sec"}, user=root_user)

    assert insert(500, 1)["ok"] == 1.0
    hijack = _raw_command(auth_cluster, {"find": "orders", "filter": {}, "lsid": lsid,
                                         "txnNumber": Int64(1000), "startTransaction": True,
                                         "autocommit": False, "$db": "sec"})
    assert hijack["ok"] == 1.0  # the reader's own session with the same id
    reply = insert(501, 2)  # root's retryable writes go on
    assert reply["ok"] == 1.0 and reply["n"] == 1, reply
    begin = _raw_command(auth_cluster, {"insert": "orders", "documents": [{"_id": 502}],
                                        "lsid": lsid, "txnNumber": Int64(3),
                                        "startTransaction": True, "autocommit": False,
                                        "$db": "sec"}, user=root_user)
    assert begin["ok"] == 1.0, begin
    # the commit needs the transaction's router: the same connection is not needed, the lsid is
    commit = _raw_command(auth_cluster, {"commitTransaction": 1, "lsid": lsid,
                                         "txnNumber": Int64(3), "autocommit": False,
                                         "$db": "admin"}, user=root_user)
    assert commit["ok"] == 1.0, commit
    root_uid = Binary(hashlib.sha256(b"root@admin").digest(), 0)
    spoof = _raw_command(auth_cluster, {"find": "orders", "filter": {}, "$db": "sec",
                                        "lsid": {**lsid, "uid": root_uid},
                                        "txnNumber": Int64(2000), "startTransaction": True,
                                        "autocommit": False})
    assert spoof["code"] == 13
    assert spoof["errmsg"] == "Unauthorized to set user digest in LogicalSessionId"
    listing = _raw_command(auth_cluster, {"aggregate": 1, "pipeline": [
        {"$listLocalSessions": {"allUsers": True}}], "cursor": {}, "$db": "admin"})
    assert listing["code"] == 13
    mine = _raw_command(auth_cluster, {"aggregate": 1, "pipeline": [{"$listLocalSessions": {}}],
                                       "cursor": {}, "$db": "admin"})
    assert mine["ok"] == 1.0
    with pymongo.MongoClient(auth_cluster.router_uri, **auth_cluster.client_options()) as root:
        ids = sorted(d["_id"] for d in root.sec.orders.find({"_id": {"$gte": 500}}))
        assert ids == [500, 501, 502]


def test_audit_root_checks_metadata_consistency(auth_cluster: Cluster) -> None:
    """L3: checkMetadataConsistency on a database needs the action on the cluster or that
    database (cluster_check_metadata_consistency_cmd.cpp); root has it on the cluster."""
    with pymongo.MongoClient(auth_cluster.router_uri, **auth_cluster.client_options()) as root:
        assert root.sec.command("checkMetadataConsistency")["ok"] == 1.0
        assert root.sec.command("checkMetadataConsistency", "orders")["ok"] == 1.0
    with _client(auth_cluster, "reader", "readpw", "sec") as cl:
        with pytest.raises(OperationFailure) as info:
            cl.sec.command("checkMetadataConsistency")
        assert info.value.code == 13
        assert info.value.details["errmsg"] == ("Not authorized to check metadata consistency "
                                                "for database sec")


def test_internal_user_authenticates_through_the_router_but_local_stays_refused(
        auth_cluster: Cluster) -> None:
    """A member's ``__system`` user authenticates against ``local`` (the key file's content as
    password, as the compose cluster's init does); every other command on ``local`` through the
    router is still IllegalOperation (20)."""
    with open(auth_cluster.key_file) as f:
        key = "".join(f.read().split())
    with _client(auth_cluster, "__system", key, "local") as cl:
        assert cl.admin.command("ping")["ok"] == 1
        with pytest.raises(pymongo.errors.OperationFailure) as err:
            cl.local.startup_log.find_one()
        assert err.value.code == 20
