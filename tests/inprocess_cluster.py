"""The launcher's :class:`shardsim.tools.launcher.Cluster` interface over the in-process test kit, so
the project's own integration tests run against :class:`shardsim.testing.ShardedCluster` when
``SHARDSIM_TEST_CLUSTER=inprocess`` (read by ``tests/conftest.py``).

What the tests use of a launcher cluster: ``router_uri``, ``shards`` (each with ``name``,
``host``, ``port``, ``address``, ``kill()``, ``stop()``, ``alive()``), ``config``/``router`` (the
same), ``add_shard()``, ``shard(name)``, ``restart(proc)``, ``admin_command(cmd)``, ``start()``,
``stop()``. Launcher arguments map onto kit options: ``shards``, ``durable``/``base_dir`` ->
``durable``/``dbpath``, ``shard_args`` ``--noop-interval-ms N`` / ``--promise-mode M`` /
``--oplog-size-mb X``; anything else raises ValueError (the test then needs processes).
"""

from __future__ import annotations

import os
from typing import Any

from shardsim.testing import ShardedCluster

MODE_ENV = "SHARDSIM_TEST_CLUSTER"


def in_process() -> bool:
    """Do the fixtures build in-process clusters (``SHARDSIM_TEST_CLUSTER=inprocess``)?"""
    mode = os.environ.get(MODE_ENV, "processes")
    if mode not in ("processes", "inprocess"):
        raise ValueError(f"{MODE_ENV} must be 'processes' or 'inprocess', not {mode!r}")
    return mode == "inprocess"


class MemberProxy:
    """A kit member seen as a :class:`shardsim.tools.procs.RoleProcess`."""

    def __init__(self, kit: ShardedCluster, name: str, module: str) -> None:
        self.kit = kit
        self.name = name
        self.module = module

    def _member(self) -> Any:
        return self.kit.cluster._member(self.name)

    @property
    def host(self) -> str:
        return self._member().host

    @property
    def port(self) -> int:
        return self._member().port

    @property
    def address(self) -> str:
        return self._member().address

    def alive(self) -> bool:
        return self._member().running

    def kill(self) -> None:
        if self.module != "shard":
            raise ValueError("the in-process cluster kills shards only")
        self.kit.kill_shard(self.name)

    def stop(self) -> None:
        self.kill()


class InProcessCluster:
    """See the module docstring."""

    def __init__(self, shards: int = 3, base_dir: str | None = None, durable: bool = False,
                 shard_args: list[str] | None = None, **unsupported: Any) -> None:
        if unsupported:
            raise ValueError(f"the in-process cluster has no {sorted(unsupported)}")
        options: dict[str, Any] = {}
        shard_options: dict[str, Any] = {}
        args = list(shard_args or [])
        while args:
            flag = args.pop(0)
            value = args.pop(0) if args else None
            if flag == "--noop-interval-ms":
                options["noop_interval_ms"] = int(value)  # type: ignore[arg-type]
            elif flag == "--promise-mode":
                options["promise_mode"] = value
            elif flag == "--oplog-size-mb":
                shard_options["oplog_size_mb"] = float(value)  # type: ignore[arg-type]
            else:
                raise ValueError(f"the in-process cluster has no shard argument {flag}")
        if durable:
            options["dbpath"] = base_dir
        self.kit = ShardedCluster(shards=shards, durable=durable, shard_options=shard_options,
                                  **options)

    def start(self) -> "InProcessCluster":
        if base := self.kit.cluster._dbpath_arg:
            os.makedirs(base, exist_ok=True)
        self.kit.start()
        return self

    def stop(self) -> None:
        self.kit.stop()

    @property
    def router_uri(self) -> str:
        return self.kit.uri

    @property
    def shards(self) -> list[MemberProxy]:
        return [MemberProxy(self.kit, n, "shard") for n in self.kit.shard_names]

    @property
    def config(self) -> MemberProxy:
        return MemberProxy(self.kit, "config", "configsvr")

    @property
    def router(self) -> MemberProxy:
        return MemberProxy(self.kit, "router", "router")

    def shard(self, name: str) -> MemberProxy:
        if name not in self.kit.shard_names:
            raise KeyError(name)
        return MemberProxy(self.kit, name, "shard")

    def add_shard(self) -> str:
        return self.kit.add_shard()

    def restart(self, proc: MemberProxy) -> MemberProxy:
        if proc.module != "shard":
            raise ValueError("the in-process cluster restarts shards only")
        self.kit.restart_shard(proc.name)
        return proc

    def admin_command(self, cmd: dict[str, Any], timeout_ms: int = 30000) -> dict[str, Any]:
        import pymongo
        with pymongo.MongoClient(self.router_uri, serverSelectionTimeoutMS=timeout_ms) as c:
            return c.admin.command(cmd)
