"""Every fault of the test kit and of ``shardsim fault``, as data: one :class:`Fault` record each.

A record names the fault (the kit's method, the CLI's command), its target role, a short doc,
its parameters, and what it does as data: the **apply** steps and the **undo** steps, each either
a :class:`Send` (a command sent to the target member: the internal and test commands of the
roles, ``configureFailPoint``, ``setParameter``, ``_shardsimTruncateOplog``,
``_shardsimSetClusterTime``) or an :class:`Action` (no command: what the runtime does to the
member itself, e.g. ``kill``: the kit drops its sockets and crashes its node, the CLI sends
SIGKILL to its process).

The faults on replica-set members are :data:`REPLICA_SET_FAULTS` (methods of
:class:`shardsim.testing.AsyncReplicaSet` / :class:`shardsim.testing.ReplicaSet`, and
``shardsim fault`` commands) until the sharded kit offers them too.

Three runtimes iterate :data:`FAULTS`:

* :class:`shardsim.testing.AsyncShardedCluster`: one method per record (the record's
  ``method``); it runs the steps with :func:`build` for a :class:`Send` and its own handler of
  each :class:`Action` name (``_act_<name>``).
* :class:`shardsim.testing.ShardedCluster`: its fault methods are generated from the records
  (each hands the async method's coroutine to the cluster's loop).
* ``shardsim fault`` (:mod:`shardsim.tools.fault_cli`): one click command per record with a
  ``command``, its arguments and options built from the :class:`Param` list; it sends the
  :class:`Send` steps to the member's process and has a handler per :class:`Action` name
  (signals, a restart of the process).

Adding a fault is one record here plus its handler (the kit method, and an :class:`Action`
handler in each runtime when it is not only commands). ``tests/testkit/test_faults_as_data.py``
checks that the kit, the sync wrapper and the CLI offer exactly these records; the faults table
of docs/testing.md is :func:`markdown_table`'s output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Union

from bson.timestamp import Timestamp

from shardsim.core.protocol import shard as shrq

#: A :class:`Param` without a default (required by the kit method).
REQUIRED: Any = object()


@dataclass(frozen=True)
class Arg:
    """A placeholder in a command template, filled from the fault's argument ``name``.

    ``unit="s"`` turns a millisecond value into seconds (an int when whole: ``10`` for 10000,
    ``0.2`` for 200, as ``periodicNoopIntervalSecs`` is reported). ``optional``: the field is
    left out of the command when the argument is None."""

    name: str
    unit: str | None = None
    optional: bool = False


@dataclass(frozen=True)
class Send:
    """Send ``command`` (a template whose :class:`Arg` values :func:`fill` replaces) to the
    fault's target member (``to="target"``), or to each of its targets.

    With ``request`` (a declared internal request class: ``request(**fields).to_command()``
    builds the wire command ``{request.NAME: <first field>, <other fields>...}``), ``command``
    holds the request's fields instead; :func:`build` makes the command either way."""

    command: Mapping[str, Any]
    to: str = "target"
    request: Any = None


@dataclass(frozen=True)
class Action:
    """A step with no command: the runtime acts on the member itself. ``name`` keys the
    handler each runtime has; ``kit`` and ``cli`` say what each does."""

    name: str
    kit: str
    cli: str


Step = Union[Send, Action]


@dataclass(frozen=True)
class Param:
    """One parameter of a fault: ``name`` (the kit method's, and the CLI's destination),
    ``kind`` (``shard``, ``member``, ``ms`` (>= 0, float), ``interval_ms`` (>= 1, int),
    ``timestamp``, ``failpoint``, ``mode``, ``document``), ``default`` (:data:`REQUIRED` or a value; the
    kit's), ``option`` (the CLI's ``--flag``; None: a positional argument), ``cli_default``
    and ``help`` (the CLI's)."""

    name: str
    kind: str
    default: Any = REQUIRED
    option: str | None = None
    cli_default: Any = None
    help: str = ""


