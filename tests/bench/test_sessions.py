"""Agent sessions, pure: what each turn sends given the replies so far, and the per-turn and
per-session figures from raw samples (table-tested, no server)."""

from __future__ import annotations

from typing import Any

import pytest

from moetune.bench.analysis.sessions import (
    per_session,
    per_turn,
    prompt_cache,
    serve_run_metrics,
    session_metric_samples,
    summarize_sessions,
    tg_vs_context,
    theil_sen,
    turn_samples,
)
from moetune.bench.serve.load import RequestOptions, request_body
from moetune.bench.serve.sessions import (
    Reply,
    SessionSpec,
    SessionTexts,
    kept_message,
    session_tag,
    strip_thinking,
    turn_request,
)
from moetune.report.compare import RunMetrics, compare

SPEC = SessionSpec(sessions=2, turns=3, system_tokens=64, turn_tokens=16, output_len=8)
TEXTS = SessionTexts("ab12.s0 system", ("first", "second", "third"))


@pytest.mark.parametrize(
    ("text", "stripped"),
    [
        ("<think>plan</think>answer", "answer"),
        ("a<think>x\ny</think>b<think>z</think>c", "abc"),  # several blocks, across lines
        ("<think>never closed", ""),  # an unclosed block runs to the end
        ("no reasoning", "no reasoning"),
        ("", ""),
    ],
)
def test_strip_thinking(text: str, stripped: str) -> None:
    assert strip_thinking(text) == stripped


@pytest.mark.parametrize(
    ("reply", "strip", "message", "left_out"),
    [
        # intact: as the server sent it, the reasoning beside the content
        (Reply("answer", "plan"), False, {"role": "assistant", "content": "answer", "reasoning_content": "plan"}, 0),
        (Reply("<think>plan</think>answer"), False, {"role": "assistant", "content": "<think>plan</think>answer"}, 0),
        (Reply("answer"), False, {"role": "assistant", "content": "answer"}, 0),
        # stripped: no reasoning_content, no <think> block in the content
        (Reply("answer", "plan"), True, {"role": "assistant", "content": "answer"}, 4),
        (Reply("<think>plan</think>answer"), True, {"role": "assistant", "content": "answer"}, 19),
        (Reply("answer"), True, {"role": "assistant", "content": "answer"}, 0),
    ],
)
def test_the_reply_the_client_keeps(reply: Reply, strip: bool, message: dict[str, str], left_out: int) -> None:
    assert kept_message(reply, strip=strip) == (message, left_out)


