"""The local mini cluster: a config server, N shards and a router as child processes.

::

    with Cluster(shards=3) as cluster:
        client = pymongo.MongoClient(cluster.router_uri)
        ...

:class:`Cluster` starts ``python -m shardsim.configsvr``, ``python -m shardsim.shard`` (×N) and ``python -m
router`` on free loopback ports (or the router on ``port``), runs ``addShard`` for every shard
and waits until the router answers. :meth:`Cluster.stop` always leaves nothing running: it is
called on any start-up failure, on leaving the ``with`` block (also by an exception or Ctrl-C).
``durable=True`` gives every process a ``--dbpath`` under ``base_dir``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

from shardsim.core.server import READY_RE
from shardsim.tools.procs import OwnedPopen, RoleProcess, port_in_use, role_module


class ClusterError(RuntimeError):
    """The cluster could not start (port clash, a process died at start, addShard failed)."""


class FileRoleProcess(RoleProcess):
    """A RoleProcess whose output goes to a log file instead of a pipe, so it can outlive the
    launcher (``shardsim up --detach``). ``start()`` waits for the ready line in the file."""

    _offset = 0  # size of the log file when the child was spawned (its output starts there)

    def start(self, timeout: float = 30.0) -> "FileRoleProcess":
        """:meth:`spawn`, then :meth:`wait_ready`."""
        self.spawn()
        return self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the child, its output appended to ``log_path``, without waiting."""
        assert self.log_path, "FileRoleProcess needs log_path"
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.env:
            env.update(self.env)
        self._offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        try:
            with open(self.log_path, "a") as log, open(os.devnull) as devnull:
                OwnedPopen(self, [sys.executable, "-m", role_module(self.module), *self.args],
                           stdin=devnull, stdout=log, stderr=subprocess.STDOUT,
                           env=env, start_new_session=True, text=True)
        except BaseException:
            self.stop()  # Ctrl-C (or any error) while starting: leave nothing behind
            raise

    def wait_ready(self, timeout: float = 30.0) -> "FileRoleProcess":
        """Wait for the ready line in the log file (written after :meth:`spawn`'s offset)."""
        assert self.proc is not None, "spawn() first"
        offset = self._offset
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                with open(self.log_path) as f:  # type: ignore[arg-type]
                    f.seek(offset)
                    text = f.read()
                m = READY_RE.search(text)
                if m:
                    self.host, self.port = m.group(2), int(m.group(3))
                    return self
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        with open(self.log_path) as f:  # type: ignore[arg-type]
            f.seek(offset)
            out = f.read()[-4000:]
        self.stop()
        raise RuntimeError(f"{self.name} did not start (exit {self.proc.returncode}):\n{out}")


