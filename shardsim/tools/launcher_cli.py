"""``shardsim up`` / ``shardsim status`` / ``shardsim down``: the local mini cluster from a shell.

``up`` starts a config server, N shards and a router (:class:`shardsim.tools.launcher.Cluster`)
(``--members M``: every shard a replica set of M member processes; ``--topology replicaset``:
one plain replica set of M members, no router),
prints the connection string and one status line per process, and stops everything on Ctrl-C
(or SIGTERM) at any moment, also during start-up (exit 130 then), with no child left behind. ``up --detach`` leaves the cluster running and writes ``cluster.json`` (pids,
ports, log files) in the run directory; ``status`` and ``down`` read it from any shell.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import click

from shardsim.core import server_version as server_version_mod

from shardsim.tools.launcher import (CONFIG_SET_NAME, Cluster, ClusterError, check_owner,
                                     default_run_dir, pid_is, read_state, state_path, stop_pid,
                                     write_state)


def _status_line(name: str, module: str, host: str | None, port: int | None, pid: int | None,
                 alive: bool, member_state: str | None = None) -> str:
    role = {"configsvr": "config server", "shard": "shard", "router": "router"}.get(module, module)
    if member_state is not None:
        role = "member"
    state = ("running" if alive else "DOWN") + (f" {member_state}" if member_state and alive
                                               else "")
    return f"  {name:<10} {role:<13} {host}:{port:<6} pid {pid or '-':<8} {state}"


# Foreground ``up``: the first SIGINT/SIGTERM raises KeyboardInterrupt, which ends start-up or
# the wait loop; every later one is ignored, so that the cleanup it starts cannot itself be cut
# short and leave processes behind (the cleanup is bounded: SIGKILL after 5 s per process).
_stopping = False


def _interrupt(signum: int, frame: Any) -> None:
    global _stopping
    if _stopping:
        return
    _stopping = True
    raise KeyboardInterrupt


def _direct_children() -> list[int]:
    """Pids whose parent is this process, zombies included (Linux ``/proc``; empty elsewhere)."""
    me, pids = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) > 1 and int(fields[1]) == me:
            pids.append(int(entry))
    return pids


def _reap(pids: list[int]) -> list[int]:
    """Reap whichever of ``pids`` have exited; returns those still running."""
    left = []
    for pid in pids:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (subprocess's own bookkeeping)
            continue
        if not done:
            left.append(pid)
    return left


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # its own session (start_new_session) ...
    except OSError:
        try:
            os.kill(pid, sig)  # ... or not yet (forked, before setsid/exec)
        except OSError:
            pass


def _stop_stray_children(timeout: float = 5.0) -> None:
    """Backstop after :meth:`Cluster.stop`: every child of ``up`` is a cluster process, so a
    child still there is one the cluster lost track of (e.g. a Ctrl-C landed just as
    ``Popen`` returned its pid). SIGTERM, SIGKILL after ``timeout`` s, and reap."""
    pids = _reap(_direct_children())
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        time.sleep(0.02)
        pids = _reap(pids)
    for pid in pids:
        _signal_group(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _stop_all(cluster: Cluster | None) -> None:
    """Stop the cluster and any stray child; a KeyboardInterrupt that lands in here (only the
    first signal raises) just restarts the idempotent cleanup."""
    global _stopping
    _stopping = True
    while True:
        try:
            if cluster is not None:
                cluster.stop()
            _stop_stray_children()
            return
        except KeyboardInterrupt:
            continue


def _print_cluster(cluster: Cluster) -> None:
    if cluster.topology == "replicaset":
        click.echo(f"shardsim replica set ready: {cluster.uri}")
    else:
        click.echo(f"shardsim cluster ready: {cluster.router_uri}")
    for uri in cluster.router_uris[1:] if cluster.topology == "sharded" else ():
        click.echo(f"another router: {uri}")
    shard_sets = [n for n in cluster.sets if n != CONFIG_SET_NAME]
    if cluster.topology == "sharded" and shard_sets:
        click.echo("the shards are replica sets: " + ", ".join(
            cluster.shard_connection_string(n) for n in shard_sets))
    if cluster.topology == "sharded" and CONFIG_SET_NAME in cluster.sets:
        click.echo(f"the config server is a replica set: {cluster.configdb}")
    if cluster.auth is not None:
        click.echo(f"authentication on: user '{cluster.auth[0]}' (root, authSource admin); "
                   f"key file {cluster.key_file}")
    for p in cluster.processes:
        click.echo(_status_line(p.name, p.module, p.host, p.port, p.pid, p.alive(),
                                "" if cluster._set_of(p) else None))


run_dir_option = click.option(
    "--run-dir", type=click.Path(file_okay=False), default=None,
    help="Where a detached cluster's state (cluster.json) and logs live "
         "[default: $SHARDSIM_RUN_DIR or <tmp>/shardsim-<uid>-<port>].")
port_option = click.option(
    "--port", type=int, default=None,
    help="The detached cluster's router port (selects its run directory; needed when this "
         "user has several detached clusters).")


def resolve_run_dir(run_dir: str | None, port: int | None = None) -> str:
    """``--run-dir``, else :func:`default_run_dir` (``port``'s, or the only detached cluster's);
    a ClickException when several detached clusters leave the choice open."""
    if run_dir:
        return run_dir
    try:
        return default_run_dir(port)
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.option("--shards", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Number of shards.")
@click.option("--port", type=int, default=27017, show_default=True,
              help="Router port (0 picks a free one).")
@click.option("--dbpath", type=click.Path(file_okay=False), default=None,
              help="Make every process durable, with its data under this directory.")
@click.option("--routers", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Number of routers (the second and later ones on free ports).")
@click.option("--detach", is_flag=True, help="Leave the cluster running in the background.")
@click.option("--auth", is_flag=True,
              help="Key file for the members and a root user from $MONGO_INITDB_ROOT_USERNAME / "
                   "$MONGO_INITDB_ROOT_PASSWORD (default root / root).")
@click.option("--tlsCertificateKeyFile", "tls_cert", type=click.Path(dir_okay=False),
              default=None, help="Serve TLS only (requireTLS) with this PEM certificate+key.")
@click.option("--tlsCAFile", "tls_ca", type=click.Path(dir_okay=False), default=None,
              help="The CA of the members' certificates (with --tlsCertificateKeyFile).")
@click.option("--enable-test-commands", "test_commands", is_flag=True,
              help="Enable the test-only commands (configureFailPoint, the _shardsim testing "
                   "commands; needed by 'shardsim fault'); off by default, as in mongod.")
@click.option("--setParameter", "set_parameter", multiple=True, metavar="enableTestCommands=1",
              help="mongod's spelling of --enable-test-commands.")
@click.option("--topology", type=click.Choice(["sharded", "replicaset"]), default="sharded",
              show_default=True,
              help="sharded: config server, shards and routers; replicaset: one plain replica "
                   "set of --members members (no router), the first on --port.")
@click.option("--members", type=click.IntRange(1, 50), default=1, show_default=True,
              help="Members per replica set: every shard (or the replica set of --topology "
                   "replicaset) is that many processes; 1 = one process per shard, as before.")
@click.option("--config-members", type=click.IntRange(1, 50), default=None,
              help="Members of the config server replica set [default: --members]; 1 = one "
                   "config server process.")
@click.option("--set-name", default="rs0", show_default=True,
              help="The replica set's name (--topology replicaset).")
@click.option("--election-timeout-ms", type=click.IntRange(min=1), default=None,
              help="The members' electionTimeoutMillis [default: the server's, 10000].")
@click.option("--heartbeat-interval-ms", type=click.IntRange(min=1), default=None,
              help="The members' heartbeatIntervalMillis [default: the server's, 2000].")
@click.option("--heartbeat-timeout-ms", type=click.IntRange(min=1), default=None,
              help="The members' heartbeatTimeoutSecs, in ms [default: the server's, 10000].")
@server_version_mod.click_option
@run_dir_option
def up(shards: int, port: int, dbpath: str | None, detach: bool, run_dir: str | None,
       auth: bool = False, tls_cert: str | None = None, tls_ca: str | None = None,
       routers: int = 1, test_commands: bool = False, set_parameter: tuple[str, ...] = (),
       server_version: str = "8.0", topology: str = "sharded", members: int = 1,
       set_name: str = "rs0", election_timeout_ms: int | None = None,
       heartbeat_interval_ms: int | None = None,
       heartbeat_timeout_ms: int | None = None, config_members: int | None = None) -> None:
    """Start a local cluster: config server, SHARDS shards and a router on 127.0.0.1:PORT
    (--topology replicaset: a replica set of MEMBERS members, the first on PORT)."""
    global _stopping
    repl_args: list[str] = []
    for flag, value in (("--election-timeout-ms", election_timeout_ms),
                        ("--heartbeat-interval-ms", heartbeat_interval_ms),
                        ("--heartbeat-timeout-ms", heartbeat_timeout_ms)):
        if value is not None:
            repl_args += [flag, str(value)]
    if topology == "replicaset" and routers != 1:
        raise click.BadParameter("a replica set has no routers", param_hint="--routers")
    for item in set_parameter:
        name, _, value = item.partition("=")
        if name != "enableTestCommands" or value.lower() not in ("0", "1", "true", "false"):
            raise click.BadParameter(f"only enableTestCommands=0|1 is known, got {item!r}",
                                     param_hint="--setParameter")
        test_commands = value.lower() in ("1", "true")
    run_dir = run_dir or default_run_dir(port)
    if detach:
        state = read_state(run_dir)
        if state and any(pid_is(p["pid"], p["module"]) for p in state["processes"]):
            raise click.ClickException(
                f"a detached cluster is already running ({state_uri(state)}); "
                f"run 'shardsim down' first (state: {state_path(run_dir)})")
    base_dir = dbpath or (os.path.join(run_dir, "cluster") if detach else None)
    # SIGTERM behaves like Ctrl-C: stop everything. Installed before the first child exists.
    if threading.current_thread() is threading.main_thread():
        _stopping = False
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)  # also when started with SIGINT ignored
    # One try/finally from before the first child to the very end: whatever ends `up` (Ctrl-C
    # at any moment of start-up or later, a start failure, a process dying) stops everything.
    # Only a detached cluster that started completely is left running.
    cluster: Cluster | None = None
    phase = "starting"  # -> "failed" | "running" | "detached"
    code = 0
    try:
        creds = (os.environ.get("MONGO_INITDB_ROOT_USERNAME") or "root",
                 os.environ.get("MONGO_INITDB_ROOT_PASSWORD") or "root") if auth else None
        tls = {"cert": tls_cert, "ca": tls_ca or tls_cert} if tls_cert else None
        cluster = Cluster(shards=shards, base_dir=base_dir, durable=dbpath is not None,
                          port=port, detach=detach, auth=creds, tls=tls, routers=routers,
                          test_commands=test_commands, server_version=server_version,
                          members=members, topology=topology, set_name=set_name,
                          repl_args=repl_args, config_members=config_members)
        try:
            cluster.start()
        except ClusterError as exc:
            phase = "failed"
            raise click.ClickException(f"cluster did not start: {exc}") from None
        if detach:
            write_state(run_dir, cluster.state())
            phase = "detached"
            _stopping = True  # from here on Ctrl-C must not stop the detached cluster
            _print_cluster(cluster)
            click.echo(f"detached; state in {state_path(run_dir)} "
                       f"('shardsim status', 'shardsim down')")
            return
        phase = "running"
        _print_cluster(cluster)
        click.echo("press Ctrl-C to stop")
        while True:
            time.sleep(0.5)
            dead = [p for p in cluster.processes if not p.alive()]
            if dead:
                for p in dead:
                    click.echo(f"{p.name} exited unexpectedly (code {p.proc.returncode if p.proc else '?'}); "
                               f"last output:\n" + "\n".join(list(p.output)[-20:]), err=True)
                code = 1
                break
    except KeyboardInterrupt:
        if phase == "starting":
            code = 130
    finally:
        if phase != "detached":
            _stopping = True
            if phase != "failed":
                click.echo("stopping cluster ...", err=True)
            _stop_all(cluster)
            if phase != "failed":
                click.echo("interrupted; everything stopped" if code == 130 else "stopped",
                           err=True)
    sys.exit(code)


def _ping(host: str, port: int) -> bool:
    import pymongo
    try:
        client: Any = pymongo.MongoClient(host, port, directConnection=True,
                                          serverSelectionTimeoutMS=1500, connectTimeoutMS=1500)
        try:
            client.admin.command("ping")
            return True
        finally:
            client.close()
    except Exception:
        return False


def state_uri(state: dict[str, Any]) -> str:
    """A detached cluster's connection string from its state file (``uri``; older files:
    ``router_uri``)."""
    return state.get("uri") or state.get("router_uri", "?")


def _member_state(host: str, port: int) -> str | None:
    """A replica-set member's state as its ``hello`` says: PRIMARY, SECONDARY, or OTHER."""
    import pymongo
    try:
        client: Any = pymongo.MongoClient(host, port, directConnection=True,
                                          serverSelectionTimeoutMS=1500, connectTimeoutMS=1500)
        try:
            hello = client.admin.command("hello")
        finally:
            client.close()
    except Exception:
        return None
    if hello.get("isWritablePrimary"):
        return "PRIMARY"
    return "SECONDARY" if hello.get("secondary") else "OTHER"


