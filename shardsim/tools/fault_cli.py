"""``shardsim fault ...``: faults on demand for a running ``shardsim up --detach`` cluster.

The cluster is found through its state file (``cluster.json`` in the run directory, written by
``up --detach``; :mod:`shardsim.tools.launcher_cli`). The same faults as the in-process kit's methods
(:class:`shardsim.testing.ShardedCluster`), done to processes:

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
==========================  ==================================================================

The members are reached directly (``directConnection=true``); a cluster started with
``--auth`` or TLS is not supported here (the state file holds no credentials).
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import click

from shardsim.tools.launcher import (FileRoleProcess, pid_is, read_state, state_path,
                               write_state)
from shardsim.tools.launcher_cli import resolve_run_dir, run_dir_option
from shardsim.core.protocol import shard as shrq


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
        raise click.ClickException(f"{p['name']}: {exc.details.get('errmsg', exc)} "
                                   f"(code {exc.code})") from None
    except pymongo.errors.PyMongoError as exc:
        raise click.ClickException(f"{p['name']} did not answer: {exc}") from None
    finally:
        client.close()


@click.group()
def fault() -> None:
    """Faults on demand for a running 'shardsim up --detach' cluster."""


@fault.command("pause-shard")
@click.argument("name")
@run_dir_option
def pause_shard(name: str, run_dir: str | None) -> None:
    """Stop shard NAME (SIGSTOP): it answers nothing until resume-shard."""
    _, state = _state(run_dir)
    _signal(_member(state, name, "shard"), signal.SIGSTOP)
    click.echo(f"{name} paused")


@fault.command("resume-shard")
@click.argument("name")
@run_dir_option
def resume_shard(name: str, run_dir: str | None) -> None:
    """Let shard NAME run again (SIGCONT)."""
    _, state = _state(run_dir)
    _signal(_member(state, name, "shard"), signal.SIGCONT)
    click.echo(f"{name} resumed")


@fault.command("kill-shard")
@click.argument("name")
@run_dir_option
def kill_shard(name: str, run_dir: str | None) -> None:
    """Kill shard NAME like kill -9."""
    _, state = _state(run_dir)
    p = _member(state, name, "shard")
    _signal(p, signal.SIGKILL)
    try:
        os.waitpid(p["pid"], 0)
    except ChildProcessError:
        pass  # not our child: its parent (init) reaps it
    click.echo(f"{name} killed")


@fault.command("restart-shard")
@click.argument("name")
@run_dir_option
def restart_shard(name: str, run_dir: str | None) -> None:
    """Start shard NAME again on the same port and dbpath (killing it first if it runs)."""
    run_dir, state = _state(run_dir)
    p = _member(state, name, "shard")
    if "args" not in p:
        raise click.ClickException("the state file has no start arguments (written by an "
                                   "older shardsim); restart the cluster")
    if pid_is(p["pid"], p["module"]):
        os.kill(p["pid"], signal.SIGCONT)
        os.kill(p["pid"], signal.SIGKILL)
    proc = FileRoleProcess(p["module"], p["args"], name=p["name"], log_path=p["log"])
    try:
        proc.start()
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    p["pid"] = proc.pid
    write_state(run_dir, state)
    click.echo(f"{name} restarted on {proc.address} (pid {p['pid']})")


@fault.command("noop-interval")
@click.argument("ms", type=click.IntRange(min=1))
@click.option("--shard", "name", default=None, help="Only this shard (or 'configsvr').")
@run_dir_option
def noop_interval(ms: int, name: str | None, run_dir: str | None) -> None:
    """Set the periodic no-op writer's interval to MS milliseconds (mongod's
    periodicNoopIntervalSecs; 10000 reproduces a real idle shard's latency)."""
    _, state = _state(run_dir)
    members = [_member(state, name)] if name else \
        [p for p in state["processes"] if p["module"] in ("shard", "configsvr")]
    secs: Any = ms // 1000 if ms % 1000 == 0 else ms / 1000
    for p in members:
        _command(p, {"setParameter": 1, "periodicNoopIntervalSecs": secs})
        click.echo(f"{p['name']}: no-op interval {ms} ms")


def _timestamp(text: str) -> Any:
    from bson.timestamp import Timestamp
    secs, _, inc = text.partition(",")
    try:
        return Timestamp(int(secs), int(inc or 0))
    except ValueError:
        raise click.BadParameter(f"expected SECS[,INC], not {text!r}") from None


@fault.command("truncate-oplog")
@click.argument("name")
@click.option("--before", default=None, help="Timestamp SECS[,INC] [default: the newest entry].")
@run_dir_option
def truncate_oplog(name: str, before: str | None, run_dir: str | None) -> None:
    """Drop shard NAME's oplog entries older than --before (history loss: 286)."""
    _, state = _state(run_dir)
    p = _member(state, name, "shard")
    if before is None:
        ts = _command(p, {"serverStatus": 1})["oplog"]["latestOptime"]
    else:
        ts = _timestamp(before)
    reply = _command(p, shrq.TruncateOplog(1, ts).to_command())
    first = reply["earliestOptime"]
    click.echo(f"{name}: {reply['removed']} oplog entries removed; oldest now "
               f"{first.time},{first.inc}")


