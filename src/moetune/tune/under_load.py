"""`tune --layout FILE --service NAME --with-load OTHER=SPEC ...`: every candidate measured while
the layout's other services serve their load.

A candidate's layout is launched whole and measured by `serve-bench LAYOUT_PLAN --load ...`
(:mod:`moetune.bench.serve.layout_run`): the tuned service runs the search's single-stream workload
(one stream, ``-r`` requests of ``--depth`` + ``--pp-tokens`` prompt tokens and ``--tg-tokens``
output tokens: the depth is sent as prompt, there is no prefix cache across requests) alone and
then beside every ``--with-load`` service's own workload; the objective is the tuned service's
figure under that shared load, per request: TG its decode rate (1 / time per output token), PP its
prompt tokens over the time to the first token, ttft the first tokens per second. Its figure alone
(the others idle) is kept beside it, so the table says what the load costs each candidate. The
speed constants are not refitted from these runs (the calibration reads single-stream benchmarks
of a server alone); the search's Gaussian process learns what the model misses under load.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from moetune.bench.analysis.serve import ALONE, LOAD, SERVICE, SHARED, RequestFigures, request_figures, request_metrics
from moetune.bench.serve.loadspec import ServiceLoad, parse_loads, service_load
from moetune.bench.single.runner import BenchOptions
from moetune.bench.single.workloads import Workload
from moetune.errors import InputError
from moetune.monitor.snapshot import Snapshot
from moetune.store.db import ResultsDB

Status = Callable[[str], None]
OBJECTIVES = ("tg", "pp", "ttft")


@dataclass(frozen=True, slots=True, kw_only=True)
class Rates:
    """The tuned service's per-request figures under one load (alone or shared)."""

    tg: tuple[float, ...] = ()  # decode tokens/s
    pp: tuple[float, ...] = ()  # prompt tokens/s to the first token
    ttft: tuple[float, ...] = ()  # first tokens per second (1 / time to first token)

    def of(self, objective: str) -> tuple[float, ...]:
        return {"tg": self.tg, "pp": self.pp, "ttft": self.ttft}[objective]


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    shared: Rates
    alone: Rates


def check(loads: Sequence[str], layout: Path | None, service: str | None, objective: str) -> list[ServiceLoad]:
    """The ``--with-load`` specs, read and checked against the search (services checked at launch)."""
    if not loads:
        return []
    if layout is None or service is None:
        raise InputError("--with-load loads the other services of a layout", hint="give --layout FILE --service NAME")
    if objective not in (*OBJECTIVES, "weighted"):
        raise InputError(
            f"--with-load measures the tuned service's single stream under load: --objective {objective} is not one",
            hint=f"--objective {' | '.join(OBJECTIVES)} | weighted:SERVICE=METRIC:WEIGHT,...",
        )
    out = parse_loads(list(loads))
    if any(ld.service == service for ld in out):
        raise InputError(
            f"--with-load {service}=: {service} is the service tuned; its workload is the search's",
            hint="load the layout's other services",
        )
    return out


def tuned_load(service: str, w: Workload, options: BenchOptions) -> ServiceLoad:
    """The search's workload as the tuned service's load: one stream, a request per repeat."""
    keys: dict[str, object] = {
        "concurrency": 1,
        "requests": options.repeats,
        "input-len": w.depth + w.pp_tokens,
        "output-len": w.max_tokens,
        "warmup": options.warmup,
        "timeout": options.timeout_s,
    }
    return service_load(service, keys)


def run_candidate(
    db: ResultsDB,
    path: Path,
    service: str,
    *,
    loads: Sequence[ServiceLoad],
    w: Workload,
    options: BenchOptions,
    label: str,
    sweep_id: str,
    launch_timeout_s: float,
    status: Status,
    on_snapshot: Callable[[Snapshot], None] | None = None,
    transport: str | None = None,
    rdma_dev: str | None = None,
    slo: dict[str, float] | None = None,
) -> int:
    """Launch the candidate's layout, measure the tuned service alone and under the others' load,
    store it as one serve-bench run under the tune's id; its run id."""
    from moetune.bench.serve.layout_run import LayoutSpec, layout_bench
    from moetune.bench.target import plan_target, with_transport

    target = with_transport(plan_target(path, service), transport, rdma_dev)
    spec = LayoutSpec(
        loads=(tuned_load(service, w, options), *loads),
        label=label,
        launch_timeout_s=launch_timeout_s,
        sweep_id=sweep_id,
        slo=slo,
    )
    doc = layout_bench(target, spec, db, log=status, on_snapshot=on_snapshot)
    return int(doc["run"]["id"])


def _rates(samples: Sequence[dict[str, object]], service: str, load: str) -> Rates:
    """``service``'s requests under ``load``, as rates (:func:`request_figures`, the figures every
    per-request table reads)."""
    figs = service_figures(samples, service, load)
    return Rates(
        tg=tuple(f.decode_tok_s for f in figs if f.decode_tok_s),
        pp=tuple(f.prefill_tok_s for f in figs if f.prefill_tok_s),
        ttft=tuple(1000 / f.ttft_ms for f in figs if f.ttft_ms),
    )


def service_figures(samples: Sequence[dict[str, object]], service: str, load: str) -> list[RequestFigures]:
    """The figures of ``service``'s successful requests under ``load`` (alone or shared), in order."""
    out = []
    for s in samples:
        if s.get(SERVICE) == service and s.get(LOAD) == load and (f := request_figures(request_metrics(s))):
            out.append(f)
    return out


def measured(samples: Sequence[dict[str, object]], service: str) -> Measured:
    """The tuned service's figures from a candidate's run: under the shared load, and alone."""
    return Measured(shared=_rates(samples, service, SHARED), alone=_rates(samples, service, ALONE))
