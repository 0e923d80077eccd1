"""``shardsim top``: a running cluster's change-stream cursors, live (rich).

Every second (``--interval``) it runs, on the router,
``aggregate: 1, pipeline: [{$currentOp: {idleCursors: true, localOps: true}}, {$match:
{changeStream: {$exists: true}}}]`` (see :mod:`router.current_op`) and shows one table: per
router change-stream cursor, one row per remote (shards and config server) with the member its
cursor is on (``host``) and that member's state as the router sees it (``PRIMARY``,
``SECONDARY``, ``UNKNOWN`` when unreachable...), its promise's
cluster time, its lag behind the router's cluster time, the events it has buffered, whether a
getMore to it is outstanding, and whether it holds the stream back right now (``waitingFor``).
``--once`` prints the table once and exits (exit 0), for scripts and tests.

The cluster is ``--uri``, or the detached cluster of the run directory (``shardsim up
--detach``).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from shardsim.tools.launcher import read_state, state_path
from shardsim.tools.launcher_cli import resolve_run_dir, run_dir_option

PIPELINE = [{"$currentOp": {"idleCursors": True, "localOps": True}},
            {"$match": {"changeStream": {"$exists": True}}}]


def change_stream_cursors(client: Any) -> list[dict[str, Any]]:
    """The router's change-stream cursor entries (``$currentOp``, :data:`PIPELINE`)."""
    return list(client.admin.aggregate(PIPELINE))


def _ts(ts: Any) -> str:
    return "-" if ts is None else f"{ts.time},{ts.inc}"


def table(entries: list[dict[str, Any]]) -> Any:
    """A ``rich.table.Table`` of ``entries`` (:func:`change_stream_cursors`): one row per
    remote of each cursor; the remotes in ``waitingFor`` are marked ``WAITING``."""
    from rich.table import Table
    t = Table(title=f"shardsim change streams ({len(entries)} cursor"
                    f"{'' if len(entries) == 1 else 's'})", expand=False)
    for col, justify in (("cursor", "left"), ("ns", "left"), ("remote", "left"),
                         ("host", "left"), ("state", "left"), ("promise", "right"), ("lag ms", "right"), ("buffered", "right"),
                         ("getMore", "center"), ("holds back", "left")):
        t.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for e in entries:
        cs = e["changeStream"]
        waiting = set(cs.get("waitingFor") or [])
        first = True
        for r in cs.get("remotes") or []:
            lag = r.get("lagMillis")
            t.add_row(str(e["cursor"]["cursorId"]) if first else "",
                      e.get("ns", "") if first else "",
                      r["name"], r.get("host") or "", r.get("state") or "-",
                      _ts(r.get("promiseClusterTime")),
                      "-" if lag is None else str(lag), str(r.get("bufferedEvents", 0)),
                      "out" if r.get("inFlight") else "",
                      "[bold red]WAITING[/]" if r["name"] in waiting else "")
            first = False
        if first:  # no remote (not expected): still show the cursor
            t.add_row(str(e["cursor"]["cursorId"]), e.get("ns", ""), *[""] * 8)
    if not entries:
        t.caption = "no change-stream cursor open on the router"
    return t


def _uri(uri: str | None, run_dir: str | None) -> str:
    if uri:
        return uri
    run_dir = resolve_run_dir(run_dir)
    state = read_state(run_dir)
    if state is None:
        raise click.ClickException(f"no --uri and no detached cluster (no {state_path(run_dir)})")
    if "router_uri" not in state:
        raise click.ClickException(f"the detached cluster is a replica set ({state.get('uri')}) "
                                   f"without a router; 'shardsim top' shows a router's cursors")
    return state["router_uri"]


@click.command()
@click.option("--uri", default=None, help="The router [default: the detached cluster's].")
@click.option("--once", is_flag=True, help="Print one table and exit.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between refreshes.")
@run_dir_option
def top(uri: str | None, once: bool, interval: float, run_dir: str | None) -> None:
    """Show the router's change-stream cursors live: per remote its promise, lag, buffered
    events, and which remotes hold the stream back."""
    import pymongo
    from rich.console import Console
    from rich.live import Live
    client: Any = pymongo.MongoClient(_uri(uri, run_dir), serverSelectionTimeoutMS=5000)
    # not a terminal (a pipe, a file): wide enough for cursor ids and timestamps
    console = Console() if sys.stdout.isatty() else Console(width=200)
    try:
        if once:
            console.print(table(change_stream_cursors(client)))
            return
        with Live(table(change_stream_cursors(client)), console=console,
                  refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(table(change_stream_cursors(client)))
    except KeyboardInterrupt:
        pass
    except pymongo.errors.PyMongoError as exc:
        raise click.ClickException(f"the router did not answer: {exc}") from None
    finally:
        client.close()
