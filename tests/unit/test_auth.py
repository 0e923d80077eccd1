"""Unit tests of shardsim.core.auth: the privilege table covers every command, built-in roles and
resource matching, SCRAM credentials, the cluster-time KeyRing."""

from __future__ import annotations

import asyncio

import pytest
from bson import Binary, Int64, Timestamp

from shardsim.core.auth import privileges, roles
from shardsim.core.auth.cluster_time import KeyRing, new_key_doc
from shardsim.core.auth.scram import ClientConversation, ServerConversation, make_credentials
from shardsim.core.auth.session import AuthSession
from shardsim.core.auth.store import MemoryUserStore
from shardsim.core.errors import MongoError


def test_every_registered_command_declares_its_privileges() -> None:
    """Every command of every role says what it needs where it is defined (the internal ones
    too: ``INTERNAL``), so none falls back to the internal privilege by omission."""
    from shardsim.configsvr.node import ConfigServerNode
    from shardsim.router.node import RouterNode
    from shardsim.shard.node import ShardNode
    missing = []
    for node in (ShardNode(), ConfigServerNode(), RouterNode(configdb="127.0.0.1:1")):
        missing += [f"{type(node).__name__}.{n}" for n in node.commands.names()
                    if node.commands.spec(n).privileges is None]
    assert not missing, f"commands without declared privileges: {missing}"


def _spec_of():
    from shardsim.router.node import RouterNode
    return RouterNode(configdb="127.0.0.1:1").commands.spec


def _privs(*role_refs: tuple[str, str]) -> dict:
    sess = AuthSession(users=[("u", "x")])
    store = MemoryUserStore()
    asyncio.run(store.put_user({"_id": "x.u", "user": "u", "db": "x",
                                "roles": [{"role": r, "db": d} for r, d in role_refs]}))
    return asyncio.run(sess.resolve(store))


def test_read_role_matching() -> None:
    p = _privs(("read", "sec"))
    assert roles.authorized(p, ("ns", "sec", "orders"), ["find", "changeStream"])
    assert roles.authorized(p, ("db", "sec"), ["changeStream", "find"])
    assert not roles.authorized(p, ("ns", "sec", "orders"), ["insert"])
    assert not roles.authorized(p, ("ns", "other", "orders"), ["find"])
    assert not roles.authorized(p, ("anyNormal",), ["find"])
    assert not roles.authorized(p, ("ns", "sec", "system.users"), ["find"])  # not normal


def test_any_database_roles_and_root() -> None:
    p = _privs(("readAnyDatabase", "admin"))
    assert roles.authorized(p, ("anyNormal",), ["changeStream", "find"])
    assert roles.authorized(p, ("ns", "a", "b"), ["find"])
    assert not roles.authorized(p, ("ns", "config", "shards"), ["find"])  # not local/config
    root = _privs(("root", "admin"))
    assert roles.authorized(root, ("cluster",), ["addShard", "serverStatus"])
    assert roles.authorized(root, ("ns", "a", "b"), ["insert", "remove", "update"])
    assert not roles.authorized(root, ("cluster",), ["internal"])
    assert not roles.authorized(_privs(("readAnyDatabase", "test")), ("ns", "a", "b"), ["find"])


def test_change_stream_privileges() -> None:
    from shardsim.core.commands import ConnectionInfo, Request

    def req(arg, db, spec=None):
        body = {"aggregate": arg, "pipeline": [{"$changeStream": spec or {}}], "$db": db}
        return Request("aggregate", db, body, ConnectionInfo(1))

    spec_of = _spec_of()
    assert privileges.required(spec_of, "aggregate", req("c", "d")) == \
        [(("ns", "d", "c"), ["changeStream", "find"])]
    assert privileges.required(spec_of, "aggregate", req(1, "d")) == \
        [(("db", "d"), ["changeStream", "find"])]
    assert privileges.required(spec_of, "aggregate",
                               req(1, "admin", {"allChangesForCluster": True})) \
        == [(("anyNormal",), ["changeStream", "find"])]
    # an undeclared (unknown) command needs the internal privilege
    assert privileges.required(spec_of, "noSuchCommand", req(1, "admin")) == \
        [(("cluster",), ["internal"])]


