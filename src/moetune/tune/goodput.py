"""`moetune tune --objective goodput`: each candidate measured by serve-bench at the search's
concurrency, and its goodput as samples the comparison rule can judge.

A candidate's plan is made with one slot per stream (:func:`moetune.plan.serving.slotted`, what
serve-bench's ``--match-slots`` does to a plan at launch, planned here so the ledger counts every
slot's cache), launched, and loaded with ``C`` closed-loop streams for ``N`` requests; the run is
an ordinary serve-bench run in the history, under the tune's id.

The samples. A request has no rate of its own, and its "met the targets" indicator (0 or 1) has a
median of 0 or 1, which the comparison rule (a bootstrap CI of the ratio of medians) cannot use.
So the level is cut into completion windows: the requests in the order they ended, ``C`` at a
time (one round of the closed loop; a last partial round joins the one before), each window
spanning from the end of the previous window (the first: from the level's first request) to its
own last end. A window's goodput is its met requests over its span; the spans add up to the
level's span, so the windows' goodputs average, weighted by span, to the level's goodput
(serve-bench's ``levels[0].goodput.req_s``, reported beside them). With ``N`` requests there are
``N / C`` windows: the bootstrap sees the round-to-round spread of the rate, which is what another
run of the same configuration would also vary by.

What the search learns from is the windows' request rates (completed requests over the span),
against the predicted rate: the smooth part of goodput (:mod:`moetune.plan.serving`), measured
even where no request met a target. :attr:`Goodput.floor`, half a request over the level's span,
is the least goodput a level can tell apart from none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.bench.analysis.level_summary import LevelSummary
from moetune.bench.analysis.serve import RequestMetrics, level_span, level_summary, request_metrics
from moetune.bench.analysis.slo import goodput
from moetune.monitor.snapshot import Snapshot
from moetune.plan.serving import ServeLoad
from moetune.store.db import ResultsDB

Status = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Goodput:
    values: tuple[float, ...]  # each completion window's goodput, requests/s
    rates: tuple[float, ...]  # each completion window's completed requests/s
    level: LevelSummary  # serve-bench's figures of the level, goodput included
    floor: float  # what a level with no request meeting the targets stands for in the search

    @property
    def level_req_s(self) -> float | None:
        g = self.level.goodput
        return None if g is None else g.req_s


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def windows(
    samples: Sequence[dict[str, object]], slo: dict[str, float], concurrency: int
) -> tuple[list[float], list[float]]:
    """The completion windows' goodputs and request rates (requests/s) of one level's raw samples
    (module docstring)."""
    good = window_rates(samples, concurrency, lambda m: float(goodput([m], slo, None).met == 1))
    rates = window_rates(samples, concurrency, lambda m: float(m.ok))
    return good, rates


def window_rates(
    samples: Sequence[dict[str, object]], concurrency: int, count: Callable[[RequestMetrics], float]
) -> list[float]:
    """Per completion window of one level's raw samples (module docstring), what ``count`` counts of
    its requests over the window's span: its met requests, completed requests, output tokens."""
    rows = []
    for s in samples:
        m = request_metrics(s)
        end = _num(s.get("t_end")) or _num(s.get("t_send"))
        if end is not None:
            rows.append((end, m))
    t0 = min((t for s in samples if (t := _num(s.get("t_sched"))) is not None), default=None)
    if t0 is None or not rows:
        return []
    rows.sort(key=lambda r: r[0])
    c = max(1, concurrency)
    groups = [rows[i : i + c] for i in range(0, len(rows), c)]
    if len(groups) > 1 and len(groups[-1]) < c:
        last = groups.pop()
        groups[-1] += last
    out = []
    start = t0
    for g in groups:
        end = g[-1][0]
        if end > start:
            out.append(sum(count(m) for _, m in g) / (end - start))
        start = end
    return out


def measured(samples: Sequence[dict[str, object]], load: ServeLoad) -> Goodput:
    slo = load.targets
    span = level_span(samples)
    good, rates = windows(samples, slo, load.concurrency)
    return Goodput(tuple(good), tuple(rates), level_summary(samples, slo), 0.5 / span if span else 0.0)


def serve_candidate(
    db: ResultsDB,
    path: Path,
    load: ServeLoad,
    *,
    label: str,
    sweep_id: str,
    launch_timeout_s: float,
    request_timeout_s: float,
    status: Status,
    on_snapshot: Callable[[Snapshot], None] | None = None,
    transport: str = "tcp",
    rdma_dev: str | None = None,
) -> int:
    """Launch the plan at ``path`` with one slot per stream, run serve-bench's closed loop on it,
    store the run under the tune's id; its run id."""
    from moetune.bench.serve.run import ServeBenchSpec, serve_bench
    from moetune.bench.servers import PlanServers
    from moetune.bench.target import plan_target, with_transport

    spec = ServeBenchSpec(
        url=str(path),
        concurrency=(load.concurrency,),
        input_len=load.input_len,
        output_len=load.output_len,
        requests=load.requests,
        timeout_s=request_timeout_s,
        label=label,
        slo=load.targets,
    )
    source = PlanServers(
        with_transport(plan_target(path), transport, rdma_dev),
        match=True,
        need_per_slot=load.per_slot,
        status=status,
        timeout_s=launch_timeout_s,
    )
    doc = serve_bench(spec, db, log=status, source=source, on_snapshot=on_snapshot, sweep_id=sweep_id)
    return int(doc["run"]["id"])
