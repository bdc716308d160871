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
      - {label: ncm4 rdma, plan: ncm4.json, transport: rdma}   # the same plan over RDMA

A plan's ``transport`` (tcp, rdma, auto; default tcp) is how its server talks to its RPC workers
(`launch --transport`); ``--transport tcp,rdma`` on the command line measures every plan with
each transport instead, labelled ``LABEL (tcp)``, ``LABEL (rdma)``. An RDMA plan whose builds
lack RDMA is refused before the first launch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from moetune.bench.single.runner import BenchOptions, Progress, bench_target
from moetune.bench.single.workloads import Workload
from moetune.bench.target import Target, plan_target, with_transport
from moetune.errors import InputError, MoetuneError, RuntimeFailure
from moetune.kinds import RunStatus, Transport
from moetune.monitor.snapshot import Snapshot
from moetune.store.db import ResultsDB

MEASURED, RESUMED, FAILED = "measured", "resumed", "failed"


@dataclass(frozen=True, slots=True)
class SweepEntry:
    label: str
    target: Target

    @property
    def path(self) -> Path:
        assert self.target.plan_path is not None
        return self.target.plan_path


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


def load_sweep(
    paths: list[Path], server: str | None = None, transports: Sequence[str] | None = None, rdma_dev: str | None = None
) -> SweepSpec:
    """Plan files (labels from their "label" or file name), or one sweep YAML file; each plan's
    server to measure chosen by the one rule (:func:`moetune.bench.target.choose_server`).
    ``transports`` (``--transport``): one sets every plan's, several measure every plan with each."""
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
                raise InputError(
                    f'sweep file {p}: expected a mapping with a "plans" list',
                    hint="plans: [{label: cpu-moe, plan: cpu-moe.json}, ...]",
                )
            name = doc.get("name", name)
            baseline = doc.get("baseline", baseline)
            for item in doc["plans"]:
                if isinstance(item, str):
                    item = {"plan": item}
                if not isinstance(item, dict) or "plan" not in item:
                    raise InputError(f'sweep file {p}: each plan needs a "plan" path ({item!r})')
                t = plan_target((p.parent / str(item["plan"])).resolve(), server)
                if item.get("transport") is not None:
                    if transports:
                        raise InputError(
                            f"sweep file {p}: plan {item.get('label') or t.label!r} sets its transport; "
                            "--transport sets every plan's",
                            hint="drop one of them",
                        )
                    t = _entry_transport(t, item["transport"], p)
                entries.append(SweepEntry(str(item.get("label") or t.label), t))
        else:
            t = plan_target(p.resolve(), server)
            entries.append(SweepEntry(str(t.label), t))
    entries = _with_transports(entries, transports, rdma_dev)
    labels = [e.label for e in entries]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise InputError(f"sweep: labels repeat: {dup}", hint="give each plan a distinct label in the sweep file")
    if baseline is not None and baseline not in labels:
        raise InputError(f"sweep: baseline {baseline!r} is not one of the plans' labels ({', '.join(labels)})")
    return SweepSpec(name, baseline, tuple(entries))


def _entry_transport(t: Target, value: object, path: Path) -> Target:
    if str(value) not in tuple(Transport):
        raise InputError(f"sweep file {path}: transport {value!r}: choose {', '.join(Transport)}")
    return with_transport(t, str(value))


def _with_transports(
    entries: list[SweepEntry], transports: Sequence[str] | None, rdma_dev: str | None
) -> list[SweepEntry]:
    """One transport: every plan launched with it; several: every plan once per transport."""
    if not transports:
        return [SweepEntry(e.label, with_transport(e.target, None, rdma_dev)) for e in entries]
    if len(transports) == 1:
        return [SweepEntry(e.label, with_transport(e.target, transports[0], rdma_dev)) for e in entries]
    return [
        SweepEntry(f"{e.label} ({tr})", with_transport(e.target, tr, rdma_dev)) for e in entries for tr in transports
    ]


