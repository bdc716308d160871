"""`moetune bench TARGET` and `moetune sweep PLAN...`: single-stream benchmarks stored in the history."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

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
from moetune.cli.progress import callbacks, progress_bar
from moetune.option_defaults import BUILTIN_WORKLOADS, DEFAULT_MIN_CHANGE

if TYPE_CHECKING:
    from moetune.app.bench import BenchResult
    from moetune.app.sweep import InterleavedResult, SweepResult
    from moetune.bench.single.runner import BenchOptions
    from moetune.bench.single.sweep_bench import SweepOptions
    from moetune.bench.single.workloads import Workload

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
            type=click.Choice(BUILTIN_WORKLOADS),
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


def _print_run(result: BenchResult, as_json: bool) -> None:
    from moetune.report.results_view import prediction_lines, workloads_table

    if as_json:
        print_json(result.to_json())
        return
    print_wide(workloads_table(result.summary))
    for line in prediction_lines(result.prediction):
        out.print(line, markup=False, highlight=False)
    for message, remedy in result.warnings():
        warn(message, remedy)
    r = result.run
    out.print(f"run {r.id} ({r.label}) stored in {result.db_path}; `moetune results show {r.id}` for details")


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
    from moetune.app.bench import BenchRequest, bench

    swept = _sweep_options(sweep_ctx, kw) if sweep else None
    if swept is None:
        workloads, options = build_workloads(kw)
    else:  # llama-sweep-bench has its own workload
        from moetune.bench.single.runner import BenchOptions

        workloads, options = [], BenchOptions()
    req = BenchRequest(
        target=target,
        workloads=workloads,
        options=options,
        server=server_name,
        label=label,
        launch_timeout_s=launch_timeout_s,
        transport=transport,
        rdma_dev=rdma_dev,
        db_path=db_path,
        sweep=swept,
    )
    with progress_bar(not as_json) as bars:
        result = bench(req, callbacks(bars), interrupted=err.print)
    _print_run(result, as_json)


def _sweep_options(sweep_ctx: int | None, kw: dict[str, Any]) -> SweepOptions:
    """--sweep's options: one sweep unless --repeats is given, llama-sweep-bench's own TG unless --tg-tokens is."""
    from click.core import ParameterSource

    from moetune.bench.single.sweep_bench import SweepOptions

    ctx = click.get_current_context()
    given = {k for k in kw if ctx.get_parameter_source(k) not in (ParameterSource.DEFAULT, None)}
    repeats = kw["repeats"] if "repeats" in given else 1
    tg = kw["tg_tokens"] if "tg_tokens" in given else None
    return SweepOptions(ctx=sweep_ctx, tg=tg, repeats=repeats, timeout_s=kw["timeout_s"] * 6)


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
    from click.core import ParameterSource

    from moetune.app.sweep import SweepRequest, sweep, sweep_interleaved
    from moetune.bench.single.sweep import load_sweep

    spec = load_sweep(list(plans), server_name, transport, rdma_dev)
    if interleave is None and click.get_current_context().get_parameter_source("rounds") != ParameterSource.DEFAULT:
        raise click.UsageError("--rounds counts the rounds of --interleave; add --interleave")
    workloads, options = build_workloads(kw)
    req = SweepRequest(
        spec=spec,
        workloads=workloads,
        options=options,
        db_path=db_path,
        baseline=baseline,
        sid=sid,
        launch_timeout_s=launch_timeout_s,
        plot=plot_path,
        min_change=min_change / 100,
        interleave=interleave,
        rounds=rounds,
    )
    if interleave is not None:
        with progress_bar(not as_json) as bars:
            paired = sweep_interleaved(req, callbacks(bars))
        _print_interleaved(paired, as_json)
        failure = paired.failure()
    else:
        with progress_bar(not as_json) as bars:
            result = sweep(req, callbacks(bars))
        _print_sweep(result, as_json)
        failure = result.failure()
    if failure is not None:
        raise failure


def _print_sweep(result: SweepResult, as_json: bool) -> None:
    if as_json:
        print_json(result.to_json())
        return
    comparison_output(result.comparison, "table")
    for message, remedy in result.warnings:
        warn(message, remedy)
    out.print(
        f"sweep {result.sweep}: {len(result.measured)} of {len(result.outcomes)} plans measured; "
        "re-run the same command to resume" + (f"; plot: {result.plot}" if result.plot else "")
    )


def _print_interleaved(paired: InterleavedResult, as_json: bool) -> None:
    from moetune.report.paired_view import VIEWS

    if as_json:
        print_json(paired.to_json())
        return
    res, comp = paired.run, paired.comparison
    if comp is not None:
        comparison_output(comp, "table", VIEWS)
    cost = f"{res.launches} launches took {res.launch_s:.1f} s of {res.wall_s:.1f} s" if res.launches else ""
    out.print(
        f"sweep {res.sweep}: {paired.complete} of {res.rounds} rounds complete ({res.mode})"
        + (f"; {cost}" if cost else "")
        + "; re-run the same command to resume, or with more --rounds "
        "to extend" + (f"; plot: {paired.plot}" if paired.plot and comp else "")
    )


def register(cli: click.Group) -> None:
    cli.add_command(bench_cmd)
    cli.add_command(sweep_cmd)