@fault.command("fail-point")
@click.argument("member")
@click.argument("name")
@click.option("--mode", default="alwaysOn", show_default=True,
              help="alwaysOn, off, or JSON such as '{\"times\": 2}'.")
@click.option("--data", default=None, help="The fail point's data, JSON.")
@run_dir_option
def fail_point(member: str, name: str, mode: str, data: str | None, run_dir: str | None) -> None:
    """configureFailPoint NAME on MEMBER (router, configsvr or a shard)."""
    _, state = _state(run_dir)
    p = _member(state, member)
    try:
        mode_value: Any = json.loads(mode) if mode.lstrip().startswith("{") else mode
        cmd: dict[str, Any] = {"configureFailPoint": name, "mode": mode_value}
        if data is not None:
            cmd["data"] = json.loads(data)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None
    reply = _command(p, cmd)
    click.echo(f"{member}: {name} {mode} (was entered {reply.get('count', 0)} times)")


@fault.command("slow-promises")
@click.argument("name")
@click.argument("ms", type=click.FloatRange(min=0))
@run_dir_option
def slow_promises(name: str, ms: float, run_dir: str | None) -> None:
    """Delay shard NAME's change-stream promises by MS milliseconds."""
    _, state = _state(run_dir)
    p = _member(state, name, "shard")
    delay: Any = int(ms) if ms == int(ms) else ms
    _command(p, {"configureFailPoint": "shardsimDelayPromise", "mode": "alwaysOn",
                 "data": {"delayMs": delay}})
    click.echo(f"{name}: promises delayed by {delay} ms")


@fault.command("stall-promises")
@click.argument("name")
@run_dir_option
def stall_promises(name: str, run_dir: str | None) -> None:
    """Freeze shard NAME's change-stream promise until clear-promises."""
    _, state = _state(run_dir)
    _command(_member(state, name, "shard"),
             {"configureFailPoint": "shardsimStallPromise", "mode": "alwaysOn"})
    click.echo(f"{name}: promises stalled")


@fault.command("clear-promises")
@click.argument("name")
@run_dir_option
def clear_promises(name: str, run_dir: str | None) -> None:
    """Undo slow-promises, stall-promises and a pending same-cluster-time pin on shard NAME."""
    from bson.timestamp import Timestamp
    _, state = _state(run_dir)
    p = _member(state, name, "shard")
    for fp in ("shardsimStallPromise", "shardsimDelayPromise"):
        _command(p, {"configureFailPoint": fp, "mode": "off"})
    _command(p, shrq.SetClusterTime(Timestamp(0, 0)).to_command())
    click.echo(f"{name}: promise faults cleared")


def _time_key(p: dict[str, Any]) -> int:
    """The newest of a shard's cluster time and oplog entry, as a ts key."""
    reply = _command(p, {"serverStatus": 1})
    times = [reply.get("$clusterTime", {}).get("clusterTime"),
             reply.get("oplog", {}).get("latestOptime")]
    return max(((t.time << 32) | t.inc) for t in times if t is not None)


@fault.command("same-cluster-time")
@click.argument("shard_a")
@click.argument("shard_b")
@run_dir_option
def same_cluster_time(shard_a: str, shard_b: str, run_dir: str | None) -> None:
    """Give the next write of shards SHARD_A and SHARD_B the same cluster time."""
    from bson.timestamp import Timestamp
    if shard_a == shard_b:
        raise click.BadParameter("two different shards are needed")
    _, state = _state(run_dir)
    members = [_member(state, shard_a, "shard"), _member(state, shard_b, "shard")]
    for _ in range(3):  # a clock may move between the look and the pin: look again
        key = max(_time_key(p) for p in members) + 1
        ts = Timestamp(key >> 32, key & 0xFFFFFFFF)
        try:
            for p in members:
                _pin(p, ts)
        except _Moved:
            continue
        click.echo(f"{shard_a}, {shard_b}: next write at {ts.time},{ts.inc}")
        return
    raise click.ClickException("the shards' clocks kept moving; try again")


class _Moved(Exception):
    """A pin refused because the shard's clock is already past it (BadValue 2)."""


def _pin(p: dict[str, Any], ts: Any) -> None:
    import pymongo
    import pymongo.errors
    client: Any = pymongo.MongoClient(p["host"], p["port"], directConnection=True,
                                      serverSelectionTimeoutMS=5000)
    try:
        client.admin.command(shrq.SetClusterTime(ts).to_command())
    except pymongo.errors.OperationFailure as exc:
        if exc.code == 2:
            raise _Moved() from None
        raise click.ClickException(f"{p['name']}: {exc.details.get('errmsg', exc)} "
                                   f"(code {exc.code})") from None
    except pymongo.errors.PyMongoError as exc:
        raise click.ClickException(f"{p['name']} did not answer: {exc}") from None
    finally:
        client.close()
