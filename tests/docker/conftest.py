"""Fixtures driving the docker compose mini cluster (deploy/docker-compose.yml) from tests.

:class:`ComposeCluster` runs the compose tool (`docker compose` or `docker-compose`, whichever is
installed) under a unique project name with the router published on a free loopback port, so a
test cluster never collides with a user's cluster or another run. ``down()`` removes the
containers, network and volumes and is safe to call twice; ``leftovers()`` lists anything of the
project that is still there.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from shardsim.tools.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
AUTH_COMPOSE_FILE = ROOT / "deploy" / "docker-compose.auth.yml"
BUILD_SCRIPT = ROOT / "deploy" / "build-image.sh"


def docker_unavailable() -> str | None:
    """Why Docker cannot be used here (None when `docker info` works and a compose tool exists)."""
    if shutil.which("docker") is None:
        return "no `docker` command on PATH"
    try:
        r = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                           capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "`docker info` timed out (engine not answering)"
    if r.returncode != 0:
        return "`docker info` failed: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    return None


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) if it works, else `docker-compose` (v1/v2 binary)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def build_images(timeout_s: float = 1500) -> None:
    """`make docker-build`: wheels on the host, the local base image if no registry (debootstrap
    on first use, hence the long timeout), then the shardsim image. Raises RuntimeError with the
    script's output on failure."""
    r = subprocess.run(["bash", str(BUILD_SCRIPT)], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"deploy/build-image.sh failed ({r.returncode}):\n{r.stdout[-3000:]}\n"
                           f"{r.stderr[-5000:]}")


class ComposeCluster:
    """One compose project of deploy/docker-compose.yml with the router on ``127.0.0.1:port``."""

    def __init__(self, port: int, project: str | None = None,
                 extra_files: tuple[Path, ...] = (), env: dict[str, str] | None = None) -> None:
        self.port = port
        self.project = project or f"shardsim-test-{secrets.token_hex(4)}"
        self.uri = f"mongodb://127.0.0.1:{port}/"
        cmd = compose_command()
        assert cmd is not None
        self._cmd = cmd + ["-p", self.project, "-f", str(COMPOSE_FILE)]
        for f in extra_files:
            self._cmd += ["-f", str(f)]
        self._env = dict(os.environ, SHARDSIM_PORT=str(port), SHARDSIM_PORT2=str(free_port()),
                         SHARDSIM_BIND="127.0.0.1", **(env or {}))
        self._down = False

    def compose(self, *args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
        """Run one compose subcommand; raises RuntimeError with its output when ``check``."""
        r = subprocess.run(self._cmd + list(args), cwd=ROOT, env=self._env, capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"compose {' '.join(args)} failed ({r.returncode}):\n"
                               f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def container(self, service: str) -> str:
        """The container id of ``service`` (running or not)."""
        cid = self.compose("ps", "-a", "-q", service).stdout.strip()
        if not cid:
            raise RuntimeError(f"no container for service {service}")
        return cid.splitlines()[0]

    def up(self, timeout_s: float = 240) -> None:
        """Start the cluster and wait until the init service has added the shards (exit 0)."""
        self.compose("up", "-d", timeout=timeout_s)
        init = self.container("init")
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.inspect(init)["State"]
            if state["Status"] == "exited":
                if state["ExitCode"] != 0:
                    raise RuntimeError(f"init exited {state['ExitCode']}:\n{self.logs()}")
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"init did not finish in {timeout_s}s:\n{self.logs()}")
            time.sleep(0.5)

    def inspect(self, cid: str) -> dict:
        out = subprocess.run(["docker", "inspect", cid], capture_output=True, text=True,
                             check=True, timeout=30).stdout
        return json.loads(out)[0]

    def health(self, service: str) -> str:
        """The Docker health status of ``service``'s container (healthy/unhealthy/starting),
        or its run state when it has no health check / is not running."""
        state = self.inspect(self.container(service))["State"]
        if state.get("Status") != "running":
            return state.get("Status", "?")
        return state.get("Health", {}).get("Status", "running")

    def wait_healthy(self, service: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while (status := self.health(service)) != "healthy":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{service} is {status} after {timeout_s}s:\n{self.logs(service)}")
            time.sleep(0.5)

    def exec(self, service: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """`docker exec` in ``service``'s container (as the image's user)."""
        return subprocess.run(["docker", "exec", self.container(service), *argv],
                              capture_output=True, text=True, timeout=timeout)

    def logs(self, *services: str) -> str:
        r = self.compose("logs", "--no-color", "--tail", "60", *services, check=False)
        return r.stdout[-6000:] + r.stderr[-2000:]

    def down(self) -> None:
        """`down -v --remove-orphans`: containers, the network and the volumes go. Idempotent."""
        if self._down:
            return
        self.compose("down", "-v", "--remove-orphans", "-t", "5", timeout=180)
        self._down = True

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes of this project that still exist (by compose's
        project label, and by the project-name prefix compose gives networks and volumes)."""
        label = f"label=com.docker.compose.project={self.project}"

        def ids(*argv: str) -> set[str]:
            out = subprocess.run(["docker", *argv], capture_output=True, text=True, check=True,
                                 timeout=30).stdout
            return {line for line in out.split() if line}

        prefix = f"name={self.project}_"
        return {
            "containers": sorted(ids("ps", "-a", "-q", "--filter", label)),
            "networks": sorted(ids("network", "ls", "-q", "--filter", label)
                               | ids("network", "ls", "-q", "--filter", prefix)),
            "volumes": sorted(ids("volume", "ls", "-q", "--filter", label)
                              | ids("volume", "ls", "-q", "--filter", prefix)),
        }


@pytest.fixture(scope="session")
def shardsim_image() -> str:
    """The shardsim image, built once per session for every compose test (the base image too
    when it is missing and no registry is reachable): its tag, ``$SHARDSIM_IMAGE`` or
    ``shardsim:local``. Skips (the only skip of these tests) when there is no usable Docker
    engine; a failed build is an error."""
    reason = docker_unavailable()
    if reason:
        pytest.skip(f"no usable Docker engine: {reason}")
    build_images()
    return os.environ.get("SHARDSIM_IMAGE", "shardsim:local")


@pytest.fixture(scope="module")
def compose_cluster(shardsim_image: str) -> Iterator[ComposeCluster]:
    """The compose cluster of one test module (down before the next module's project comes
    up, so two projects never run side by side): image built (``shardsim_image``), `up`, init
    finished. Always torn down with `down -v`, pass or fail; tests that kill services restart
    them themselves."""
    yield from running(ComposeCluster(free_port()))


def running(c: ComposeCluster) -> Iterator[ComposeCluster]:
    """``up`` the cluster, yield it, and always tear it down with `down -v`; if that fails,
    remove whatever the project still has (a fixture body: ``yield from running(c)``)."""
    try:
        c.up()
        yield c
    finally:
        try:
            c.down()
        finally:
            left = c.leftovers()
            for kind, cmd in (("containers", ["rm", "-f", "-v"]), ("networks", ["network", "rm"]),
                              ("volumes", ["volume", "rm", "-f"])):
                if left[kind]:
                    subprocess.run(["docker", *cmd, *left[kind]], capture_output=True, timeout=120)
