"""Starting and stopping role processes: free loopback ports, readiness, guaranteed cleanup.

Every role prints one line ``shardsim <role> ready on <host>:<port>`` on stdout once it
listens (see :func:`shardsim.core.server.run_node`); :class:`RoleProcess` waits for that line.
Used by the launcher (``shardsim up``) and by the tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, Sequence

from shardsim.core.server import READY_RE

def role_module(role: str) -> str:
    """The module ``python -m`` runs for a role: ``shard`` -> ``shardsim.shard``."""
    return f"shardsim.{role}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


class OwnedPopen(subprocess.Popen):
    """A Popen that hands itself to ``owner.proc`` *before* it forks.

    An exception raised inside ``Popen()`` after the fork (a KeyboardInterrupt from Ctrl-C lands
    easily while the parent waits for the child's exec) would otherwise lose the only reference
    to a running child, and nobody could stop it. With the object already on the owner,
    :meth:`RoleProcess.stop` finds it: ``pid`` is None until the fork, then set.
    """

    def __init__(self, owner: "RoleProcess", *args: Any, **kwargs: Any) -> None:
        # What stop()/poll()/__del__ read, valid before Popen.__init__ has run a line.
        self.pid = None
        self.returncode = None
        self._child_created = False
        self._waitpid_lock = threading.Lock()
        owner.proc = self
        super().__init__(*args, **kwargs)


class RoleProcess:
    """One role as a child process: ``python -m <module> <args>``.

    ``start()`` waits (up to ``timeout`` s) for the ready line and raises RuntimeError with
    the process's last output if it exits or times out first; on that or on any other
    exception while starting (KeyboardInterrupt) the process is stopped before it propagates.
    ``stop()`` sends SIGTERM then SIGKILL; ``kill()`` sends SIGKILL (for crash tests).
    """

    def __init__(self, module: str, args: Sequence[str], *, name: str | None = None,
                 env: dict[str, str] | None = None, log_path: str | None = None) -> None:
        self.module = module
        self.args = list(args)
        self.name = name or module
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.port: int | None = None
        self.host: str | None = None
        self.output: deque[str] = deque(maxlen=200)
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout: float = 30.0) -> "RoleProcess":
        """:meth:`spawn`, then :meth:`wait_ready`."""
        self.spawn()
        return self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the child without waiting for it to be ready (several processes then start
        at the same time: :meth:`shardsim.tools.launcher.Cluster.start`). On any exception while
        spawning the process is stopped before it propagates."""
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.env:
            env.update(self.env)
        self._ready.clear()
        # The log is opened here, not in the reader thread: a Ctrl-C during start-up makes the
        # launcher remove its run directory, and a reader opening the file after that failed
        # with a traceback of its own thread.
        log = open(self.log_path, "a") if self.log_path else None
        reading = False  # the reader owns (and closes) the log once it runs
        try:
            OwnedPopen(self, [sys.executable, "-m", role_module(self.module), *self.args],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       start_new_session=True)
            assert self.proc is not None
            self._reader = threading.Thread(target=self._pump, args=(log,), daemon=True)
            self._reader.start()
            reading = True
        except BaseException:
            if log is not None and not reading:
                log.close()
            self.stop()  # Ctrl-C (or any error) while starting: leave nothing behind
            raise

    def wait_ready(self, timeout: float = 30.0) -> "RoleProcess":
        """Wait (up to ``timeout`` s) for the ready line of a spawned process; RuntimeError with
        its last output (after stopping it) when it exits or times out first."""
        assert self.proc is not None, "spawn() first"
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self._ready.wait(0.05):
                    return self
                if self.proc.poll() is not None:
                    if self._reader is not None:
                        self._reader.join(1)
                    break
        except BaseException:
            self.stop()
            raise
        out = "\n".join(self.output)
        self.stop()
        raise RuntimeError(f"{self.name} did not start (exit {self.proc.returncode}):\n{out}")

    def _pump(self, log: Any) -> None:
        """Read the child's output until it ends: keep the last lines, append them to ``log``
        (an open file, closed here at the end, or None) and notice the ready line."""
        assert self.proc is not None and self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                self.output.append(line.rstrip())
                if log:
                    log.write(line)
                    log.flush()
                m = READY_RE.search(line)
                if m and not self._ready.is_set():
                    self.host, self.port = m.group(2), int(m.group(3))
                    self._ready.set()
        finally:
            if log:
                log.close()

    def _forked(self) -> bool:
        """True once a child exists and has not been reaped (``proc.pid`` is None while
        :class:`OwnedPopen` has not forked yet)."""
        return (self.proc is not None and getattr(self.proc, "pid", None) is not None
                and self.proc.poll() is None)

    def alive(self) -> bool:
        return self._forked()

    def _signal(self, sig: int) -> None:
        assert self.proc is not None and self.proc.pid is not None
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            # Forked but not yet in its own session (setsid runs just before exec).
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` s; always reaps."""
        if not self._forked():
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the process group and reap it."""
        if not self._forked():
            return
        self._signal(signal.SIGKILL)
        self.proc.wait(10)  # type: ignore[union-attr]

