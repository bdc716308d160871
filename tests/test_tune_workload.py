"""`moetune tune --objective replay:FILE` and `--objective turn`, the pure parts: what --objective
accepts and how it refuses the rest, a replay pass's total and a session's turn time from raw
samples, the prefix cache as the server reported it, the salt and the pinned tokens a replayed
pass sends, the prediction's schedule, and a faster workload winning the verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from moetune.bench.analysis.objective import cache_of, objective_metrics, replay_totals, turn_times
from moetune.bench.record.schedule import ReplayRequest, pinned, replay_body, salted
from moetune.errors import InputError
from moetune.plan.settings import Settings
from moetune.report.compare import RunMetrics, compare
from moetune.tune import workload as wl
from moetune.tune.verdict import verdicts
from tests.helpers import run_cli

SHA = "ab" * 32


def chat(seq: int, t: float, content: str, *, prompt: int = 20, completion: int = 8) -> dict[str, Any]:
    """A recorded line: a chat request with its counts."""
    return {
        "schema": 1,
        "seq": seq,
        "method": "POST",
        "path": "/v1/chat/completions",
        "t_start_s": t,
        "t_end_s": t + 0.5,
        "status": 200,
        "body": {"messages": [{"role": "user", "content": content}], "max_tokens": completion},
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "tokens_from": "usage",
    }


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("tg", ("tg", None)),
        ("goodput", ("goodput", None)),
        ("turn", ("turn", None)),
        ("replay:s.jsonl", ("replay", Path("s.jsonl"))),
        (" replay: a/b.jsonl", ("replay", Path("a/b.jsonl"))),
    ],
)
def test_objective_names(text: str, want: tuple[str, Path | None]) -> None:
    assert wl.parse(text) == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("replay", "--objective replay needs the session file: --objective replay:FILE"),
        ("replay:", "give the session file"),
        ("speed", "--objective 'speed': choose one of tg, pp, ttft, goodput, turn, replay:FILE"),
    ],
)
def test_objective_refused(text: str, says: str) -> None:
    with pytest.raises(InputError) as e:
        wl.parse(text)
    assert says in str(e.value)


def test_a_session_file_is_checked_before_anything_is_planned(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        wl.replay_objective(tmp_path / "none.jsonl", "max")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"seq": 0}\nnot json\n{"seq": 1}\n')
    with pytest.raises(InputError, match=r"--objective replay:\S*bad.jsonl: line 1 is not a recorded request"):
        wl.replay_objective(bad, "max")
    gets = write(tmp_path / "gets.jsonl", [{"seq": 0, "method": "GET", "path": "/v1/models", "t_start_s": 0}])
    with pytest.raises(InputError, match="records no chat or completions request"):
        wl.replay_objective(gets, "max")
    good = write(
        tmp_path / "good.jsonl",
        [
            chat(0, 0.0, "a"),
            chat(1, 1.0, "b", prompt=300, completion=40),
            {**chat(2, 2.0, "c"), "status": 400, "prompt_tokens": None, "completion_tokens": None, "tokens_from": None},
        ],
    )
    with pytest.raises(InputError, match=r"--replay-speed 'fast': give max"):
        wl.replay_objective(good, "fast")
    w = wl.replay_objective(good, "1X")
    assert (w.speed, w.concurrency, w.counted, len(w.calls), w.excused) == ("1x", 1, True, 3, (2,))
    assert w.per_slot == 340 + wl.TEMPLATE_TOKENS  # the longest request and its reply, and the template's
    uncounted = write(tmp_path / "uncounted.jsonl", [{**chat(0, 0.0, "a"), "prompt_tokens": None}])
    assert wl.replay_objective(uncounted, "max").per_slot == 0  # not counted: the slots get the user's --ctx
    w = wl.replay_objective(
        write(tmp_path / "counted.jsonl", [chat(0, 0.0, "a"), chat(1, 1.0, "b", prompt=300, completion=40)]), "max"
    )
    assert (w.counted, w.excused) == (True, ())
    assert w.per_slot == 340 + wl.TEMPLATE_TOKENS  # the longest request and its reply, and the template's
    assert wl.slotted(Settings(ctx=4096, slots=1), w).ctx == 4096  # the user's --ctx is larger: kept
    assert wl.slotted(Settings(ctx=256, slots=1), w).ctx == 404


def test_what_tune_refuses_of_the_workload_objectives(tmp_path: Path) -> None:
    hw = tmp_path / "hw.yaml"
    hw.write_text("nodes: [{name: local, cpu: {cores: 2, ram_mib: 16000}}]\n")
    good = write(tmp_path / "s.jsonl", [chat(0, 0.0, "a")])
    for args, says in [
        (["--objective", "bogus"], "--objective 'bogus': choose one of"),
        (["--objective", f"replay:{tmp_path / 'none.jsonl'}"], "no such file"),
        (["--objective", "replay"], "needs the session file"),
        (["--objective", "tg", "--replay-speed", "max"], "--replay-speed paces --objective replay:FILE"),
        (["--objective", "tg", "--turns", "3"], "--turns: only with --objective turn"),
        (["--objective", f"replay:{good}", "--depth", "512"], "--depth: the replay sends the recorded requests"),
        (["--objective", f"replay:{good}", "--replay-speed", "0x"], "--replay-speed '0x'"),
        (["--objective", "turn", "--depth", "0"], "--depth 0: with --objective turn the system prompt"),
        (["--objective", "turn", "--slo", "ttft_ms=100"], "--slo: only with --objective goodput"),
        (["--objective", "goodput", "--slo", "ttft_ms=500", "--confirm", "2"], "--confirm launches single-stream"),
    ]:
        r = run_cli("tune", str(tmp_path / "m.gguf"), "--hw", str(hw), *args, "--db", str(tmp_path / "t.db"))
        assert r.exit_code == 2 and says in r.stderr, (args, r.stderr)


def pass_sample(
    repeat: int,
    t0: float,
    t1: float,
    *,
    error: str | None = None,
    sha: str = SHA[:16],
    processed: int = 10,
    reused: int = 0,
    request: int = 0,
) -> dict[str, Any]:
    return {
        "index": 0,
        "concurrency": 1,
        "rate": None,
        "t_sched": t0,
        "t_send": t0,
        "t_end": t1,
        "error": error,
        "chunks": [],
        "replay": {"sha256": sha, "repeat": repeat, "request": request},
        "timings": {"prompt_n": processed, "cache_n": reused},
    }


def test_a_pass_total_is_its_span_and_a_failed_pass_has_none() -> None:
    s = [
        pass_sample(-1, 0.0, 9.0),  # a warmup pass: not measured
        pass_sample(0, 10.0, 11.0),
        pass_sample(0, 11.0, 12.5, reused=8),
        pass_sample(1, 13.0, 14.0),
        pass_sample(1, 14.0, 15.0, error="http_500"),
        pass_sample(2, 16.0, 17.0),
        pass_sample(2, 16.5, 18.0, reused=8),
    ]
    t = replay_totals(s)[SHA[:16]]
    assert t.seconds == pytest.approx((2.5, 2.0)) and t.failed == 1
    # a request the recording failed too may fail again without failing its pass
    assert replay_totals(s, excused=(0,))[SHA[:16]].seconds == pytest.approx((2.5, 2.0, 2.0))
    c = cache_of([x for x in s if x["replay"]["repeat"] >= 0])
    assert (c.processed, c.reused) == (50, 16)  # the failed request's counts left out
    assert c.reused_share == pytest.approx(16 / 66)
    assert cache_of([{"usage": {"prompt_tokens": 5}}]).reused is None  # reported by neither: unknown, not 0


def turn(session: int, n: int, e2e: float, *, error: str | None = None) -> dict[str, Any]:
    return {
        "index": n,
        "concurrency": 1,
        "rate": None,
        "t_sched": 0.0,
        "t_send": 0.0,
        "t_end": e2e,
        "error": error,
        "chunks": [],
        "session": session,
        "turn": n,
    }


def test_a_sessions_turn_time_is_its_turns_mean() -> None:
    s = [
        turn(0, 1, 2.0),
        turn(0, 2, 1.0),
        turn(0, 3, 1.5),
        turn(1, 1, 2.2),
        turn(1, 2, 1.0, error="timeout"),
        turn(2, 1, 1.8),
        turn(2, 2, 1.2),
        turn(2, 3, 1.2),
    ]
    t = turn_times(s)
    assert t.seconds == pytest.approx((1.5, 1.4)) and t.failed == 1


def test_compare_pairs_the_passes_of_one_file_only() -> None:
    a = [pass_sample(k, 0.0, 2.0 + 0.01 * k) for k in range(4)]
    b = [pass_sample(k, 0.0, 1.5 + 0.01 * k) for k in range(4)]
    other = [pass_sample(k, 0.0, 1.0, sha="cd" * 8) for k in range(4)]
    ma, mb = objective_metrics(a), objective_metrics(b)
    assert set(ma) == {f"replay_s:{SHA[:16]}"} and not ma[f"replay_s:{SHA[:16]}"].higher_is_better
    c = compare(
        RunMetrics(run=1, label="a", kind="serve-bench", status="done", metrics=ma),
        [
            RunMetrics(run=2, label="b", kind="serve-bench", status="done", metrics=mb),
            RunMetrics(run=3, label="c", kind="serve-bench", status="done", metrics=objective_metrics(other)),
        ],
    )
    (row,) = c.rows
    assert (row.run, row.verdict) == (2, "faster") and row.change_pct == pytest.approx(-25, abs=1)
    assert "run 3 (c) shares no metric" in " ".join(c.notes)


def test_the_faster_workload_wins_and_a_noisy_one_does_not() -> None:
    class E:
        plan = None
        failed = None
        fits = True

    def m(seconds: list[float]) -> list[float]:
        from moetune.bench.analysis.objective import Cache, Totals

        return wl.Measured(totals=Totals(tuple(seconds)), cache=Cache(0, 0), requests=1, ok=1).values

    values = {0: m([10.0, 10.2, 9.9, 10.1]), 1: m([8.0, 8.1, 7.9, 8.05]), 2: m([6.0, 14.0, 9.0, 11.0])}
    out, best = verdicts([E(), E(), E()], values, None)  # type: ignore[list-item]
    assert best == 1 and out[1].startswith("best, faster") and out[2].startswith("same")


def test_the_schedule_the_prediction_assumes() -> None:
    assert wl.finish_s([0, 0, 0], [1, 1, 1], 1) == 3  # back to back on one slot
    assert wl.finish_s([0, 0, 0], [1, 1, 1], 2) == 2
    assert wl.finish_s([0, 5, 6], [1, 2, 1], 1) == 8  # at the recorded pace: idle until due, then queued
    assert wl.finish_s([0, 0.5], [1, 1], 1) == 2


def test_a_pass_sends_its_salt_and_the_recorded_counts() -> None:
    body = {
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}],
        "max_tokens": 99,
        "n_predict": 5,
    }
    assert salted(body, "x.r1")["messages"][0]["content"] == "x.r1 sys"
    assert salted(body, "x.r1")["messages"][1] == {"role": "user", "content": "q"}
    parts = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]}
    assert salted(parts, "s")["messages"][0]["content"][1]["text"] == "s hi"
    assert salted({"prompt": "p"}, "s") == {"prompt": "s p"}
    assert pinned(body, 7) == {"messages": body["messages"], "max_tokens": 7, "ignore_eos": True}
    r = ReplayRequest(
        seq=0,
        target="/v1/chat/completions",
        body=body,
        offset_s=0.0,
        max_tokens=99,
        recorded_completion_tokens=7,
        recorded_prompt_tokens=20,
    )
    sent = json.loads(replay_body(r, None, salt="t.r0", pin=True))
    assert sent["max_tokens"] == 7 and sent["ignore_eos"] and sent["messages"][0]["content"] == "t.r0 sys"
    assert json.loads(replay_body(r, None))["messages"] == body["messages"]  # a plain replay: as recorded


def test_a_time_objective_reads_as_the_times_change() -> None:
    from moetune.tune.verdict import compare as judge

    base, other = [1 / 10.0, 1 / 10.1, 1 / 9.9, 1 / 10.0], [1 / 8.0, 1 / 8.1, 1 / 7.9, 1 / 8.0]
    assert judge(base, other, as_time=True)[1] == "faster (-20.0% time vs baseline)"
    assert judge(base, other)[1] == "faster (+25.0% vs baseline)"


def test_a_workload_whose_every_pass_failed_says_why() -> None:
    w = wl.ReplayObjective(
        file=Path("s.jsonl"), sha256=SHA, speed="max", concurrency=1, per_slot=0, calls=(), counted=False
    )
    m = wl.measured([pass_sample(0, 0.0, 1.0, error="http_400"), pass_sample(0, 1.0, 2.0)], w)
    assert m.seconds == () and m.totals.failed == 1
    assert m.problem() == (
        "no pass of the workload ended without a failed request (1 of 2 requests failed: "
        "http_400 x1); `moetune serve-report RUN` shows them"
    )
    assert wl.measured([pass_sample(0, 0.0, 1.0)], w).problem() is None


def test_launches_pooled_keep_each_launchs_passes_apart() -> None:
    w = wl.ReplayObjective(
        file=Path("s.jsonl"), sha256=SHA, speed="max", concurrency=1, per_slot=0, calls=(), counted=False
    )
    first = [pass_sample(0, 0.0, 1.0), pass_sample(1, 2.0, 4.0)]
    second = [pass_sample(0, 100.0, 103.0), pass_sample(1, 110.0, 114.0, error="timeout")]
    m = wl.pooled([first, second], w)
    assert m.seconds == pytest.approx((1.0, 2.0, 3.0)) and m.totals.failed == 1
    assert (m.requests, m.ok, m.errors) == (4, 3, (("timeout", 1),))
    # one list of both launches' samples would merge each pass index across them
    assert wl.measured(first + second, w).seconds == pytest.approx((103.0,))
    assert wl.measured(first, w) == wl.pooled([first], w)
