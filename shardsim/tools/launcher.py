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
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

from shardsim.core.server import READY_RE
from shardsim.tools.procs import OwnedPopen, RoleProcess, port_in_use, role_module


#: The config server replica set's name (``--set-name`` of its members, ``--configdb
#: config/h1,h2,h3``): the project's config server has always answered ``setName: "config"``.
CONFIG_SET_NAME = "config"


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

    ``members`` — members per replica set (default 1: every shard is one process, as before);
    with N > 1 every shard is a replica set of N member processes named ``shard0``,
    ``shard0-1``, ``shard0-2``... (``python -m shardsim.shard --members h1,h2,h3``, member 0 with
    ``--initiate`` at its first start only), added as ``shard0/h1,h2,h3``; ``topology`` —
    ``"sharded"`` (default) or ``"replicaset"``: one plain replica set of ``members`` members
    named ``set_name`` (``rs0``), no config server and no router, the first member on ``port``
    (0: a free one); ``repl_args`` — the members' timing options (``--election-timeout-ms``,
    ``--heartbeat-interval-ms``, ``--heartbeat-timeout-ms``; the server's defaults when empty);
    ``config_members`` — members of the config server (default ``members``): with N > 1 it is
    a replica set (CSRS) ``config`` of processes ``configsvr``, ``configsvr-1``, ...
    (``python -m shardsim.configsvr --set-name config --members h1,h2,h3``), the routers get
    ``--configdb config/h1,h2,h3``, and ``sets["config"]`` lists them (``shardsim fault
    step-down config``).

    Attributes after :meth:`start`: ``uri`` (what a client connects to: the first router's, or
    ``mongodb://h1,h2,h3/?replicaSet=rs0`` for a replica set), ``sets`` (``{set name: [member
    RoleProcess]}`` of every set of more than one member), ``router_uri`` (``mongodb://127.0.0.1:P/``, the first
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
                 test_commands: bool = False, server_version: str = "8.0",
                 members: int = 1, topology: str = "sharded", set_name: str = "rs0",
                 repl_args: Sequence[str] = (), config_members: int | None = None) -> None:
        from shardsim.core import server_version as versions
        self.server_version = versions.get(server_version).name  # ValueError when unknown
        if topology not in ("sharded", "replicaset"):
            raise ValueError(f"unknown topology {topology!r} (sharded or replicaset)")
        if members < 1:
            raise ValueError("a replica set needs at least one member")
        self.topology = topology
        self.num_members = int(members)
        # the config server: one process, or a replica set (CSRS) of this many members
        self.num_config_members = int(members if config_members is None else config_members)
        if self.num_config_members < 1:
            raise ValueError("a config server needs at least one member")
        self.set_name = set_name
        self.repl_args = list(repl_args)
        self.sets: dict[str, list[RoleProcess]] = {}
        self._shard_names: list[str] = []
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
        self.config: RoleProcess | None = None  # the config server (member 0 of its set)
        self.config_members: list[RoleProcess] = []  # every config server process
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
            self.uri, serverSelectionTimeoutMS=30000, **self._direct(), **kw)
        try:
            client.admin.command("createUser", self.auth[0], pwd=self.auth[1],
                                 roles=[{"role": "root", "db": "admin"}])
        finally:
            client.close()

    # -- properties -------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        """What a client connects to: :attr:`router_uri` for a sharded cluster,
        ``mongodb://h1,h2,h3/?replicaSet=<set_name>`` for a replica set (one member:
        ``mongodb://h:p/?directConnection=true``)."""
        if self.topology == "sharded":
            return self.router_uri
        members = self.sets.get(self.set_name) or self.shards
        assert members and all(m.port for m in members), "replica set not started"
        if len(members) == 1:
            return f"mongodb://{members[0].address}/?directConnection=true"
        return (f"mongodb://{','.join(m.address for m in members)}/"
                f"?replicaSet={self.set_name}")

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
        configs = self.config_members or [self.config]
        return [p for p in (*configs, *self.shards, self.router, *self.extra_routers)
                if p is not None]

    @property
    def configdb(self) -> str:
        """The routers' ``--configdb``: ``config/h1,h2,h3`` for a config server replica set,
        else the config server's ``host:port``."""
        assert self.config is not None
        if len(self.config_members) > 1:
            return CONFIG_SET_NAME + "/" + ",".join(m.address for m in self.config_members)
        return self.config.address

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

    def _direct(self) -> dict[str, Any]:
        """``directConnection=True`` for a router; a replica set's URI says it itself."""
        return {"directConnection": True} if self.topology == "sharded" else {}

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
        if "--initiate" in proc.args:  # only ever at a set's first start, never on a restart
            proc.args.remove("--initiate")
        return proc

    def start(self) -> "Cluster":
        """Start everything and add the shards; on any failure stop everything and raise."""
        try:
            if self.port and port_in_use(self.port, self.host):
                raise ClusterError(f"port {self.port} is already in use on {self.host}: stop "
                                   f"whatever listens there or choose another --port")
            if self.topology == "replicaset":
                self._start_replica_set()
                return self
            # Every process is put on the cluster *before* it starts, so that stop() (on any
            # exception, also a KeyboardInterrupt during the ready wait) reaches it.
            # Most of a start is the child's imports, so the processes start at the same time:
            # the config server and the shards need nothing of each other; the router needs
            # the config server's address (its port is known once it is ready).
            if self.num_config_members > 1:
                self.config_members = self._new_config_set()
                self.config = self.config_members[0]
            else:
                self.config = self._proc(
                    "configsvr", ["--port", self._saved_port("configsvr"), "--host", self.host,
                                  *self._dbpath("config"), *self._security_args()],
                    "configsvr")
                self.config_members = [self.config]
            for proc in self.config_members:
                proc.spawn()
            for _ in range(self.num_shards):
                for proc in self._new_shard_members():
                    proc.spawn()
            for proc in self.config_members:
                self._ready(proc)
            if len(self.config_members) > 1:  # the routers' first catalog read needs it
                self._wait_primary(self.config_members)
            self.router = self._proc(
                "router", ["--port", str(self.port), "--host", self.host,
                           "--configdb", self.configdb, *self._security_args()],
                "router")
            self.router.spawn()
            for i in range(1, self.num_routers):
                extra = self._proc(
                    "router", ["--port", "0", "--host", self.host,
                               "--configdb", self.configdb, *self._security_args()],
                    f"router{i}")
                self.extra_routers.append(extra)
                extra.spawn()
            for proc in (*self.shards, self.router, *self.extra_routers):
                self._ready(proc)
            for name, members in self.sets.items():
                if name != CONFIG_SET_NAME:
                    self._wait_primary(members)
            if self.auth is not None and not self._has_users():
                self._create_root_user()
            for name in self._shard_names:
                self._add_shard_named(name)
            self._save_ports()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_replica_set(self) -> None:
        """``topology="replicaset"``: the members of :attr:`set_name`, started together; then a
        primary (called from :meth:`start`, which stops everything on failure)."""
        members = self._new_set(self.set_name, first_port=self.port)
        for proc in members:
            proc.spawn()
        for proc in members:
            self._ready(proc)
        if len(members) > 1:
            self._wait_primary(members)
        if self.auth is not None and not self._has_users():
            self._create_root_user()
        self._save_ports()

    def _new_shard_members(self) -> list[RoleProcess]:
        """The next shard's processes (one, or its set's members), put on the cluster (not
        started)."""
        name = f"shard{len(self._shard_names)}"  # shards are only ever appended
        self._shard_names.append(name)
        if self.num_members == 1:
            return [self._new_shard(name)]
        return self._new_set(name)

    def _new_set(self, name: str, first_port: int = 0) -> list[RoleProcess]:
        """The member processes of replica set ``name`` (not started), put on the cluster:
        ``name``, ``name-1``, ``name-2``...; every member must know every address before it
        starts, so the ports are chosen now (held together, so N distinct ones; the first on
        ``first_port`` when given; a durable cluster's kept ports). Member 0 gets
        ``--initiate`` when the set is new (no data in its dbpath yet): mongod's
        ``replSetInitiate``, once. A one-member "set" is a plain shard process."""
        names = [name if i == 0 else f"{name}-{i}" for i in range(self.num_members)]
        ports = self._set_ports(names, first_port)
        hosts = ",".join(f"{self.host}:{p}" for p in ports)
        procs = []
        for i, mname in enumerate(names):
            dbpath = self._dbpath(mname)
            fresh = not dbpath or not os.listdir(dbpath[1])
            args = ["--port", str(ports[i]), "--host", self.host, "--shard-name", name]
            if self.num_members > 1:
                args += ["--members", hosts, *(["--initiate"] if i == 0 and fresh else []),
                         *self.repl_args]
            proc = self._proc("shard", [*args, *dbpath, *self.shard_args,
                                        *self._security_args()], mname)
            self.shards.append(proc)
            procs.append(proc)
        if self.num_members > 1:
            self.sets[name] = procs
        return procs

    def _new_config_set(self) -> list[RoleProcess]:
        """The config server replica set's processes (not started): ``configsvr``,
        ``configsvr-1``, ... (dbpaths ``data/config``, ``data/config-1``, ...), set
        :data:`CONFIG_SET_NAME`, each ``python -m shardsim.configsvr --members h1,h2,h3``
        (member 0 with ``--initiate`` when new), as ``mongod --configsvr --replSet``."""
        names = ["configsvr" if i == 0 else f"configsvr-{i}"
                 for i in range(self.num_config_members)]
        ports = self._set_ports(names)
        hosts = ",".join(f"{self.host}:{p}" for p in ports)
        procs = []
        for i, mname in enumerate(names):
            dbpath = self._dbpath("config" if i == 0 else f"config-{i}")
            fresh = not dbpath or not os.listdir(dbpath[1])
            args = ["--port", str(ports[i]), "--host", self.host, "--set-name", CONFIG_SET_NAME,
                    "--members", hosts, *(["--initiate"] if i == 0 and fresh else []),
                    *self.repl_args]
            procs.append(self._proc("configsvr", [*args, *dbpath, *self._security_args()],
                                    mname))
        self.sets[CONFIG_SET_NAME] = procs
        return procs

    def _set_ports(self, names: list[str], first_port: int = 0) -> list[int]:
        """Ports for the members ``names`` of one set: a durable cluster's kept ones, else
        free ones chosen now (held together, so all distinct; the first on ``first_port``
        when given)."""
        ports = [int(self._saved_port(n)) for n in names]
        if first_port and not ports[0]:
            ports[0] = first_port
        socks = []
        try:
            for i, port in enumerate(ports):
                if not port:
                    sock = socket.socket()
                    sock.bind((self.host, 0))
                    socks.append(sock)
                    ports[i] = sock.getsockname()[1]
        finally:
            for sock in socks:
                sock.close()
        return ports

    def _wait_primary(self, members: list[RoleProcess], timeout: float | None = None) -> str:
        """Wait for a writable primary among ``members`` (``hello`` on each); returns its
        ``host:port``. A new set with the server's 10 s election timeout would wait that long
        for its first election, so the initiating member is asked to ``replSetStepUp`` at once,
        as the server's own test harness does (``ReplSetTest.initiate`` ->
        ``_initiateWithNodeZeroAsPrimary`` / ``stepUp``, ``src/mongo/shell/replsettest.js``);
        when that fails the natural election is awaited. ClusterError after ``timeout`` s
        (default: ``start_timeout``)."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        next_step_up = time.monotonic()
        while True:
            hellos = [self._member_command(m, {"hello": 1}) for m in members]
            for m, hello in zip(members, hellos):
                if hello and hello.get("isWritablePrimary"):
                    return m.address
            # Only while no member is (becoming) primary: a stepUp can then only help.
            if time.monotonic() >= next_step_up and not any(
                    h and h.get("primary") for h in hellos):
                next_step_up = time.monotonic() + 2.0
                self._member_command(members[0], {"replSetStepUp": 1})
            if time.monotonic() > deadline:
                raise ClusterError(f"replica set {members[0].name} elected no primary in "
                                   f"{timeout or self.start_timeout:.0f} s")
            time.sleep(0.1)

    def _member_command(self, proc: RoleProcess, cmd: dict[str, Any]) -> dict[str, Any] | None:
        """``cmd`` on one member directly; None when it fails or does not answer."""
        import pymongo
        import pymongo.errors
        kw = self.client_options()
        for k in ("username", "password", "authSource"):
            kw.pop(k, None)
        client: Any = pymongo.MongoClient(proc.host, proc.port, directConnection=True,
                                          serverSelectionTimeoutMS=2000,
                                          connectTimeoutMS=2000, **kw)
        try:
            return client.admin.command(cmd)
        except pymongo.errors.PyMongoError:
            return None
        finally:
            client.close()

    def _new_shard(self, name: str) -> RoleProcess:
        """Shard ``name``'s single process, put on the cluster (not started)."""
        proc = self._proc("shard", ["--port", self._saved_port(name), "--host", self.host,
                                    "--shard-name", name,
                                    *self._dbpath(name), *self.shard_args,
                                    *self._security_args()], name)
        self.shards.append(proc)
        return proc

    def _start_shard(self) -> str:
        """Start the next shard's processes (and wait for its primary); returns its name."""
        procs = self._new_shard_members()
        for proc in procs:
            proc.spawn()
        for proc in procs:
            self._ready(proc)
        if len(procs) > 1:
            self._wait_primary(procs)
        return self._shard_names[-1]

    def shard_connection_string(self, name: str) -> str:
        """What ``addShard`` gets for shard ``name``: ``host:port``, or
        ``name/h1:p1,h2:p2,h3:p3`` for a replica set (as mongos is given a set)."""
        if name in self.sets:
            return f"{name}/" + ",".join(m.address for m in self.sets[name])
        return self.shard(name).address

    def admin_command(self, cmd: dict[str, Any], timeout_ms: int = 30000) -> dict[str, Any]:
        """Run an admin command on the router (a replica set: its primary) with pymongo."""
        import pymongo
        client: pymongo.MongoClient = pymongo.MongoClient(
            self.uri, serverSelectionTimeoutMS=timeout_ms, **self._direct(),
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

    def _add_shard_named(self, name: str) -> None:
        import pymongo.errors
        target = self.shard_connection_string(name)
        try:
            self.admin_command({"addShard": target, "name": name})
        except pymongo.errors.PyMongoError as exc:
            raise ClusterError(f"addShard {name} ({target}) failed: {exc}") from None

    def _add_shard(self, shard: RoleProcess) -> None:
        self._add_shard_named(shard.name)

    def add_shard(self) -> str:
        """Start one more shard (``members`` processes) and add it to the cluster; returns
        its name."""
        if self.topology != "sharded":
            raise ClusterError("a replica set has no shards to add")
        name = self._start_shard()
        self._add_shard_named(name)
        self._save_ports()
        return name

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
        out: dict[str, Any] = {"topology": self.topology, "uri": self.uri}
        if self.topology == "sharded":
            out["router_uri"] = self.router_uri
        if self.sets:
            out["sets"] = {name: [m.name for m in ms] for name, ms in self.sets.items()}
        return {
            **out,
            "base_dir": self.base_dir,
            "started": time.time(),
            "processes": [{"name": p.name, "module": p.module, "pid": p.pid, "host": p.host,
                           "port": p.port, "log": p.log_path, "args": list(p.args),
                           **({"set": self._set_of(p)} if self._set_of(p) else {})}
                          for p in self.processes],
        }


    def _set_of(self, proc: RoleProcess) -> str | None:
        """The name of the set (of more than one member) ``proc`` is a member of, or None."""
        for name, members in self.sets.items():
            if proc in members:
                return name
        return None


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
