"""tune's second baseline: the engine run with the model and no tuning flags ("engine defaults"),
measured with the same workload as every candidate, and the winner judged against it (TG and PP);
and the guard of ``--objective tg``: a candidate that loses more than ``--max-pp-loss`` of the
baselines' prefill speed cannot win.

The engine-defaults run is stored under the tune's id like a candidate, but its plan document
carries no prediction (its placement is the engine's, not the plan's), so no calibration reads it.
Where the defaults beat the search's best on the objective by the rule of `compare` (and keep the
baseline's PP within ``--max-pp-loss`` under ``--objective tg``), they are the recommendation: the
plan tune writes and prints is theirs, so a tune never recommends flags that measured slower than
none.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from moetune.bench.analysis.single import bench_metrics
from moetune.bench.analysis.stats import SLOWER
from moetune.bench.single.workloads import Workload
from moetune.engine.command import defaults_service_argv
from moetune.plan.plan import Plan
from moetune.planfiles import document
from moetune.store.db import ResultsDB
from moetune.tune.verdict import change_text, compare

LABEL = "engine defaults"
PLAN_FILE = "engine_defaults.json"  # the defaults' plan document, in the tune's plan folder
MAX_PP_LOSS = 0.10  # --max-pp-loss's default: the share of the baselines' PP a TG winner may give up


@dataclass
class Defaults:
    """The engine-defaults baseline: its document, its run (or why it failed)."""

    doc: dict[str, Any]  # the plan document
    run: int | None = None
    failed: str | None = None
    confirmed: list[int] = field(default_factory=list)  # its runs of tune's --confirm round

    @property
    def runs(self) -> tuple[int, ...]:
        return () if self.run is None else (self.run, *self.confirmed)

    @property
    def pending(self) -> bool:
        return self.run is None and self.failed is None

    @property
    def argv(self) -> list[str]:
        return list(self.doc["argv"])


def defaults_doc(plan: Plan, engine: str, model: str) -> dict[str, object]:
    """The baseline plan's document with the engine's no-flag command in place of the plan's."""
    doc = document(plan, engine, None, [model], argvs=[defaults_service_argv(sp) for sp in plan.services])
    doc = copy.deepcopy(doc)
    doc["label"] = LABEL
    doc["engine_defaults"] = True
    for sj in doc["services"]:
        sj["predicted"] = None  # the engine places the weights itself: the plan's prediction is not its
    return doc


@dataclass(frozen=True, slots=True)
class Rates:
    """A run's measured TG and PP samples (tokens/s) for the tune's workload."""

    tg: tuple[float, ...] = ()
    pp: tuple[float, ...] = ()

    def median(self, what: str) -> float | None:
        v = self.tg if what == "tg" else self.pp
        return statistics.median(v) if v else None


def rates(db: ResultsDB, runs: Sequence[int], w: Workload) -> Rates:
    """The TG and PP samples of ``runs`` (one configuration's launches), pooled."""
    if not runs:
        return Rates()
    ms = bench_metrics([s for r in runs for s in db.samples(r)])
    tg, pp = ms.get(f"tg:{w.name}"), ms.get(f"pp:{w.name}")
    return Rates(tuple(tg.values) if tg else (), tuple(pp.values) if pp else ())


def versus(base: Rates, other: Rates) -> dict[str, object]:
    """``other`` against ``base``, TG and PP, by the rule of `compare`: ratio of medians and verdict."""
    out: dict[str, object] = {}
    for what in ("tg", "pp"):
        a, b = (base.tg, other.tg) if what == "tg" else (base.pp, other.pp)
        if len(a) < 2 or len(b) < 2:
            out[what] = None
            continue
        verdict, text = compare(list(a), list(b))
        out[what] = {"ratio": round(statistics.median(b) / statistics.median(a), 4), "verdict": verdict, "text": text}
    return out


def pp_rejections(pp_medians: dict[int, float], references: dict[str, float], max_loss: float) -> dict[int, str]:
    """The candidates whose PP median lies more than ``max_loss`` below a baseline's (``references``:
    name -> PP median), each with the reason (the first baseline it falls short of)."""
    out: dict[int, str] = {}
    for i, pp in pp_medians.items():
        for name, ref in references.items():
            if ref > 0 and pp < (1 - max_loss) * ref:
                whose = name + ("'" if name.endswith("s") else "'s")
                out[i] = (
                    f"rejected: PP {pp:.4g} tok/s is {(1 - pp / ref) * 100:.0f}% below the {whose} "
                    f"{ref:.4g} (--max-pp-loss {max_loss * 100:g}%)"
                )
                break
    return out


def beat_best(best: Sequence[float], theirs: Sequence[float], *, as_time: bool = False) -> str | None:
    """How the engine defaults beat the search's best on the objective (``best``, ``theirs``: the
    objective's samples, higher is better); None where they do not. Judged as the report judges the
    best against them (`compare`, the defaults as its baseline), so the two never disagree."""
    if len(best) < 2 or len(theirs) < 2 or compare(list(theirs), list(best), as_time=as_time)[0] != SLOWER:
        return None
    ratio = statistics.median(theirs) / statistics.median(best)
    return f"faster ({change_text(ratio, as_time=as_time)} vs the best candidate)"


def workload_text(w: Workload) -> str:
    """What a single-stream objective measured, in words."""
    return f"depth {w.depth}, prompt {w.pp_tokens} tokens, output {w.max_tokens} tokens"
