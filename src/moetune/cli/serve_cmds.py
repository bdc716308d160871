"""`moetune serve-bench` (concurrent streaming load against a server) and `moetune serve-report`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from moetune.cli.common import db_option, err, json_option, out, print_json, transport_options, warn
from moetune.cli.session_opts import session_options
from moetune.option_defaults import ARRIVALS

if TYPE_CHECKING:
    from rich.table import Table

    from moetune.app.serve_bench import ServeBenched


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


SLO_HELP = (
    "Latency targets in ms, any subset of ttft_ms, itl_ms (a request's largest gap), tpot_ms, e2e_ms: "
    "ttft_ms=500,itl_ms=100. Adds goodput per level: the share and rate of requests that met them all."
)


def levels_table(levels: Sequence[Mapping[str, Any]], slo: dict[str, float] | None = None) -> Table:
    from rich import box
    from rich.table import Table

    from moetune.bench.analysis.level_summary import LevelSummary

    caption = None
    if slo:
        from moetune.bench.analysis.slo import slo_text

        caption = f"goodput: requests with {slo_text(slo)} (failed ones count as not met)"
    t = Table(
        title="serve-bench, times in ms",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        caption=caption,
        caption_justify="left",
    )
    cols = (
        "c",
        "slots",
        "ok",
        "errors",
        "TTFT\np50",
        "TTFT\np99",
        "TTFC\np50",
        "ITL\np50",
        "ITL\np99",
        "TPOT\np50",
        "E2E\np50",
        "req/s",
        "out\ntok/s",
        *(("good\n%", "good\nreq/s") if slo else ()),
    )
    for col in cols:
        t.add_column(col, justify="right", no_wrap=True)
    for d in levels:
        lv = LevelSummary.from_json(d)
        errs = lv.error_count
        slots = (d.get("server") or {}).get("slots")
        good: tuple[str, ...] = ()
        if slo:
            g = lv.goodput
            share, req_s = (None, None) if g is None else (g.share, g.req_s)
            good = (
                "-" if share is None else f"{share * 100:.1f}",
                "-" if req_s is None else f"{req_s:.2f}",
            )
        t.add_row(
            str(lv.concurrency) + (f"@{lv.rate}/s" if lv.rate else ""),
            "?" if slots is None else str(slots),
            str(lv.ok),
            f"[red]{errs}[/]" if errs else "0",
            _ms(lv.ttft_ms.p50),
            _ms(lv.ttft_ms.p99),
            _ms(lv.ttfc_ms.p50),
            _ms(lv.itl_ms.p50),
            _ms(lv.itl_ms.p99),
            _ms(lv.tpot_ms.p50),
            _ms(lv.e2e_ms.p50),
            "-" if lv.request_s is None else f"{lv.request_s:.2f}",
            "-" if lv.output_tok_s is None else f"{lv.output_tok_s:.1f}",
            *good,
        )
    return t


def _render(result: ServeBenched, as_json: bool) -> None:
    if result.layout:
        _render_layout(result.doc, as_json)
        return
    doc = result.doc
    run = doc["run"]
    if result.plots:
        err.print("plots: " + ", ".join(str(p) for p in result.plots))
    for a in [*run.get("advice", []), *(run.get("flags") or {}).get("warnings", [])]:
        warn(a["message"], a["remedy"])
    for lv in doc["levels"]:
        for a in lv.get("advice", []):
            if a["code"] == "retries":  # a note: it changes no figure
                err.print(f"note: {a['message']}", style="dim")
            else:
                warn(a["message"], a["remedy"])
    if as_json:
        print_json(doc)
        return
    ctx = sorted({(lv.get("server") or {}).get("n_ctx_slot") or 0 for lv in doc["levels"]})
    sessions = doc.get("sessions")
    if sessions:
        from moetune.cli.session_opts import describe

        for note in sessions["warnings"]:
            warn(note)
    w = run["workload"] or {}
    what = (
        describe(sessions)
        if sessions
        else f"replay of {w['replay']['file']} at {w['replay']['speed']}"
        if w.get("replay")
        else w.get("dataset") or f"{w.get('input_len')} prompt tokens"
    )
    out.print(
        f"run {run['id']} ({run['label']}) against {run['target']}, {what}, "
        f"context per slot: {', '.join(str(c) if c else '?' for c in ctx)}"
    )
    # at its natural width when stdout is a file or pipe (rich would fold it to 80 columns)
    from rich.console import Console

    console = out if out.is_terminal else Console(width=160, highlight=False, soft_wrap=True)
    console.print(levels_table(doc["levels"], run.get("slo")))
    if sessions:
        from moetune.cli.session_opts import sessions_tables

        console.print(sessions_tables(sessions))


def _log(line: str) -> None:
    err.print(line, style="dim")


@click.command("serve-bench")
@click.argument("target")
@click.option(
    "--concurrency",
    "-C",
    "concurrency",
    default="1",
    show_default=True,
    help="Concurrent streams, one level per value: 1,2,4.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    help="Open loop: requests/s arriving on schedule, each waiting for one of the concurrency slots.",
)
@click.option("--arrivals", type=click.Choice(ARRIVALS), default="poisson", show_default=True)
@click.option(
    "--dataset",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="ShareGPT JSON (or JSON lines) file of conversations to take prompts from.",
)
@click.option(
    "--input-len",
    type=click.IntRange(1),
    help="Synthetic prompt length in tokens, chat template included [default: 128].",
)
@click.option(
    "--output-len", type=click.IntRange(1), help="Tokens to generate [default: 64, or the dataset reply's length]."
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="The served model's tokenizer.json: counts prompts for a server without /tokenize (vLLM, "
    "SGLang...), the chat template's tokens measured by a probe request (needs moetune[tokenizers]).",
)
@click.option("--requests", type=click.IntRange(1), help="Requests per level [default: 4 x concurrency, at least 8].")
@click.option(
    "--duration", type=click.FloatRange(min=0, min_open=True), help="Seconds per level instead of --requests."
)
@click.option(
    "--warmup",
    type=click.IntRange(0),
    default=2,
    show_default=True,
    help="Requests sent one by one before measuring (stored apart).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--prefix-cache",
    is_flag=True,
    help="Let prompts hit the server's prefix cache (identical prompts, "
    "cache_prompt on). Off: every prompt is unique and cache_prompt is false.",
)
@click.option(
    "--thinking",
    type=click.Choice(["on", "off", "default"]),
    default="default",
    show_default=True,
    help="chat_template_kwargs.enable_thinking for every request.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=600,
    show_default=True,
    help="Seconds one request may take.",
)
@click.option("--model", help="The request's model field [default: the server's first /v1/models entry].")
@click.option("--label", help="Name of this run in the results history.")
@click.option(
    "--match-slots",
    is_flag=True,
    help="For a plan TARGET: start its server with --parallel and -c matched to each concurrency level.",
)
@click.option("--server", help="For a plan TARGET with several servers: the one to benchmark.")
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write latency and throughput plots (PNG) into this directory.",
)
@click.option("--slo", "slo_text", metavar="KEY=MS,...", help=SLO_HELP)
@click.option(
    "--replay",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Send the requests of a session `moetune record` wrote, in its order, as one level.",
)
@click.option(
    "--speed",
    default="1x",
    show_default=True,
    help="With --replay: 1x at the recorded arrival times, Nx N times faster, max as fast as the client "
    "slots allow; in flight at most the recorded concurrency, or --concurrency.",
)
@click.option(
    "--load",
    "loads",
    multiple=True,
    metavar="SERVICE=SPEC",
    help="For a layout plan TARGET: drive SERVICE with the workload SPEC, every --load at once, each also "
    "measured alone: KEY:VALUE pairs of these options' names, e.g. main=concurrency:1,requests:8,"
    "input-len:512,output-len:64 or worker0=replay:FILE,speed:max (the options given here are the "
    "defaults). Reports each service's slowdown under the shared load.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="With --load: rounds of alone then shared (alternating order).",
)
@session_options
@transport_options()
@db_option
@json_option
def serve_bench_cmd(
    target: str,
    concurrency: str,
    rate: float | None,
    arrivals: str,
    dataset: Path | None,
    input_len: int | None,
    output_len: int | None,
    tokenizer: Path | None,
    requests: int | None,
    duration: float | None,
    warmup: int,
    seed: int,
    prefix_cache: bool,
    thinking: str,
    timeout_s: float,
    model: str | None,
    label: str | None,
    match_slots: bool,
    server: str | None,
    plot_dir: Path | None,
    slo_text: str | None,
    replay: Path | None,
    speed: str,
    loads: tuple[str, ...],
    rounds: int,
    transport: str | None,
    rdma_dev: str | None,
    db_path: Path | None,
    as_json: bool,
    **session_args: Any,
) -> None:
    """Measure a server under concurrent streaming load: TTFT, ITL, TPOT, throughput per level.

    TARGET is a server URL (http://127.0.0.1:8080) or a plan file whose server moetune starts
    (and stops afterwards); with --match-slots it is started again for each level with
    --parallel and -c matched to the level's concurrency.
    Every request is stored as a raw sample in the results history (compare runs with
    `moetune compare`); the figures are derived from those samples. With --replay FILE it sends
    the requests of a session `moetune record` wrote instead, as one level.

    With --sessions N, N agent sessions instead: conversations that grow turn by turn, each turn
    sending the whole history; per turn, TTFT, TG and the prompt tokens processed and reused
    from the server's prefix cache (--strip-thinking shows what dropping the reasoning costs).

    With --load SERVICE=SPEC (repeated), TARGET is a layout plan: moetune launches all of it and
    drives every named service at once, each with its own workload, then each alone, and reports
    every service's figures under the shared load beside its figures alone (the slowdown, with its
    interval) and which process and device was busy, as one run.
    """
    from moetune.app.progress import Callbacks
    from moetune.app.serve_bench import ServeBenchRequest, serve_bench
    from moetune.cli.progress import progress_bar

    req = ServeBenchRequest(
        target=target,
        concurrency=concurrency,
        rate=rate,
        arrivals=arrivals,
        dataset=dataset,
        input_len=input_len,
        output_len=output_len,
        tokenizer=tokenizer,
        requests=requests,
        duration=duration,
        warmup=warmup,
        seed=seed,
        prefix_cache=prefix_cache,
        thinking=thinking,
        timeout_s=timeout_s,
        model=model,
        label=label,
        match_slots=match_slots,
        server=server,
        plot_dir=plot_dir,
        slo=slo_text,
        replay=replay,
        speed=speed,
        loads=loads,
        rounds=rounds,
        transport=transport,
        rdma_dev=rdma_dev,
        db_path=db_path,
        given=frozenset(_given(*click.get_current_context().params)),
        **session_args,
    )
    with progress_bar(not as_json, bars=False) as live:
        result = serve_bench(req, Callbacks(status=_log, on_snapshot=live.machine))
    _render(result, as_json)
    if not as_json:
        rid = result.run_id
        also = f"`moetune results show {rid}`, " if result.layout else ""
        err.print(
            f"stored as run {rid}: `moetune serve-report {rid}`, {also}`moetune compare {rid} OTHER`", style="dim"
        )


def _render_layout(doc: dict[str, Any], as_json: bool) -> None:
    for a in [*doc["run"].get("advice", []), *(doc["run"].get("flags") or {}).get("warnings", [])]:
        warn(a["message"], a["remedy"])
    for lv in doc["levels"]:
        for a in lv.get("advice", []):
            if a["code"] != "retries":
                warn(f"{lv.get('service')} ({lv.get('load')}): {a['message']}", a["remedy"])
    if as_json:
        print_json(doc)
        return
    from rich.console import Console

    from moetune.report.layout_view import layout_tables

    run = doc["run"]
    idle = doc["layout"].get("idle") or []
    out.print(
        f"run {run['id']} ({run['label']}) against {run['target']}: "
        + "; ".join(f"{s['name']}: {s['workload'].get('describe')}" for s in doc["layout"]["services"])
        + (f"; up and idle: {', '.join(idle)}" if idle else "")
    )
    console = out if out.is_terminal else Console(width=160, highlight=False, soft_wrap=True)
    for t in layout_tables(doc):
        console.print(t)


def _given(*names: str) -> list[str]:
    """The options of the running command that were given on the command line."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return [n for n in names if ctx.get_parameter_source(n) not in (None, ParameterSource.DEFAULT)]


@click.command("serve-report")
@click.argument("run_ref", metavar="RUN")
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write latency and throughput plots (PNG) into this directory.",
)
@click.option(
    "--slo",
    "slo_text",
    metavar="KEY=MS,...",
    help="Judge goodput by these latency targets instead of "
    "the ones the run was measured with (ttft_ms, itl_ms, tpot_ms, e2e_ms).",
)
@db_option
@json_option
def serve_report_cmd(
    run_ref: str, plot_dir: Path | None, slo_text: str | None, db_path: Path | None, as_json: bool
) -> None:
    """Figures of a stored serve-bench run (id, label or `latest`), derived again from its samples;
    goodput by the run's own latency targets, or by --slo."""
    from moetune.app.serve_bench import stored

    _render(stored(run_ref, slo_text=slo_text, plot_dir=plot_dir, db_path=db_path), as_json)


def register(cli: click.Group) -> None:
    cli.add_command(serve_bench_cmd)
    cli.add_command(serve_report_cmd)
