"""`tune --layout FILE --service NAME --objective weighted:SERVICE=METRIC:WEIGHT,...`: several
services' figures weighed into one score (pure: the spec's text, raw samples in; scores out).

Every candidate of the tuned service is launched inside the layout and measured by the under-load
path (:mod:`moetune.tune.under_load`): the tuned service's single stream and every ``--with-load``
service's own workload at the same time. Each term is one service's figure under that shared load:

- the tuned service: ``tg`` (decode tokens/s, 1 / TPOT), ``pp`` (prompt tokens over the time to the
  first token), and its requests' ``ttft``, ``itl``, ``tpot``;
- a ``--with-load`` service: ``goodput`` (requests/s meeting ``--slo``, serve-bench's rule),
  ``throughput`` (alias ``tok_s``: output tokens/s over the level's span), ``ttft``, ``itl``,
  ``tpot``.

A per-request figure is the median over the service's requests (``itl``: each request's mean gap,
as `compare` and the contention rows read it); ``goodput`` and ``throughput`` are the shared
level's own figures (serve-bench's ``goodput.req_s`` and ``output_tok_s``).

The score is relative to a reference, the baseline (the first candidate measured where the
baseline could not be): ``sum(weight * figure / figure_of_the_baseline)`` for the higher-is-better
figures (tg, pp, goodput, throughput), ``weight * figure_of_the_baseline / figure`` for the
latencies (ttft, itl, tpot), so the baseline scores the sum of the weights and 1.1 x that is 10%
better overall. A baseline goodput of zero (no request met the targets) counts as the least a
level can tell from none, half a request over its span.

What the search ranks and `compare`'s rule judges are samples of the score: each term's spread
(its requests' values, or for goodput and throughput its completion windows,
:func:`moetune.tune.goodput.window_rates`), normalised as the term is and read at the same
quantiles for every term; at each quantile the terms' deviations from their medians add in
quadrature (as the spreads of independent terms add), around the score: the samples' median is
the score, and a term with one value (one window) adds no spread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from moetune.bench.analysis.serve import LOAD, SERVICE, SHARED, level_summary, request_figures, request_metrics
from moetune.errors import InputError

PREFIX = "weighted:"
EXAMPLE = "weighted:main=tg:1,worker0=goodput:0.5"


@dataclass(frozen=True, slots=True, kw_only=True)
class Metric:
    unit: str
    higher: bool  # higher is better (else it enters the score inverted: baseline / value)
    tuned: bool  # a figure of the tuned service
    loaded: bool  # a figure of a --with-load service
    family: str | None  # its per-request family (request_figures), None for a level's figure
    text: str


METRICS: dict[str, Metric] = {
    "tg": Metric(unit="tok/s", higher=True, tuned=True, loaded=False, family="decode", text="decode tokens/s"),
    "pp": Metric(unit="tok/s", higher=True, tuned=True, loaded=False, family="prefill", text="prompt tokens/s"),
    "ttft": Metric(unit="ms", higher=False, tuned=True, loaded=True, family="ttft", text="time to first token"),
    "itl": Metric(unit="ms", higher=False, tuned=True, loaded=True, family="itl", text="inter-token latency"),
    "tpot": Metric(unit="ms", higher=False, tuned=True, loaded=True, family="tpot", text="time per output token"),
    "goodput": Metric(
        unit="req/s", higher=True, tuned=False, loaded=True, family=None, text="requests/s meeting --slo"
    ),
    "throughput": Metric(unit="tok/s", higher=True, tuned=False, loaded=True, family=None, text="output tokens/s"),
}
ALIASES = {"tok_s": "throughput"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Term:
    service: str
    metric: str
    weight: float

    @property
    def name(self) -> str:
        return f"{self.service}.{self.metric}"

    @property
    def higher(self) -> bool:
        return METRICS[self.metric].higher

    @property
    def unit(self) -> str:
        return METRICS[self.metric].unit


@dataclass(frozen=True, slots=True, kw_only=True)
class Weighted:
    """The parsed spec; ``slo``: the latency targets its goodput terms count requests by."""

    terms: tuple[Term, ...]
    text: str
    slo: tuple[tuple[str, float], ...] = ()

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.service for t in self.terms))

    def to_json(self) -> dict[str, object]:
        return {
            "text": self.text,
            "terms": [
                {"service": t.service, "metric": t.metric, "weight": t.weight, "unit": t.unit} for t in self.terms
            ],
            "slo": dict(self.slo) or None,
            "relative_to": "baseline",
        }


def _metric_list() -> str:
    return ", ".join([*METRICS, *ALIASES])


def parse(text: str) -> Weighted:
    """``weighted:SERVICE=METRIC[:WEIGHT],...`` (a weight left out is 1); every problem an
    InputError that names the term and the fix."""
    t = text.strip()
    where = f"--objective {t}"
    body = t.removeprefix(PREFIX).strip() if t.startswith(PREFIX) else None
    if not body:
        raise InputError(
            f"{where}: give the terms, SERVICE=METRIC:WEIGHT separated by commas",
            hint=f"e.g. --objective {EXAMPLE}",
        )
    terms: list[Term] = []
    for part in (p.strip() for p in body.split(",")):
        if not part:
            continue
        service, eq, rest = (x.strip() for x in part.partition("="))
        if not eq or not service or not rest:
            raise InputError(f"{where}: {part!r} is not SERVICE=METRIC:WEIGHT", hint=f"e.g. --objective {EXAMPLE}")
        raw_metric, colon, raw_weight = (x.strip() for x in rest.partition(":"))
        metric = ALIASES.get(raw_metric, raw_metric)
        if metric not in METRICS:
            raise InputError(f"{where}: {part!r}: unknown metric {raw_metric!r}", hint=f"metrics: {_metric_list()}")
        weight = 1.0
        if colon:
            try:
                weight = float(raw_weight)
            except ValueError:
                weight = math.nan
            if not math.isfinite(weight) or weight <= 0:
                raise InputError(
                    f"{where}: {part!r}: the weight {raw_weight!r} is not a positive number",
                    hint=f"give {service}={metric}:W with W > 0 (a weight of 1 can be left out); drop a term to weigh it 0",
                )
        if any(x.service == service and x.metric == metric for x in terms):
            raise InputError(f"{where}: {service}={metric} is given twice", hint="give each term once")
        terms.append(Term(service=service, metric=metric, weight=weight))
    if not terms:
        raise InputError(f"{where}: no terms given", hint=f"e.g. --objective {EXAMPLE}")
    return Weighted(terms=tuple(terms), text=t)


def check(
    w: Weighted,
    *,
    tuned: str | None,
    loaded: Sequence[str],
    services: Sequence[str] | None,
) -> None:
    """The spec against the search: a layout (``services``, None without --layout), the tuned
    service, the ``--with-load`` ones (``loaded``), and --slo for goodput."""
    where = f"--objective {w.text}"
    if services is None or tuned is None:
        raise InputError(
            f"{where}: weighs services of a layout measured at the same time",
            hint="give --layout FILE --service NAME (and --with-load OTHER=SPEC for the others)",
        )
    for t in w.terms:
        m = METRICS[t.metric]
        if t.service not in services:
            raise InputError(
                f"{where}: {t.service} is no service of the layout (services: {', '.join(services)})",
                hint=f"name one of them, e.g. {services[0]}={t.metric}:{t.weight:g}",
            )
        if t.service == tuned:
            if not m.tuned:
                raise InputError(
                    f"{where}: {t.service}={t.metric}: {t.service} is the service tuned, measured by one stream; "
                    f"{t.metric} is a figure of a loaded service",
                    hint=f"weigh its tg, pp, ttft, itl or tpot (e.g. {t.service}=tg:{t.weight:g})",
                )
        elif t.service not in loaded:
            raise InputError(
                f"{where}: {t.service} has no --with-load spec and is not the service tuned ({tuned}): "
                "it would stand idle, with no figure to weigh",
                hint=f"add --with-load {t.service}=SPEC (e.g. {t.service}=c:2,requests:8,prompt:256,output:64)",
            )
        elif not m.loaded:
            raise InputError(
                f"{where}: {t.service}={t.metric}: {t.metric} is the tuned service's ({tuned}) single-stream figure",
                hint=f"weigh {t.service}'s goodput, throughput, ttft, itl or tpot",
            )
        if t.metric == "goodput" and not w.slo:
            raise InputError(
                f"{where}: {t.service}=goodput counts the requests that meet latency targets: give --slo",
                hint="--slo ttft_ms=500,itl_ms=100",
            )
    if w.slo and not any(t.metric == "goodput" for t in w.terms):
        raise InputError(
            f"--slo: only a goodput term counts requests by latency targets, and {w.text} has none",
            hint="drop --slo, or weigh a loaded service's goodput (e.g. worker0=goodput:0.5)",
        )


# ---- a candidate's figures, from its run's raw samples ------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """One term's figure of one run, and the values its spread is read from."""

    value: float | None  # None: the service had no successful request
    spread: tuple[float, ...] = ()
    floor: float = 0.0  # the least goodput a level tells from none (half a request over its span)
    n: int = 0  # the requests it was measured from


