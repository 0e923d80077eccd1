"""``shardsim fault ...``: faults on demand for a running ``shardsim up --detach`` cluster.

The cluster is found through its state file (``cluster.json`` in the run directory, written by
``up --detach``; :mod:`shardsim.tools.launcher_cli`). Every fault but the four on processes
(pause, resume, kill, restart) uses test-only commands: start the cluster with ``shardsim up
--detach --enable-test-commands`` (CommandNotFound 59 otherwise, with that hint). The same
faults as the in-process kit's methods
(:class:`shardsim.testing.ShardedCluster`), done to processes: one command per record of
:mod:`shardsim.testing.faults` that names one (its arguments and options are the record's
parameters; its commands are sent to the member's process, its actions are signals or a
restart of the process, :data:`ACTIONS`):

==========================  ==================================================================
``pause-shard NAME``        SIGSTOP to the shard's process: it stops answering, the router's
                            getMore to it waits, its promise stops and the merged stream holds
                            back every later event
``resume-shard NAME``       SIGCONT
``kill-shard NAME``         SIGKILL (``kill -9``); nothing is flushed beyond what durable mode
                            committed
``restart-shard NAME``      start it again with the same arguments: same port, same dbpath
                            (the state file gets the new pid)
``noop-interval MS``        the periodic no-op writer's interval of every shard and the config
                            server (``--shard NAME``: one member), via ``setParameter:
                            {periodicNoopIntervalSecs: MS / 1000}`` on the member (shardsim
                            accepts it at runtime with test commands on; mongod only at startup)
``truncate-oplog NAME``     drop the shard's oplog entries older than ``--before`` (a
                            Timestamp ``SECS[,INC]``; default: the shard's newest entry), with
                            the test command ``_shardsimTruncateOplog``: resuming before it
                            fails with 286 ChangeStreamHistoryLost
``slow-promises NAME MS``   delay shard NAME's change-stream promises by MS ms (fail point
                            ``shardsimDelayPromise``, ``data: {delayMs: MS}``)
``stall-promises NAME``     freeze its promise (fail point ``shardsimStallPromise``): the
                            merged stream waits for it while it serves every command
``clear-promises NAME``     both fail points off, and a pending clock pin cleared
``same-cluster-time A B``   the next oplog entry of shards A and B gets one cluster time T,
                            just past both (``_shardsimSetClusterTime: T`` on each): their
                            events tie on ``clusterTime``
``fail-point MEMBER NAME``  ``configureFailPoint`` on ``router``, ``configsvr`` or a shard:
                            ``--mode`` (``alwaysOn``/``off`` or JSON such as ``{"times": 2}``)
                            and ``--data`` (JSON)
``step-down [SET]``         ``replSetStepDown: --secs`` (10), ``force: true``, on the set's
                            primary (found by ``hello`` on each member); waits for a new one
``kill-primary [SET]``      SIGKILL to the set's primary
``restart-member HOST``     start the member (``host:port`` or its name, e.g. ``rs0-1``) again
                            with the same arguments (never ``--initiate``)
``isolate HOST``            every link between the member and the other processes of the
                            cluster (members, config server, routers) cut at both ends with
                            the test command ``_shardsimCutLinks`` (:mod:`shardsim.core.links`):
                            the member runs on, its timers too, so a cut-off primary steps
                            down after the election timeout while the others elect a new one;
                            its ``w: 1`` writes in between roll back when it rejoins. A client
                            connecting to it directly (this CLI too) still reaches it. Marked
                            in the state file
``partition A B``           the link between two processes (members by ``host:port`` or name;
                            a router or the config server too) cut both ways, replies and
                            replication alike (``_shardsimCutLinks`` on both)
``lag HOST MS``             the secondary applies every fetched batch MS ms late (fail point
                            ``shardsimDelayApply``, ``data: {delayMs: MS}``; 0 ends it)
``hold-commit-point [SET]`` mongod's ``stopReplProducer`` fail point on every member but the
                            primary: nothing new reaches a majority, ``w: "majority"`` waits
                            (64 WriteConcernFailed after ``wtimeout``), change streams release
                            nothing newer
``heal``                    on every running process ``_shardsimCutLinks: "heal"``; on every
                            member the two fail points off: every fault above ends
``freeze HOST SECS``        ``replSetFreeze: SECS`` on the member
==========================  ==================================================================

The replica-set commands work on a cluster started with ``--members N`` (every shard a set
named after the shard) or ``--topology replicaset`` (one set, ``rs0``); SET may be left out
when there is one set. ``isolate``, ``partition``, ``lag``, ``hold-commit-point`` and ``heal``
need test commands (``--enable-test-commands``). No choice here is random: every fault names
its target, or acts on the set's primary (or its secondaries) as ``hello`` reports it.

The members are reached directly (``directConnection=true``); a cluster started with
``--auth`` or TLS is not supported here (the state file holds no credentials).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import click

from shardsim.testing import faults
from shardsim.core.protocol.shard import CutLinks
from shardsim.testing.faults import Fault, Param
from shardsim.tools.launcher import (FileRoleProcess, pid_is, read_state,
                               state_path, write_state)
from shardsim.tools.launcher_cli import resolve_run_dir, run_dir_option


def _state(run_dir: str | None) -> tuple[str, dict[str, Any]]:
    run_dir = resolve_run_dir(run_dir)
    state = read_state(run_dir)
    if state is None:
        raise click.ClickException(f"no detached cluster (no {state_path(run_dir)}); start "
                                   f"one with 'shardsim up --detach'")
    return run_dir, state


def _member(state: dict[str, Any], name: str, module: str | None = None) -> dict[str, Any]:
    for p in state["processes"]:
        if p["name"] == name and (module is None or p["module"] == module):
            return p
    names = [p["name"] for p in state["processes"] if module is None or p["module"] == module]
    raise click.ClickException(f"no {'shard' if module == 'shard' else 'member'} named "
                               f"{name!r} (there are: {', '.join(names)})")


class _CommandFailed(click.ClickException):
    """A member answered ``ok: 0`` (``code`` kept: same-cluster-time retries on BadValue 2)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _signal(p: dict[str, Any], sig: int) -> None:
    if not pid_is(p["pid"], p["module"]):
        raise click.ClickException(f"{p['name']} is not running (pid {p['pid']})")
    os.kill(p["pid"], sig)