def test_each_turn_sends_the_whole_history() -> None:
    first = turn_request(0, TEXTS, [], SPEC)
    assert (first.session, first.turn, first.max_tokens, first.stripped_chars) == (0, 1, 8, 0)
    assert first.messages() == [{"role": "system", "content": "ab12.s0 system"}, {"role": "user", "content": "first"}]
    replies = [Reply("one", "r1"), Reply("two", "r2")]
    third = turn_request(0, TEXTS, replies, SPEC)
    assert third.turn == 3
    assert third.messages() == [
        {"role": "system", "content": "ab12.s0 system"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one", "reasoning_content": "r1"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "two", "reasoning_content": "r2"},
        {"role": "user", "content": "third"},
    ]
    # the history a turn sends starts with the one the turn before sent: a prefix the server can reuse
    second = turn_request(0, TEXTS, replies[:1], SPEC)
    assert third.messages()[: len(second.messages())] == second.messages()


def test_stripped_history_leaves_the_reasoning_out_of_every_reply() -> None:
    spec = SessionSpec(sessions=1, turns=3, strip_thinking=True)
    third = turn_request(0, TEXTS, [Reply("one", "r1"), Reply("<think>xy</think>two")], spec)
    assert [m.get("content") for m in third.messages()] == ["ab12.s0 system", "first", "one", "second", "two", "third"]
    assert not any("reasoning_content" in m for m in third.messages())
    assert third.stripped_chars == 2 + 17
    # stripped consistently: again a prefix of the next turn's history
    second = turn_request(0, TEXTS, [Reply("one", "r1")], spec)
    assert third.messages()[: len(second.messages())] == second.messages()


def test_a_turn_past_the_last_is_refused() -> None:
    with pytest.raises(ValueError, match="turn 4"):
        turn_request(0, TEXTS, [Reply("a")] * 3, SPEC)


@pytest.mark.parametrize(
    "bad",
    [
        {"sessions": 0},
        {"sessions": 1, "turns": 0},
        {"sessions": 1, "turn_tokens": 0},
        {"sessions": 1, "think_time_s": -1.0},
    ],
)
def test_a_spec_that_makes_no_sense(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SessionSpec(**bad)


def test_the_request_asks_for_the_prefix_cache_and_sends_the_history() -> None:
    import json

    turn = turn_request(1, TEXTS, [Reply("one", "r1")], SPEC)
    body = json.loads(request_body(turn, RequestOptions(model="m", cache_prompt=True, thinking=True)))
    assert body["cache_prompt"] is True and body["max_tokens"] == 8 and body["stream"] is True
    assert body["messages"] == turn.messages()
    assert body["chat_template_kwargs"] == {"enable_thinking": True}


def test_context_need_and_tags() -> None:
    assert SPEC.context_need() == 64 + 3 * (16 + 8)
    assert session_tag("ab12", 3) == "ab12.s3 "
    assert SPEC.to_json()["strip_thinking"] is False


# -- figures from raw samples ---------------------------------------------------------------------


def sample(
    session: int,
    turn: int,
    *,
    processed: int | None,
    reused: int | None,
    ttft: float = 0.05,
    tpot: float = 0.01,
    tokens: int = 5,
    error: str | None = None,
    source: str = "timings",
    stripped: int = 0,
) -> dict[str, Any]:
    """A stored turn: ``tokens`` one-token events, the first ``ttft`` s after sending, then one every ``tpot`` s."""
    t = 100.0 + 10 * turn + session
    chunks = [[t + ttft + i * tpot, 1, 1, 0, None, None] for i in range(tokens)] if error is None else []
    timings: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    context = None if processed is None else processed + (reused or 0)
    if source == "timings":
        timings = {"prompt_n": processed, "cache_n": reused}
        usage = {"prompt_tokens": context, "completion_tokens": tokens}
    elif source == "usage":
        usage = {
            "prompt_tokens": context,
            "completion_tokens": tokens,
            "prompt_tokens_details": {"cached_tokens": reused},
        }
    else:
        usage = {"prompt_tokens": context, "completion_tokens": tokens}
    return {
        "session": session,
        "turn": turn,
        "concurrency": 2,
        "rate": None,
        "t_sched": t,
        "t_slot": t,
        "t_send": t,
        "t_end": t + 1,
        "chunks": chunks,
        "error": error,
        "status": 200 if error is None else None,
        "usage": usage if error is None else None,
        "timings": timings if error is None else None,
        "max_tokens": tokens,
        "prompt_tokens": None,
        "retries": [],
        "count_source": "timings",
        "stripped_chars": stripped,
    }


@pytest.mark.parametrize(
    ("s", "expect"),
    [
        # llama-server: timings
        ({"timings": {"prompt_n": 40, "cache_n": 600}, "usage": {"prompt_tokens": 640}}, (640, 40, 600, "timings")),
        # ik_llama.cpp: timings without cache_n, the whole prompt in usage
        ({"timings": {"prompt_n": 40}, "usage": {"prompt_tokens": 640}}, (640, 40, 600, "timings")),
        # OpenAI-style with cached_tokens (vLLM --enable-prompt-tokens-details)
        ({"usage": {"prompt_tokens": 640, "prompt_tokens_details": {"cached_tokens": 512}}}, (640, 128, 512, "usage")),
        # usage alone: the context, nothing about the cache
        ({"usage": {"prompt_tokens": 640}}, (640, None, None, None)),
        ({}, (None, None, None, None)),
    ],
)
def test_prompt_cache_from_what_the_server_reports(s: dict[str, Any], expect: tuple[Any, ...]) -> None:
    c = prompt_cache(s)
    assert (c.context, c.processed, c.reused, c.source) == expect


RUN = [
    sample(0, 1, processed=300, reused=0, ttft=0.10),
    sample(1, 1, processed=300, reused=0, ttft=0.12),
    sample(0, 2, processed=100, reused=310, ttft=0.03, tpot=0.011),
    sample(1, 2, processed=100, reused=310, ttft=0.04, tpot=0.011),
    sample(0, 3, processed=100, reused=520, ttft=0.04, tpot=0.012),
    sample(1, 3, processed=None, reused=None, error="http_400:exceed_context_size_error"),
]


def test_per_turn() -> None:
    turns = per_turn(turn_samples(RUN))
    assert [t["turn"] for t in turns] == [1, 2, 3]
    t2 = turns[1]
    assert (t2["requests"], t2["ok"], t2["errors"]) == (2, 2, {})
    assert t2["context_tokens"]["p50"] == 410 and t2["prompt_tokens_processed"]["p50"] == 100
    assert t2["prompt_tokens_reused"]["p50"] == 310
    assert t2["reused_share"]["p50"] == pytest.approx(310 / 410, abs=1e-4)
    assert t2["ttft_ms"]["p50"] == pytest.approx(35.0)
    assert t2["tg_tok_s"]["p50"] == pytest.approx(1 / 0.011, rel=1e-3)
    assert set(t2["ttft_ms"]) == {"p50", "p90", "p99", "mean"}
    t3 = turns[2]
    assert (t3["requests"], t3["ok"], t3["errors"]) == (2, 1, {"http_400:exceed_context_size_error": 1})
    assert t3["prompt_tokens_reused"]["p50"] == 520  # the failed turn counts in no figure


def test_per_session() -> None:
    s0, s1 = per_session(turn_samples(RUN))
    assert (s0["session"], s0["turns"], s0["ok"], s0["context_tokens"]) == (0, 3, 3, 620)
    assert (s0["prompt_tokens_processed"], s0["prompt_tokens_reused"]) == (500, 830)
    assert s0["reused_share"] == pytest.approx(830 / 1330, abs=1e-4)
    assert (s1["turns"], s1["ok"], s1["errors"], s1["context_tokens"]) == (
        3,
        2,
        {"http_400:exceed_context_size_error": 1},
        410,
    )
    assert s1["prompt_tokens_processed"] == 400


def test_summary_without_cache_figures_warns_and_leaves_them_null() -> None:
    run = [sample(s, t, processed=100 * t, reused=50, source="none") for s in (0, 1) for t in (1, 2)]
    doc = summarize_sessions(run, SPEC.to_json(), slots=4)
    assert doc["cache_source"] is None
    assert doc["prompt_tokens_processed"] is None and doc["reused_share"] is None
    assert doc["turns"][1]["prompt_tokens_reused"]["p50"] is None
    assert doc["turns"][1]["context_tokens"]["p50"] == 250  # usage.prompt_tokens still gives the context
    assert any("neither timings.cache_n nor" in w for w in doc["warnings"])


@pytest.mark.parametrize(
    ("run", "kw", "words"),
    [
        # reuse nowhere after the first turn
        ([sample(0, t, processed=100 * t, reused=0) for t in (1, 2)], {}, "reused no prompt tokens"),
        # more sessions than slots
        (
            [sample(0, 1, processed=100, reused=0)],
            {"slots": 1, "spec": SessionSpec(sessions=3)},
            "3 sessions on 1 slot",
        ),
        # stripping with nothing to strip
        (
            [sample(0, t, processed=100, reused=50 * t) for t in (1, 2)],
            {"spec": SessionSpec(sessions=1, strip_thinking=True)},
            "nothing to strip",
        ),
    ],
)
def test_session_warnings(run: list[dict[str, Any]], kw: dict[str, Any], words: str) -> None:
    spec = kw.get("spec", SPEC)
    doc = summarize_sessions(run, spec.to_json(), slots=kw.get("slots"))
    assert any(words in w for w in doc["warnings"]), doc["warnings"]


def test_a_clean_run_has_no_session_warnings() -> None:
    run = [sample(s, t, processed=100, reused=200 * (t - 1), stripped=10 * (t - 1)) for s in (0, 1) for t in (1, 2)]
    spec = SessionSpec(sessions=2, strip_thinking=True)
    assert summarize_sessions(run, spec.to_json(), slots=2)["warnings"] == []


def test_tg_against_context() -> None:
    # TG falls from 100 to 80 tok/s as the context grows from 1000 to 3000 tokens; one odd turn
    run = [
        sample(s, t, processed=100, reused=1000 * t - 100, tpot=1 / (110 - 10 * t))
        for s in (0, 1, 2)
        for t in (1, 2, 3)
    ]
    run[4] = sample(1, 2, processed=100, reused=1900, tpot=1 / 20)  # a turn that waited behind another's prompt
    fit = tg_vs_context(turn_samples(run))
    assert fit is not None
    assert fit["turns"] == [1, 3] and fit["context_tokens"] == [1000, 3000]
    assert fit["tg_tok_s"] == [pytest.approx(100, rel=1e-3), pytest.approx(80, rel=1e-3)]
    assert fit["change_pct"] == pytest.approx(-20, abs=0.1)
    assert fit["slope_tok_s_per_1k_tokens"] == pytest.approx(-10, rel=1e-2)  # the odd turn does not pull it
    assert tg_vs_context(turn_samples(run[:2])) is None  # too few points
    assert theil_sen([(1, 1), (1, 2)]) is None  # no spread in x


def test_metrics_for_compare() -> None:
    m = session_metric_samples(RUN)
    assert set(m) == {f"{f}:turn={n}" for f in ("ttft", "decode", "processed", "reused") for n in (1, 2, 3)} - {
        "reused:turn=1"
    }  # cold by construction
    assert m["reused:turn=2"].values == (310.0, 310.0) and m["reused:turn=2"].higher_is_better
    assert m["processed:turn=3"].values == (100.0,) and not m["processed:turn=3"].higher_is_better
    assert (m["ttft:turn=2"].family, m["ttft:turn=2"].x, m["ttft:turn=2"].x_label) == ("ttft by turn", 2.0, "turn")
    both = serve_run_metrics(RUN)  # the level's metrics too: the sessions are one level of c=2
    assert "ttft:c=2" in both and "reused:turn=2" in both


def test_intact_and_stripped_compare_turn_by_turn() -> None:
    intact = [sample(s, t, processed=100, reused=400 * (t - 1)) for s in range(4) for t in (1, 2, 3)]
    stripped = [sample(s, t, processed=160, reused=300 * (t - 1)) for s in range(4) for t in (1, 2, 3)]
    c = compare(
        RunMetrics(run=1, label="intact", kind="serve-bench", status="done", metrics=serve_run_metrics(intact)),
        [RunMetrics(run=2, label="stripped", kind="serve-bench", status="done", metrics=serve_run_metrics(stripped))],
    )
    rows = {r.metric: r for r in c.rows}
    assert rows["reused:turn=3"].verdict == "slower" and rows["reused:turn=3"].change_pct == pytest.approx(-25)
    assert rows["processed:turn=2"].verdict == "slower" and rows["processed:turn=2"].change_pct == pytest.approx(60)
    assert "reused:turn=1" not in rows  # cold by construction


def test_a_baseline_that_reused_nothing_gives_a_note_not_a_ratio() -> None:
    cold = [sample(s, t, processed=100 * t, reused=0) for s in range(4) for t in (1, 2)]
    warm = [sample(s, t, processed=100, reused=100 * (t - 1)) for s in range(4) for t in (1, 2)]
    c = compare(
        RunMetrics(run=1, label="cold", kind="serve-bench", status="done", metrics=serve_run_metrics(cold)),
        [RunMetrics(run=2, label="warm", kind="serve-bench", status="done", metrics=serve_run_metrics(warm))],
    )
    assert "reused:turn=2" not in {r.metric for r in c.rows}
    assert "reused:turn=2: the baseline's median is 0, so no change in % (run 2: 100)" in c.notes
    assert {r.metric: r.verdict for r in c.rows}["processed:turn=2"] == "faster"