@dataclass(frozen=True)
class Fault:
    """One fault: see the module docstring. ``target`` is the role it acts on (``shard``,
    ``shards`` (two of them), ``member`` (router, config server or shard), ``shards and config
    server``, ``cluster``); ``doc`` one line; ``undone_by`` the record that undoes it (None:
    not undone, e.g. history truncated stays lost); ``done`` the CLI's message (a format
    string over the arguments and the reply); ``notes`` anything else (``in-process only``:
    ``command`` is None because ``shardsim fault`` cannot start or drain a shard process)."""

    method: str
    command: str | None
    target: str
    doc: str
    params: tuple[Param, ...] = ()
    apply: tuple[Step, ...] = ()
    undo: tuple[Step, ...] = ()
    undone_by: str | None = None
    done: str = ""
    notes: tuple[str, ...] = ()

    @property
    def sends(self) -> tuple[Send, ...]:
        """The commands of the apply steps."""
        return tuple(s for s in self.apply if isinstance(s, Send))

    @property
    def actions(self) -> tuple[Action, ...]:
        """The actions of the apply steps."""
        return tuple(s for s in self.apply if isinstance(s, Action))


def fill(template: Any, args: Mapping[str, Any]) -> Any:
    """The command of a :class:`Send` with every :class:`Arg` replaced by ``args[name]``
    (recursively in sub-documents; optional fields whose value is None left out)."""
    if isinstance(template, Arg):
        value = args[template.name]
        if template.unit == "s" and value is not None:  # ms -> s, an int when whole
            value = value // 1000 if value % 1000 == 0 else value / 1000
        return value
    if isinstance(template, Mapping):
        out: dict[str, Any] = {}
        for k, v in template.items():
            if isinstance(v, Arg) and v.optional and args.get(v.name) is None:
                continue
            out[k] = fill(v, args)
        return out
    return template


def build(step: Send, args: Mapping[str, Any]) -> dict[str, Any]:
    """The command ``step`` sends with the fault's arguments ``args`` (:func:`fill`, then the
    step's ``request`` class when it has one)."""
    body = fill(step.command, args)
    return step.request(**body).to_command() if step.request is not None else body


_SHARD = Param("name", "shard", help="The shard's name.")
_STOP = Action("stop-answering", "close the member's gate: commands and replies wait",
               "SIGSTOP to its process")
_GO = Action("answer-again", "open the gate: everything held proceeds", "SIGCONT")
_KILL = Action("kill", "drop its sockets (Server.abort), cancel its tasks, node.crash()",
               "SIGKILL (kill -9) and reap it")
_START = Action("start", "build the node again on the same port and dbpath (killed first "
                "if it runs)", "start the process again with the same arguments")
_STALL_OFF = Send({"configureFailPoint": "shardsimStallPromise", "mode": "off"})
_DELAY_OFF = Send({"configureFailPoint": "shardsimDelayPromise", "mode": "off"})
_UNPIN = Send({"ts": Timestamp(0, 0)}, request=shrq.SetClusterTime)

