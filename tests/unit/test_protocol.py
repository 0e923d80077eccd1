"""The contract between roles (``shardsim/core/protocol/``): every internal request declared once,
built and parsed by the same declaration, and no internal command name spelled elsewhere."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest
from bson.binary import Binary, UuidRepresentation
from bson.timestamp import Timestamp
import uuid

from shardsim.configsvr.commands import FAMILIES as CONFIG_FAMILIES
from shardsim.core import links
from shardsim.core.auth import commands as auth_commands
from shardsim.core.errors import MongoError
from shardsim.core.protocol import REGISTRY, configsvr, shard
from shardsim.shard.change_stream import cursor as cs_cursor
from shardsim.shard.commands import FAMILIES as SHARD_FAMILIES, testing

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCTION = ("router", "shard", "configsvr", "shardsim")
# an internal command name: _shardsimXxx / _configsvrXxx / _shardsvrXxx (not an attribute
# like _shardsim_x)
INTERNAL_NAME = re.compile(r"^_(shardsim|configsvr|shardsvr)[A-Z]")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_no_internal_command_name_outside_the_protocol():
    """``_shardsim*`` / ``_configsvr*`` names appear as code only in ``shardsim/core/protocol``."""
    found = []
    for folder in PRODUCTION:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("shardsim/core/protocol/"):
                continue
            tree = ast.parse(path.read_text(), filename=rel)
            docs = _docstrings(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                        INTERNAL_NAME.match(node.value) and id(node) not in docs:
                    found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, "internal command names outside shardsim/core/protocol:\n" + "\n".join(found)


def _names(*families) -> set[str]:
    return {name for fam in families for name in fam.names()}


def test_every_request_has_a_handler_on_the_role_that_answers_it():
    answered_by_shard = _names(*SHARD_FAMILIES, testing.commands, cs_cursor.commands,
                               auth_commands.commands, links.commands)
    answered_by_config = _names(*CONFIG_FAMILIES)
    for name, cls in REGISTRY.items():
        where = answered_by_config if cls.__module__.endswith(".configsvr") else answered_by_shard
        assert name in where, f"{name} ({cls.__name__}) has no handler"


SAMPLES = {
    shard.SetFilteringMetadata: ("db.c", {"epoch": 1, "chunks": []}),
    shard.MigrationStart: ("db.c", "sid", {"a": 1}, {"a": 0}, {"a": 10}),
    shard.ShardsvrMoveRange: ("db.c", "shard1", {"a": 0}, {"a": 10}),
    shard.MergeSessionRecords: (1, [{"lsid": {}, "txnNumber": 1, "stmts": []}]),
    shard.TruncateOplog: (1, Timestamp(5, 1)),
    shard.CutLinks: ("cut", ["127.0.0.1:27018"]),
    shard.EnsureCollection: ("c", Binary.from_uuid(uuid.uuid4(), UuidRepresentation.STANDARD)),
    configsvr.ShardCollection: ("db.c", {"a": "hashed"}),
    configsvr.RenameCollection: ("db.c", "db.d"),
}


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.NAME)
def test_built_requests_parse_back(cls):
    built = cls(*SAMPLES[cls])
    cmd = built.to_command()
    assert next(iter(cmd)) == cls.NAME
    assert cls.parse(cmd) == built


def test_optional_fields_are_left_out_and_forwarded_ones_kept():
    cmd = configsvr.ShardCollection.forward("db.c", {"key": {"a": 1}, "unique": True, "other": 1})
    assert cmd.to_command() == {"_configsvrShardCollection": "db.c", "key": {"a": 1}, "unique": True}
    only = configsvr.ReshardCollection.forward("db.c", {"key": {"a": 1}, "toShard": "s"},
                                               only=("toShard",), provenance="moveCollection")
    assert only.to_command() == {"_configsvrReshardCollection": "db.c",
                                 "provenance": "moveCollection", "toShard": "s"}


def test_parse_errors_are_the_idl_parsers():
    with pytest.raises(MongoError) as missing:
        shard.MigrationStart.parse({"_shardsimMigrationStart": "db.c", "sessionId": "s"})
    assert missing.value.code == 40414
    assert "'_shardsimMigrationStart.key' is missing but a required field" in missing.value.errmsg
    with pytest.raises(MongoError) as wrong:
        shard.MigrationStart.parse({"_shardsimMigrationStart": "db.c", "sessionId": 7,
                                    "key": {}, "min": {}, "max": {}})
    assert wrong.value.code == 14
    assert wrong.value.errmsg == ("BSON field '_shardsimMigrationStart.sessionId' is the wrong "
                                  "type 'int', expected type 'string'")
    with pytest.raises(MongoError) as not_bool:  # a bool is no number on the wire
        shard.MigrateClone.parse({"_migrateClone": True, "sessionId": "s"})
    assert not_bool.value.code == 14