@click.command()
@run_dir_option
@port_option
def status(run_dir: str | None, port: int | None = None) -> None:
    """Show the detached cluster's processes (exit 1 if none is running or one is down)."""
    run_dir = resolve_run_dir(run_dir, port)
    state = read_state(run_dir)
    if state is None:
        click.echo(f"no detached cluster (no {state_path(run_dir)})")
        sys.exit(1)
    ok = True
    kind = "replica set" if state.get("topology") == "replicaset" else "cluster"
    click.echo(f"shardsim {kind}: {state_uri(state)}")
    for p in state["processes"]:
        alive = pid_is(p["pid"], p["module"]) and _ping(p["host"], p["port"])
        member_state = _member_state(p["host"], p["port"]) if alive and p.get("set") else None
        ok = ok and alive
        if p.get("set"):  # a replica-set member: its state, as its hello says
            member_state = (member_state or "?") if alive else ""
        click.echo(_status_line(p["name"], p["module"], p["host"], p["port"], p["pid"], alive,
                                member_state))
    sys.exit(0 if ok else 1)


@click.command()
@run_dir_option
@port_option
def down(run_dir: str | None, port: int | None = None) -> None:
    """Stop the detached cluster and remove its state file (only a cluster this user
    started: another user's state file is refused)."""
    run_dir = resolve_run_dir(run_dir, port)
    state = read_state(run_dir)
    if state is None:
        click.echo(f"no detached cluster (no {state_path(run_dir)})")
        return
    try:
        check_owner(run_dir)
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from None
    for p in reversed(state["processes"]):
        stopped = stop_pid(p["pid"], p["module"])
        click.echo(f"  {p['name']:<10} {'stopped' if stopped else 'was not running'}")
    os.remove(state_path(run_dir))
    click.echo("cluster stopped")