def figures(samples: Sequence[Mapping[str, Any]], w: Weighted, concurrency: Mapping[str, int]) -> dict[Term, Figure]:
    """Each term's figure under the shared load from a candidate's raw (measured) samples;
    ``concurrency``: each loaded service's streams (its completion windows)."""
    from moetune.tune.goodput import window_rates

    by: dict[str, list[dict[str, object]]] = {}
    for s in samples:
        if s.get(LOAD) == SHARED and s.get(SERVICE) in w.services:
            by.setdefault(str(s[SERVICE]), []).append(dict(s))
    slo = dict(w.slo)
    out: dict[Term, Figure] = {}
    for t in w.terms:
        mine = by.get(t.service, [])
        fam = METRICS[t.metric].family
        if fam is not None:
            vals = [v for s in mine if (f := request_figures(request_metrics(s))) and (v := f.families().get(fam))]
            out[t] = Figure(value=float(np.median(vals)) if vals else None, spread=tuple(vals), n=len(vals))
            continue
        level = level_summary(mine, slo or None) if mine else None
        c = concurrency.get(t.service, 1)
        span = None if level is None else level.duration_s
        ok = level is not None and level.ok > 0
        if t.metric == "goodput":
            value = level.goodput.req_s if ok and level is not None and level.goodput is not None else None
            good = window_rates(mine, c, lambda m: float(_met(m, slo)))
            out[t] = Figure(value=value, spread=tuple(good), floor=0.5 / span if span else 0.0, n=len(mine))
        else:
            value = level.output_tok_s if ok and level is not None else None
            toks = window_rates(mine, c, lambda m: float(m.output_tokens) if m.ok else 0.0)
            out[t] = Figure(value=value, spread=tuple(toks), n=len(mine))
    return out


