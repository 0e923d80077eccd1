"""``shardsim spec``: run the unified change-stream spec tests against shardsim (or any URI).

Without ``--uri`` it starts what it tests: a mini sharded cluster
(:class:`shardsim.tools.launcher.Cluster`) for ``--topology sharded``, or for ``--topology
replicaset`` a replica set of ``--members`` member processes (3 by default, as ``shardsim up
--topology replicaset --members 3``; connected with ``replicaSet=rs0``, so the driver discovers
the set), or with ``--members 1`` one ``python -m shardsim.shard`` process (a one-member
replica set, connected with ``directConnection=true``); both are stopped on exit. It prints a table of every test with its
result and, for skips, the reason (from ``runOnRequirements``), then the summary line
``N passed, N failed, N skipped`` alone on a line. The exit status is 1 if any test failed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import quote_plus

import click
from pymongo.errors import PyMongoError

from shardsim.core import server_version as server_version_mod

from .runner import DEFAULT_ITERATE_TIMEOUT, Runner, TestResult
from .uris import redact_uri

PROJECT_ROOT = Path(__file__).resolve().parents[2]



def _shared_specs() -> Path:
    """``shared/specs`` next to the project checkout, or next to one of its ancestors (a git
    worktree under ``wt/`` finds the same ``shared/specs`` as the main checkout)."""
    for base in PROJECT_ROOT.parents:
        if (base / "shared" / "specs").is_dir():
            return base / "shared" / "specs"
    return PROJECT_ROOT.parent / "shared" / "specs"


SHARED_SPECS = _shared_specs()
CACHE_SPECS = PROJECT_ROOT / ".cache" / "specs"
SHARED_SPEC_DIR = SHARED_SPECS / "change-streams" / "tests" / "unified"
CACHE_SPEC_DIR = CACHE_SPECS / "change-streams" / "tests" / "unified"

# The suites `--suite all` runs, in this order.
SUITES = ("change-streams", "crud", "transactions", "transactions-convenient-api",
          "retryable-writes", "retryable-reads", "sessions", "collection-management",
          "causal-consistency", "index-management", "run-command", "unified-test-format")


def suite_dir(name: str) -> Path:
    """Where suite ``name``'s unified JSON tests are: under ``../shared/specs/<name>/`` when it
    exists, else the ``make fetch-specs`` cache ``.cache/specs/<name>/``; inside it
    ``tests/unified``, ``tests/valid-pass`` (unified-test-format) or ``tests``.
    ClickException when neither has the suite."""
    for base in (SHARED_SPECS, CACHE_SPECS):
        for sub in ("tests/unified", "tests/valid-pass", "tests"):
            d = base / name / sub
            if d.is_dir() and any(d.glob("*.json")):
                return d
    raise click.ClickException(f"no spec tests for suite {name!r} in {SHARED_SPECS} or {CACHE_SPECS}; "
                               f"run `make fetch-specs` or pass --spec-dir")


def suite_names(requested: tuple[str, ...]) -> list[str]:
    """``--suite`` values expanded (``all`` = every suite found), duplicates removed."""
    out: list[str] = []
    for name in requested:
        names = [n for n in SUITES if _suite_exists(n)] if name == "all" else [name]
        out += [n for n in names if n not in out]
    return out


def _suite_exists(name: str) -> bool:
    try:
        suite_dir(name)
        return True
    except click.ClickException:
        return False


def default_spec_dir() -> Path:
    """``../shared/specs/change-streams/tests/unified`` (relative to the project root) when it
    exists, else the ``make fetch-specs`` cache ``.cache/specs/change-streams/tests/unified``."""
    if SHARED_SPEC_DIR.is_dir():
        return SHARED_SPEC_DIR
    return CACHE_SPEC_DIR


def credentials_from_env() -> tuple[str, str]:
    """The user ``--auth`` creates and authenticates as: ``$MONGO_INITDB_ROOT_USERNAME`` /
    ``$MONGO_INITDB_ROOT_PASSWORD``, default ``root`` / ``root`` (as ``shardsim up --auth``)."""
    return (os.environ.get("MONGO_INITDB_ROOT_USERNAME") or "root",
            os.environ.get("MONGO_INITDB_ROOT_PASSWORD") or "root")


def with_credentials(uri: str, user: str, password: str, auth_source: str = "admin") -> str:
    """``mongodb://h:p,.../[db][?opts]`` with ``user:password@`` (percent-encoded) and
    ``authSource`` added, as a driver's test runner puts its credentials in the URI."""
    scheme, rest = uri.split("://", 1)
    hosts, sep, tail = rest.partition("/")
    path, qmark, query = tail.partition("?")
    opts = [o for o in query.split("&") if o]
    if not any(o.lower().startswith("authsource=") for o in opts):
        opts.append(f"authSource={auth_source}")
    return (f"{scheme}://{quote_plus(user)}:{quote_plus(password)}@{hosts}/{path}"
            f"?{'&'.join(opts)}")


