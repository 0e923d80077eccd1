"""``shardsim load``: plan, shard, write with Spark, watch, verify, report.

Exit status: 0 when every watcher's stream verifies; 1 when the verifier finds a violation
(the first bad event is printed); 2 when the run could not be carried out (cluster, Spark or
write errors).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from typing import Any

import click


def output_paths(out_dir: str | None, result: str | None, plot: str | None) -> tuple[str, str]:
    """Where ``load`` writes its JSON result and its plot: ``--result``/``--plot`` relative
    to ``--out`` (created), the result defaulting to ``<out>/load-result.json`` and the plot
    to the result's path with ``.png``, so the two always land together (never in the current
    directory when ``--out`` or a ``--result`` elsewhere says otherwise)."""
    base = out_dir or (os.path.dirname(result) if result else "") or "."
    if result is None:
        result = os.path.join(base, "load-result.json")
    elif out_dir and not os.path.isabs(result):
        result = os.path.join(out_dir, result)
    if plot is None:
        plot = os.path.splitext(result)[0] + ".png"
    elif out_dir and not os.path.isabs(plot):
        plot = os.path.join(out_dir, plot)
    for path in (result, plot):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return result, plot


def _fail(console: Any, msg: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {msg}")
    sys.exit(code)


@click.command("load")
@click.option("--ops", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Number of planned operations.")
@click.option("--shards", type=click.IntRange(min=1), default=3, show_default=True,
              help="Shards of the mini cluster started when no --uri is given.")
@click.option("--uri", default=None, help="Router URI of a running cluster (else one is started).")
@click.option("--mix", default="insert=60,update=30,delete=10", show_default=True,
              help="Operation mix, weights per kind.")
@click.option("--distribution", type=click.Choice(["uniform", "zipf"]), default="uniform",
              show_default=True, help="How updates/deletes pick their document.")
@click.option("--collections", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--doc-size", type=click.IntRange(min=0), default=128, show_default=True,
              help="Target BSON size of inserted documents (bytes).")
@click.option("--seed", type=int, default=1, show_default=True, help="Same seed, same plan.")
@click.option("--db", default="shardsim_load", show_default=True)
@click.option("--watchers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Concurrent watchers of the merged stream (each is verified).")
@click.option("--direct", is_flag=True, help="Write to each shard's own port, not the router.")
@click.option("--spark-master", default="local[*]", show_default=True,
              help="Spark master, e.g. spark://HOST:7077.")
@click.option("--batch-size", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Operations per bulk write.")
@click.option("--inject-fault", type=click.Choice(["reorder", "drop", "duplicate"]), default=None,
              help="Perturb the received stream before verifying (the verifier must catch it).")
@click.option("--idle-timeout", type=float, default=15.0, show_default=True,
              help="Seconds of silence after the writers finish before a watcher gives up.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Directory for the result and the plot (created if missing) "
                   "[default: the --result file's directory, else the current one].")
@click.option("--result", "result_path", default=None,
              help="JSON result file [default: load-result.json in --out].")
@click.option("--plot", "plot_path", default=None,
              help="PNG plot of high-water marks and delivered events [default: beside the "
                   "result, same name with .png].")
@click.option("--skip-final-check", is_flag=True,
              help="Do not read the collections back to compare with the plan.")
def load(ops: int, shards: int, uri: str | None, mix: str, distribution: str, collections: int,
         doc_size: int, seed: int, db: str, watchers: int, direct: bool, spark_master: str,
         batch_size: int, inject_fault: str | None, idle_timeout: float,
         result_path: str | None, plot_path: str | None, skip_final_check: bool,
         out_dir: str | None = None) -> None:
    """Drive a Spark load through the cluster and verify the merged change stream end to end."""
    from rich.console import Console

    result_path, plot_path = output_paths(out_dir, result_path, plot_path)

    from shardsim.tools.load.plan import Plan, PlanSpec, parse_mix

    console = Console()
    try:
        spec = PlanSpec(ops=ops, seed=seed, mix=parse_mix(mix), distribution=distribution,
                        collections=collections, doc_size=doc_size, db=db)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    t_cmd = t = time.time()
    plan = Plan(spec)
    phases = {"plan_s": time.time() - t}
    console.print(f"plan: {len(plan):,} ops {plan.counts()} over {collections} collection(s), "
                  f"seed {seed}, {distribution} ({time.time() - t:.1f} s)")
    with contextlib.ExitStack() as stack:
        if uri is None:
            from shardsim.tools.launcher import Cluster

            console.print(f"starting a mini cluster with {shards} shard(s)…")
            t = time.time()
            try:
                cluster = stack.enter_context(Cluster(shards=shards))
            except Exception as exc:  # noqa: BLE001 - ClusterError, missing role modules, ...
                _fail(console, f"could not start the mini cluster: {exc}")
            uri = cluster.router_uri
            phases["cluster_start_s"] = time.time() - t
        code = _run(console, plan, uri, watchers=watchers, direct=direct, master=spark_master,
                    batch_size=batch_size, fault=inject_fault, idle_timeout=idle_timeout,
                    result_path=result_path, plot_path=plot_path,
                    final_check=not skip_final_check, stack=stack, phases=phases,
                    t_cmd=t_cmd)
    sys.exit(code)


def _run(console: Any, plan: Any, uri: str, *, watchers: int, direct: bool, master: str,
         batch_size: int, fault: str | None, idle_timeout: float, result_path: str,
         plot_path: str, final_check: bool, stack: contextlib.ExitStack,
         phases: dict[str, float], t_cmd: float) -> int:
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    from shardsim.tools.load import cluster as cl
    from shardsim.tools.load import report
    from shardsim.tools.load.plan import partition_by_shard
    from shardsim.tools.load.spark_job import SparkRunner, build_tasks
    from shardsim.tools.load.watch import ShardSampler, WaitSampler, Watcher

    spec = plan.spec
    client = MongoClient(uri, serverSelectionTimeoutMS=5000)
    stack.callback(client.close)
    try:
        hosts = cl.list_shards(client)
        t = time.time()
        chunks = cl.prepare(client, spec)
        phases["shard_collections_s"] = time.time() - t
        console.print(f"sharded {len(spec.collection_names)} collection(s) over "
                      f"{len(chunks.shards)} shard(s) ({len(chunks.chunks)} chunks, {time.time() - t:.1f} s)")
    except (PyMongoError, RuntimeError) as exc:
        _fail(console, f"could not shard the target collections: {exc}")
    workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="shardsim-load-"))
    tasks = build_tasks(plan, chunks, uri, hosts, direct=direct, batch_size=batch_size,
                        progress_dir=workdir)
    planned = {s: len(v) for s, v in partition_by_shard(plan, chunks).items()}

    runner = SparkRunner(master)
    console.print(f"starting Spark ({master})…")
    try:
        runner.start()
    except Exception as exc:  # noqa: BLE001 - Java missing, bad master, ...
        _fail(console, f"could not start Spark: {exc}")
    stack.callback(runner.stop)
    console.print(f"Spark up in {runner.startup_s:.1f} s")
    phases["spark_start_s"] = runner.startup_s

    samplers = [ShardSampler(s, hosts[s], spec.db) for s in chunks.shards]
    for smp in samplers:
        smp.start()
        stack.callback(smp.stop)
    for smp in samplers:
        smp.opened.wait(30)
    waits = WaitSampler(uri, spec.db)  # which remote held delivery back ($currentOp)
    waits.start()
    stack.callback(waits.stop)
    ws = []
    for i in range(watchers):
        w = Watcher(uri, spec.db, len(plan), os.path.join(workdir, f"watcher{i}.pickle"),
                    idle_timeout=idle_timeout)
        stack.callback(w.kill)
        try:
            w.start()
        except RuntimeError as exc:
            _fail(console, str(exc))
        ws.append(w)

    t_start = time.time()
    box, outs = _drive(console, runner, tasks, ws, samplers, plan, spec, phases, t_start)

    if "error" in box:
        _fail(console, f"Spark job failed: {box['error']}")
    results = box["results"]
    errors = [f"{r.shard}: {r.error}" for r in results if r.error]
    if errors:
        _fail(console, "writes failed: " + "; ".join(errors))

    final = _read_back(console, client, hosts, chunks, spec, phases) if final_check else None
    t = time.time()

    verdicts, first_bad, events0 = _verify_all(console, plan, outs, final, fault, spec)
    phases["verify_s"] = time.time() - t
    waits.stop()
    figures = report.compute(plan, results, events0, [s.data for s in samplers], planned,
                             waits=waits)
    figures["spark_startup_s"] = runner.startup_s
    phases["total_s"] = time.time() - t_cmd
    figures["phases"] = phases
    ok = first_bad is None
    verdict = "PASS: every planned op delivered once, in order" if ok else f"FAIL: {first_bad}"
    console.print(report.table(figures, verdict, ok))
    doc = {"spec": spec.to_json(), "uri": uri, "direct": direct, "spark_master": master,
           "watchers": verdicts, "figures": figures, "ok": ok, "first_violation": first_bad}
    report.write_json(result_path, doc)
    try:
        report.plot(plot_path, figures["t0"] or t_start, [s.data for s in samplers], events0,
                    results, outs[0].hwm)
    except Exception as exc:  # noqa: BLE001 - a plot failure must not hide the verdict
        console.print(f"[yellow]plot failed:[/] {exc}")
    console.print("phases (s): " + ", ".join(f"{k[:-2]} {v:.1f}" for k, v in phases.items()))
    console.print(f"result: {result_path}, plot: {plot_path}")
    if not ok:
        console.print(f"[bold red]first bad event:[/] {first_bad}")
    return 0 if ok else 1


def _drive(console: Any, runner: Any, tasks: list[Any], ws: list[Any], samplers: list[Any],
           plan: Any, spec: Any, phases: dict[str, float], t_start: float) -> tuple[dict, list]:
    """Run the Spark writers with live progress bars until they and the watchers finish, then
    collect the watchers' events and count each shard's oplog. Returns (job box, watcher outputs)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from shardsim.tools.load.spark_job import run_in_background

    thread, box = run_in_background(runner, tasks)
    columns = (TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        wbar = progress.add_task("written", total=len(plan), rate="")
        dbars = [progress.add_task(f"delivered (watcher {i})", total=len(plan), rate="")
                 for i in range(len(ws))]

        def refresh() -> None:
            el = max(1e-6, time.time() - t_start)
            done = sum(_read_progress(tk.progress_path) for tk in tasks)
            progress.update(wbar, completed=done, rate=f"{done / el:,.0f} ops/s")
            for bar, w in zip(dbars, ws):
                progress.update(bar, completed=w.received, rate=f"{w.received / el:,.0f} ev/s")

        while thread.is_alive():
            refresh()
            thread.join(0.2)
        for w in ws:
            w.finish()
        while any(w.proc.is_alive() for w in ws):
            refresh()
            time.sleep(0.2)
        refresh()
    phases["load_s"] = time.time() - t_start
    t = time.time()
    outs = [w.join(30) for w in ws]
    for smp in samplers:
        smp.stop()
    for smp in samplers:
        smp.join(5)
    phases["collect_events_s"] = time.time() - t
    t = time.time()
    # one thread per shard: each count is a scan inside that shard's own process
    counters = [threading.Thread(target=smp.count_oplog,
                                 args=([f"{spec.db}.{c}" for c in spec.collection_names],))
                for smp in samplers]
    for th in counters:
        th.start()
    for th in counters:
        th.join()
    phases["count_oplogs_s"] = time.time() - t
    return box, outs


def _read_back(console: Any, client: Any, hosts: dict[str, str], chunks: Any, spec: Any,
               phases: dict[str, float]) -> Any:
    """The collections' final contents ``{coll: {_id: doc}}``, through the router, else (a reply
    over 16 MB, say) from each shard directly: no migrations run during a load."""
    from pymongo.errors import PyMongoError

    from shardsim.tools.load.verify import final_from_docs

    t = time.time()
    try:
        final = final_from_docs({c: list(client[spec.db][c].find({}))
                                 for c in spec.collection_names})
        source = "through the router"
    except PyMongoError as exc:
        # No migrations run during the load, so the shards' own documents are the contents.
        console.print(f"[yellow]read-back through the router failed ({str(exc).split(', full error')[0]}); "
                      f"reading each shard directly[/]")
        try:
            final = _read_shards(hosts, chunks.shards, spec)
        except PyMongoError as exc2:
            _fail(console, f"could not read the collections back: {exc2}")
        source = "from the shards directly"
    console.print(f"read back {sum(len(v) for v in final.values()):,} documents "
                  f"{source} ({time.time() - t:.1f} s)")
    phases["read_back_s"] = time.time() - t
    return final


def _verify_all(console: Any, plan: Any, outs: list[Any], final: Any, fault: str | None,
                spec: Any) -> tuple[list[dict], str | None, list[Any]]:
    """Verify every watcher's events against the plan (and the final contents); returns the
    per-watcher verdicts, the first violation (or None) and watcher 0's events."""
    from shardsim.tools.load.verify import Event, inject_fault, verify

    verdicts = []
    first_bad = None
    for i, out in enumerate(outs):
        events = [Event(*e) for e in out.events]
        injected = ""
        if fault:
            events, injected = inject_fault(events, fault, seed=spec.seed)
            console.print(f"watcher {i}: {injected}")
        if out.error:
            console.print(f"[red]watcher {i} stream error:[/] {out.error}")
        rep = verify(plan, events, final)
        verdicts.append({"watcher": i, "ok": rep.ok and not out.error, "events": rep.events,
                         "matched": rep.matched, "missing": rep.missing, "injected": injected,
                         "stream_error": out.error,
                         "violation": None if rep.violation is None else {
                             "index": rep.violation.index, "kind": rep.violation.kind,
                             "message": rep.violation.message}})
        if not rep.ok and first_bad is None:
            first_bad = f"watcher {i}: {rep.violation.message}"
        elif out.error and first_bad is None:
            first_bad = f"watcher {i}: change stream failed: {out.error}"
        if i == 0:
            events0 = events if not fault else [Event(*e) for e in out.events]
    return verdicts, first_bad, events0


def _read_shards(hosts: dict[str, str], shards: list[str], spec: Any) -> dict:
    """``{coll: {_id: doc}}`` read from every shard's own port (directConnection)."""
    from pymongo import MongoClient

    from shardsim.tools.load.verify import final_from_docs

    docs: dict[str, list] = {c: [] for c in spec.collection_names}
    for shard in shards:
        with MongoClient(f"mongodb://{hosts[shard]}/?directConnection=true") as direct:
            for c in spec.collection_names:
                docs[c].extend(direct[spec.db][c].find({}))
    return final_from_docs(docs)


def _read_progress(path: str | None) -> int:
    if not path:
        return 0
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0