def _command(p: dict[str, Any], cmd: dict[str, Any]) -> dict[str, Any]:
    import pymongo
    import pymongo.errors
    client: Any = pymongo.MongoClient(p["host"], p["port"], directConnection=True,
                                      serverSelectionTimeoutMS=5000)
    try:
        return client.admin.command(cmd)
    except pymongo.errors.OperationFailure as exc:
        hint = ""
        if exc.code == 59:  # CommandNotFound: test-only commands are off by default
            hint = ("; the faults that use test-only commands need a cluster started with "
                    "'shardsim up --detach --enable-test-commands'")
        raise _CommandFailed(f"{p['name']}: {exc.details.get('errmsg', exc)} "
                             f"(code {exc.code}){hint}", exc.code) from None
    except pymongo.errors.PyMongoError as exc:
        raise click.ClickException(f"{p['name']} did not answer: {exc}") from None
    finally:
        client.close()


# -- the actions of the records, done to processes ------------------------------------------
def _stop_answering(p: dict[str, Any], run_dir: str, state: dict[str, Any],
                    targets: Any = None) -> dict[str, Any]:
    _signal(p, signal.SIGSTOP)
    return {}


def _answer_again(p: dict[str, Any], run_dir: str, state: dict[str, Any],
                  targets: Any = None) -> dict[str, Any]:
    _signal(p, signal.SIGCONT)
    return {}


def _kill(p: dict[str, Any], run_dir: str, state: dict[str, Any],
          targets: Any = None) -> dict[str, Any]:
    _signal(p, signal.SIGKILL)
    try:
        os.waitpid(p["pid"], 0)
    except ChildProcessError:
        pass  # not our child: its parent (init) reaps it
    return {}


def _start(p: dict[str, Any], run_dir: str, state: dict[str, Any],
           targets: Any = None) -> dict[str, Any]:
    if "args" not in p:
        raise click.ClickException("the state file has no start arguments (written by an "
                                   "older shardsim); restart the cluster")
    if pid_is(p["pid"], p["module"]):
        os.kill(p["pid"], signal.SIGCONT)
        os.kill(p["pid"], signal.SIGKILL)
    args = [a for a in p["args"] if a != "--initiate"]  # a set is initiated once, never again
    proc = FileRoleProcess(p["module"], args, name=p["name"], log_path=p["log"])
    try:
        proc.start()
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    p["pid"] = proc.pid
    p.pop("isolated", None)  # a new process: whatever isolate stopped is gone
    write_state(run_dir, state)
    return {"address": proc.address, "pid": p["pid"]}


def _cut(p: dict[str, Any], hosts: list[str]) -> None:
    """``{_shardsimCutLinks: "cut", hosts}`` on process ``p`` (:mod:`shardsim.core.links`)."""
    _command(p, CutLinks("cut", hosts).to_command())