@contextlib.contextmanager
def deployment(topology: str, uri: str | None, shards: int,
               mongoses: int = 1, auth: tuple[str, str] | None = None,
               server_version: str = "8.0", members: int = 1) -> Iterator[str]:
    """Yield a connection string for ``topology``; start (and always stop) processes if
    needed. A started sharded cluster has ``mongoses`` routers, all listed in the URI (tests
    whose clients set ``useMultipleMongoses: true`` need at least two). ``auth``: ``(user,
    password)``: the started processes get a key file (authentication on) and that user with
    ``root`` on ``admin``; the URI carries the credentials. With ``uri`` it is ignored (put
    the credentials in the URI). ``server_version``: the release the started processes behave
    as (``--server-version``, shardsim/core/server_version.py), so that ``runOnRequirements``
    selects the tests a real server of that release runs. ``members``: the replica set's
    members for ``replicaset`` (more than one: ``mongodb://h1,h2,h3/?replicaSet=rs0``, the
    server's timing defaults)."""
    if uri:
        yield uri
        return
    if topology == "replicaset" and members > 1:
        from shardsim.tools.launcher import Cluster
        with Cluster(topology="replicaset", members=members, auth=auth, test_commands=True,
                     server_version=server_version) as rs:
            yield with_credentials(rs.uri, *auth) if auth else rs.uri
        return
    if topology == "sharded":
        from shardsim.tools.launcher import Cluster
        with Cluster(shards=shards, routers=mongoses, auth=auth, test_commands=True,
                     server_version=server_version) as cluster:
            target = cluster.routers_uri
            yield with_credentials(target, *auth) if auth else target
        return
    from shardsim.tools.procs import RoleProcess
    with contextlib.ExitStack() as stack:
        args = ["--port", "0", "--shard-name", "rs0", "--enable-test-commands"]  # fail points
        if server_version != "8.0":
            args += ["--server-version", server_version]
        if auth:
            key_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="shardsim-spec-"))
            args += ["--keyFile", _write_key_file(key_dir)]
        shard = RoleProcess("shard", args, name="shard rs0")
        shard.start()
        stack.callback(shard.stop)
        target = f"mongodb://{shard.host}:{shard.port}/?directConnection=true"
        if auth:
            _create_root_user(target, *auth)
            target = with_credentials(target, *auth)
        yield target


def _write_key_file(directory: str) -> str:
    """A random key file (mode 0600) in ``directory``, like the launcher's."""
    import base64
    path = os.path.join(directory, "keyfile")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(base64.b64encode(os.urandom(756)).decode() + "\n")
    return path


def _create_root_user(uri: str, user: str, password: str) -> None:
    """The first user of a fresh process, through the localhost exception."""
    import pymongo
    client: pymongo.MongoClient = pymongo.MongoClient(uri, serverSelectionTimeoutMS=30000)
    try:
        client.admin.command("createUser", user, pwd=password,
                             roles=[{"role": "root", "db": "admin"}])
    finally:
        client.close()


