"""`moetune tune`: search for the fastest plan in a budget of launches."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from moetune.cli.common import (
    db_option,
    json_option,
    out,
    plan_options,
    print_json,
    require_hw,
    transport_options,
)
from moetune.option_defaults import DEFAULT_SYSTEM_TOKENS, DEFAULT_TURNS

if TYPE_CHECKING:
    from moetune.app.tune import Tuned


def _list(kind: str) -> Any:
    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[Any, ...] | None:
        if value is None:
            return None
        items = [x.strip() for x in value.split(",") if x.strip()]
        try:
            if kind == "int":
                return tuple(int(x) for x in items)
            if kind == "bool":
                return tuple({"on": True, "off": False}[x] for x in items)
            if kind == "cache":
                return tuple((x.split("/")[0], x.split("/")[-1]) for x in items)
            if kind == "transport":
                from moetune.cli.common import TRANSPORTS

                bad = [x for x in items if x not in TRANSPORTS]
                if bad:
                    raise KeyError(bad[0])
                return tuple(dict.fromkeys(items))
        except (ValueError, KeyError):
            raise click.BadParameter(f"{value!r}: expected a comma list ({param.help})") from None
        return tuple(items)

    return parse


# each --try-* option's parameter and the search axis it gives (moetune.app.tune.Axes)
TRY_AXES = {
    "try_strategy_s": "strategies",
    "try_threads": "threads",
    "try_ubatch": "ubatches",
    "try_fa": "flash_attn",
    "try_cache": "cache_types",
    "try_repack": "repack",
    "try_amb": "amb_mib",
    "try_mla": "mla",
    "try_fmoe": "fused_moe",
    "try_muge": "merge_up_gate",
    "try_transport": "transports",
}


@click.command("tune")
@click.argument("model", required=False)
@click.option(
    "--layout",
    "layout",
    type=click.Path(path_type=Path),
    help="Tune one service of this layout file (`moetune plan --layout`) instead of MODEL alone: the "
    "others keep their placements, planned first, so no candidate takes their memory.",
)
@click.option("--service", help="With --layout: the service to tune.")
@click.option(
    "--with-load",
    "with_load",
    multiple=True,
    metavar="SERVICE=SPEC",
    help="With --layout: while each candidate is measured, this other service of the layout serves this load "
    "(serve-bench's --load SPEC, e.g. worker=c:2,requests:8,prompt:256,output:64); repeat it per service.",
)
@plan_options
@click.option(
    "--budget",
    type=click.IntRange(1, 100),
    default=5,
    show_default=True,
    help="Launches at most (the baseline's included; the engine-defaults run is not counted).",
)
@click.option(
    "--confirm",
    type=click.IntRange(0, 10),
    default=0,
    show_default=True,
    metavar="N",
    help="After the search, launch the N best measured (the engine defaults among them where they rank "
    "there) once more each and judge them on both launches pooled: on a shared machine a whole launch "
    "runs fast or slow, and one lucky launch would otherwise win. Not counted in --budget; the single-stream "
    "and workload objectives (tg, pp, ttft, replay:FILE, turn). Running a finished search again with --confirm "
    "adds the round.",
)
@click.option(
    "--objective",
    default="tg",
    show_default=True,
    metavar="tg|pp|ttft|goodput|turn|replay:FILE|weighted:SERVICE=METRIC:WEIGHT,...",
    help="What to optimise: decode speed, prefill speed, the first token's latency (prompt/PP + 1/TG), "
    "goodput (requests/s meeting --slo under --concurrency streams, serve-bench); turn: the time of "
    "an agent's turn (--turns turns of --pp-tokens in and --tg-tokens out after a --depth-token "
    "system prompt, the prefix cache on); replay:FILE: the total time of a session `moetune record` "
    "wrote, replayed (--replay-speed); weighted:SERVICE=METRIC:WEIGHT,... (with --layout): a score of "
    "several services' figures measured at once, each relative to the baseline's (weight x figure / "
    "baseline figure; latencies inverted, baseline / figure): the tuned service's tg, pp, ttft, itl, tpot, "
    "a --with-load service's goodput (--slo), throughput (tok_s), ttft, itl, tpot; e.g. "
    "weighted:main=tg:1,worker0=goodput:0.5.",
)
@click.option(
    "--replay-speed",
    default=None,
    metavar="max|1x|Nx",
    help="--objective replay:FILE: max sends each request as soon as a client slot frees (back to back, "
    "at most the recorded concurrency in flight), 1x at the recorded arrival times, Nx N times "
    "faster (serve-bench's --speed) [default: max].",
)
@click.option(
    "--turns",
    type=click.IntRange(1),
    default=None,
    help=f"--objective turn: turns per session [default: {DEFAULT_TURNS}].",
)
@click.option(
    "--slo",
    help="Latency targets of --objective goodput (and of a weighted objective's goodput terms), e.g. "
    "ttft_ms=500,itl_ms=100 (keys: ttft_ms, itl_ms, tpot_ms, e2e_ms).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1),
    default=None,
    help="Streams of --objective goodput (default 4); each candidate is planned with as many slots.",
)
@click.option(
    "--requests",
    type=click.IntRange(2),
    default=None,
    help="Requests per candidate with --objective goodput (default 8 x --concurrency, at least 16; "
    "at least 2 x --concurrency).",
)
@click.option(
    "--depth",
    type=click.IntRange(0),
    default=None,
    help="Context depth of the measurement (tokens already in the cache) [default: 0]; with --objective "
    f"turn the system prompt each session starts with [default: {DEFAULT_SYSTEM_TOKENS}].",
)
@click.option(
    "--pp-tokens",
    type=click.IntRange(1),
    default=512,
    show_default=True,
    help="Prompt tokens measured (with --objective goodput: each request's prompt).",
)
@click.option(
    "--tg-tokens",
    type=click.IntRange(2),
    default=128,
    show_default=True,
    help="Tokens generated (with --objective goodput: by each request).",
)
@click.option(
    "-r",
    "--repeats",
    type=click.IntRange(2),
    default=3,
    show_default=True,
    help="Measured runs per launch (for the confidence intervals; with --objective replay:FILE passes over "
    "the session, with turn sessions).",
)
@click.option("--warmup", type=click.IntRange(0), default=1, show_default=True)
@click.option(
    "--try-strategy",
    "try_strategy_s",
    multiple=True,
    help="Placements to try: repeat the option, or ';' between strategies (a comma list splits only "
    "where a strategy starts: 'cpu-moe,layers:CUDA0=3-14,CUDA1=68-77' is two); default: every "
    "family where there is an accelerator: auto, cpu-moe, n-cpu-moe at 1/4, 1/2, 3/4 of the MoE "
    "layers, and head-tail splits of the N layers' experts auto fits (head-tail:N/2+N/2, "
    "head-tail:2N/5+2N/5+N/5: the first, last and middle MoE layers).",
)
@click.option(
    "--try-threads", callback=_list("int"), help="Thread counts to try (default: all, 3/4 and half the cores)."
)
@click.option("--try-ubatch", callback=_list("int"), help="Ubatch sizes to try (default: -ub, a quarter, four times).")
@click.option("--try-fa", callback=_list("bool"), help="Flash attention: on,off (default both).")
@click.option("--try-cache", callback=_list("cache"), help="Cache types K/V, e.g. f16/f16,q8_0/q8_0 (default both).")
@click.option(
    "--try-repack",
    callback=_list("bool"),
    help="CPU weight repacking (-rtr in ik_llama.cpp; -nr turns mainline's off): on,off (default both).",
)
@click.option(
    "--try-amb",
    callback=_list("int"),
    help="ik_llama.cpp -amb MiB to try, 0 = unbounded (default with "
    "an ik engine: 0,512 where it bounds something: MLA models, or attention without flash attention).",
)
@click.option("--try-mla", callback=_list("int"), help="ik_llama.cpp -mla modes to try on an MLA model (default 3,2).")
@click.option(
    "--try-fmoe", callback=_list("bool"), help="ik_llama.cpp fused MoE: on,off (default both with an ik engine)."
)
@click.option(
    "--try-muge",
    callback=_list("bool"),
    help="ik_llama.cpp -muge (up/gate experts merged): on,off (default both with an ik engine).",
)
@click.option(
    "--try-transport",
    callback=_list("transport"),
    help="RPC transports to try: tcp,rdma (only where "
    "the hardware file sets `rdma: true` on every RPC node; rdma refused unless the builds have it).",
)
@transport_options()
@click.option(
    "--max-pp-loss",
    type=click.FloatRange(0, 100),
    default=10.0,
    show_default=True,
    help="--objective tg: the most prefill speed (percent of the baseline's and the engine defaults') a "
    "winner may give up; a faster candidate that loses more is rejected, with the reason.",
)
@click.option("--launch-timeout", "launch_timeout_s", type=click.FloatRange(1), default=600.0, show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(1),
    default=600.0,
    show_default=True,
    help="Seconds to wait for one request.",
)
@click.option(
    "--wait-quiet",
    "wait_quiet_s",
    type=click.FloatRange(1),
    is_flag=False,
    flag_value=600.0,
    default=None,
    metavar="[SECONDS]",
    help="When other programs keep the machine busy (foreign load over MOETUNE_MAX_FOREIGN_CORES, "
    "0.5 cores by default), wait up to SECONDS (600 if not given) for it to go quiet, then go on; "
    "without it the search stops with exit code 3.",
)
@click.option(
    "--max-kld",
    type=click.FloatRange(0),
    help="Quality guard: a best that changes the numerics (cache "
    "types, engine, model) is measured against the baseline by `moetune quality` and rejected when its "
    "mean KL divergence is above this (e.g. 0.001).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Write the winning plan here (the engine defaults' where they beat every candidate).",
)
@db_option
@json_option
def tune_cmd(
    model: str | None,
    layout: Path | None,
    service: str | None,
    with_load: tuple[str, ...],
    hw_path: str | None,
    strategy: str,
    engine_name: str | None,
    port: int,
    budget: int,
    confirm: int,
    objective: str,
    replay_speed: str | None,
    turns: int | None,
    slo: str | None,
    concurrency: int | None,
    requests: int | None,
    depth: int | None,
    pp_tokens: int,
    tg_tokens: int,
    repeats: int,
    warmup: int,
    transport: str | None,
    rdma_dev: str | None,
    max_pp_loss: float,
    launch_timeout_s: float,
    timeout_s: float,
    wait_quiet_s: float | None,
    max_kld: float | None,
    output: Path | None,
    db_path: Path | None,
    as_json: bool,
    **settings_kw: Any,
) -> None:
    """Find the fastest plan for MODEL on the hardware in a budget of launches.

    Every candidate (placement, threads, -ub, flash attention, cache types, repacking; with an
    ik_llama.cpp engine also -amb, the MLA mode, fused MoE and -muge) is planned and checked
    against the memory ledger first; one that does not fit is never launched. The plan `moetune
    plan` would make with these options is launched first (the baseline); then each launch is
    benchmarked (with repeats and confidence intervals), the speed model is refitted to what was
    measured, and the next candidate is the one with the largest expected improvement. The search
    stops when the budget is spent or no candidate expects to gain more than the measurement noise.
    A candidate that fails at launch is diagnosed, recorded and skipped. Run the same command again
    to resume after Ctrl-C or a crash. The winner must beat the baseline by the rule of `compare`;
    else the baseline stays. Beside the baseline, the engine is measured once with the model and no
    tuning flags (the "engine defaults", not counted in --budget), and the winner is reported
    against it, TG and PP. With --objective tg a candidate that gives up more than --max-pp-loss
    of either baseline's PP cannot win.

    With an RPC link that carries RDMA (`rdma: true` on the node in the hardware file),
    --try-transport tcp,rdma makes the transport an axis: each candidate is then the same plan
    launched over each transport (the load time is stored with every run; `moetune compare`).

    With --layout FILE --service NAME, one service of a layout is tuned while the others keep the
    placements `moetune plan --layout` gives them: they are planned first, so a candidate that would
    take their memory does not fit and is never launched. Each candidate is the whole layout (the
    winner written with -o is the layout's plan) and is launched whole; NAME's server is measured
    while the others stand idle. The engine-defaults run is NAME's model alone. With --with-load
    OTHER=SPEC (repeatable), NAME's single stream is measured alone and then while each OTHER serves
    its load (serve-bench LAYOUT --load): the objective is NAME's figure under the load (the depth
    sent as prompt), its figure alone beside it; no engine-defaults run then.

    --objective weighted:SERVICE=METRIC:WEIGHT,... (with --layout) answers a layout's trade in one
    score: each candidate's layout is measured as under --with-load (NAME's single stream and every
    OTHER's load at once) and scored sum(WEIGHT x figure / the baseline's figure), a latency
    (ttft, itl, tpot) inverted (the baseline's / the figure): relative to the baseline, which
    scores the sum of the weights. NAME's metrics: tg, pp, ttft, itl, tpot; an OTHER's (it needs
    --with-load): goodput (requests/s meeting --slo), throughput (tok_s: output tokens/s), ttft,
    itl, tpot. E.g. weighted:main=tg:1,worker0=goodput:0.5 weighs main's decode speed against
    half as much of worker0's goodput. The table shows each term and the score.

    --objective goodput measures each candidate with serve-bench instead: --concurrency closed-loop
    streams (the plan gets as many slots), --requests requests of --pp-tokens prompt tokens and
    --tg-tokens output tokens, and the rate of requests meeting every --slo target.

    --objective replay:FILE replays a session `moetune record` wrote on each candidate (planned with
    a slot per request the recording had in flight): --warmup passes, then -r measured passes over
    the whole session, each request generating the recorded number of tokens; the objective is a
    pass's total time (--replay-speed max: back to back; 1x: at the recorded pace). --objective turn
    runs -r agent sessions one after another (a --depth-token system prompt, --turns turns of
    --pp-tokens in and --tg-tokens out, the history resent, the prefix cache on); the objective is a
    session's mean turn time. Both report the prompt tokens the server processed and reused.

    A machine too busy to rank candidates (other programs' CPU load over MOETUNE_MAX_FOREIGN_CORES
    for 2 s before a launch, or during a measurement) stops the search with exit code 3, naming
    the programs; --wait-quiet waits for it instead (a contended candidate is measured again).
    """
    from moetune.app.plan_options import PlanOptions
    from moetune.app.tune import Axes, TuneRequest, tune
    from moetune.cli.progress import callbacks, progress_bar

    require_hw(hw_path)
    assert hw_path is not None
    if (model is None) == (layout is None):
        raise click.UsageError("give a MODEL, or --layout FILE --service NAME (not both)")
    if (layout is None) != (service is None):
        raise click.UsageError("--service names the layout's service to tune: give --layout and --service together")
    axes = Axes(**{axis: settings_kw.pop(opt) or None for opt, axis in TRY_AXES.items()})  # --try-*
    routing = settings_kw.pop("routing")
    opts = PlanOptions(**settings_kw)
    req = TuneRequest(
        hw=hw_path,
        model=model,
        layout=layout,
        service=service,
        with_load=with_load,
        settings=opts.settings(),
        routing=routing,
        strategy=strategy,
        engine=engine_name,
        port=opts.port(port),
        budget=budget,
        confirm=confirm,
        objective=objective,
        replay_speed=replay_speed,
        turns=turns,
        slo=slo,
        concurrency=concurrency,
        requests=requests,
        depth=depth,
        pp_tokens=pp_tokens,
        tg_tokens=tg_tokens,
        repeats=repeats,
        warmup=warmup,
        axes=axes,
        transport=transport,
        rdma_dev=rdma_dev,
        max_pp_loss=max_pp_loss / 100,
        launch_timeout_s=launch_timeout_s,
        timeout_s=timeout_s,
        wait_quiet_s=wait_quiet_s,
        max_kld=max_kld,
        output=output,
        db_path=db_path,
    )
    with progress_bar(not as_json) as bars:
        tuned = tune(req, callbacks(bars))
    if as_json:
        print_json(tuned.doc)
    else:
        _print_result(tuned)
    failure = tuned.failure(output)
    if failure is not None:
        raise failure


def _print_result(tuned: Tuned) -> None:
    from moetune.cli.common import print_text, print_wide
    from moetune.tune.report import confirm_lines, defaults_lines, result_table, work_lines

    result, doc = tuned.result, tuned.doc
    print_wide(result_table(result, tuned.kld))
    out.print(f"stopped: {result.stopped}; {result.launches} launches; tune {result.tune_id}", markup=False)
    for line in confirm_lines(doc):
        out.print(line, markup=False)
    shell = tuned.best_shell()
    if shell is None:
        out.print("best: none (no configuration was measured)", markup=False)
        return
    if won := doc.get("defaults_win"):
        best = f"best: {doc['best']['label']}, {won}: {doc['best_candidate']['label']} measured slower than no flags"
    else:
        best = f"best: {doc['best']['label']}" + ("" if result.best else " (the baseline: nothing beat it)")
    out.print(best, markup=False)
    out.print("command:", markup=False)
    print_text(shell)
    out.print(f"plan: {doc['plan']} (`moetune launch` or `moetune bench` it)", markup=False)
    for line in [*work_lines(doc), *defaults_lines(doc)]:
        out.print(line, markup=False)


def register(cli: click.Group) -> None:
    cli.add_command(tune_cmd)