def _running(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [q for q in state["processes"] if pid_is(q["pid"], q["module"])]


def _cut_off(p: dict[str, Any], run_dir: str, state: dict[str, Any],
             targets: Any = None) -> dict[str, Any]:
    """``isolate``: the links between the member and every other running process of the
    cluster cut at both ends; the member marked ``isolated`` in the state file (for ``heal``'s
    message and for the primary look-ups, which skip it)."""
    others = [q for q in _running(state) if q is not p]
    _cut(p, [_address(q) for q in others])
    for q in others:
        _cut(q, [_address(p)])
    p["isolated"] = True
    write_state(run_dir, state)
    return {}


def _cut_link(p: dict[str, Any], run_dir: str, state: dict[str, Any],
              targets: Any = None) -> dict[str, Any]:
    """``partition``: the link between the two target processes cut at both ends."""
    a, b = targets
    _cut(a, [_address(b)])
    _cut(b, [_address(a)])
    return {}


def _reconnect(p: dict[str, Any], run_dir: str, state: dict[str, Any],
               targets: Any = None) -> dict[str, Any]:
    """``heal`` on one running process: every link back; on a replica-set member the lag and
    hold fail points off too; its ``isolated`` mark removed."""
    _command(p, CutLinks("heal").to_command())
    if p.get("set"):
        for name in ("stopReplProducer", "shardsimDelayApply"):
            _command(p, {"configureFailPoint": name, "mode": "off"})
    p.pop("isolated", None)
    write_state(run_dir, state)
    return {}


#: The CLI's handler of each :class:`faults.Action` name (the kit's are its ``_act_*``); each
#: is called with the first target, the run directory, the state and every target.
ACTIONS = {"stop-answering": _stop_answering, "answer-again": _answer_again, "kill": _kill,
           "start": _start, "cut-off": _cut_off, "cut-link": _cut_link,
           "reconnect": _reconnect}


def _run(fault_: Fault, targets: list[dict[str, Any]], args: dict[str, Any], run_dir: str,
         state: dict[str, Any]) -> dict[str, Any]:
    """Run the record's apply steps on the target processes; returns the last reply merged
    with what the actions reported (for the record's ``done`` message)."""
    out: dict[str, Any] = {}
    for step in fault_.apply:
        if isinstance(step, faults.Send):
            cmd = faults.build(step, args)
            for p in (targets if step.to == "each" else targets[:1]):
                out.update(_command(p, cmd))
        else:
            out.update(ACTIONS[step.name](targets[0], run_dir, state, targets))
    return out


# -- what some records need before or around their steps ------------------------------------
def _timestamp(text: str) -> Any:
    from bson.timestamp import Timestamp
    secs, _, inc = text.partition(",")
    try:
        return Timestamp(int(secs), int(inc or 0))
    except ValueError:
        raise click.BadParameter(f"expected SECS[,INC], not {text!r}") from None


def _truncate_oplog(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
                    run_dir: str) -> None:
    p = _member(state, args["name"], "shard")
    if args["before"] is None:
        args["before"] = _command(p, {"serverStatus": 1})["oplog"]["latestOptime"]
    else:
        args["before"] = _timestamp(args["before"])
    reply = _run(fault_, [p], args, run_dir, state)
    first = reply["earliestOptime"]
    click.echo(fault_.done.format(**args, removed=reply["removed"],
                                  oldest=f"{first.time},{first.inc}"))


def _noop_interval(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
                   run_dir: str) -> None:
    name = args["name"]
    members = [_member(state, name)] if name else \
        [p for p in state["processes"] if p["module"] in ("shard", "configsvr")]
    for p in members:
        _run(fault_, [p], args, run_dir, state)
        click.echo(fault_.done.format(**args, member=p["name"]))


def _slow_promises(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
                   run_dir: str) -> None:
    ms = args["ms"]
    args["ms"] = int(ms) if ms == int(ms) else ms
    _run(fault_, [_member(state, args["name"], "shard")], args, run_dir, state)
    click.echo(fault_.done.format(**args))


def _fail_point(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
                run_dir: str) -> None:
    p = _member(state, args["member"])
    mode = args["mode_text"] = args["mode"]
    try:
        args["mode"] = json.loads(mode) if mode.lstrip().startswith("{") else mode
        if args["data"] is not None:
            args["data"] = json.loads(args["data"])
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None
    reply = _run(fault_, [p], args, run_dir, state)
    click.echo(fault_.done.format(**args, count=reply.get("count", 0)))


def _time_key(p: dict[str, Any]) -> int:
    """The newest of a shard's cluster time and oplog entry, as a ts key."""
    reply = _command(p, {"serverStatus": 1})
    times = [reply.get("$clusterTime", {}).get("clusterTime"),
             reply.get("oplog", {}).get("latestOptime")]
    return max(((t.time << 32) | t.inc) for t in times if t is not None)


def _same_cluster_time(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
                       run_dir: str) -> None:
    from bson.timestamp import Timestamp
    if args["shard_a"] == args["shard_b"]:
        raise click.BadParameter("two different shards are needed")
    members = [_member(state, args["shard_a"], "shard"), _member(state, args["shard_b"], "shard")]
    for _ in range(3):  # a clock may move between the look and the pin: look again
        key = max(_time_key(p) for p in members) + 1
        args["ts"] = Timestamp(key >> 32, key & 0xFFFFFFFF)
        try:
            _run(fault_, members, args, run_dir, state)
        except _CommandFailed as exc:
            if exc.code == 2:  # BadValue: the clock is already past it
                continue
            raise
        click.echo(fault_.done.format(**args))
        return
    raise click.ClickException("the shards' clocks kept moving; try again")


def _on_a_shard(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
                run_dir: str) -> None:
    """The records whose target is one shard named ``name`` and that need nothing more."""
    reply = _run(fault_, [_member(state, args["name"], "shard")], args, run_dir, state)
    click.echo(fault_.done.format(**{**reply, **args}))


# -- replica-set members (faults.REPLICA_SET_FAULTS) ---------------------------------------
PRIMARY_WAIT_S = 60.0  # the server's election timeout is 10 s; catch-up and no-op come on top


def _set_members(state: dict[str, Any], name: str | None) -> tuple[str, list[dict[str, Any]]]:
    """The set ``name`` (the only one when None; the config server's set, ``config``, is
    only taken when named or alone) and its members' state entries."""
    sets = state.get("sets") or {}
    if not sets:
        raise click.ClickException("the detached cluster has no replica set of more than one "
                                   "member; start one with 'shardsim up --detach --topology "
                                   "replicaset --members 3' (or --members 3 for the shards)")
    if name is None:
        shard_sets = [n for n in sets if n != "config"] or list(sets)
        if len(shard_sets) > 1:
            raise click.ClickException(f"several replica sets ({', '.join(sets)}): name one")
        name = shard_sets[0]
    if name not in sets:
        raise click.ClickException(f"no replica set named {name!r} (there are: "
                                   f"{', '.join(sets)})")
    return name, [_member(state, m) for m in sets[name]]


def _member_at(state: dict[str, Any], host: str) -> dict[str, Any]:
    """A member by ``host:port`` or by name."""
    for p in state["processes"]:
        if host in (p["name"], f"{p['host']}:{p['port']}"):
            return p
    raise click.ClickException(f"no member at {host!r} (there are: " + ", ".join(
        f"{p['name']} ({p['host']}:{p['port']})" for p in state["processes"]) + ")")


def _address(p: dict[str, Any]) -> str:
    return f"{p['host']}:{p['port']}"


def _hello(p: dict[str, Any]) -> dict[str, Any] | None:
    """The member's ``hello``, or None when it is down, stopped or does not answer at once."""
    import pymongo
    if not pid_is(p["pid"], p["module"]) or p.get("isolated"):
        return None
    client: Any = pymongo.MongoClient(p["host"], p["port"], directConnection=True,
                                      serverSelectionTimeoutMS=1000, connectTimeoutMS=1000,
                                      socketTimeoutMS=2000)
    try:
        return client.admin.command("hello")
    except Exception:
        return None
    finally:
        client.close()


def _wait_primary(name: str, members: list[dict[str, Any]], other_than: str | None = None,
                  timeout: float = PRIMARY_WAIT_S) -> dict[str, Any]:
    """The member that is writable primary (by its ``hello``), waiting up to ``timeout`` s
    for one (other than ``other_than``, an address)."""
    deadline = time.monotonic() + timeout
    while True:
        for p in members:
            hello = _hello(p)
            if hello and hello.get("isWritablePrimary") and _address(p) != other_than:
                return p
        if time.monotonic() > deadline:
            raise click.ClickException(f"{name}: no {'new ' if other_than else ''}primary "
                                       f"after {timeout:.0f} s")
        time.sleep(0.1)


def _step_down(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
               run_dir: str) -> None:
    name, members = _set_members(state, args["name"])
    args["name"] = name
    primary = _wait_primary(name, members)
    _run(fault_, [primary], args, run_dir, state)
    new = _wait_primary(name, members, other_than=_address(primary))
    click.echo(fault_.done.format(**args, old=_address(primary), new=_address(new)))


def _kill_primary(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
                  run_dir: str) -> None:
    name, members = _set_members(state, args["name"])
    args["name"] = name
    primary = _wait_primary(name, members)
    _run(fault_, [primary], args, run_dir, state)
    click.echo(fault_.done.format(**args, host=_address(primary)))


def _on_a_member(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
                 run_dir: str) -> None:
    """restart-member, isolate, freeze: one member, by host:port or name."""
    p = _member_at(state, args["host"])
    args["host"] = _address(p)
    reply = _run(fault_, [p], args, run_dir, state)
    click.echo(fault_.done.format(**{**reply, **args}))


def _heal(fault_: Fault, state: dict[str, Any], args: dict[str, Any], run_dir: str) -> None:
    """Every running process: its links back, and on members the lag and hold fail points
    off. Says which members were isolated."""
    cut = [p["name"] for p in state["processes"] if p.get("isolated")]
    failed = []
    for p in _running(state):
        try:
            _run(fault_, [p], args, run_dir, state)
        except click.ClickException as exc:  # e.g. a paused shard: heal the others first
            failed.append(exc.message)
    click.echo(fault_.done.format(healed=", ".join(cut) or "nothing was isolated"))
    if failed:
        raise click.ClickException("not healed: " + "; ".join(failed))


def _partition(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
               run_dir: str) -> None:
    a, b = _member_at(state, args["host_a"]), _member_at(state, args["host_b"])
    if a is b:
        raise click.BadParameter("two different hosts are needed")
    args["host_a"], args["host_b"] = _address(a), _address(b)
    for p in (a, b):
        if not pid_is(p["pid"], p["module"]):
            raise click.ClickException(f"{p['name']} is not running (pid {p['pid']})")
    _run(fault_, [a, b], args, run_dir, state)
    click.echo(fault_.done.format(**args))


def _lag(fault_: Fault, state: dict[str, Any], args: dict[str, Any], run_dir: str) -> None:
    p = _member_at(state, args["host"])
    if not p.get("set"):
        raise click.ClickException(f"{p['name']} is not a member of a replica set of more "
                                   f"than one member")
    ms = args["ms"]
    args["ms"] = int(ms) if ms == int(ms) else ms
    args["host"] = _address(p)
    _run(fault_, [p], args, run_dir, state)
    click.echo(fault_.done.format(**args))


def _hold_commit_point(fault_: Fault, state: dict[str, Any], args: dict[str, Any],
                       run_dir: str) -> None:
    """stopReplProducer on every member but the primary (as the kit's hold_commit_point)."""
    name, members = _set_members(state, args["name"])
    args["name"] = name
    primary = _wait_primary(name, members)
    others = [p for p in members if p is not primary]
    _run(fault_, others, args, run_dir, state)
    click.echo(fault_.done.format(**args, members=", ".join(_address(p) for p in others)))


HANDLERS = {"truncate_oplog": _truncate_oplog, "set_noop_interval": _noop_interval,
            "slow_promises": _slow_promises, "configure_fail_point": _fail_point,
            "same_cluster_time": _same_cluster_time, "step_down": _step_down,
            "kill_primary": _kill_primary, "restart_member": _on_a_member,
            "isolate": _on_a_member, "freeze": _on_a_member, "heal": _heal,
            "partition": _partition, "lag": _lag, "hold_commit_point": _hold_commit_point}


# -- the commands, built from the records ---------------------------------------------------
_TYPES: dict[str, Any] = {"interval_ms": click.IntRange(min=1), "ms": click.FloatRange(min=0),
                          "secs": click.IntRange(min=0)}


def _click_param(p: Param) -> click.Parameter:
    kind = _TYPES.get(p.kind, str)
    if p.option is None:  # a set may be left out: the cluster's only one
        return click.Argument([p.name], type=kind, required=p.kind != "set")
    return click.Option([p.option, p.name], type=kind, default=p.cli_default,
                        show_default=p.cli_default is not None, help=p.help)


def _make_command(fault_: Fault) -> click.Command:
    handler = HANDLERS.get(fault_.method, _on_a_shard)

    def callback(run_dir: str | None, **args: Any) -> None:
        run_dir, state = _state(run_dir)
        handler(fault_, state, args, run_dir)

    params = [_click_param(p) for p in fault_.params]
    command = click.Command(fault_.command, callback=callback, params=params,
                            help=fault_.doc)
    return run_dir_option(command)


@click.group()
def fault() -> None:
    """Faults on demand for a running 'shardsim up --detach' cluster."""


for _record in faults.FAULTS + faults.REPLICA_SET_FAULTS:
    if _record.command:
        fault.add_command(_make_command(_record))
del _record
