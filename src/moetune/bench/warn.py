"""Warnings about a benchmark's trustworthiness, each with its remedy (as hyperfine gives them).

Pure: they are read off the raw samples and the derived metrics, so `results show` gives the
same warnings as the run did.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from moetune.bench import metrics as m
from moetune.bench.stats import MetricSamples, cv, first_run_slower, median, outliers

NOISY_CV = 0.10
THINKING_SHARE = 0.5
OVERHEAD_SHARE = 0.25
SHORT_OUTPUT = 32
MIN_DEVIATION = 0.05  # an outlier (or a slow first run) must also be this far from the median to matter
MIN_OUTLIER_N = 5  # below this many runs, "outliers" says little


class Code(Enum):
    FIRST_RUN_SLOWER = ("the first measured run was slower than the rest: caches or the server were still "
                        "warming up", "use more warm-up runs (--warmup 2 or more)")
    OUTLIERS = ("statistical outliers were detected",
                "re-run on a quiet machine: stop other programs and servers, and pin the threads")
    NOISY = ("the runs vary a lot", "quiet the machine, or raise --repeats so that the interval narrows")
    FEW_SAMPLES = ("fewer than three measured runs: the interval is wide or absent", "use --repeats 5 or more")
    CACHE_HIT = ("the server reused cached prompt tokens where none were wanted, so PP was measured on part "
                 "of the prompt", "leave --cache-bust on, and make sure no other client uses the server")
    CACHE_MISS = ("the server's cache did not hold the context the depth test filled",
                  "free slot 0 (other clients evict it), or run the server with --parallel 1 and a context of at "
                  "least depth + pp + tg tokens")
    CACHE_UNKNOWN = ("the server reports no cached-token count, so the cache state is unconfirmed",
                     "use a llama.cpp build whose timings carry cache_n, or check prompt_n by hand")
    THINKING_DOMINATES = ("thinking tokens dominate the output: the answer took a fraction of the time",
                          "compare thinking-on runs only with thinking-on runs; turn it off with --thinking off "
                          "where the answer is what matters")
    SHORT_OUTPUT = ("the model stopped early: TG from so few tokens is imprecise",
                    "use --ignore-eos --max-tokens N for exact output lengths")
    HIGH_OVERHEAD = ("the client's overhead is a large share of each request, so client-side figures differ "
                     "from the server's", "trust the server's timings (the primary figures); use longer outputs")

    @property
    def text(self) -> str:
        return self.value[0]

    @property
    def remedy(self) -> str:
        return self.value[1]


@dataclass(frozen=True, slots=True)
class BenchWarning:
    code: Code
    subject: str  # the metric or workload it is about
    detail: str

    @property
    def message(self) -> str:
        return f"{self.subject}: {self.code.text} ({self.detail})"

    def to_json(self) -> dict[str, str]:
        return {"code": self.code.name.lower(), "subject": self.subject, "detail": self.detail,
                "message": self.message, "remedy": self.code.remedy}


def grouped(warnings: list[dict[str, str]]) -> list[tuple[str, str]]:
    """(message, remedy) per kind of warning, its subjects listed together: what a person reads."""
    by: dict[str, list[dict[str, str]]] = {}
    for w in warnings:
        by.setdefault(w["code"], []).append(w)
    out = []
    for code, ws in by.items():
        c = Code[code.upper()]
        out.append((f"{c.text}: " + ", ".join(f"{w['subject']} ({w['detail']})" for w in ws), c.remedy))
    return out


def _metric_warnings(name: str, ms: MetricSamples) -> list[BenchWarning]:
    xs = list(ms.values)
    out: list[BenchWarning] = []
    if len(xs) < 3:
        out.append(BenchWarning(Code.FEW_SAMPLES, name, f"n={len(xs)}"))
        return out
    med = median(xs)
    first = (first_run_slower(xs, higher_is_better=ms.higher_is_better)
             and abs(xs[0] - median(xs[1:])) >= MIN_DEVIATION * abs(median(xs[1:])))
    if first:
        out.append(BenchWarning(Code.FIRST_RUN_SLOWER, name,
                                f"{xs[0]:.4g} vs median {median(xs[1:]):.4g} {ms.unit}"))
    outs = [i for i in outliers(xs) if not (first and i == 0) and abs(xs[i] - med) >= MIN_DEVIATION * abs(med)]
    if outs and len(xs) >= MIN_OUTLIER_N:
        out.append(BenchWarning(Code.OUTLIERS, name, f"{len(outs)} of {len(xs)} runs"))
    c = cv(xs[1:] if first else xs)  # the slow first run is its own warning
    if c > NOISY_CV:
        out.append(BenchWarning(Code.NOISY, name, f"CV {c * 100:.0f}%"))
    return out


def _workload_warnings(w: str, ss: list[dict[str, Any]]) -> list[BenchWarning]:
    out: list[BenchWarning] = []
    expected = [s for s in ss if s.get("expect_cached") is not None]
    if expected:
        conf = [(s, m.cache_confirmed(s)) for s in expected]
        if all(c is None for _, c in conf):
            out.append(BenchWarning(Code.CACHE_UNKNOWN, w, f"{len(expected)} requests"))
        bad = [s for s, c in conf if c is False]
        hits = [s for s in bad if (m.cached_tokens(s) or 0) > int(s["expect_cached"])]
        misses = [s for s in bad if s not in hits]
        if hits:
            out.append(BenchWarning(Code.CACHE_HIT, w, f"{len(hits)} of {len(ss)} requests; e.g. "
                                    f"{m.cached_tokens(hits[0])} cached, {hits[0]['expect_cached']} expected"))
        if misses:
            s = misses[0]
            out.append(BenchWarning(Code.CACHE_MISS, w, f"{len(misses)} of {len(ss)} requests; e.g. "
                                    f"{m.cached_tokens(s)} cached and prompt_n {m.timings(s).get('prompt_n')}, "
                                    f"{s['expect_cached']} and {s.get('expect_prompt_n')} expected"))
    thinking = [m.reasoning_share(s) for s in ss if s.get("thinking")]
    if thinking and median(thinking) > THINKING_SHARE:
        out.append(BenchWarning(Code.THINKING_DOMINATES, w, f"{median(thinking) * 100:.0f}% of streamed chunks"))
    if not ss[0].get("ignore_eos"):
        n = [int(m.timings(s).get("predicted_n") or 0) for s in ss]
        if n and median(n) < SHORT_OUTPUT:
            out.append(BenchWarning(Code.SHORT_OUTPUT, w, f"{median(n):.0f} tokens on median"))
    shares = [m.overhead_ms(s) / m.wall_ms(s) for s in ss if m.wall_ms(s) > 0]
    if shares and median(shares) > OVERHEAD_SHARE:
        out.append(BenchWarning(Code.HIGH_OVERHEAD, w, f"{median(shares) * 100:.0f}% of the wall time, "
                                f"{median([m.overhead_ms(s) for s in ss]):.1f} ms"))
    return out


def bench_warnings(samples: list[dict[str, Any]]) -> list[BenchWarning]:
    """Every warning a bench run's measured samples call for."""
    out: list[BenchWarning] = []
    for w, ss in m.by_workload(samples).items():
        out += _workload_warnings(w, ss)
    for name, ms in m.bench_metrics(samples).items():
        out += _metric_warnings(name, ms)
    return out