class Cluster:
    """A local cluster of processes.

    ``shards`` — number of shards (named ``shard0``, ``shard1``, ...); ``base_dir`` — directory
    for logs and data (a temporary one, removed on stop, when None); ``durable`` — give every
    process ``--dbpath``; ``port`` — the router's port (0 = a free one); ``shard_args`` — extra
    arguments for every ``python -m shardsim.shard``; ``detach`` — processes write to log files in
    ``base_dir`` and survive the launcher (see ``shardsim up --detach``); ``auth`` — ``(user,
    password)``: every process gets ``--keyFile`` (a key generated into ``base_dir``) and the
    first user, ``user`` with ``root`` on ``admin``, is created through the localhost exception;
    ``tls`` — ``{"cert": PEM path, "ca": PEM path}``: every process runs ``--tlsMode
    requireTLS`` (``tls_mode`` to choose another mode) with that certificate and CA;
    ``routers`` — how many routers (mongos) to start on the same config server (default 1);
    ``test_commands`` — start every process with ``--enable-test-commands`` (mongod's
    ``enableTestCommands=1``: ``configureFailPoint`` and the ``_shardsim*`` testing commands);
    off by default, as ``shardsim up`` and mongod/mongos are; ``server_version`` — the release
    every process behaves as (``--server-version``, :mod:`shardsim.core.server_version`; 8.0).

    Attributes after :meth:`start`: ``router_uri`` (``mongodb://127.0.0.1:P/``, the first
    router), ``router``, ``config``, ``shards`` (RoleProcess list; ``.name`` is the shard name);
    with ``routers=N`` N routers share the config server (``router_uris``: every router's URI,
    the first being ``router_uri``; ``routers_uri``: one ``mongodb://h:p1,h:p2/`` for a client
    that should see several mongos; ``extra_routers``: the routers after the first, named
    ``router1``, ...).
    Raises :class:`ClusterError` when it cannot start (nothing is left running then).
    """

    def __init__(self, shards: int = 3, base_dir: str | None = None, durable: bool = False,
                 port: int = 0, shard_args: Sequence[str] = (), *, host: str = "127.0.0.1",
                 detach: bool = False, start_timeout: float = 30.0,
                 auth: tuple[str, str] | None = None, tls: dict[str, str] | None = None,
                 tls_mode: str = "requireTLS", routers: int = 1,
                 test_commands: bool = False, server_version: str = "8.0") -> None:
        from shardsim.core import server_version as versions
        self.server_version = versions.get(server_version).name  # ValueError when unknown
        self.num_shards = shards
        self.num_routers = max(1, int(routers))
        self.extra_routers: list[RoleProcess] = []
        self._own_dir = base_dir is None
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="shardsim-")
        os.makedirs(self.base_dir, exist_ok=True)
        self.durable = durable
        self.port = port
        self.host = host
        self.shard_args = list(shard_args)
        self.detach = detach
        self.start_timeout = start_timeout
        self.config: RoleProcess | None = None
        self.router: RoleProcess | None = None
        self.shards: list[RoleProcess] = []
        self.auth = auth
        self.tls = tls
        self.tls_mode = tls_mode
        self.test_commands = test_commands

    # -- security ---------------------------------------------------------------------------
    @property
    def key_file(self) -> str:
        """The cluster's key file (made on first use, mode 0600 as mongod requires)."""
        path = os.path.join(self.base_dir, "keyfile")
        if not os.path.exists(path):
            import base64
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(base64.b64encode(os.urandom(756)).decode() + "\n")
        return path

    def _security_args(self) -> list[str]:
        """Every process's security arguments (key file, TLS), ``--enable-test-commands`` and
        ``--server-version``."""
        args: list[str] = ["--enable-test-commands"] if self.test_commands else []
        if self.server_version != "8.0":
            args += ["--server-version", self.server_version]
        if self.auth is not None:
            args += ["--keyFile", self.key_file]
        if self.tls is not None:
            args += ["--tlsMode", self.tls_mode, "--tlsCertificateKeyFile", self.tls["cert"],
                     "--tlsCAFile", self.tls["ca"]]
        return args

    def client_options(self) -> dict[str, Any]:
        """pymongo.MongoClient keyword arguments for this cluster (credentials, TLS)."""
        kw: dict[str, Any] = {}
        if self.auth is not None:
            kw.update(username=self.auth[0], password=self.auth[1], authSource="admin")
        if self.tls is not None:
            kw.update(tls=True, tlsCAFile=self.tls["ca"], tlsAllowInvalidHostnames=True)
        return kw

    def _create_root_user(self) -> None:
        """The first user, through the localhost exception (no credentials yet)."""
        import pymongo
        assert self.auth is not None
        kw = self.client_options()
        for k in ("username", "password", "authSource"):
            kw.pop(k, None)
        client: pymongo.MongoClient = pymongo.MongoClient(
            self.router_uri, serverSelectionTimeoutMS=30000, directConnection=True, **kw)
        try:
            client.admin.command("createUser", self.auth[0], pwd=self.auth[1],
                                 roles=[{"role": "root", "db": "admin"}])
        finally:
            client.close()

    # -- properties -------------------------------------------------------------------------
    @property
    def router_uri(self) -> str:
        assert self.router is not None and self.router.port, "cluster not started"
        return f"mongodb://{self.host}:{self.router.port}/"

    @property
    def routers_uri(self) -> str:
        """``mongodb://h:p1,h:p2/``: every router of the cluster."""
        assert self.router is not None and self.router.port, "cluster not started"
        hosts = ",".join(f"{self.host}:{p.port}" for p in (self.router, *self.extra_routers))
        return f"mongodb://{hosts}/"

    @property
    def router_uris(self) -> list[str]:
        """Every router's ``mongodb://host:port/`` (the first is :attr:`router_uri`)."""
        return [self.router_uri] + [f"mongodb://{self.host}:{r.port}/"
                                    for r in self.extra_routers]

    @property
    def processes(self) -> list[RoleProcess]:
        return [p for p in (self.config, *self.shards, self.router, *self.extra_routers)
                if p is not None]

    # -- lifecycle ----------------------------------------------------------------------------
    def _proc(self, module: str, args: list[str], name: str) -> RoleProcess:
        log_path = os.path.join(self.base_dir, f"{name}.log")
        cls = FileRoleProcess if self.detach else RoleProcess
        return cls(module, args, name=name, log_path=log_path)

    def _dbpath(self, name: str) -> list[str]:
        if not self.durable:
            return []
        path = os.path.join(self.base_dir, "data", name)
        os.makedirs(path, exist_ok=True)
        return ["--dbpath", path]

    # A durable cluster keeps its ports: the catalog (config.shards) names shards by address.
    def _ports_file(self) -> str:
        return os.path.join(self.base_dir, "data", "ports.json")

    def _saved_port(self, name: str) -> str:
        if not self.durable:
            return "0"
        try:
            with open(self._ports_file()) as f:
                port = int(json.load(f).get(name, 0))
        except (OSError, ValueError):
            return "0"
        if port and port_in_use(port, self.host):
            raise ClusterError(f"port {port} of {name} (kept in {self._ports_file()}) is "
                               f"already in use on {self.host}")
        return str(port)

    def _save_ports(self) -> None:
        if self.durable:
            os.makedirs(os.path.dirname(self._ports_file()), exist_ok=True)
            with open(self._ports_file(), "w") as f:
                json.dump({p.name: p.port for p in self.processes
                       if p is not self.router and p not in self.extra_routers}, f)

    def _start(self, proc: RoleProcess) -> RoleProcess:
        proc.spawn()
        return self._ready(proc)

    def _ready(self, proc: RoleProcess) -> RoleProcess:
        """Wait for a spawned ``proc``; pin its port so a restart comes back on the same
        address. ClusterError when it does not start."""
        try:
            proc.wait_ready(self.start_timeout)
        except RuntimeError as exc:
            raise ClusterError(str(exc)) from None
        if "--port" in proc.args:
            proc.args[proc.args.index("--port") + 1] = str(proc.port)
        return proc

    def start(self) -> "Cluster":
        """Start everything and add the shards; on any failure stop everything and raise."""
        try:
            if self.port and port_in_use(self.port, self.host):
                raise ClusterError(f"port {self.port} is already in use on {self.host}: stop "
                                   f"whatever listens there or choose another --port")
            # Every process is put on the cluster *before* it starts, so that stop() (on any
            # exception, also a KeyboardInterrupt during the ready wait) reaches it.
            # Most of a start is the child's imports, so the processes start at the same time:
            # the config server and the shards need nothing of each other; the router needs
            # the config server's address (its port is known once it is ready).
            self.config = self._proc(
                "configsvr", ["--port", self._saved_port("configsvr"), "--host", self.host,
                              *self._dbpath("config"), *self._security_args()],
                "configsvr")
            self.config.spawn()
            for _ in range(self.num_shards):
                self._new_shard().spawn()
            self._ready(self.config)
            self.router = self._proc(
                "router", ["--port", str(self.port), "--host", self.host,
                           "--configdb", self.config.address, *self._security_args()],
                "router")
            self.router.spawn()
            for i in range(1, self.num_routers):
                extra = self._proc(
                    "router", ["--port", "0", "--host", self.host,
                               "--configdb", self.config.address, *self._security_args()],
                    f"router{i}")
                self.extra_routers.append(extra)
                extra.spawn()
            for proc in (*self.shards, self.router, *self.extra_routers):
                self._ready(proc)
            if self.auth is not None and not self._has_users():
                self._create_root_user()
            for shard in self.shards:
                self._add_shard(shard)
            self._save_ports()
        except BaseException:
            self.stop()
            raise
        return self

    def _new_shard(self) -> RoleProcess:
        """The next shard's process, put on the cluster (not started)."""
        name = f"shard{len(self.shards)}"  # shards are only ever appended
        proc = self._proc("shard", ["--port", self._saved_port(name), "--host", self.host,
                                    "--shard-name", name,
                                    *self._dbpath(name), *self.shard_args,
                                    *self._security_args()], name)
        self.shards.append(proc)
        return proc

    def _start_shard(self) -> RoleProcess:
        return self._start(self._new_shard())

    def admin_command(self, cmd: dict[str, Any], timeout_ms: int = 30000) -> dict[str, Any]:
        """Run an admin command on the router with pymongo."""
        import pymongo
        client: pymongo.MongoClient = pymongo.MongoClient(
            self.router_uri, serverSelectionTimeoutMS=timeout_ms, directConnection=True,
            **self.client_options())
        try:
            return client.admin.command(cmd)
        finally:
            client.close()

    def _has_users(self) -> bool:
        """True when the (durable) cluster already has its users: the root user logs in."""
        import pymongo.errors
        if not self.durable:
            return False
        try:
            self.admin_command({"ping": 1, "$readPreference": {"mode": "primary"}}, 10000)
            self.admin_command({"connectionStatus": 1}, 10000)
            return True
        except pymongo.errors.OperationFailure:
            return False

    def _add_shard(self, shard: RoleProcess) -> None:
        import pymongo.errors
        try:
            self.admin_command({"addShard": shard.address, "name": shard.name})
        except pymongo.errors.PyMongoError as exc:
            raise ClusterError(f"addShard {shard.name} ({shard.address}) failed: {exc}") from None

    def add_shard(self) -> str:
        """Start one more shard and add it to the cluster; returns its name."""
        proc = self._start_shard()
        self._add_shard(proc)
        self._save_ports()
        return proc.name

    def shard(self, name: str) -> RoleProcess:
        """The shard process named ``name``."""
        for p in self.shards:
            if p.name == name:
                return p
        raise KeyError(name)

    def restart(self, proc: RoleProcess) -> RoleProcess:
        """Start a stopped/killed process again on the same port (and ``--dbpath``)."""
        proc.stop()
        return self._start(proc)

    def stop(self) -> None:
        """Stop every process (router first, config server last); never raises an Exception.

        Safe to call again at any time (stopped processes are skipped), so a caller interrupted
        by KeyboardInterrupt during stop() can simply call it again.
        """
        for proc in reversed(self.processes):
            try:
                proc.stop()
            except Exception:  # pragma: no cover - keep stopping the others
                try:
                    proc.kill()
                except Exception:
                    pass
        if self._own_dir and not self.detach:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- detached state -----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What ``shardsim status``/``down``/``fault`` need: the router URI and every process
        (``args``: its command line after ``-m module``, ports pinned, for a restart)."""
        return {
            "router_uri": self.router_uri,
            "base_dir": self.base_dir,
            "started": time.time(),
            "processes": [{"name": p.name, "module": p.module, "pid": p.pid, "host": p.host,
                           "port": p.port, "log": p.log_path, "args": list(p.args)}
                          for p in self.processes],
        }


# -- state files of detached clusters (shardsim up --detach / status / down) -------------------
DEFAULT_PORT = 27017


def _run_dir_for(port: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"shardsim-{os.getuid()}-{port}")


def detached_run_dirs() -> list[str]:
    """This user's run directories that hold a detached cluster's state: the per-port ones
    (``<tmp>/shardsim-<uid>-<port>``) and the older per-user one (``<tmp>/shardsim-<uid>``)."""
    tmp = tempfile.gettempdir()
    prefix = f"shardsim-{os.getuid()}"
    try:
        names = sorted(n for n in os.listdir(tmp)
                       if n == prefix or re.fullmatch(re.escape(prefix) + r"-\d+", n))
    except OSError:
        return []
    return [os.path.join(tmp, n) for n in names
            if os.path.exists(state_path(os.path.join(tmp, n)))]


def default_run_dir(port: int | None = None) -> str:
    """Where a detached cluster's state and logs live: ``$SHARDSIM_RUN_DIR``, else one
    directory per user and router port, ``<tmp>/shardsim-<uid>-<port>`` (two clusters on two
    ports, or two people sharing a uid in a container, never share one). Without ``port``
    (``status``, ``down``, ``top``, ``fault``): the only detached cluster of this user, or the
    default port's directory when there is none. ClusterError when there are several (the
    message names them: pass ``--port`` or ``--run-dir``)."""
    env = os.environ.get("SHARDSIM_RUN_DIR")
    if env:
        return env
    if port is not None:
        return _run_dir_for(port)
    found = detached_run_dirs()
    if len(found) > 1:
        raise ClusterError("several detached clusters: " + ", ".join(found)
                           + "; choose one with --port or --run-dir")
    return found[0] if found else _run_dir_for(DEFAULT_PORT)


def check_owner(run_dir: str) -> None:
    """ClusterError unless this user owns ``run_dir``'s state file (so ``down`` never stops
    another user's cluster)."""
    try:
        owner = os.stat(state_path(run_dir)).st_uid
    except OSError:
        return
    if owner != os.getuid():
        raise ClusterError(f"{state_path(run_dir)} belongs to uid {owner}, not to you "
                           f"(uid {os.getuid()}); not touching that cluster")


def state_path(run_dir: str) -> str:
    return os.path.join(run_dir, "cluster.json")


def write_state(run_dir: str, state: dict[str, Any]) -> None:
    os.makedirs(run_dir, exist_ok=True)
    tmp = state_path(run_dir) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, state_path(run_dir))


def read_state(run_dir: str) -> dict[str, Any] | None:
    try:
        with open(state_path(run_dir)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def pid_is(pid: int | None, module: str) -> bool:
    """True if ``pid`` is alive and runs ``python -m shardsim.<module>`` (not a recycled pid)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    try:
        i = argv.index(b"-m")
    except ValueError:
        return False
    return i + 1 < len(argv) and argv[i + 1] == role_module(module).encode()


def stop_pid(pid: int, module: str, timeout: float = 5.0) -> bool:
    """SIGTERM the process group of ``pid`` (started with its own session), then SIGKILL."""
    if not pid_is(pid, module):
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_is(pid, module):
            return True
        _reap(pid)
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
