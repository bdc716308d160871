"""`moetune quality`: does a plan change the answers?

Two modes: plans against a reference plan, teacher-forced (KL divergence, top-1 agreement and
perplexity by the engine's own llama-perplexity), or ``--qa FILE``, a multiple-choice soak against
servers (``--url``, or the plans launched one after another), paired with the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from moetune.cli.common import db_option, err, json_option, out, print_json, print_wide


def _progress(as_json: bool) -> Any:
    from moetune.cli.progress import progress_bar

    return progress_bar(not as_json)


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
    if qa_path is not None:
        from moetune.cli.quality_qa import run_qa

        run_qa(
            qa_path,
            qa_format,
            plans,
            urls,
            labels,
            limit=limit,
            thinking=thinking,
            max_tokens=max_tokens,
            model=model_name,
            server=server_name,
            launch_timeout_s=launch_timeout_s,
            timeout_s=timeout_s,
            confidence=confidence,
            db_path=db_path,
            as_json=as_json,
        )
        return
    if urls:
        raise click.UsageError("--url is for --qa; teacher-forced quality runs the plans' own llama-perplexity")
    if len(plans) < 2:
        raise click.UsageError("give a REFERENCE plan and at least one CANDIDATE plan")
    _kld(
        plans,
        text_path,
        ctx,
        chunks,
        labels,
        server_name,
        launch_timeout_s,
        timeout_s,
        confidence,
        seed,
        db_path,
        as_json,
    )


def _kld(
    plans: tuple[Path, ...],
    text_path: Path | None,
    ctx: int,
    chunks: int | None,
    labels: tuple[str, ...],
    server_name: str | None,
    launch_timeout_s: float,
    timeout_s: float,
    confidence: float,
    seed: int,
    db_path: Path | None,
    as_json: bool,
) -> None:
    from dataclasses import replace

    from moetune.bench.target import plan_target
    from moetune.errors import InputError
    from moetune.quality.kld import EvalOptions, eval_text, evaluate
    from moetune.store.db import ResultsDB

    for p in plans:
        if not p.is_file():
            raise InputError(f"{p}: no such plan file", hint="write one with `moetune plan MODEL --hw HW -o FILE`")
    targets = [plan_target(p, server_name) for p in plans]
    if labels:
        if len(labels) != len(targets):
            raise InputError(f"{len(labels)} --label for {len(targets)} plans", hint="give one --label per plan")
        targets = [replace(t, doc={**(t.doc or {}), "label": lab}) for t, lab in zip(targets, labels, strict=True)]
    opt = EvalOptions(
        text=text_path or eval_text(),
        ctx=ctx,
        chunks=chunks,
        conf=confidence,
        seed=seed,
        timeout_s=timeout_s,
        launch_timeout_s=launch_timeout_s,
    )
    with ResultsDB.open(db_path) as db, _progress(as_json) as bars:
        cbs: dict[str, Any] = {}

        def progress(label: str, done: int, total: int) -> None:
            if label not in cbs:
                cbs[label] = bars(label)
            cbs[label]("chunks", done, total or done)

        ref, cands = evaluate(
            db, targets[0], targets[1:], opt, status=lambda s: err.print(f"[dim]{s}[/]"), progress=progress
        )
        db_name = str(db.path)
    if as_json:
        print_json(
            {
                "reference": ref.to_json(),
                "candidates": [c.to_json() for c in cands],
                "text": str(opt.text),
                "ctx": ctx,
                "confidence": confidence,
                "rule": {
                    "same_kld_below": _same(),
                    "close_kld_below": _close(),
                    "interval": "bootstrap over chunks (>= 5), else the engine's ±",
                },
                "db": db_name,
            }
        )
        return
    from moetune.report.quality_view import kld_table

    print_wide(kld_table(ref, cands, confidence))
    out.print(f"runs stored in {db_name}; `moetune compare` lines them up (metrics kld, top1_agree, ppl)")


def _same() -> float:
    from moetune.quality.stats import SAME_KLD

    return SAME_KLD


def _close() -> float:
    from moetune.quality.stats import CLOSE_KLD

    return CLOSE_KLD


def register(cli: click.Group) -> None:
    cli.add_command(quality_cmd)