FAULTS: tuple[Fault, ...] = (
    Fault("pause_shard", "pause-shard", "shard",
          "The shard stops answering: commands and replies wait; the merged stream holds back "
          "every later event.",
          (Param("name", "shard", default=None, help="The shard (the kit: a seeded random one "
                 "when None)."),),
          apply=(_STOP,), undo=(_GO,), undone_by="resume_shard", done="{name} paused"),
    Fault("resume_shard", "resume-shard", "shard",
          "The paused shard answers again; everything held proceeds.",
          (_SHARD,), apply=(_GO,), done="{name} resumed"),
    Fault("kill_shard", "kill-shard", "shard",
          "kill -9: connections dropped, nothing more written.",
          (Param("name", "shard", default=None, help="The shard (the kit: a seeded random one "
                 "when None)."),),
          apply=(_KILL,), undo=(_START,), undone_by="restart_shard", done="{name} killed"),
    Fault("restart_shard", "restart-shard", "shard",
          "Start the shard again on the same port and dbpath (killing it first if it runs).",
          (_SHARD,), apply=(_START,), done="{name} restarted on {address} (pid {pid})"),
    Fault("add_shard", None, "cluster",
          "Start a new shard and addShard it through the router.",
          apply=(Action("add-shard", "start a shard member, then addShard on the router",
                        "(not offered: shardsim up --shards N)"),),
          undone_by="remove_shard", notes=("in-process only",)),
    Fault("remove_shard", None, "shard",
          "Drain the shard (chunks, database primaries), removeShard it and stop it.",
          (_SHARD,),
          apply=(Action("drain-and-remove", "removeShard; moveChunk/movePrimary to seeded "
                        "random shards; removeShard; stop", "(not offered)"),),
          notes=("in-process only",)),
    Fault("set_noop_interval", "noop-interval", "shards and config server",
          "The periodic no-op writer's interval in ms (mongod's periodicNoopIntervalSecs).",
          (Param("ms", "interval_ms", help="Milliseconds (10000: a real idle shard's "
                 "latency)."),
           Param("name", "member", default=None, option="--shard",
                 help="Only this shard (or 'configsvr').")),
          apply=(Send({"setParameter": 1, "periodicNoopIntervalSecs": Arg("ms", unit="s")}),),
          done="{member}: no-op interval {ms} ms"),
    Fault("truncate_oplog", "truncate-oplog", "shard",
          "Drop the shard's oplog entries older than a time: resuming before them fails "
          "with 286 ChangeStreamHistoryLost.",
          (_SHARD, Param("before", "timestamp", option="--before",
                         help="Timestamp SECS[,INC] [default: the newest entry].")),
          apply=(Send({"one": 1, "before": Arg("before")}, request=shrq.TruncateOplog),),
          done="{name}: {removed} oplog entries removed; oldest now {oldest}"),
    Fault("slow_promises", "slow-promises", "shard",
          "Delay the shard's change-stream promises by MS milliseconds.",
          (_SHARD, Param("ms", "ms", help="Milliseconds.")),
          apply=(Send({"configureFailPoint": "shardsimDelayPromise", "mode": "alwaysOn",
                       "data": {"delayMs": Arg("ms")}}),),
          undo=(_DELAY_OFF,), undone_by="clear_promise_faults",
          done="{name}: promises delayed by {ms} ms"),
    Fault("stall_promises", "stall-promises", "shard",
          "Freeze the shard's change-stream promise: the merged stream waits for it while it "
          "serves every command.",
          (_SHARD,),
          apply=(Send({"configureFailPoint": "shardsimStallPromise", "mode": "alwaysOn"}),),
          undo=(_STALL_OFF,), undone_by="clear_promise_faults", done="{name}: promises stalled"),
    Fault("clear_promise_faults", "clear-promises", "shard",
          "Undo slow and stalled promises and a pending same-cluster-time pin on the shard.",
          (_SHARD,), apply=(_STALL_OFF, _DELAY_OFF, _UNPIN),
          done="{name}: promise faults cleared"),
    Fault("same_cluster_time", "same-cluster-time", "shards",
          "The next oplog entry of two shards gets one cluster time T, just past both: their "
          "events tie on clusterTime.",
          (Param("shard_a", "shard", help="One shard."),
           Param("shard_b", "shard", help="Another shard.")),
          apply=(Send({"ts": Arg("ts")}, to="each", request=shrq.SetClusterTime),),
          undo=(_UNPIN,), undone_by="clear_promise_faults",
          done="{shard_a}, {shard_b}: next write at {ts.time},{ts.inc}"),
    Fault("configure_fail_point", "fail-point", "member",
          "configureFailPoint on the router, the config server or a shard.",
          (Param("member", "member", help="router, config(svr) or a shard."),
           Param("name", "failpoint", help="The fail point."),
           Param("mode", "mode", option="--mode", cli_default="alwaysOn",
                 help="alwaysOn, off, or JSON such as '{\"times\": 2}'."),
           Param("data", "document", default=None, option="--data",
                 help="The fail point's data, JSON.")),
          apply=(Send({"configureFailPoint": Arg("name"), "mode": Arg("mode"),
                       "data": Arg("data", optional=True)}),),
          undo=(Send({"configureFailPoint": Arg("name"), "mode": "off"}),),
          done="{member}: {name} {mode_text} (was entered {count} times)"),
)

