"""``shardsim spec``: run the unified change-stream spec tests against shardsim (or any URI).

Without ``--uri`` it starts what it tests: a mini sharded cluster
(:class:`shardsim.launcher.Cluster`) for ``--topology sharded``, or one ``python -m shard``
process (a one-member replica set, connected with ``directConnection=true``) for
``--topology replicaset``; both are stopped on exit. It prints a table of every test with its
result and, for skips, the reason (from ``runOnRequirements``), then the summary line
``N passed, N failed, N skipped`` alone on a line. The exit status is 1 if any test failed.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Iterator

import click
from pymongo.errors import PyMongoError

from .runner import DEFAULT_ITERATE_TIMEOUT, Runner, TestResult

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SHARED_SPEC_DIR = PROJECT_ROOT.parent / "shared" / "specs" / "change-streams" / "tests" / "unified"
CACHE_SPEC_DIR = PROJECT_ROOT / ".cache" / "specs" / "change-streams" / "tests" / "unified"


def default_spec_dir() -> Path:
    """``../shared/specs/change-streams/tests/unified`` (relative to the project root) when it
    exists, else the ``make fetch-specs`` cache ``.cache/specs/change-streams/tests/unified``."""
    if SHARED_SPEC_DIR.is_dir():
        return SHARED_SPEC_DIR
    return CACHE_SPEC_DIR


@contextlib.contextmanager
def deployment(topology: str, uri: str | None, shards: int) -> Iterator[str]:
    """Yield a connection string for ``topology``; start (and always stop) processes if needed."""
    if uri:
        yield uri
        return
    if topology == "sharded":
        from shardsim.launcher import Cluster
        with Cluster(shards=shards) as cluster:
            yield cluster.router_uri
        return
    from shardsim.procs import RoleProcess
    shard = RoleProcess("shard", ["--port", "0", "--shard-name", "rs0"], name="shard rs0")
    shard.start()
    try:
        yield f"mongodb://{shard.host}:{shard.port}/?directConnection=true"
    finally:
        shard.stop()


def summary_line(results: list[TestResult]) -> str:
    """``"N passed, N failed, N skipped"``."""
    count = {s: sum(1 for r in results if r.status == s) for s in ("passed", "failed", "skipped")}
    return f"{count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped"


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
@click.option("--filter", "name_filter", default=None,
              help="Only tests whose '<file>: <description>' contains this (case-insensitive).")
@click.option("--shards", default=2, show_default=True, help="Shards of the started cluster.")
@click.option("--iterate-timeout", default=DEFAULT_ITERATE_TIMEOUT, show_default=True,
              help="Seconds iterateUntilDocumentOrError waits for a change event.")
@click.option("--verbose", "-v", is_flag=True, help="Print each failure's full diff/traceback.")
def spec(uri: str | None, topology: str, spec_dirs: tuple[Path, ...], name_filter: str | None,
         shards: int, iterate_timeout: float, verbose: bool) -> None:
    """Run the unified change-stream spec tests with pymongo and print passed/failed/skipped."""
    from rich.console import Console

    # Wide output when not on a terminal (CI logs), so rows do not wrap into columns of words.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    dirs = list(spec_dirs) or [default_spec_dir()]
    for d in dirs:
        if not d.exists():
            raise click.ClickException(
                f"spec directory {d} does not exist; pass --spec-dir or run `make fetch-specs`")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            target = stack.enter_context(deployment(topology, uri, shards))
            runner = stack.enter_context(Runner(target, iterate_timeout=iterate_timeout))
        except (RuntimeError, PyMongoError) as exc:
            raise click.ClickException(f"cannot start or reach the deployment: {exc}") from None
        console.print(f"running unified spec tests from {', '.join(map(str, dirs))} against "
                      f"{target}")
        info = runner.info
        console.print(f"server {'.'.join(map(str, info.version))}, topology {info.topology}")
        if uri and info.topology != topology:
            console.print(f"note: --topology {topology} ignored, the deployment at --uri is "
                          f"{info.topology}")

        def progress(r: TestResult) -> None:
            mark = {"passed": ".", "failed": "F", "skipped": "s"}[r.status]
            console.print(mark, end="")

        results = runner.run_paths(dirs, name_filter, progress)
        console.print()
    render_table(results, console)
    if verbose:
        for r in results:
            if r.status == "failed":
                console.rule(f"[red]FAILED[/] {r.name}")
                console.print(r.detail or r.reason, markup=False, highlight=False)
    console.print(f"elapsed {time.monotonic() - started:.1f} s")
    # The summary is the last line, alone, unstyled (scripts parse it).
    click.echo(summary_line(results))
    sys.exit(1 if any(r.status == "failed" for r in results) else 0)
