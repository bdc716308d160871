"""Warnings about a benchmark's figures, each with its remedy (as hyperfine gives them): one type,
:class:`Warning`, for single-stream and serving runs alike.

Pure: they are read off the raw samples and the derived metrics, so `results show` and
`serve-report` give the same warnings as the run did.

For serving runs the one that matters most is queueing: a server with fewer slots than
concurrent requests runs the extra requests one after another, so TTFT grows by whole generations
while throughput hardly moves and ITL stays flat (reference 004: ``--parallel 1`` at c=2 gave
TTFT x7.5 and throughput +12%). It is flagged before the run when the server's slot count is
known, and from the numbers (the signature against the lowest level) when it is not.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from moetune.bench.analysis import single as m
from moetune.bench.analysis.level_summary import LevelSummary
from moetune.bench.analysis.serve import SLOW_FACTOR
from moetune.bench.analysis.stats import MetricSamples, cv, first_run_slower, median, outliers
from moetune.jsonread import mapping, number, optional_integer
from moetune.store.record import ServerInfo

NOISY_CV = 0.10
THINKING_SHARE = 0.5
OVERHEAD_SHARE = 0.25
SHORT_OUTPUT_TOKENS = 32
MIN_DEVIATION = 0.05  # an outlier (or a slow first run) must also be this far from the median to matter
MIN_OUTLIER_N = 5  # below this many runs, "outliers" says little
CLIENT_WAIT_MS = 10.0  # open loop: a p90 wait for a client slot above this is worth a look
BEHIND_MARGIN = 0.1  # ... and requests finishing this much slower than they came due is falling behind
PREDICTED_ERROR_PCT = 1.0  # serve-bench --tokenizer: a mean error of predicted prompt lengths above this is told
BURST_WAIT_FACTOR, BURST_WAIT_MS = 2.0, 100.0  # waits this long with enough streams: arrivals bunch up


class Code(StrEnum):
    # single-stream runs: what is wrong with a metric's repeats, or a workload's requests
    FIRST_RUN_SLOWER = "first_run_slower"
    OUTLIERS = "outliers"
    NOISY = "noisy"
    FEW_SAMPLES = "few_samples"
    CACHE_HIT = "cache_hit"
    CACHE_MISS = "cache_miss"
    CACHE_UNKNOWN = "cache_unknown"
    THINKING_DOMINATES = "thinking_dominates"
    SHORT_OUTPUT = "short_output"
    HIGH_OVERHEAD = "high_overhead"
    CLIENT_FIGURES = "client_figures"
    # serving runs: a load level, or the server as the run found it
    QUEUEING = "queueing"
    CLIENT_QUEUE = "client_queue"
    LATENCY_OUTLIER = "latency_outlier"
    ERRORS = "errors"
    RETRIES = "retries"
    THINKING = "thinking"
    PROMPT_MISMATCH = "prompt_mismatch"
    SERVER_BUSY = "server_busy"
    NO_SLOT_INFO = "no_slot_info"
    NO_SERVER_TIMINGS = "no_server_timings"
    NO_TOKENIZER = "no_tokenizer"
    ITL_UNKNOWN = "itl_unknown"
    NO_USAGE = "no_usage"
    SKIPPED = "skipped_prompts"
    REPLAY_TOKENS = "replay_tokens"  # a replay generated other token counts than its recording


# what the single-stream codes say, and their remedies (serving warnings word theirs per level)
TEXT: dict[Code, tuple[str, str]] = {
    Code.FIRST_RUN_SLOWER: (
        "the first measured run was slower than the rest: caches or the server were still warming up",
        "use more warm-up runs (--warmup 2 or more)",
    ),
    Code.OUTLIERS: (
        "statistical outliers were detected",
        "re-run on a quiet machine: stop other programs and servers, and pin the threads",
    ),
    Code.NOISY: ("the runs vary a lot", "quiet the machine, or raise --repeats so that the interval narrows"),
    Code.FEW_SAMPLES: ("fewer than three measured runs: the interval is wide or absent", "use --repeats 5 or more"),
    Code.CACHE_HIT: (
        "the server reused cached prompt tokens where none were wanted, so PP was measured on part of the prompt",
        "leave --cache-bust on, and make sure no other client uses the server",
    ),
    Code.CACHE_MISS: (
        "the server's cache did not hold the context the depth test filled",
        "free slot 0 (other clients evict it), or run the server with --parallel 1 and a context of "
        "at least depth + pp + tg tokens",
    ),
    Code.CACHE_UNKNOWN: (
        "the server reports no cached-token count, so the cache state is unconfirmed",
        "against llama-server: use a build whose timings carry cache_n, or check prompt_n by hand; "
        "a server that is not llama-server ignores cache_prompt=false and may serve repeats from "
        "its prefix cache, overstating PP: turn that cache off (vLLM --no-enable-prefix-caching, "
        "SGLang --disable-radix-cache) or have it report usage.prompt_tokens_details.cached_tokens "
        "(vLLM --enable-prompt-tokens-details)",
    ),
    Code.THINKING_DOMINATES: (
        "thinking tokens dominate the output: the answer took a fraction of the time",
        "compare thinking-on runs only with thinking-on runs; turn it off with --thinking off "
        "where the answer is what matters",
    ),
    Code.SHORT_OUTPUT: (
        "the model stopped early: TG from so few tokens is imprecise",
        "use --ignore-eos --max-tokens N for exact output lengths",
    ),
    Code.HIGH_OVERHEAD: (
        "the client's overhead is a large share of each request, so client-side figures differ from the server's",
        "trust the server's timings (the primary figures); use longer outputs",
    ),
    Code.CLIENT_FIGURES: (
        "the server sends no llama.cpp timings, so TG and PP are the client's figures (source: "
        "client): TG from the chunks' arrival times and usage.completion_tokens, PP from "
        "usage.prompt_tokens over the time to the first chunk (HTTP, queueing and the first token "
        "included); overhead_ms is null",
        "compare them only with runs measured the same way; for the server's own PP/TG, benchmark llama-server",
    ),
}
NOTES = frozenset({Code.RETRIES})  # told, but not warnings: they change no figure
# the findings that make a comparison's verdicts less trustworthy: noise, a cache state other
# than the one the benchmark asked for, and figures by the client's clock (not the server's)
NOISE = frozenset(
    {
        Code.NOISY,
        Code.OUTLIERS,
        Code.FIRST_RUN_SLOWER,
        Code.FEW_SAMPLES,
        Code.CACHE_HIT,
        Code.CACHE_MISS,
        Code.CLIENT_FIGURES,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Warning:
    """One finding: its code, what it is about (a metric, a workload, a load level), the evidence,
    the sentence a person reads, and what to do."""

    code: Code
    message: str
    remedy: str
    subject: str = ""
    detail: str = ""

    @classmethod
    def of(cls, code: Code, subject: str, detail: str) -> Warning:
        """A single-stream finding, worded from :data:`TEXT`."""
        text, remedy = TEXT[code]
        return cls(code=code, message=f"{subject}: {text} ({detail})", remedy=remedy, subject=subject, detail=detail)

    @property
    def is_note(self) -> bool:
        return self.code in NOTES

    def to_json(self) -> dict[str, str]:
        return {
            "code": str(self.code),
            "subject": self.subject,
            "detail": self.detail,
            "message": self.message,
            "remedy": self.remedy,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Warning:
        """A stored warning (``kind`` was the serving runs' name for ``code`` before schema 2)."""
        return cls(
            code=Code(str(d.get("code") or d.get("kind"))),
            message=str(d.get("message") or ""),
            remedy=str(d.get("remedy") or ""),
            subject=str(d.get("subject") or ""),
            detail=str(d.get("detail") or ""),
        )


def grouped(warnings: list[Warning]) -> list[tuple[str, str]]:
    """(message, remedy) per kind of warning, its subjects listed together: what a person reads."""
    by: dict[Code, list[Warning]] = {}
    for w in warnings:
        by.setdefault(w.code, []).append(w)
    out = []
    for code, ws in by.items():
        if code in TEXT:
            out.append((f"{TEXT[code][0]}: " + ", ".join(f"{w.subject} ({w.detail})" for w in ws), TEXT[code][1]))
        else:
            out += [(w.message, w.remedy) for w in ws]
    return out


def _metric_warnings(name: str, ms: MetricSamples) -> list[Warning]:
    xs = list(ms.values)
    out: list[Warning] = []
    if len(xs) < 3:
        out.append(Warning.of(Code.FEW_SAMPLES, name, f"n={len(xs)}"))
        return out
    med = median(xs)
    first = first_run_slower(xs, higher_is_better=ms.higher_is_better) and abs(
        xs[0] - median(xs[1:])
    ) >= MIN_DEVIATION * abs(median(xs[1:]))
    if first:
        out.append(Warning.of(Code.FIRST_RUN_SLOWER, name, f"{xs[0]:.4g} vs median {median(xs[1:]):.4g} {ms.unit}"))
    outs = [i for i in outliers(xs) if not (first and i == 0) and abs(xs[i] - med) >= MIN_DEVIATION * abs(med)]
    if outs and len(xs) >= MIN_OUTLIER_N:
        out.append(Warning.of(Code.OUTLIERS, name, f"{len(outs)} of {len(xs)} runs"))
    c = cv(xs[1:] if first else xs)  # the slow first run is its own warning
    if c > NOISY_CV:
        out.append(Warning.of(Code.NOISY, name, f"CV {c * 100:.0f}%"))
    return out


def _workload_warnings(w: str, ss: Sequence[m.Sample]) -> list[Warning]:
    out: list[Warning] = []
    expected = [s for s in ss if s.get("expect_cached") is not None]
    if expected:
        conf = [(s, m.cache_confirmed(s)) for s in expected]
        if all(c is None for _, c in conf):
            out.append(Warning.of(Code.CACHE_UNKNOWN, w, f"{len(expected)} requests"))
        bad = [s for s, c in conf if c is False]
        hits = [s for s in bad if (m.cached_tokens(s) or 0) > (number(s["expect_cached"]) or 0)]
        misses = [s for s in bad if s not in hits]
        if hits:
            out.append(
                Warning.of(
                    Code.CACHE_HIT,
                    w,
                    f"{len(hits)} of {len(ss)} requests; e.g. "
                    f"{m.cached_tokens(hits[0])} cached, {hits[0]['expect_cached']} expected",
                )
            )
        if misses:
            s = misses[0]
            out.append(
                Warning.of(
                    Code.CACHE_MISS,
                    w,
                    f"{len(misses)} of {len(ss)} requests; e.g. "
                    f"{m.cached_tokens(s)} cached and prompt_n {m.timings(s).get('prompt_n')}, "
                    f"{s['expect_cached']} and {s.get('expect_prompt_n')} expected",
                )
            )
    thinking = [m.reasoning_share(s) for s in ss if s.get("thinking")]
    if thinking and median(thinking) > THINKING_SHARE:
        out.append(Warning.of(Code.THINKING_DOMINATES, w, f"{median(thinking) * 100:.0f}% of streamed chunks"))
    if not ss[0].get("ignore_eos"):
        n = [x for s in ss if (x := m.output_tokens(s)) is not None]
        if n and median(n) < SHORT_OUTPUT_TOKENS:
            out.append(Warning.of(Code.SHORT_OUTPUT, w, f"{median(n):.0f} tokens on median"))
    over = [(o, m.wall_ms(s)) for s in ss if (o := m.overhead_ms(s)) is not None and m.wall_ms(s) > 0]
    shares = [o / wall for o, wall in over]
    if shares and median(shares) > OVERHEAD_SHARE:
        out.append(
            Warning.of(
                Code.HIGH_OVERHEAD,
                w,
                f"{median(shares) * 100:.0f}% of the wall time, {median([o for o, _ in over]):.1f} ms",
            )
        )
    if m.source(ss) == "client":
        counted = sum(1 for s in ss if m.output_tokens(s) is not None and m.prompt_tokens(s) is not None)
        out.append(
            Warning.of(
                Code.CLIENT_FIGURES,
                w,
                f"{len(ss)} requests"
                + (
                    ""
                    if counted == len(ss)
                    else f"; {len(ss) - counted} without usage, whose token counts are unknown "
                    "and figures null: the server ignored stream_options.include_usage"
                ),
            )
        )
    return out


def bench_warnings(samples: Sequence[m.Sample]) -> list[Warning]:
    """Every warning a bench run's measured samples call for."""
    out: list[Warning] = []
    for w, ss in m.by_workload(samples).items():
        out += _workload_warnings(w, ss)
    for name, ms in m.bench_metrics(samples).items():
        out += _metric_warnings(name, ms)
    return out


# -- serving runs ---------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def queueing_signature(level: Mapping[str, Any], base: Mapping[str, Any]) -> str | None:
    """The numbers of queueing against a lower level (stored levels: :func:`_queueing`)."""
    return _queueing(LevelSummary.from_json(level), LevelSummary.from_json(base))


def _queueing(level: LevelSummary, base: LevelSummary) -> str | None:
    """The numbers of queueing against a lower level: TTFT up at least 2x, throughput about the
    same (not down by more than 20%, up by less than half the added concurrency), ITL within 20-25%."""
    c, c0 = level.concurrency, base.concurrency
    ttft = _ratio(level.ttft_ms.p50, base.ttft_ms.p50)
    tput = _ratio(level.output_tok_s, base.output_tok_s)
    itl = _ratio(level.itl_ms.p50, base.itl_ms.p50)
    if c <= c0 or ttft is None or tput is None or itl is None:
        return None
    if ttft >= 2 and 0.8 <= tput < 1 + 0.5 * (c / c0 - 1) and 0.8 <= itl <= 1.25:
        return (
            f"against c={c0}: TTFT x{ttft:.1f}, output tok/s x{tput:.2f}, ITL x{itl:.2f} "
            "(flat ITL with rising TTFT is queueing, not batching)"
        )
    return None


def level_warnings(
    level: Mapping[str, Any], *, slots: int | None, base: Mapping[str, Any] | None, prefix_cache: bool
) -> list[Warning]:
    """A stored level's warnings (``base``: the run's lowest level, to tell queueing from batching)."""
    return _level_warnings(
        LevelSummary.from_json(level),
        slots=slots,
        base=None if base is None else LevelSummary.from_json(base),
        prefix_cache=prefix_cache,
    )


def _level_warnings(
    level: LevelSummary, *, slots: int | None, base: LevelSummary | None, prefix_cache: bool
) -> list[Warning]:
    """A level's warnings in the order they are told: queueing, the client's own queue and latency
    outliers, failed and retried requests, then what its tokens say."""
    out = _queueing_warnings(level, slots=slots, base=base)
    out += [w for w in (_client_queue(level), _latency_outlier(level)) if w is not None]
    out += _failure_warnings(level)
    out += _token_warnings(level, prefix_cache=prefix_cache)
    return [replace(w, subject=f"c={level.concurrency}") for w in out]


def _queueing_warnings(level: LevelSummary, *, slots: int | None, base: LevelSummary | None) -> list[Warning]:
    """Requests waiting for a slot: more streams than slots, the queueing signature against the
    lowest level (``base``), or a long wait before the prompt where the slots are unknown."""
    out: list[Warning] = []
    c = level.concurrency
    signature = _queueing(level, base) if base is not None else None
    ttft, wait = level.ttft_ms.p50, level.server_wait_ms.p50
    evidence = f"TTFT p50 {ttft:.0f} ms" if ttft is not None else ""
    if evidence and wait is not None:
        evidence += f", of which {max(wait, 0):.0f} ms before the server started the prompt"
    remedy = (
        f"start llama-server with --parallel {c} and -c {c} x the per-slot context you need "
        f"(a plan: --match-slots), or keep --concurrency at or below the slot count"
    )
    if slots is not None and c <= slots:
        signature = None  # enough slots: whatever slowed the level, it was not slot queueing
    if slots is not None and c > slots:
        msg = (
            f"c={c} exceeds the server's {slots} slot{'s' if slots != 1 else ''}: {c - slots} request(s) at a "
            f"time wait in the server's queue, so TTFT includes queueing"
        )
        msg += f" (measured: {evidence}" + (f"; {signature})" if signature else ")") if evidence else ""
        out.append(Warning(code=Code.QUEUEING, message=msg, remedy=remedy))
    elif signature is not None:
        out.append(
            Warning(code=Code.QUEUEING, message=f"c={c} shows the queueing signature {signature}", remedy=remedy)
        )
    elif slots is None and wait is not None and ttft and wait > max(50.0, 0.5 * ttft):
        out.append(
            Warning(
                code=Code.QUEUEING,
                message=f"c={c}: requests queue in the server before their prompt is processed ({evidence})",
                remedy=remedy,
            )
        )
    return out


def _failure_warnings(level: LevelSummary) -> list[Warning]:
    """Failed requests (kept as samples, out of the latency figures) and requests sent again."""
    out: list[Warning] = []
    c = level.concurrency
    errors = dict(level.errors)
    if errors:
        n = sum(errors.values())
        kinds = ", ".join(f"{k} x{v}" for k, v in errors.items())
        out.append(
            Warning(
                code=Code.ERRORS,
                message=f"c={c}: {n} of {level.requests} requests failed ({kinds}); they are kept "
                "as samples and left out of the latency figures",
                remedy=_error_remedy(errors),
            )
        )
    if level.retries:
        out.append(
            Warning(
                code=Code.RETRIES,
                message=f"c={c}: {level.retries} request(s) were sent again on a new connection: "
                "the server closed a kept-alive connection as it was reused; none was lost",
                remedy="nothing to do (llama-server closes a connection after each streamed response, and "
                "idle ones after 5 s); TTFT counts from the attempt that was answered",
            )
        )
    return out


def _token_warnings(level: LevelSummary, *, prefix_cache: bool) -> list[Warning]:
    """What the level's tokens say: cache hits, reasoning, short outputs, unknown ITL or usage, prompt
    lengths counted otherwise than the server counts them."""
    out: list[Warning] = []
    c = level.concurrency
    if level.cached_tokens and not prefix_cache:
        out.append(
            Warning(
                code=Code.CACHE_HIT,
                message=f"c={c}: {level.cached_tokens} prompt tokens came from the server's prefix "
                "cache although every prompt was unique, so TTFT is lower than for a "
                "cold prompt",
                remedy="check the server honours cache_prompt=false",
            )
        )
    out_tok, reason = level.output_tokens, level.reasoning_tokens
    if out_tok and reason > 0.5 * out_tok:
        ttfc = level.ttfc_ms.p50
        out.append(
            Warning(
                code=Code.THINKING,
                message=f"c={c}: {100 * reason / out_tok:.0f}% of output tokens were reasoning; TTFT "
                "counts the first reasoning token"
                + (f", the first answer token came at {ttfc:.0f} ms (p50)" if ttfc else ""),
                remedy="pass --thinking off to measure answers only, or read ttfc_ms",
            )
        )
    if level.short_outputs:
        out.append(
            Warning(
                code=Code.SHORT_OUTPUT,
                message=f"c={c}: {level.short_outputs} request(s) produced fewer tokens than "
                "asked (a full slot context or a stop)",
                remedy="check prompt + output fits the per-slot context",
            )
        )
    ok = level.ok
    if level.itl_unknown:
        n = level.itl_unknown
        out.append(
            Warning(
                code=Code.ITL_UNKNOWN,
                message=f"c={c}: ITL is unknown for {n} of {ok} requests: the server streamed "
                "more tokens than chunks without saying how many each chunk carried, so "
                "itl_ms leaves them out"
                + (" and is null" if n == ok else "")
                + "; tpot_ms (from usage.completion_tokens) is their per-token figure",
                remedy="use a server that counts tokens per chunk: vLLM and SGLang honour "
                "stream_options.continuous_usage_stats (serve-bench asks for it), llama-server sends "
                "timings per token",
            )
        )
    if level.no_usage:
        out.append(
            Warning(
                code=Code.NO_USAGE,
                message=f"c={c}: {level.no_usage} of {ok} responses carried no usage, so their "
                "output tokens are counted as one per streamed chunk (an assumption)",
                remedy="use a server that honours stream_options.include_usage, or check the output lengths",
            )
        )
    predicted = level.prompt_token_error
    if predicted is not None:
        if predicted.mean_pct > PREDICTED_ERROR_PCT:
            out.append(
                Warning(
                    code=Code.PROMPT_MISMATCH,
                    message=f"c={c}: the prompt lengths --tokenizer predicted were off by "
                    f"{predicted.mean_pct:.1f}% on average (at most {predicted.max_pct:.1f}%, "
                    f"{predicted.mismatched} of {predicted.requests} requests) from the server's "
                    "usage.prompt_tokens; prompt_tokens_mean is the server's count",
                    remedy="give the served model's own tokenizer.json, or drop --tokenizer to fit prompts by probe requests",
                )
            )
    elif level.prompt_token_mismatches:
        out.append(
            Warning(
                code=Code.PROMPT_MISMATCH,
                message=f"c={c}: for {level.prompt_token_mismatches} request(s) the server "
                "counted a different prompt length than /tokenize gave",
                remedy="the chat template may depend on request fields; input lengths are approximate",
            )
        )
    return out


def over_capacity(level: LevelSummary) -> str | None:
    """The evidence that an open-loop level offered more requests than its streams complete: they
    finished clearly slower than they came due, or c / E2E p50 is below the rate."""
    rate, c = level.rate, level.concurrency
    if not rate:
        return None
    offered = level.offered_request_s or float(rate)
    done, e2e = level.completed_request_s, level.e2e_ms.p50
    capacity = c * 1000 / e2e if e2e else None
    evidence = []
    if done is not None and done < (1 - BEHIND_MARGIN) * offered:
        evidence.append(f"they came due at {offered:.3g}/s and finished at {done:.3g}/s")
    if capacity is not None and capacity < offered:
        evidence.append(f"{_streams(c)} at E2E p50 {e2e:.0f} ms complete about {capacity:.3g}/s")
    return "; ".join(evidence) or None


def _client_queue(level: LevelSummary) -> Warning | None:
    c, sw = level.concurrency, level.slot_wait_ms.p90
    if not level.rate or sw is None or sw <= CLIENT_WAIT_MS:
        return None
    evidence, e2e = over_capacity(level), level.e2e_ms.p50
    if evidence is not None:
        return Warning(
            code=Code.CLIENT_QUEUE,
            message=f"c={c}: the offered rate {level.rate}/s is more than {_streams(c)} "
            f"complete ({evidence}): requests waited for a client slot (p90 {sw:.0f} ms), and "
            "latency_ms includes this queue",
            remedy="lower --rate or raise --concurrency",
        )
    if e2e is not None and sw > max(BURST_WAIT_FACTOR * e2e, BURST_WAIT_MS):  # enough streams, arrivals bunch up
        return Warning(
            code=Code.CLIENT_QUEUE,
            message=f"c={c}: requests waited for a client slot in bursts (p90 {sw:.0f} ms, "
            f"{sw / e2e:.1f}x what a request takes, E2E p50 {e2e:.0f} ms), although {_streams(c)} keep up with "
            f"{level.rate}/s on average; latency_ms includes this queue",
            remedy="raise --concurrency to absorb bursts, or use --arrivals constant",
        )
    return None


def _latency_outlier(level: LevelSummary) -> Warning | None:
    c, sl, e2e = level.concurrency, level.slowest, level.e2e_ms.p50
    if sl is None or not sl.outliers or e2e is None:
        return None
    n, worst, ttft = sl.outliers, float(sl.e2e_ms), sl.ttft_ms
    tokens, typical = sl.output_tokens, sl.median_output_tokens
    msg = (
        f"c={c}: {n} of {level.ok} requests took {SLOW_FACTOR:g}x the E2E p50 or "
        f"more: the slowest {_secs(worst)} against {_secs(e2e)} (request {sl.index}, TTFT "
        f"{_secs(ttft) if ttft is not None else '?'}, {tokens} output tokens against {typical:g} on median); the "
        "mean and the tail percentiles carry it"
    )
    if tokens and typical and tokens > 3 * typical:
        remedy = (
            "it generated far more tokens than the others: fix the output length (--output-len, with "
            "ignore_eos) to compare latencies"
        )
    elif ttft is not None and ttft > 0.5 * worst:
        remedy = (
            "it waited before its first token: read the server's log at that time (another client, a "
            "prompt-cache restore, swapping, a reload) and run the level again"
        )
    else:
        remedy = (
            "it stalled while generating: read the server's log at that time (swapping, another client, a "
            "GPU or network fault) and run the level again"
        )
    return Warning(code=Code.LATENCY_OUTLIER, message=msg, remedy=remedy)


def _streams(c: int) -> str:
    return f"{c} stream{'s' if c != 1 else ''}"


def _secs(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.0f} ms"


def _error_remedy(errors: dict[str, int]) -> str:
    kinds = " ".join(errors)
    if "exceed_context" in kinds:
        return "shorten --input-len/--output-len, or raise the per-slot context (-c = slots x context)"
    if "timeout" in kinds:
        return "raise --timeout, or lower the load"
    if "http_5" in kinds:
        return "read the server's log"
    if "after_retries" in kinds or "connect" in kinds or "reset" in kinds or "truncated" in kinds:
        return "the server dropped connections: read its log (a crash, or too few --threads-http)"
    return "read the error details in the stored samples (moetune serve-report RUN --json)"


def run_warnings(
    server: ServerInfo, concurrency: list[int], skipped_overlong: int, *, tokenizer: Mapping[str, object] | None = None
) -> list[Warning]:
    """The warnings about the server as the run found it; ``tokenizer`` is what serve-bench
    ``--tokenizer`` measured (:meth:`moetune.bench.serve.tokenizer.TokenizerCounter.describe`)."""
    out: list[Warning] = []
    if server.slots is None:
        out.append(
            Warning(
                code=Code.NO_SLOT_INFO,
                message="the server does not report its slots (/props): queueing can only be recognised from the numbers",
                remedy="run against llama-server, or compare levels with the same slot count",
            )
        )
    if not server.caps.timings:
        out.append(
            Warning(
                code=Code.NO_SERVER_TIMINGS,
                message="the server sends no llama.cpp timings: server_itl_ms and "
                "server_wait_ms are null (queueing in the server cannot be told "
                "from its prompt processing), and TTFT, ITL and TPOT are the "
                "client's clock only",
                remedy="compare these runs with runs against the same kind of server; llama-server gives the "
                "server's side too",
            )
        )
    tk = tokenizer or {}
    check = number(tk.get("check_error_pct"))
    if check is not None and check > PREDICTED_ERROR_PCT:
        out.append(
            Warning(
                code=Code.PROMPT_MISMATCH,
                message=f"--tokenizer predicted a probe prompt of {tk['check_tokens']} "
                f"tokens (by the server's usage.prompt_tokens) as {tk['check_predicted']}, "
                f"{check:.1f}% off: it is likely not the served model's tokenizer",
                remedy="give the served model's own tokenizer.json, or drop --tokenizer to fit prompts by probe requests",
            )
        )
    if not server.caps.exact_prompts and tokenizer is None:
        out.append(
            Warning(
                code=Code.NO_TOKENIZER,
                message="the server has no /tokenize and /apply-template: prompts are not "
                "counted before sending (synthetic ones are fitted to --input-len on "
                "one probe prompt, by the usage.prompt_tokens of requests for one "
                "token), and each request's length is the server's usage.prompt_tokens "
                "(prompt_tokens_mean)",
                remedy="read prompt_tokens_mean for the lengths sent; for lengths counted before sending, "
                "give the served model's tokenizer.json with --tokenizer, or benchmark llama-server",
            )
        )
    busy = server.busy_slots
    if busy:
        out.append(
            Warning(
                code=Code.SERVER_BUSY,
                message=f"{busy} server slot(s) were busy when the benchmark started: another client shares the server",
                remedy="stop other clients for clean numbers",
            )
        )
    if skipped_overlong:
        out.append(
            Warning(
                code=Code.SKIPPED,
                message=f"{skipped_overlong} dataset prompt(s) were skipped: prompt + output is longer "
                f"than the per-slot context ({server.n_ctx_slot} tokens)",
                remedy="raise the server's context per slot to include them",
            )
        )
    return [replace(w, subject="server") for w in out]


def annotate(
    levels: Sequence[MutableMapping[str, object]], *, slots: int | None, prefix_cache: bool
) -> list[list[Warning]]:
    """Fill each level's ``warnings`` (message strings), ``notes`` and ``advice``; return the advice."""
    figures = [LevelSummary.from_json(lv) for lv in levels]
    base = min(range(len(levels)), key=lambda i: figures[i].concurrency, default=None)
    out = []
    for i, (lv, f) in enumerate(zip(levels, figures, strict=True)):
        server = mapping(lv.get("server"))  # a plan relaunched per level: its own slots
        lv_slots = optional_integer(server["slots"]) if "slots" in server else slots
        low = figures[base] if base is not None and base != i else None
        adv = _level_warnings(f, slots=lv_slots, base=low, prefix_cache=prefix_cache)
        lv["warnings"] = [a.message for a in adv if not a.is_note]
        lv["notes"] = [a.message for a in adv if a.is_note]
        lv["advice"] = [a.to_json() for a in adv]
        out.append(adv)
    return out