_SET = Param("name", "set", default=None,
             help="The replica set: rs0, or a shard's name (the kit: a seeded random one when "
                  "None; the CLI: the only set when omitted).")
_MEMBER = Param("host", "member", help="The member: host:port (the CLI also takes its name, "
                "e.g. rs0-1).")
_CUT = Action("cut-off", "drop every replication message and client command to and from the "
              "member, without a reply (node.repl.isolate()); its own timers run, so a cut-off "
              "primary steps down after the election timeout",
              "`{_shardsimCutLinks: \"cut\", hosts: [every other process]}` on the member and "
              "`{_shardsimCutLinks: \"cut\", hosts: [<host>]}` on every other process (members, "
              "config server, routers): the member runs on, cut off from the cluster (a client "
              "connecting to it directly still reaches it)")
_RECONNECT = Action("reconnect", "node.repl.heal() on every member: every link cut by isolate "
                    "or partition is back, lag and the held commit point end",
                    "`{_shardsimCutLinks: \"heal\"}` on every process; the fail points "
                    "stopReplProducer and shardsimDelayApply off on every member")

#: The faults on replica-set members (issue 24/25): methods of
#: :class:`shardsim.testing.AsyncReplicaSet` and :class:`shardsim.testing.ReplicaSet` (and
#: ``shardsim fault`` commands on a detached ``shardsim up --members N`` or ``--topology
#: replicaset`` cluster). Kept apart from :data:`FAULTS` until the sharded kit
#: (:class:`AsyncShardedCluster`) has them too; tests/testkit/test_faults_as_data.py checks them
#: against the replica-set kit and the CLI.
REPLICA_SET_FAULTS: tuple[Fault, ...] = (
    Fault("step_down", "step-down", "replica set",
          "replSetStepDown (force) on the set's primary, as a rolling upgrade does: its writes "
          "get 11602, w waiters 189, reads and cursors carry on; waits for a new primary.",
          (_SET, Param("secs", "secs", default=10, option="--secs", cli_default=10,
                       help="Seconds the old primary may not stand again.")),
          apply=(Send({"replSetStepDown": Arg("secs"), "force": True}),),
          done="{name}: {old} stepped down; new primary {new}"),
    Fault("kill_primary", "kill-primary", "replica set",
          "kill -9 the set's primary; the others elect a new one within the election timeout.",
          (_SET,), apply=(_KILL,), undo=(_START,), undone_by="restart_member",
          done="{name}: primary {host} killed"),
    Fault("restart_member", "restart-member", "member",
          "Start the member again on the same port and dbpath (killed first if it runs); it "
          "rejoins as a secondary and catches up (without a dbpath: empty, replaying the "
          "oplog from its sync source).",
          (_MEMBER,), apply=(_START,), done="{host} restarted on {address} (pid {pid})"),
    Fault("isolate", "isolate", "member",
          "Cut the member off from everything until heal: the others elect a new primary "
          "when it was the primary.",
          (_MEMBER,), apply=(_CUT,), undo=(_RECONNECT,), undone_by="heal",
          done="{host} isolated"),
    Fault("partition", "partition", "members",
          "Cut the link between two hosts both ways, replies and replication alike, until "
          "heal (the kit: two members, replication only; the CLI: any two processes, a "
          "router or the config server too).",
          (Param("host_a", "member", help="One host (the CLI also takes its name)."),
           Param("host_b", "member", help="Another host.")),
          apply=(Action("cut-link", "drop the replication messages between the two members "
                        "(node.repl.cut({_id}) on each)",
                        "`{_shardsimCutLinks: \"cut\", hosts: [<other>]}` on each of the two "
                        "processes"),),
          undo=(_RECONNECT,), undone_by="heal", done="{host_a} <-/-> {host_b}: link cut"),
    Fault("lag", "lag", "member",
          "The secondary applies every fetched batch MS milliseconds late (0 ends it): its "
          "optimes fall behind; with two lagging members the commit point too.",
          (_MEMBER, Param("ms", "ms", help="Milliseconds.")),
          apply=(Send({"configureFailPoint": "shardsimDelayApply", "mode": "alwaysOn",
                       "data": {"delayMs": Arg("ms")}}),),
          undo=(Send({"configureFailPoint": "shardsimDelayApply", "mode": "off"}),),
          undone_by="heal", done="{host}: applies {ms} ms late"),
    Fault("hold_commit_point", "hold-commit-point", "replica set",
          "Hold the set's majority commit point: its secondaries stop fetching (mongod's "
          "stopReplProducer), w: majority writes wait (64 after wtimeout) and change streams "
          "release nothing newer, until heal.",
          (Param("name", "set", help="The replica set (a shard's name; the CLI: the only set "
                 "when omitted)."),),
          apply=(Send({"configureFailPoint": "stopReplProducer", "mode": "alwaysOn"},
                      to="each"),),
          undo=(Send({"configureFailPoint": "stopReplProducer", "mode": "off"}, to="each"),),
          undone_by="heal", done="{name}: commit point held ({members} stopped fetching)"),
    Fault("heal", "heal", "replica set",
          "Restore every link cut by isolate and partition; end lag and the held commit "
          "point.",
          apply=(_RECONNECT,), done="healed: {healed}"),
    Fault("freeze", "freeze", "member",
          "replSetFreeze: the member does not stand for election for SECS seconds (0 "
          "unfreezes); NotSecondary 95 on a primary.",
          (_MEMBER, Param("secs", "secs", help="Seconds (0 unfreezes).")),
          apply=(Send({"replSetFreeze": Arg("secs")}),), done="{host} frozen for {secs} s"),
)