def _met(m: Any, slo: Mapping[str, float]) -> bool:
    from moetune.bench.analysis.slo import goodput

    return bool(goodput([m], slo, None).met == 1)


# ---- the score -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    """One term of a candidate's score."""

    term: Term
    value: float | None
    reference: float | None  # the baseline's figure (goodput: at least its floor)
    ratio: float | None  # value / reference (latencies: reference / value)
    contribution: float | None  # weight x ratio

    def to_json(self) -> dict[str, object]:
        t = self.term
        return {
            "service": t.service,
            "metric": t.metric,
            "weight": t.weight,
            "unit": t.unit,
            "higher_is_better": t.higher,
            "value": self.value,
            "baseline": self.reference,
            "ratio": self.ratio,
            "contribution": self.contribution,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Score:
    parts: tuple[Part, ...]
    total: float | None  # None: a term has no figure (the problem says which)
    samples: tuple[float, ...] = ()  # what the search ranks: the score's spread, centred on it
    reference: int | None = None  # the candidate it is relative to
    problem: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "score": self.total,
            "terms": [p.to_json() for p in self.parts],
            "samples": list(self.samples),
            "relative_to": self.reference,
            "problem": self.problem,
        }


def _ratio(t: Term, value: float, ref: float) -> float:
    if t.higher:
        return value / ref
    return ref / value if value > 0 else 0.0


