"""A sweep: launch, bench and stop each of several plans, resumably, then compare them.

Its id is a hash of what defines it (labels, plans, workloads, repeat settings), so running the
same command again resumes it: plans whose run in this sweep is complete are skipped, the rest
(never started, interrupted, failed) are run again.

A sweep file (YAML) lists the plans with labels, paths relative to the file::

    name: placements          # optional
    baseline: cpu-moe         # optional; default the first plan
    plans:
      - {label: cpu-moe, plan: cpu-moe.json}
      - {label: n-cpu-moe 4, plan: ncm4.json}
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from moetune.bench.launch import launched
from moetune.bench.runner import BenchOptions, Progress, bench
from moetune.bench.workloads import Workload
from moetune.errors import InputError, MoetuneError
from moetune.run.prepare import read_plan
from moetune.store.db import ResultsDB

MEASURED, RESUMED, FAILED = "measured", "resumed", "failed"


@dataclass(frozen=True, slots=True)
class SweepEntry:
    label: str
    path: Path
    plan: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SweepSpec:
    name: str | None
    baseline: str | None
    entries: tuple[SweepEntry, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    label: str
    run: int | None
    status: str  # measured | resumed | failed
    error: str | None = None


def _read_plan(path: Path) -> dict[str, Any]:
    """The plan document; read and checked by the launcher's own reader (one place for that)."""
    return read_plan(path)[1]


def _plan_label(path: Path, plan: dict[str, Any]) -> str:
    return str(plan.get("label") or plan.get("name") or path.stem)


def load_sweep(paths: list[Path]) -> SweepSpec:
    """Plan files (labels from their "label" or file name), or one sweep YAML file."""
    if not paths:
        raise InputError("give plan files or a sweep file", hint="moetune sweep a.json b.json, or sweep.yaml")
    name = baseline = None
    entries: list[SweepEntry] = []
    for p in paths:
        if p.suffix.lower() in (".yaml", ".yml"):
            try:
                doc = yaml.safe_load(p.read_text())
            except (OSError, yaml.YAMLError) as e:
                raise InputError(f"sweep file {p}: {e}") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("plans"), list):
                raise InputError(f"sweep file {p}: expected a mapping with a \"plans\" list",
                                 hint="plans: [{label: cpu-moe, plan: cpu-moe.json}, ...]")
            name = doc.get("name", name)
            baseline = doc.get("baseline", baseline)
            for item in doc["plans"]:
                if isinstance(item, str):
                    item = {"plan": item}
                if not isinstance(item, dict) or "plan" not in item:
                    raise InputError(f"sweep file {p}: each plan needs a \"plan\" path ({item!r})")
                pp = (p.parent / str(item["plan"])).resolve()
                plan = _read_plan(pp)
                entries.append(SweepEntry(str(item.get("label") or _plan_label(pp, plan)), pp, plan))
        else:
            plan = _read_plan(p)
            entries.append(SweepEntry(_plan_label(p, plan), p.resolve(), plan))
    labels = [e.label for e in entries]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise InputError(f"sweep: labels repeat: {dup}", hint="give each plan a distinct label in the sweep file")
    if baseline is not None and baseline not in labels:
        raise InputError(f"sweep: baseline {baseline!r} is not one of the plans' labels ({', '.join(labels)})")
    return SweepSpec(name, baseline, tuple(entries))


def sweep_id(spec: SweepSpec, workloads: list[Workload], options: BenchOptions) -> str:
    key = {"entries": [{"label": e.label, "plan": e.plan} for e in spec.entries],
           "workloads": [w.to_json() for w in workloads],
           "options": {k: v for k, v in asdict(options).items() if k in ("repeats", "warmup", "cache_bust")}}
    return "sw-" + hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def run_sweep(db: ResultsDB, spec: SweepSpec, workloads: list[Workload], options: BenchOptions, *,
              sid: str | None = None, server: str | None = None, launch_timeout_s: float = 600.0,
              status: Callable[[str], None] | None = None,
              progress_for: Callable[[str], Progress | None] | None = None) -> tuple[str, list[Outcome]]:
    """Run every plan not yet complete in this sweep; return the sweep id and one outcome per plan."""
    sid = sid or sweep_id(spec, workloads, options)
    db.create_sweep(sid, {"name": spec.name, "baseline": spec.baseline,
                          "plans": [{"label": e.label, "path": str(e.path)} for e in spec.entries],
                          "workloads": [w.to_json() for w in workloads], "options": asdict(options)})
    outcomes: list[Outcome] = []
    for e in spec.entries:
        done = [r for r in db.runs(sweep_id=sid) if r.label == e.label and r.status == "done"]
        if done:
            if status:
                status(f"{e.label}: complete in run {done[0].id}, skipped")
            outcomes.append(Outcome(e.label, done[0].id, RESUMED))
            continue
        try:
            with launched(e.plan, source=str(e.path), server=server, timeout_s=launch_timeout_s,
                          status=status) as srv:
                run_id = bench(db, srv.url, workloads, options, label=e.label, target=str(e.path), plan=e.plan,
                               engine_build=srv.engine_build, model_path=srv.model_path, sweep_id=sid,
                               extra_meta={"launch_run": srv.launch_run},
                               progress=progress_for(e.label) if progress_for else None)
            outcomes.append(Outcome(e.label, run_id, MEASURED))
        except MoetuneError as err:  # one plan failing (out of memory, say) must not lose the others
            if status:
                status(f"{e.label}: failed: {err}")
            outcomes.append(Outcome(e.label, None, FAILED, str(err)))
    return sid, outcomes