def summary_line(results: list[TestResult]) -> str:
    """``"N passed, N failed, N skipped"``."""
    count = {s: sum(1 for r in results if r.status == s) for s in ("passed", "failed", "skipped")}
    return f"{count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped"


def render_suite_tables(by_suite: dict[str, list[TestResult]], console: object) -> None:
    """Per suite: its main failure causes (first line of the reason, with counts); then one
    table with a row per suite (passed / failed / skipped / pass rate of the tests run)."""
    from collections import Counter

    from rich.table import Table

    for suite, results in by_suite.items():
        causes = Counter(_cause(r.reason) for r in results if r.status == "failed")
        if not causes:
            continue
        t = Table(title=f"{suite}: failure causes", expand=False)
        t.add_column("tests", justify="right")
        t.add_column("cause")
        for cause, n in causes.most_common(15):
            t.add_row(str(n), cause)
        console.print(t)  # type: ignore[attr-defined]
    table = Table(title="unified spec suites", expand=False)
    for col in ("suite", "passed", "failed", "skipped", "pass rate"):
        table.add_column(col, justify="left" if col == "suite" else "right")
    for suite, results in by_suite.items():
        n = {s: sum(1 for r in results if r.status == s) for s in ("passed", "failed", "skipped")}
        ran = n["passed"] + n["failed"]
        rate = f"{100 * n['passed'] / ran:.0f} %" if ran else "-"
        table.add_row(suite, str(n["passed"]), str(n["failed"]), str(n["skipped"]), rate)
    console.print(table)  # type: ignore[attr-defined]


def _cause(reason: str) -> str:
    """A failure reason shortened to its cause (operation labels and long values cut)."""
    text = reason.split(": ", 1)[1] if reason.startswith("operation ") and ": " in reason else reason
    return text if len(text) <= 110 else text[:107] + "..."


def render_table(results: list[TestResult], console: object) -> None:
    """Print the rich results table (file, test, result, reason or time)."""
    from rich.table import Table

    table = Table(title="unified spec tests", show_lines=False, expand=False)
    table.add_column("file", style="cyan", no_wrap=True)
    table.add_column("test")
    table.add_column("result", no_wrap=True)
    table.add_column("reason / time")
    style = {"passed": "green", "failed": "bold red", "skipped": "yellow"}
    for r in results:
        reason = r.reason if len(r.reason) <= 160 else r.reason[:157] + "..."
        note = reason if r.status != "passed" else f"{r.duration:.2f} s"
        if r.status == "failed" and r.duration:
            note = f"{reason} ({r.duration:.2f} s)"
        table.add_row(r.file.removeprefix("change-streams-"), r.description,
                      f"[{style[r.status]}]{r.status}[/]", note)
    console.print(table)  # type: ignore[attr-defined]


@click.command("spec")
@click.option("--uri", default=None, help="Run against this deployment instead of starting one.")
@click.option("--topology", type=click.Choice(["sharded", "replicaset"]), default="sharded",
              show_default=True, help="What to start when --uri is not given.")
@click.option("--spec-dir", "spec_dirs", multiple=True, type=click.Path(path_type=Path),
              help="Directory (or file) of unified JSON tests; repeatable. Default: "
                   "../shared/specs/change-streams/tests/unified, else the make fetch-specs cache.")
@click.option("--suite", "suites", multiple=True,
              help="A suite of ../shared/specs (or the make fetch-specs cache) to run: "
                   f"{', '.join(SUITES)}, or all; repeatable. Prints a table per suite.")
@click.option("--filter", "name_filter", default=None,
              help="Only tests whose '<file>: <description>' contains this (case-insensitive).")
@click.option("--shards", default=2, show_default=True, help="Shards of the started cluster.")
@click.option("--members", type=click.IntRange(1, 50), default=3, show_default=True,
              help="Members of the started replica set (--topology replicaset); 1: one "
                   "process, connected directly.")
