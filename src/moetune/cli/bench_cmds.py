"""`moetune bench TARGET` and `moetune sweep PLAN...`: single-stream benchmarks stored in the history."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from moetune.bench.analysis.stats import DEFAULT_MIN_CHANGE
from moetune.bench.single.workloads import BUILTIN_NAMES
from moetune.cli.common import (
    comparison_output,
    db_option,
    err,
    json_option,
    out,
    print_json,
    print_wide,
    transport_options,
    warn,
)

if TYPE_CHECKING:
    from moetune.bench.single.runner import BenchOptions
    from moetune.bench.single.runner import Progress as ProgressFn
    from moetune.bench.single.sweep import SweepSpec
    from moetune.bench.single.workloads import Workload
    from moetune.monitor.snapshot import Snapshot
    from moetune.store.db import ResultsDB

F = TypeVar("F", bound=Callable[..., Any])


def _ints(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[int]:
    try:
        return [int(x) for v in value for x in v.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter("give token counts: --depth 0,512,1024") from None


def workload_options(f: F) -> F:
    opts = [
        click.option(
            "-w",
            "--workload",
            "workload_names",
            multiple=True,
            type=click.Choice(BUILTIN_NAMES),
            help="Built-in workload (repeatable): short-json (max_tokens 256), long-openapi (2048), "
            "reference (both). Default short-json unless --prompt-file or --depth is given.",
        ),
        click.option(
            "--prompt-file",
            "prompt_files",
            multiple=True,
            type=click.Path(path_type=Path),
            help="Custom workload: a text file (the user message) or a JSON request body (repeatable).",
        ),
        click.option(
            "--thinking",
            type=click.Choice(["off", "on", "both", "template"]),
            help="chat_template_kwargs.enable_thinking for every chat workload; 'both' runs each twice, "
            "'template' sends none. Default: the workload's own (built-ins: off, as the reference).",
        ),
        click.option("--max-tokens", type=click.IntRange(1), help="Output tokens for every chat workload."),
        click.option(
            "--ignore-eos",
            is_flag=True,
            help="Exact output lengths: generate --max-tokens whatever the model says (ignore_eos, n_predict).",
        ),
        click.option(
            "--depth",
            "depths",
            multiple=True,
            callback=_ints,
            help="Context depths in tokens (comma list, repeatable): PP and TG measured on top of a "
            "filled, cache-confirmed context.",
        ),
        click.option(
            "--pp-tokens",
            type=click.IntRange(1),
            default=512,
            show_default=True,
            help="Depth workloads: new prompt tokens processed at each depth.",
        ),
        click.option(
            "--tg-tokens",
            type=click.IntRange(2),
            default=128,
            show_default=True,
            help="Depth workloads: tokens generated at each depth.",
        ),
        click.option(
            "-r", "--repeats", type=click.IntRange(1), default=5, show_default=True, help="Measured runs per workload."
        ),
        click.option(
            "--warmup", type=click.IntRange(0), default=1, show_default=True, help="Unmeasured runs before them."
        ),
        click.option(
            "--cache-bust/--no-cache-bust",
            default=True,
            show_default=True,
            help="Chat workloads: send cache_prompt=false so every run processes the whole prompt "
            "(token counts unchanged).",
        ),
        click.option(
            "--timeout",
            "timeout_s",
            type=click.FloatRange(1),
            default=600.0,
            show_default=True,
            help="Seconds to wait for one request.",
        ),
        click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def build_workloads(kw: dict[str, Any]) -> tuple[list[Workload], BenchOptions]:
    from moetune.bench.single.runner import BenchOptions
    from moetune.bench.single.workloads import expand

    names = list(kw["workload_names"]) or ([] if kw["prompt_files"] or kw["depths"] else ["short-json"])
    ws = expand(
        names,
        list(kw["prompt_files"]),
        thinking=kw["thinking"],
        max_tokens=kw["max_tokens"],
        ignore_eos=kw["ignore_eos"],
        depths=kw["depths"],
        pp_tokens=kw["pp_tokens"],
        tg_tokens=kw["tg_tokens"],
    )
    return ws, BenchOptions(
        repeats=kw["repeats"],
        warmup=kw["warmup"],
        cache_bust=kw["cache_bust"],
        timeout_s=kw["timeout_s"],
        seed=kw["seed"],
    )


class Bars:
    """Progress on stderr: one bar per run (``bars(label)`` makes its callback) and, under them, the
    live line of the machine and the load (``bars.machine``, fed the sampler's snapshots)."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def __call__(self, label: str) -> ProgressFn:
        bar = self.progress
        task: Any = None

        def cb(what: str, done: int, total: int) -> None:
            nonlocal task
            if task is None:
                task = bar.add_task(label, total=total, what="")
            bar.update(task, completed=done, what=what)

        return cb

    def machine(self, snap: Snapshot) -> None:
        from moetune.report.live_view import live_line

        self.progress.machine_line = live_line(snap)
        self.progress.refresh()


@contextmanager
def progress_bar(enabled: bool = True, bars: bool = True) -> Iterator[Bars]:
    """:class:`Bars` on stderr (nothing shown unless ``enabled``; without ``bars``, the live line alone)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.text import Text

    class WithMachine(Progress):
        machine_line = ""

        def get_renderables(self) -> Iterator[Any]:
            if self.tasks:
                yield self.make_tasks_table(self.tasks)
            if self.machine_line:
                yield Text(self.machine_line, style="dim", overflow="ellipsis", no_wrap=True)

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TextColumn("[dim]{task.fields[what]}"),
    )
    with WithMachine(
        *columns, console=err, disable=not enabled or (not err.is_terminal and not bars), transient=not bars
    ) as bar:
        try:
            yield Bars(bar)
        finally:
            bar.machine_line = ""  # the live line goes; the bars stay


def _print_run(db: ResultsDB, run_id: int, as_json: bool) -> None:
    from moetune.bench.analysis.predicted import report
    from moetune.bench.analysis.summary import bench_summary
    from moetune.bench.analysis.warnings import grouped
    from moetune.report.results_view import prediction_lines, workloads_table

    r = db.run(run_id)
    typed = bench_summary(db.samples(run_id))
    summary = typed.to_json()
    rep = report(typed, dict(r.meta.details))
    if as_json:
        print_json({"run": {**r.header(), "db": str(db.path)}, **summary, **(rep or {}), "flags": r.flags().to_json()})
        return
    print_wide(workloads_table(typed))
    for line in prediction_lines(rep):
        out.print(line, markup=False, highlight=False)
    for message, remedy in grouped(list(typed.warnings)) + r.flags().warnings():
        warn(message, remedy)
    out.print(f"run {run_id} ({r.label}) stored in {db.path}; `moetune results show {run_id}` for details")


@click.command("bench")
@click.argument("target")
@workload_options
@click.option("--label", help="Name of this configuration in the history (default: the plan's or the server's).")
@click.option("--server", "server_name", help="Plan targets with several servers: the one to bench.")
@click.option(
    "--launch-timeout",
    "launch_timeout_s",
    type=click.FloatRange(1),
    default=600.0,
    show_default=True,
    help="Plan targets: seconds to wait for the servers to load.",
)
@click.option(
    "--sweep",
    is_flag=True,
    help="Plan targets: run ik_llama.cpp's llama-sweep-bench with the plan's flags "
    "instead of requests to a server: PP and TG at every ubatch step of the context, stored as depth "
    "workloads d0, d512, ... (comparable with --depth runs).",
)
@click.option("--sweep-ctx", type=click.IntRange(1), help="--sweep: the depth to sweep to (default: the plan's -c).")
@transport_options(what="`moetune sweep PLAN --transport tcp,rdma` measures both")
@db_option
@json_option
def bench_cmd(
    target: str,
    label: str | None,
    server_name: str | None,
    launch_timeout_s: float,
    sweep: bool,
    sweep_ctx: int | None,
    transport: str | None,
    rdma_dev: str | None,
    db_path: Path | None,
    as_json: bool,
    **kw: Any,
) -> None:
    """Single-stream PP/TG of TARGET: a running server's URL, or a plan file (launched, measured, stopped).

    The server's own timings are the figures (PP = prompt_n/prompt_ms, TG = predicted_n/predicted_ms);
    the client's clock is kept beside them. Against an OpenAI-compatible server that is not llama-server
    (no timings), TG and PP are the client's, labelled so, with token counts from the responses' usage.
    Every sample is stored as it arrives. With --sweep, a plan
    is measured by llama-sweep-bench (one sweep unless --repeats is given; --tg-tokens sets its TG).
    """
    from moetune.bench.single.runner import bench_target
    from moetune.bench.target import resolve, with_transport
    from moetune.store.db import ResultsDB

    if sweep:
        if transport is not None or rdma_dev is not None:
            from moetune.errors import InputError

            raise InputError(
                "--transport with --sweep: llama-sweep-bench runs outside the launcher, whose "
                "transport it does not take",
                hint="drop --transport (the workers use tcp), or bench the plan through its server (without --sweep)",
            )
        _sweep_bench(target, server_name, label, launch_timeout_s, sweep_ctx, db_path, as_json, kw)
        return
    workloads, options = build_workloads(kw)
    t = with_transport(resolve(target, server_name), transport, rdma_dev)
    with ResultsDB.open(db_path) as db:
        started: list[int] = []
        try:
            with progress_bar(not as_json) as bars:
                run_id = bench_target(
                    db,
                    t,
                    workloads,
                    options,
                    label=label,
                    launch_timeout_s=launch_timeout_s,
                    status=lambda s: err.print(f"[dim]{s}[/]"),
                    progress_for=bars,
                    on_start=started.append,
                    on_snapshot=bars.machine,
                )
        except KeyboardInterrupt:
            if started:
                n = db.sample_counts(started[0]).get("measure", 0)
                err.print(f"run {started[0]} interrupted: {n} measured samples kept in {db.path}")
            raise
        _print_run(db, run_id, as_json)


def _sweep_bench(
    target: str,
    server_name: str | None,
    label: str | None,
    launch_timeout_s: float,
    sweep_ctx: int | None,
    db_path: Path | None,
    as_json: bool,
    kw: dict[str, Any],
) -> None:
    from click.core import ParameterSource

    from moetune.bench.single.sweep_bench import SweepOptions, bench_sweep
    from moetune.bench.target import resolve
    from moetune.store.db import ResultsDB

    ctx = click.get_current_context()
    given = {k for k in kw if ctx.get_parameter_source(k) not in (ParameterSource.DEFAULT, None)}
    repeats = kw["repeats"] if "repeats" in given else 1
    tg = kw["tg_tokens"] if "tg_tokens" in given else None
    t = resolve(target, server_name)
    with ResultsDB.open(db_path) as db, progress_bar(not as_json) as bars:
        run_id = bench_sweep(
            db,
            t,
            SweepOptions(ctx=sweep_ctx, tg=tg, repeats=repeats, timeout_s=kw["timeout_s"] * 6),
            label=label,
            launch_timeout_s=launch_timeout_s,
            status=lambda s: err.print(f"[dim]{s}[/]"),
            progress=bars(label or str(t.label)),
        )
    with ResultsDB.open(db_path) as db:
        _print_run(db, run_id, as_json)


class _ModeChoice(click.Choice[str]):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return str(super().convert(value, param, ctx))
        except click.BadParameter:
            self.fail(
                f"{value!r} is not launches or batches (a plan? write --interleave after the plans, or "
                "--interleave=launches)",
                param,
                ctx,
            )


@click.command("sweep")
@click.argument("plans", nargs=-1, required=True, type=click.Path(path_type=Path))
@workload_options
@click.option("--baseline", help="Label of the baseline plan (default: the sweep file's, else the first).")
@click.option("--sweep-id", "sid", help="Resume or name a sweep explicitly (default: derived from plans and options).")
@click.option("--server", "server_name", help="Plans with several servers: the one to bench.")
@click.option("--launch-timeout", "launch_timeout_s", type=click.FloatRange(1), default=600.0, show_default=True)
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Also draw the comparison to FILE.png.")
@click.option(
    "--min-change",
    type=click.FloatRange(0, 100),
    default=DEFAULT_MIN_CHANGE * 100,
    show_default=True,
    help="Changes below this many percent are called 'no significant difference'.",
)
@click.option(
    "--interleave",
    type=_ModeChoice(["launches", "batches"]),
    is_flag=False,
    flag_value="launches",
    help="Measure the plans in alternating rounds (A B, B A, ...) and judge them by the paired "
    "differences within rounds, so that the machine's drift cancels. launches (the default): "
    "each round launches each plan; batches: both servers stay up (they must fit together) "
    "and rounds alternate request batches.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="--interleave: rounds (an even number balances the order); more rounds extend a sweep.",
)
@transport_options(several=True)
@db_option
@json_option
def sweep_cmd(
    plans: tuple[Path, ...],
    baseline: str | None,
    sid: str | None,
    server_name: str | None,
    launch_timeout_s: float,
    plot_path: Path | None,
    min_change: float,
    interleave: str | None,
    rounds: int,
    transport: tuple[str, ...] | None,
    rdma_dev: str | None,
    db_path: Path | None,
    as_json: bool,
    **kw: Any,
) -> None:
    """Launch, bench and stop each plan in turn, then compare them. Resumable: run the same command
    again after an interruption and completed plans are skipped.

    PLANS are plan JSON files, or one sweep YAML file listing them with labels. With --interleave,
    rounds instead of plans: a round complete in every plan is skipped.
    """
    from moetune.bench.single.sweep import load_sweep

    spec = load_sweep(list(plans), server_name, transport, rdma_dev)
    if interleave is not None:
        _sweep_interleaved(
            spec, baseline, sid, launch_timeout_s, plot_path, min_change, interleave, rounds, db_path, as_json, kw
        )
        return
    from click.core import ParameterSource

    if click.get_current_context().get_parameter_source("rounds") != ParameterSource.DEFAULT:
        raise click.UsageError("--rounds counts the rounds of --interleave; add --interleave")
    from moetune.bench.analysis.warnings import grouped
    from moetune.bench.single.sweep import FAILED, baseline_of, run_sweep
    from moetune.errors import RuntimeFailure
    from moetune.report.compare import compare_runs
    from moetune.report.plot import plot_runs
    from moetune.store.db import ResultsDB

    workloads, options = build_workloads(kw)
    with ResultsDB.open(db_path) as db:
        with progress_bar(not as_json) as bars:
            sid, outcomes = run_sweep(
                db,
                spec,
                workloads,
                options,
                sid=sid,
                launch_timeout_s=launch_timeout_s,
                status=lambda s: err.print(f"[dim]{s}[/]"),
                progress_for=bars,
                on_snapshot=bars.machine,
            )
        ok = [o for o in outcomes if o.run is not None]
        base = baseline_of(spec, outcomes, baseline)
        runs = [db.run(o.run) for o in [base, *[o for o in ok if o is not base]] if o.run is not None]
        compared = compare_runs(db, runs, min_change=min_change / 100, seed=options.seed)
        comp = compared.comparison
        if plot_path:
            plot_runs(list(compared.metrics), plot_path, seed=options.seed, title=f"sweep {sid}")
        if as_json:
            print_json(
                {
                    "sweep": sid,
                    "plans": [{"label": o.label, "run": o.run, "status": o.status, "error": o.error} for o in outcomes],
                    "plot": str(plot_path) if plot_path else None,
                    "comparison": comp.to_json(),
                }
            )
        else:
            comparison_output(comp, "table")
            for o in ok:
                assert o.run is not None
                run = db.run(o.run)
                for message, remedy in grouped(compared.noise[o.run]) + run.flags().warnings():
                    warn(f"{o.label} (run {o.run}): {message}", remedy)
            out.print(
                f"sweep {sid}: {len(ok)} of {len(outcomes)} plans measured; re-run the same command to resume"
                + (f"; plot: {plot_path}" if plot_path else "")
            )
        failed = [o for o in outcomes if o.status == FAILED]
        if failed:
            raise RuntimeFailure(
                f"sweep {sid}: {len(failed)} plan(s) failed: "
                + "; ".join(f"{o.label}: {(o.error or '').splitlines()[0]}" for o in failed),
                hint="fix them and run the same command again: completed plans are skipped",
            )


def _sweep_interleaved(
    spec: SweepSpec,
    baseline: str | None,
    sid: str | None,
    launch_timeout_s: float,
    plot_path: Path | None,
    min_change: float,
    mode: str,
    rounds: int,
    db_path: Path | None,
    as_json: bool,
    kw: dict[str, Any],
) -> None:
    from moetune.bench.single.interleave import run_interleaved
    from moetune.errors import MoetuneError, RuntimeFailure
    from moetune.report.paired import load_sweep as load_paired
    from moetune.report.paired_view import VIEWS
    from moetune.report.plot import plot_runs
    from moetune.store.db import ResultsDB

    workloads, options = build_workloads(kw)
    with ResultsDB.open(db_path) as db:
        with progress_bar(not as_json) as bars:
            res = run_interleaved(
                db,
                spec,
                workloads,
                options,
                mode=mode,
                rounds=rounds,
                sid=sid,
                launch_timeout_s=launch_timeout_s,
                status=lambda s: err.print(f"[dim]{s}[/]"),
                progress_for=bars,
                on_snapshot=bars.machine,
            )
        why = ""
        try:
            comp = load_paired(db, res.sweep, baseline=baseline, min_change=min_change / 100, seed=options.seed)
        except MoetuneError as e:
            if not res.failed:
                raise
            comp, why = None, str(e)
    if comp is not None and plot_path:
        plot_runs([comp.baseline, *comp.others], plot_path, seed=options.seed, title=f"sweep {res.sweep} (pooled)")
    done = len(comp.rounds) if comp else 0
    cost = f"{res.launches} launches took {res.launch_s:.1f} s of {res.wall_s:.1f} s" if res.launches else ""
    if as_json:
        print_json(
            {
                "sweep": res.sweep,
                "interleave": {
                    "mode": res.mode,
                    "rounds": res.rounds,
                    "complete": done,
                    "launches": res.launches,
                    "launch_s": res.launch_s,
                    "wall_s": res.wall_s,
                },
                "plans": [o.to_json() for o in res.outcomes],
                "plot": str(plot_path) if plot_path else None,
                "comparison": comp.to_json() if comp else None,
            }
        )
    else:
        if comp is not None:
            comparison_output(comp, "table", VIEWS)
        out.print(
            f"sweep {res.sweep}: {done} of {res.rounds} rounds complete ({res.mode})"
            + (f"; {cost}" if cost else "")
            + "; re-run the same command to resume, or with more --rounds "
            "to extend" + (f"; plot: {plot_path}" if plot_path and comp else "")
        )
    if res.failed:
        o = res.failed[0]
        raise RuntimeFailure(
            f"sweep {res.sweep}: {o.label} failed in round {o.round}: "
            f"{(o.error or '').splitlines()[0]}" + ("" if comp else f" ({why})"),
            hint="fix it and run the same command again: complete rounds are skipped",
        )


def register(cli: click.Group) -> None:
    cli.add_command(bench_cmd)
    cli.add_command(sweep_cmd)