def _base(t: Term, f: Figure | None) -> float | None:
    """What a reference's figure counts as (goodput: at least its floor); None where it has none."""
    if f is None or f.value is None:
        return None
    v = max(f.value, f.floor) if t.metric == "goodput" else f.value
    return v if v > 0 else None


def reference_of(figs: Mapping[int, Mapping[Term, Figure]]) -> int | None:
    """The candidate the scores are relative to: the baseline (index 0), else the first measured
    whose every term has a figure to be relative to."""
    return next((i for i in sorted(figs) if all(_base(t, f) is not None for t, f in figs[i].items())), None)


def score(w: Weighted, figs: Mapping[Term, Figure], ref: Mapping[Term, Figure], reference: int | None = None) -> Score:
    """One candidate's score against the reference's figures (module docstring)."""
    parts: list[Part] = []
    problems: list[str] = []
    for t in w.terms:
        f, base = figs.get(t), _base(t, ref.get(t))
        value = None if f is None else f.value
        if value is None:
            problems.append(f"{t.service}'s {t.metric}: no successful request under the shared load")
        if base is None:
            problems.append(f"{t.service}'s {t.metric}: the baseline measured none to be relative to")
        ratio = None if value is None or base is None else _ratio(t, value, base)
        parts.append(
            Part(
                term=t,
                value=value,
                reference=base,
                ratio=ratio,
                contribution=None if ratio is None else t.weight * ratio,
            )
        )
    if problems:
        return Score(parts=tuple(parts), total=None, reference=reference, problem="; ".join(problems))
    total = sum(p.contribution or 0.0 for p in parts)
    return Score(parts=tuple(parts), total=total, samples=_samples(w, figs, parts, total), reference=reference)


def _samples(w: Weighted, figs: Mapping[Term, Figure], parts: Sequence[Part], total: float) -> tuple[float, ...]:
    """The score's spread: every term's normalised values read at the same quantiles, their
    deviations from the term's median added in quadrature (as independent terms' spreads add) on
    the side of the median they fall, around the score; an odd count, so the middle one is the score."""
    spreads = []
    for t, p in zip(w.terms, parts, strict=True):
        assert p.reference is not None
        ys = [t.weight * _ratio(t, x, p.reference) for x in figs[t].spread if x > 0 or t.higher]
        spreads.append(np.asarray(ys, dtype=float))
    n = max((y.size for y in spreads), default=1)
    n += 1 - n % 2
    qs = (np.arange(n) + 0.5) / n
    squares = np.zeros(n)  # below the median every term's deviation is <= 0, above it >= 0
    for y in spreads:
        if y.size > 1:
            squares += (np.quantile(y, qs) - np.median(y)) ** 2
    dev = np.sign(qs - 0.5) * np.sqrt(squares)
    return tuple(float(max(0.0, total + d)) for d in dev)


def scores(w: Weighted, figs: Mapping[int, Mapping[Term, Figure]]) -> dict[int, Score]:
    """Every measured candidate's score, relative to :func:`reference_of`."""
    ref = reference_of(figs)
    if ref is None:
        return {i: score(w, f, {}, None) for i, f in figs.items()}
    return {i: score(w, f, figs[ref], ref) for i, f in figs.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Predicted:
    """The speed model's single-stream figures of one candidate's tuned service."""

    tg: float
    pp: float
    ttft_s: float


def predicted(w: Weighted, tuned: str, mine: Predicted, base: Predicted) -> float:
    """The score the speed model expects (the search's prior): the tuned service's terms from the
    predicted figures against the baseline's; the other services' as the baseline's (the model
    knows no contention; the search learns it from the measurements)."""
    total = 0.0
    for t in w.terms:
        if t.service != tuned:
            total += t.weight
            continue
        ratio = {
            "tg": mine.tg / base.tg if base.tg > 0 else 1.0,
            "pp": mine.pp / base.pp if base.pp > 0 else 1.0,
            "ttft": base.ttft_s / mine.ttft_s if mine.ttft_s > 0 else 1.0,
        }.get(t.metric, mine.tg / base.tg if base.tg > 0 else 1.0)  # itl, tpot: 1 / TG
        total += t.weight * ratio
    return total
