"""`moetune quality`: does a plan change the answers?

Two modes: plans against a reference plan, teacher-forced (KL divergence, top-1 agreement and
perplexity by the engine's own llama-perplexity), or ``--qa FILE``, a multiple-choice soak against
servers (``--url``, or the plans launched one after another), paired with the first.
"""

from __future__ import annotations

from pathlib import Path

import click

from moetune.cli.common import db_option, json_option, out, print_json, print_wide


@click.command("quality")
@click.argument("plans", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--text",
    "text_path",
    type=click.Path(path_type=Path),
    help="Evaluation text (default: moetune's own, written for the project).",
)
@click.option(
    "--ctx",
    type=click.IntRange(16),
    default=256,
    show_default=True,
    help="Tokens per chunk (llama-perplexity -c); the second half of each chunk is scored.",
)
@click.option("--chunks", type=click.IntRange(1), help="At most this many chunks (default: all the text holds).")
@click.option(
    "--qa",
    "qa_path",
    type=click.Path(path_type=Path),
    help="Multiple-choice soak instead: questions in FILE (JSON lines, or --qa-format), asked of each "
    "--url or each plan's server; the first is the baseline of the paired comparison.",
)
@click.option(
    "--qa-format",
    type=click.Choice(["jsonl", "jcommonsenseqa"]),
    default="jsonl",
    show_default=True,
    help="--qa FILE's format: moetune's JSON lines, or JCommonsenseQA's (JGLUE) JSON lines.",
)
@click.option("--url", "urls", multiple=True, help="--qa: an OpenAI-compatible server (repeatable).")
@click.option("--limit", type=click.IntRange(1), help="--qa: ask only the first N questions.")
@click.option(
    "--thinking",
    type=click.Choice(["off", "on", "template"]),
    default="off",
    show_default=True,
    help="--qa: chat_template_kwargs.enable_thinking; 'template' sends none.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="--qa: tokens each answer may take (raise it with --thinking on).",
)
@click.option("--model", "model_name", help="--qa: the model name sent in each request (default: none).")
@click.option(
    "--label",
    "labels",
    multiple=True,
    help="Name of each configuration in the history, in order (default: the plan's, or the URL).",
)
@click.option("--server", "server_name", help="Plans with several servers: the one to evaluate.")
@click.option("--launch-timeout", "launch_timeout_s", type=click.FloatRange(1), default=600.0, show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(1),
    default=3600.0,
    show_default=True,
    help="Seconds one llama-perplexity run (or one --qa request) may take.",
)
@click.option("--confidence", type=click.FloatRange(0.5, 0.999), default=0.95, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@db_option
@json_option
def quality_cmd(
    plans: tuple[Path, ...],
    text_path: Path | None,
    ctx: int,
    chunks: int | None,
    qa_path: Path | None,
    qa_format: str,
    urls: tuple[str, ...],
    limit: int | None,
    thinking: str,
    max_tokens: int,
    model_name: str | None,
    labels: tuple[str, ...],
    server_name: str | None,
    launch_timeout_s: float,
    timeout_s: float,
    confidence: float,
    seed: int,
    db_path: Path | None,
    as_json: bool,
) -> None:
    """Does a plan change the answers? PLANS: REFERENCE CANDIDATE... (plan files).

    Each plan runs llama-perplexity with the flags its server gets (placement, RPC workers, cache
    types, -fa, threads) on one text. The reference saves its logits once (reused while its plan,
    model, text and engine stay the same); each candidate reports its KL divergence from them (mean,
    interval, 99th percentile), top-1 agreement (the share of tokens whose most likely next token is
    the reference's) and perplexity. Intervals: bootstrap over chunks (at least 5), else the
    engine's ±. Verdict: same when the KLD interval's upper end is below 0.001, close below 0.01,
    else worse.

    With --qa FILE: each --url (or each plan's server, launched in turn) answers every question,
    greedy, thinking off; accuracy with its Wilson interval, and each against the first, paired:
    McNemar's exact test, verdict same | better | worse, and how often the two answers agree.
    """
    from moetune.app.quality import QualityRequest, kld, qa
    from moetune.cli.progress import callbacks, progress_bar

    if qa_path is None and urls:
        raise click.UsageError("--url is for --qa; teacher-forced quality runs the plans' own llama-perplexity")
    if qa_path is None and len(plans) < 2:
        raise click.UsageError("give a REFERENCE plan and at least one CANDIDATE plan")
    req = QualityRequest(
        plans=plans,
        text=text_path,
        ctx=ctx,
        chunks=chunks,
        labels=labels,
        server=server_name,
        launch_timeout_s=launch_timeout_s,
        timeout_s=timeout_s,
        confidence=confidence,
        seed=seed,
        db_path=db_path,
        qa=qa_path,
        qa_format=qa_format,
        urls=urls,
        limit=limit,
        thinking=thinking,
        max_tokens=max_tokens,
        model=model_name,
    )
    if qa_path is not None:
        from moetune.report.quality_view import soak_table

        with progress_bar(not as_json) as bars:
            soaked = qa(req, callbacks(bars))
        if as_json:
            print_json(soaked.to_json())
            return
        print_wide(soak_table(soaked.report))
        out.print(f"runs stored in {soaked.db}")
        return
    from moetune.report.quality_view import kld_table

    with progress_bar(not as_json) as bars:
        result = kld(req, callbacks(bars))
    if as_json:
        print_json(result.to_json())
        return
    print_wide(kld_table(result.reference, result.candidates, confidence))
    out.print(f"runs stored in {result.db}; `moetune compare` lines them up (metrics kld, top1_agree, ppl)")


def register(cli: click.Group) -> None:
    cli.add_command(quality_cmd)