#: The records by the kit's method name.
BY_METHOD: dict[str, Fault] = {f.method: f for f in FAULTS}
#: The replica-set records by the replica-set kit's method name.
RS_BY_METHOD: dict[str, Fault] = {f.method: f for f in REPLICA_SET_FAULTS}
#: The records offered by ``shardsim fault``, by command name (both tuples).
BY_COMMAND: dict[str, Fault] = {f.command: f for f in FAULTS + REPLICA_SET_FAULTS if f.command}


def _step_text(step: Step) -> str:
    if isinstance(step, Action):
        return f"kit: {step.kit}; CLI: {step.cli}"
    command: Any = step.command
    if step.request is not None:  # {NAME: <first field>, <the other fields>...}
        items = list(step.command.items())
        command = {step.request.NAME: items[0][1], **dict(items[1:])}
    return f"`{_show(command)}`" + (" on each" if step.to == "each" else "")


def _show(value: Any) -> str:
    """A command template as the docs print it: ``{configureFailPoint: "x", mode: <mode>}``."""
    if isinstance(value, Arg):
        return f"<{value.name}>" + (" / 1000" if value.unit == "s" else "")
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def markdown_table(records: tuple[Fault, ...] | None = None) -> str:
    """A faults table of docs/testing.md: one row per record of ``records`` (default
    :data:`FAULTS`; :data:`REPLICA_SET_FAULTS` has its own table) with the kit method and
    arguments, CLI command, target, what it does, the apply and undo steps."""
    rows = ["| kit method | `shardsim fault` | target | what it does | apply | undo |",
            "| --- | --- | --- | --- | --- | --- |"]
    for f in FAULTS if records is None else records:
        params = ", ".join(p.name if p.default is REQUIRED else f"{p.name}={p.default!r}"
                           for p in f.params)
        apply = "; ".join(_step_text(s) for s in f.apply)
        undo = "; ".join(_step_text(s) for s in f.undo)
        if f.undone_by:
            undo = f"`{f.undone_by}`" + (f": {undo}" if undo else "")
        rows.append(f"| `{f.method}({params})` | {f'`{f.command}`' if f.command else '-'} | "
                    f"{f.target} | {f.doc} | {apply} | {undo or '-'} |")
    return "\n".join(rows) + "\n"


__all__ = ["Action", "Arg", "BY_COMMAND", "BY_METHOD", "FAULTS", "Fault", "Param", "REQUIRED",
           "REPLICA_SET_FAULTS", "RS_BY_METHOD", "Send", "Step", "build", "fill",
           "markdown_table"]