@click.option("--mongoses", default=2, show_default=True,
              help="Routers of the started sharded cluster (useMultipleMongoses tests need 2).")
@click.option("--auth", is_flag=True,
              help="Start the deployment with authentication on (a key file and a root user from "
                   "$MONGO_INITDB_ROOT_USERNAME / $MONGO_INITDB_ROOT_PASSWORD, default root / "
                   "root) and run every client as that user. With --uri, put the credentials "
                   "in the URI instead.")
@click.option("--iterate-timeout", default=DEFAULT_ITERATE_TIMEOUT, show_default=True,
              help="Seconds iterateUntilDocumentOrError waits for a change event.")
@click.option("--verbose", "-v", is_flag=True, help="Print each failure's full diff/traceback.")
@server_version_mod.click_option
def spec(uri: str | None, topology: str, spec_dirs: tuple[Path, ...], suites: tuple[str, ...],
         name_filter: str | None, shards: int, mongoses: int, auth: bool,
         iterate_timeout: float, verbose: bool, server_version: str = "8.0",
         members: int = 3) -> None:
    """Run unified spec tests (default: change streams) with pymongo and print
    passed/failed/skipped; with --suite, a table per suite."""
    from rich.console import Console

    # Wide output when not on a terminal (CI logs), so rows do not wrap into columns of words.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    named = {name: [suite_dir(name)] for name in suite_names(suites)}
    if spec_dirs:
        named["--spec-dir"] = list(spec_dirs)
    if not named:
        named["change-streams"] = [default_spec_dir()]
    dirs = [d for ds in named.values() for d in ds]
    for d in dirs:
        if not d.exists():
            raise click.ClickException(
                f"spec directory {d} does not exist; pass --spec-dir or run `make fetch-specs`")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            if auth and uri:
                raise click.ClickException("--auth starts an authenticated deployment; with "
                                           "--uri put the credentials in the URI "
                                           "(mongodb://user:password@host/?authSource=admin)")
            creds = credentials_from_env() if auth else None
            if uri and server_version != "8.0":
                raise click.ClickException("--server-version chooses what shardsim starts; the "
                                           "deployment at --uri reports its own version")
            target = stack.enter_context(deployment(topology, uri, shards, mongoses, creds,
                                                    server_version, members))
            runner = stack.enter_context(Runner(target, iterate_timeout=iterate_timeout))
        except (RuntimeError, PyMongoError) as exc:
            raise click.ClickException(f"cannot start or reach the deployment: {exc}") from None
        console.print(f"running unified spec tests from {', '.join(map(str, dirs))} against "
                      f"{redact_uri(target)}")
        info = runner.info
        console.print(f"server {'.'.join(map(str, info.version))}, topology {info.topology}, "
                      f"auth {'on (' + ', '.join(info.auth_mechanisms) + ')' if info.auth else 'off'}")
        if uri and info.topology != topology:
            console.print(f"note: --topology {topology} ignored, the deployment at --uri is "
                          f"{info.topology}")

        def progress(r: TestResult) -> None:
            mark = {"passed": ".", "failed": "F", "skipped": "s"}[r.status]
            console.print(mark, end="")

        by_suite = {}
        for name, suite_dirs in named.items():
            by_suite[name] = runner.run_paths(suite_dirs, name_filter, progress)
        results = [r for rs in by_suite.values() for r in rs]
        console.print()
    if len(named) == 1 and not suites:
        render_table(results, console)
    else:
        render_suite_tables(by_suite, console)
    if verbose:
        for r in results:
            if r.status == "failed":
                console.rule(f"[red]FAILED[/] {r.name}")
                console.print(r.detail or r.reason, markup=False, highlight=False)
    console.print(f"elapsed {time.monotonic() - started:.1f} s")
    # The summary is the last line, alone, unstyled (scripts parse it).
    click.echo(summary_line(results))
    sys.exit(1 if any(r.status == "failed" for r in results) else 0)