def test_scram_round_trip_both_mechanisms() -> None:
    creds = make_credentials("alice", "pässword")
    for mech in ("SCRAM-SHA-1", "SCRAM-SHA-256"):
        client = ClientConversation(mech, "alice", "pässword")
        server = ServerConversation(mech, lambda u: creds if u == "alice" else None)
        final = client.final(server.start(client.first()))
        client.verify(server.finish(final))
        assert server.done and server.user == "alice"
        bad = ClientConversation(mech, "alice", "wrong")
        server = ServerConversation(mech, lambda u: creds)
        with pytest.raises(Exception):
            server.finish(bad.final(server.start(bad.first())))


def test_keyring_signs_and_validates() -> None:
    doc = new_key_doc(Timestamp(1000, 1))
    signer, checker = KeyRing(), KeyRing()
    signer.load([doc])
    checker.load([doc])
    dummy = {"hash": Binary(b"\0" * 20), "keyId": Int64(0)}
    ts = Timestamp(2000, 5)
    sig = signer.sign(ts, dummy)
    checker.validate({"clusterTime": ts, "signature": sig})  # a valid signature passes
    later = Timestamp(3000, 1)
    with pytest.raises(MongoError) as info:
        checker.validate({"clusterTime": later, "signature": dummy})
    assert info.value.code == 211
    with pytest.raises(MongoError) as info:
        checker.validate({"clusterTime": later, "signature": sig})  # proof of another second
    assert info.value.code == 204  # TimeProofMismatch (TimeProofService::checkProof), not 210
    checker.validate({"clusterTime": Timestamp(1500, 0), "signature": dummy})  # not ahead


def test_key_file_readable_by_others_is_refused(tmp_path) -> None:
    """security_file.cpp: a key file group or others may access is refused, and the process
    does not start (one line on stderr, exit status 1)."""
    import os
    import subprocess
    import sys

    from shardsim.core.auth.security import read_key_file
    path = tmp_path / "keyfile"
    path.write_text("abcdefghij\n")
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match=f"^permissions on {path} are too open$"):
        read_key_file(str(path))
    proc = subprocess.run([sys.executable, "-m", "router", "--port", "0", "--configdb",
                           "127.0.0.1:1", "--keyFile", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"shardsim router: permissions on {path} are too open"
    os.chmod(path, 0o600)
    assert read_key_file(str(path)) == "abcdefghij"


def test_test_commands_options(tmp_path) -> None:
    """--enable-test-commands / --setParameter enableTestCommands=1 turn the test-only
    commands on; off by default (mongod's enableTestCommands); --no-test-commands wins."""
    import click
    from click.testing import CliRunner

    from shardsim.core.auth.cli import test_commands_options
    from shardsim.tools.launcher import Cluster

    @click.command()
    @test_commands_options
    def cmd(test_commands: bool) -> None:
        click.echo(f"on={test_commands}")

    runner = CliRunner()
    for args, out in (([], "on=False"), (["--enable-test-commands"], "on=True"),
                      (["--setParameter", "enableTestCommands=1"], "on=True"),
                      (["--setParameter", "enableTestCommands=true"], "on=True"),
                      (["--setParameter", "enableTestCommands=0"], "on=False"),
                      (["--enable-test-commands", "--no-test-commands"], "on=False")):
        res = runner.invoke(cmd, args)
        assert res.exit_code == 0 and res.output.strip() == out, (args, res.output)
    res = runner.invoke(cmd, ["--setParameter", "auditLog=1"])
    assert res.exit_code == 1 and 'Illegal --setParameter parameter: "auditLog"' in res.output
    base = str(tmp_path)
    assert "--enable-test-commands" not in Cluster(shards=1, base_dir=base)._security_args()
    assert "--enable-test-commands" in Cluster(shards=1, base_dir=base,
                                               test_commands=True)._security_args()