def check_transports(spec: SweepSpec) -> None:
    """Every plan's transport the builds can give, before the first launch (RDMA: refused when a
    build lacks it)."""
    from moetune.bench.servers import check_transport

    for e in spec.entries:
        check_transport(e.target)


def plan_record(spec: SweepSpec) -> list[dict[str, str]]:
    """The sweep's plans as its record lists them: label, path, and a transport other than tcp."""
    return [
        {
            "label": e.label,
            "path": str(e.path),
            **({"transport": e.target.transport} if e.target.transport != Transport.TCP else {}),
        }
        for e in spec.entries
    ]


def _entry_key(e: SweepEntry) -> dict[str, object]:
    key: dict[str, object] = {"label": e.label, "plan": e.target.doc}
    if e.target.transport != Transport.TCP:  # tcp as before transports were chosen: older sweeps resume
        key["transport"] = e.target.transport
    if e.target.rdma_dev:
        key["rdma_dev"] = e.target.rdma_dev
    return key


def sweep_id(spec: SweepSpec, workloads: list[Workload], options: BenchOptions, interleave: str | None = None) -> str:
    """The sweep's id: a hash of its plans, workloads and repeat settings (and, for an interleaved
    sweep, its mode; not its number of rounds, so that more rounds extend it)."""
    key: dict[str, object] = {
        "entries": [_entry_key(e) for e in spec.entries],
        "workloads": [w.to_json() for w in workloads],
        "options": {k: v for k, v in asdict(options).items() if k in ("repeats", "warmup", "cache_bust")},
    }
    if interleave is not None:
        key["interleave"] = interleave
    return "sw-" + hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def run_sweep(
    db: ResultsDB,
    spec: SweepSpec,
    workloads: list[Workload],
    options: BenchOptions,
    *,
    sid: str | None = None,
    launch_timeout_s: float = 600.0,
    status: Callable[[str], None] | None = None,
    progress_for: Callable[[str], Progress | None] | None = None,
    on_snapshot: Callable[[Snapshot], None] | None = None,
) -> tuple[str, list[Outcome]]:
    """Run every plan not yet complete in this sweep; return the sweep id and one outcome per plan."""
    check_transports(spec)
    sid = sid or sweep_id(spec, workloads, options)
    db.create_sweep(
        sid,
        {
            "name": spec.name,
            "baseline": spec.baseline,
            "plans": plan_record(spec),
            "workloads": [w.to_json() for w in workloads],
            "options": asdict(options),
        },
    )
    outcomes: list[Outcome] = []
    for e in spec.entries:
        done = [r for r in db.runs(sweep_id=sid) if r.label == e.label and r.status == RunStatus.DONE]
        if done:
            if status:
                status(f"{e.label}: complete in run {done[0].id}, skipped")
            outcomes.append(Outcome(e.label, done[0].id, RESUMED))
            continue
        try:
            run_id = bench_target(
                db,
                e.target,
                workloads,
                options,
                label=e.label,
                sweep_id=sid,
                launch_timeout_s=launch_timeout_s,
                status=status,
                progress_for=progress_for,
                on_snapshot=on_snapshot,
            )
            outcomes.append(Outcome(e.label, run_id, MEASURED))
        except MoetuneError as err:  # one plan failing (out of memory, say) must not lose the others
            if status:
                status(f"{e.label}: failed: {err}")
            outcomes.append(Outcome(e.label, None, FAILED, str(err)))
    return sid, outcomes


def baseline_of(spec: SweepSpec, outcomes: list[Outcome], override: str | None = None) -> Outcome:
    """The outcome the others are compared with: ``--baseline``, else the sweep file's, else the
    first plan measured."""
    ok = [o for o in outcomes if o.run is not None]
    label = override or spec.baseline or (ok[0].label if ok else None)
    base = next((o for o in ok if o.label == label), None)
    if base is None:
        what = f"the sweep's baseline {label!r} has no completed run" if label else "no plan of the sweep completed"
        raise RuntimeFailure(what, hint="see the failures above; fix the plan and run the same command again")
    return base
