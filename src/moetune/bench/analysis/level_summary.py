"""One serve-bench load level's figures as a typed document (:class:`LevelSummary`).

:func:`moetune.bench.analysis.serve.summarize_level` builds it from raw samples; modules read its
attributes; :meth:`LevelSummary.to_json` gives the dict ``serve-bench --json`` prints and a run's
stored summary keeps (one key order, unchanged since the dict era), and
:meth:`LevelSummary.from_json` is the one reader of a stored one. Stored summaries are not
versioned apart: the reader takes every shape written so far (a key a summary of an older
moetune lacks reads as its empty value), and the stored form is exactly what ``to_json`` gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from moetune.jsonread import integer as _i
from moetune.jsonread import mapping as _m
from moetune.jsonread import number as _f


def _floats(x: object) -> dict[str, float]:
    return {str(k): f for k, v in _m(x).items() if (f := _f(v)) is not None}


def _ints(x: object) -> dict[str, int]:
    return {str(k): _i(v) for k, v in _m(x).items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Percentiles:
    """p50, p90, p99 and the mean of one figure over a level's requests, in ms (None: no value)."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean}

    @classmethod
    def from_json(cls, d: object) -> Percentiles:
        d = _m(d)
        return cls(p50=_f(d.get("p50")), p90=_f(d.get("p90")), p99=_f(d.get("p99")), mean=_f(d.get("mean")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Slowest:
    """The successful request that took longest end to end, and how many were outliers."""

    index: int | None
    e2e_ms: float
    outliers: int
    ttft_ms: float | None
    output_tokens: int
    median_output_tokens: float

    def to_json(self) -> dict[str, object]:
        return {
            "index": self.index,
            "e2e_ms": self.e2e_ms,
            "outliers": self.outliers,
            "ttft_ms": self.ttft_ms,
            "output_tokens": self.output_tokens,
            "median_output_tokens": self.median_output_tokens,
        }

    @classmethod
    def from_json(cls, d: object) -> Slowest | None:
        if not isinstance(d, Mapping):
            return None
        index = d.get("index")
        return cls(
            index=index if isinstance(index, int) else None,
            e2e_ms=_f(d.get("e2e_ms")) or 0.0,
            outliers=_i(d.get("outliers")),
            ttft_ms=_f(d.get("ttft_ms")),
            output_tokens=_i(d.get("output_tokens")),
            median_output_tokens=_f(d.get("median_output_tokens")) or 0.0,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptTokenError:
    """How far a local tokenizer's predicted prompt lengths were from the server's counts (%)."""

    requests: int
    mismatched: int
    mean_pct: float
    max_pct: float
    bias_pct: float

    def to_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "mismatched": self.mismatched,
            "mean_pct": self.mean_pct,
            "max_pct": self.max_pct,
            "bias_pct": self.bias_pct,
        }

    @classmethod
    def from_json(cls, d: object) -> PromptTokenError | None:
        if not isinstance(d, Mapping):
            return None
        return cls(
            requests=_i(d.get("requests")),
            mismatched=_i(d.get("mismatched")),
            mean_pct=_f(d.get("mean_pct")) or 0.0,
            max_pct=_f(d.get("max_pct")) or 0.0,
            bias_pct=_f(d.get("bias_pct")) or 0.0,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelGoodput:
    """A level's goodput (:func:`moetune.bench.analysis.slo.goodput`): ``share`` (met / of),
    ``req_s`` (met / span), the targets, and per target how many successful requests missed it."""

    share: float | None
    req_s: float | None
    slo: Mapping[str, float]
    met: int
    of: int
    missed: Mapping[str, int]
    failed: int
    unknown: int

    def to_json(self) -> dict[str, object]:
        return {
            "share": self.share,
            "req_s": self.req_s,
            "slo": dict(self.slo),
            "met": self.met,
            "of": self.of,
            "missed": dict(self.missed),
            "failed": self.failed,
            "unknown": self.unknown,
        }

    @classmethod
    def from_json(cls, d: object) -> LevelGoodput | None:
        if not isinstance(d, Mapping):
            return None
        return cls(
            share=_f(d.get("share")),
            req_s=_f(d.get("req_s")),
            slo=_floats(d.get("slo")),
            met=_i(d.get("met")),
            of=_i(d.get("of")),
            missed=_ints(d.get("missed")),
            failed=_i(d.get("failed")),
            unknown=_i(d.get("unknown")),
        )


_NONE = Percentiles()


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelSummary:
    """One load level's figures (:func:`moetune.bench.analysis.serve.summarize_level` says what each
    means). ``service`` and ``load``: the level's service and whether the others were loaded, in a
    layout run (None in a run of one server). ``warnings``: the level's warning messages, which
    :func:`moetune.bench.analysis.warnings.annotate` fills in the document (empty here)."""

    service: str | None = None
    load: str | None = None
    concurrency: int
    rate: float | None = None
    requests: int = 0
    ok: int = 0
    errors: Mapping[str, int] = field(default_factory=dict)
    duration_s: float | None = None
    ttft_ms: Percentiles = _NONE
    ttfc_ms: Percentiles = _NONE
    itl_ms: Percentiles = _NONE
    server_itl_ms: Percentiles = _NONE
    tpot_ms: Percentiles = _NONE
    e2e_ms: Percentiles = _NONE
    latency_ms: Percentiles = _NONE
    slot_wait_ms: Percentiles = _NONE
    server_wait_ms: Percentiles = _NONE
    output_tokens: int = 0
    reasoning_tokens: int = 0
    output_tok_s: float | None = None
    request_s: float | None = None
    goodput: LevelGoodput | None = None
    offered_request_s: float | None = None
    completed_request_s: float | None = None
    slowest: Slowest | None = None
    prompt_tokens_mean: float | None = None
    prompt_token_mismatches: int = 0
    prompt_token_error: PromptTokenError | None = None
    itl_unknown: int = 0
    no_usage: int = 0
    cached_tokens: int = 0
    short_outputs: int = 0
    retries: int = 0
    warnings: tuple[str, ...] = ()

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def to_json(self) -> dict[str, object]:
        """The level as ``serve-bench --json`` prints it and a run's summary stores it."""
        return {
            **({"service": self.service, "load": self.load} if self.service else {}),
            "concurrency": self.concurrency,
            "rate": self.rate,
            "requests": self.requests,
            "ok": self.ok,
            "errors": dict(self.errors),
            "duration_s": self.duration_s,
            "ttft_ms": self.ttft_ms.to_json(),
            "ttfc_ms": self.ttfc_ms.to_json(),
            "itl_ms": self.itl_ms.to_json(),
            "server_itl_ms": self.server_itl_ms.to_json(),
            "tpot_ms": self.tpot_ms.to_json(),
            "e2e_ms": self.e2e_ms.to_json(),
            "latency_ms": self.latency_ms.to_json(),
            "slot_wait_ms": self.slot_wait_ms.to_json(),
            "server_wait_ms": self.server_wait_ms.to_json(),
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "output_tok_s": self.output_tok_s,
            "request_s": self.request_s,
            "goodput": None if self.goodput is None else self.goodput.to_json(),
            "offered_request_s": self.offered_request_s,
            "completed_request_s": self.completed_request_s,
            "slowest": None if self.slowest is None else self.slowest.to_json(),
            "prompt_tokens_mean": self.prompt_tokens_mean,
            "prompt_token_mismatches": self.prompt_token_mismatches,
            "prompt_token_error": None if self.prompt_token_error is None else self.prompt_token_error.to_json(),
            "itl_unknown": self.itl_unknown,
            "no_usage": self.no_usage,
            "cached_tokens": self.cached_tokens,
            "short_outputs": self.short_outputs,
            "retries": self.retries,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> LevelSummary:
        """A stored level (:meth:`to_json`, or what an older moetune stored: keys it lacks read as
        their empty value); keys beside the figures (``server``, ``notes``, ``advice``) are left."""
        service = d.get("service")
        load = d.get("load")
        return cls(
            service=service if isinstance(service, str) else None,
            load=load if isinstance(load, str) else None,
            concurrency=_i(d.get("concurrency")),
            rate=_f(d.get("rate")),
            requests=_i(d.get("requests")),
            ok=_i(d.get("ok")),
            errors=_ints(d.get("errors")),
            duration_s=_f(d.get("duration_s")),
            ttft_ms=Percentiles.from_json(d.get("ttft_ms")),
            ttfc_ms=Percentiles.from_json(d.get("ttfc_ms")),
            itl_ms=Percentiles.from_json(d.get("itl_ms")),
            server_itl_ms=Percentiles.from_json(d.get("server_itl_ms")),
            tpot_ms=Percentiles.from_json(d.get("tpot_ms")),
            e2e_ms=Percentiles.from_json(d.get("e2e_ms")),
            latency_ms=Percentiles.from_json(d.get("latency_ms")),
            slot_wait_ms=Percentiles.from_json(d.get("slot_wait_ms")),
            server_wait_ms=Percentiles.from_json(d.get("server_wait_ms")),
            output_tokens=_i(d.get("output_tokens")),
            reasoning_tokens=_i(d.get("reasoning_tokens")),
            output_tok_s=_f(d.get("output_tok_s")),
            request_s=_f(d.get("request_s")),
            goodput=LevelGoodput.from_json(d.get("goodput")),
            offered_request_s=_f(d.get("offered_request_s")),
            completed_request_s=_f(d.get("completed_request_s")),
            slowest=Slowest.from_json(d.get("slowest")),
            prompt_tokens_mean=_f(d.get("prompt_tokens_mean")),
            prompt_token_mismatches=_i(d.get("prompt_token_mismatches")),
            prompt_token_error=PromptTokenError.from_json(d.get("prompt_token_error")),
            itl_unknown=_i(d.get("itl_unknown")),
            no_usage=_i(d.get("no_usage")),
            cached_tokens=_i(d.get("cached_tokens")),
            short_outputs=_i(d.get("short_outputs")),
            retries=_i(d.get("retries")),
            warnings=tuple(str(w) for w in warnings) if isinstance(warnings := d.get("warnings"), list | tuple) else (),
        )
