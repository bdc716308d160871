"""`moetune serve-bench --sessions`: the agent-sessions options and their tables (their checks:
``moetune.app.serve_bench.session_spec``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from rich.console import Group


F = TypeVar("F", bound=Callable[..., Any])


def session_options(f: F) -> F:
    """The options of the sessions workload, added to serve-bench."""
    opts = [
        click.option(
            "--sessions",
            type=click.IntRange(1),
            help="Agent sessions: N concurrent conversations that "
            "grow turn by turn, each turn sending the whole history (replaces the load levels).",
        ),
        click.option("--turns", type=click.IntRange(1), help="Turns per session [default: 4]."),
        click.option(
            "--system-tokens", type=click.IntRange(16), help="Tokens of each session's system prompt [default: 512]."
        ),
        click.option(
            "--turn-tokens",
            type=click.IntRange(1),
            help="Tokens each turn adds: a user message, a tool's output [default: 128]. Each reply adds --output-len.",
        ),
        click.option(
            "--think-time",
            type=click.FloatRange(0),
            help="Seconds a session waits between a reply and its next turn [default: 0].",
        ),
        click.option(
            "--strip-thinking",
            is_flag=True,
            help="Drop the reasoning (reasoning_content, "
            "<think> blocks) from the history before the next turn, as some clients do; the server must "
            "then evaluate each reply again.",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def describe(s: dict[str, Any]) -> str:
    spec = s["spec"]
    return (
        f"{spec['sessions']} sessions x {spec['turns']} turns ({spec['system_tokens']} system + "
        f"{spec['turn_tokens']} per turn + {spec['output_len']} reply tokens), history "
        + ("with the reasoning stripped" if spec["strip_thinking"] else "intact")
    )


def _n(x: Any, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def sessions_tables(s: dict[str, Any]) -> Group:
    """Per turn (the medians over the sessions) and per session."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

    src = {"timings": "llama-server's timings", "usage": "usage.prompt_tokens_details"}.get(
        s.get("cache_source") or "", "not reported"
    )
    turns = Table(
        title=f"sessions per turn, p50 over the sessions (prompt tokens from {src})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in (
        "turn",
        "ok",
        "context\ntokens",
        "processed\ntokens",
        "reused\ntokens",
        "reused\n%",
        "TTFT\nms",
        "TG\ntok/s",
    ):
        turns.add_column(col, justify="right", no_wrap=True)
    for t in s["turns"]:
        share = t["reused_share"]["p50"]
        turns.add_row(
            str(t["turn"]),
            f"{t['ok']}/{t['requests']}",
            _n(t["context_tokens"]["p50"]),
            _n(t["prompt_tokens_processed"]["p50"]),
            _n(t["prompt_tokens_reused"]["p50"]),
            _n(None if share is None else share * 100, ".1f"),
            _n(t["ttft_ms"]["p50"], ".1f"),
            _n(t["tg_tok_s"]["p50"], ".1f"),
        )
    sess = Table(title="per session, over its turns", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in (
        "session",
        "turns ok",
        "last\ncontext",
        "processed\ntokens",
        "reused\ntokens",
        "reused\n%",
        "TTFT p50\nms",
        "TG p50\ntok/s",
    ):
        sess.add_column(col, justify="right", no_wrap=True)
    for p in s["per_session"]:
        share = p["reused_share"]
        sess.add_row(
            str(p["session"]),
            f"{p['ok']}/{p['turns']}",
            _n(p["context_tokens"]),
            _n(p["prompt_tokens_processed"]),
            _n(p["prompt_tokens_reused"]),
            _n(None if share is None else share * 100, ".1f"),
            _n(p["ttft_ms"]["p50"], ".1f"),
            _n(p["tg_tok_s"]["p50"], ".1f"),
        )
    parts: list[Any] = [turns, sess]
    fit = s.get("tg_vs_context")
    if fit:
        (t0, t1), (c0, c1), (g0, g1) = fit["turns"], fit["context_tokens"], fit["tg_tok_s"]
        parts.append(
            f"TG against context: {g0:.1f} tok/s at {c0} tokens (turn {t0}), {g1:.1f} at {c1} (turn {t1}): "
            f"{_n(fit['change_pct'], '+.1f')}%; {fit['slope_tok_s_per_1k_tokens']:+.1f} tok/s per 1000 "
            f"tokens over all {fit['points']} turns (Theil–Sen)"
        )
    return Group(*parts)
