"""The faults are data (:mod:`shardsim.testing.faults`): the in-process kit, its blocking
wrapper and ``shardsim fault`` offer exactly the records, and run every step a record names."""

from __future__ import annotations

import inspect
import os

from click.testing import CliRunner

from shardsim.testing import (AsyncReplicaSet, AsyncShardedCluster, ReplicaSet,
                              ShardedCluster, faults)
from shardsim.tools import fault_cli

NOT_FAULTS = {"start", "stop", "command", "client", "shard_address", "node",
              # replica-set shards (shardsim/testing/replica_sets.py): queries and their faults
              "members_of", "primary_of", "member_node", "step_down", "kill_primary",
              "restart_member", "isolate", "partition", "heal", "freeze", "lag",
              "hold_commit_point"}
DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "testing.md")


def _public_methods(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)}


def test_the_kit_offers_one_method_per_record_and_no_other_fault() -> None:
    methods = {n for n in _public_methods(AsyncShardedCluster)
               if inspect.iscoroutinefunction(getattr(AsyncShardedCluster, n))}
    assert methods - NOT_FAULTS == set(faults.BY_METHOD)


def test_the_blocking_wrapper_is_generated_from_the_records() -> None:
    assert _public_methods(ShardedCluster) - NOT_FAULTS == set(faults.BY_METHOD)
    for record in faults.FAULTS:
        method = getattr(ShardedCluster, record.method)
        assert method.fault is record
        assert inspect.signature(method) == \
            inspect.signature(getattr(AsyncShardedCluster, record.method))


def test_the_cli_offers_one_command_per_record_that_names_one() -> None:
    assert set(fault_cli.fault.commands) == set(faults.BY_COMMAND)
    out = CliRunner().invoke(fault_cli.fault, ["--help"]).output
    listed = {line.split()[0] for line in out.split("Commands:")[1].splitlines()
              if line.startswith("  ") and not line.startswith("    ")}
    assert listed == set(faults.BY_COMMAND)
    for name, record in faults.BY_COMMAND.items():
        help_text = CliRunner().invoke(fault_cli.fault, [name, "--help"]).output
        for p in record.params:
            assert (p.option or p.name.upper()) in help_text


def test_the_replica_set_kit_offers_one_method_per_replica_set_record() -> None:
    """REPLICA_SET_FAULTS are methods of AsyncReplicaSet (same parameters as the record) and
    of the blocking ReplicaSet; none is (yet) a record of the sharded kit."""
    for record in faults.REPLICA_SET_FAULTS:
        method = getattr(AsyncReplicaSet, record.method)
        assert inspect.iscoroutinefunction(method), record.method
        params = list(inspect.signature(method).parameters.values())[1:]
        assert [p.name for p in params] == [p.name for p in record.params], record.method
        for p, param in zip(record.params, params):
            expected = inspect.Parameter.empty if p.default is faults.REQUIRED else p.default
            assert param.default == expected, (record.method, p.name)
        assert callable(getattr(ReplicaSet, record.method)), record.method
        assert record.method not in faults.BY_METHOD
        for step in record.apply + record.undo:
            if isinstance(step, faults.Action) and record.command:
                assert step.name in fault_cli.ACTIONS, (record.method, step.name)
        if record.undone_by:
            assert record.undone_by in faults.RS_BY_METHOD
        if record.command is None:
            assert "in-process only" in record.notes


def test_every_action_has_a_handler_in_the_kit_and_every_cli_action_in_the_cli() -> None:
    for record in faults.FAULTS:
        for step in record.apply + record.undo:
            if isinstance(step, faults.Action):
                assert hasattr(AsyncShardedCluster, "_act_" + step.name.replace("-", "_"))
                if record.command:
                    assert step.name in fault_cli.ACTIONS
            else:
                assert isinstance(step.command, dict) and step.to in ("target", "each")
        if record.undone_by:
            assert record.undone_by in faults.BY_METHOD


def test_fill_builds_the_commands_a_fault_sends() -> None:
    noop = faults.BY_METHOD["set_noop_interval"].apply[0].command
    assert faults.fill(noop, {"ms": 200}) == {"setParameter": 1, "periodicNoopIntervalSecs": 0.2}
    assert faults.fill(noop, {"ms": 10000})["periodicNoopIntervalSecs"] == 10
    fp = faults.BY_METHOD["configure_fail_point"].apply[0].command
    assert faults.fill(fp, {"name": "failCommand", "mode": "off", "data": None}) == \
        {"configureFailPoint": "failCommand", "mode": "off"}
    assert faults.fill(fp, {"name": "x", "mode": {"times": 1}, "data": {"a": 1}})["data"] == {"a": 1}


def test_a_send_step_may_build_a_declared_internal_request() -> None:
    class Pin:  # the shape of a shardsim.core.protocol request
        NAME = "_pin"

        def __init__(self, ts: int) -> None:
            self.ts = ts

        def to_command(self) -> dict:
            return {self.NAME: self.ts}

    step = faults.Send({"ts": faults.Arg("ts")}, request=Pin)
    assert faults.build(step, {"ts": 7}) == {"_pin": 7}
    assert faults.build(faults.Send({"ping": 1}), {}) == {"ping": 1}


def test_the_docs_faults_table_is_the_records_table() -> None:
    with open(DOCS) as f:
        text = f.read()
    assert faults.markdown_table() in text
    assert faults.markdown_table(faults.REPLICA_SET_FAULTS) in text
