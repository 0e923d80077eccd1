"""The compose cluster with authentication (deploy/docker-compose.auth.yml, `make up-auth`):
a key file made once and shared by the members, a root user from the official image's
MONGO_INITDB_ROOT_USERNAME / MONGO_INITDB_ROOT_PASSWORD variables."""

from __future__ import annotations

import secrets
from typing import Iterator

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from conftest import AUTH_COMPOSE_FILE, ComposeCluster, running
from shardsim.tools.procs import free_port

USER, PASSWORD = "admin", "s3cret-" + secrets.token_hex(4)


@pytest.fixture(scope="module")
def auth_cluster(shardsim_image: str) -> Iterator[ComposeCluster]:
    yield from running(ComposeCluster(free_port(), extra_files=(AUTH_COMPOSE_FILE,),
                                      env={"MONGO_INITDB_ROOT_USERNAME": USER,
                                           "MONGO_INITDB_ROOT_PASSWORD": PASSWORD}))


def _client(c: ComposeCluster, **kw) -> MongoClient:
    return MongoClient(c.uri, serverSelectionTimeoutMS=10000, **kw)


def test_root_user_from_environment_sees_three_shards_and_can_watch(auth_cluster):
    with _client(auth_cluster, username=USER, password=PASSWORD) as client:
        shards = client.admin.command("listShards")["shards"]
        assert sorted(s["_id"] for s in shards) == ["shard0", "shard1", "shard2"]
        status = client.admin.command("connectionStatus")["authInfo"]
        assert status["authenticatedUsers"] == [{"user": USER, "db": "admin"}]
        with client.shop.orders.watch() as stream:
            client.shop.orders.insert_one({"_id": 1})
            assert stream.next()["documentKey"] == {"_id": 1}


def test_anonymous_and_wrong_password_are_refused(auth_cluster):
    with _client(auth_cluster) as anon:
        with pytest.raises(OperationFailure) as err:
            anon.shop.orders.find_one()
        assert err.value.code == 13
    with _client(auth_cluster, username=USER, password="wrong") as bad:
        with pytest.raises(OperationFailure) as err:
            bad.admin.command("ping")
        assert err.value.code == 18


def test_members_share_one_key_file(auth_cluster):
    modes = {s: auth_cluster.exec(s, "stat", "-c", "%a", "/run/shardsim/keyfile").stdout.strip()
             for s in ("configsvr", "shard0", "router", "router2")}
    assert set(modes.values()) == {"400"}, modes
    keys = {auth_cluster.exec(s, "cat", "/run/shardsim/keyfile").stdout for s in ("shard1", "router")}
    assert len(keys) == 1 and len(next(iter(keys)).strip()) > 100
