"""The ledger against llama.cpp's own dry run at the published models' full size.

Sparse header-exact replicas of the presets (``moetune testmodel --preset NAME --sparse``, each in
its mainline recipe) are planned by moetune and projected by ``llama-fit-params -lv 4`` with the
plan's exact arguments: its first ``memory breakdown`` gives model, context and compute per device.
CPU only, and one or two loopback ``ggml-rpc-server`` devices holding the layers with every expert
on the CPU (``cpu-moe``); a sample of ctx 4k/32k/128k (capped at the model's trained context),
ubatch 512/2048/8192, cache f16/q8_0 and flash attention on/off, so the grid runs in a few minutes.

Fit verdicts: for every accelerator point the devices are given the plan's own need times 0.93 and
1.07 (emulated with ``-fitt``: free memory minus the capacity, as tests/plan/test_fit_params.py
does), and moetune's verdict is compared with llama-fit-params' (``cannot meet free memory
target`` or not). The host is left out there: llama-fit-params does not check host memory when
devices exist; CPU-only points compare the host verdict (none of these models fits 24 GiB).

Writes results/fullscale.md and results/fullscale.json.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from moetune.engine import registry
from moetune.engine.argv import strip_flags
from moetune.engine.command import service_argv
from moetune.hardware.inventory import from_dict
from moetune.model.archs import PRESETS, mainline_recipe
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServicePlan, ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.run.verify import Figures, ledger_figures, mainline_figures

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/engine_harness.py
from tests.engine_harness import loopback_hw, rpc_workers

ROOT = Path(__file__).resolve().parent.parent
TOL = {"model": 0.005, "context": 0.01, "compute": 0.10}
SLACK_MIB = 1.0  # llama-fit-params prints whole MiB
CTXS = (4096, 32768, 131072)
UBS = (512, 2048, 8192)
CACHES = ("f16", "q8_0")


class Point(NamedTuple):  # a NamedTuple: run.py loads benches without registering their module
    preset: str
    n_rpc: int
    ctx: int
    ub: int
    cache: str
    fa: bool

    @property
    def settings(self) -> Settings:
        ct = self.cache if self.fa else "f16"  # a quantized V cache needs flash attention
        return Settings(ctx=self.ctx, ubatch=self.ub, batch=max(self.ub, 2048), ctk=self.cache, ctv=ct, flash_attn=self.fa)


def sample_points(presets: list[str], n_ctx_train: dict[str, int], per_config: int = 4) -> list[Point]:
    """A deterministic sample of the grid: each (preset, device count) gets ``per_config`` points
    walking the ctx, ubatch, cache and flash-attention axes out of step, so every value of every
    axis is met across the presets."""
    out = []
    k = 0
    for preset in presets:
        ctxs = sorted({min(c, n_ctx_train[preset]) for c in CTXS})
        for n_rpc in (0, 1, 2):
            for _ in range(per_config):
                out.append(Point(preset, n_rpc, ctxs[k % len(ctxs)], UBS[(k // 2) % len(UBS)], CACHES[k % 2],
                                 (k // 3) % 4 != 3))
                k += 1
    return out


def engine_run(fit: Path, sp: ServicePlan, extra: list[str]) -> str:
    cmd = [str(fit), *strip_flags(service_argv(sp)), "-lv", "4", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.stdout + r.stderr


def _err(pred: float, meas: float) -> float:
    return 0.0 if abs(pred - meas) <= SLACK_MIB else (pred - meas) / max(meas, 1e-9)


def compare_rows(p: Point, ours: list[Figures], theirs: list[Figures]) -> list[dict[str, Any]]:
    by = {f.device: f for f in theirs}
    rows = []
    for f in ours:
        e = by.get(f.device)
        if e is None:
            continue
        row: dict[str, Any] = {"preset": p.preset, "rpc_devices": p.n_rpc, "ctx": p.ctx, "ub": p.ub, "cache": p.cache,
                               "fa": p.fa, "device": f.device.split("[")[0]}
        for what in TOL:
            a, b = getattr(f, f"{what}_mib"), getattr(e, f"{what}_mib")
            row[f"{what}_pred"], row[f"{what}_meas"], row[f"{what}_err"] = round(a, 1), round(b, 1), round(_err(a, b), 4)
        rows.append(row)
    return rows


_FREE = re.compile(r"- (RPC\d+) \([^)]*\) \| +\d+ = +(\d+) \+")


def verdicts(fit: Path, p: ModelProfile, point: Point, ends: list[str]) -> list[dict[str, Any]]:
    """moetune's and llama-fit-params' verdict on devices of 0.93x and 1.07x the plan's need."""
    hw_big = from_dict(loopback_hw(ends, mem_mib=1e7, cpu_ram_mib=1e8))
    sp = make_plan([ServiceSpec("t", p, point.settings, "cpu-moe")], hw_big).main
    text = engine_run(fit, sp, [])
    free = {m[1]: int(m[2]) for m in _FREE.finditer(text)}
    need = {f.device: f.model_mib + f.context_mib + f.compute_mib for f in ledger_figures(sp) if f.device != "CPU"}
    names = {v: k for k, v in sp.hw.engine_names().items()}
    out = []
    for factor in (0.93, 1.07):
        caps = {e: need[names[e]] * factor for e in free}
        if any(caps[e] > free[e] for e in free):
            out.append({"factor": factor, "skipped": "a device would need more than the host has free"})
            continue
        doc = loopback_hw(ends, cpu_ram_mib=1e8)
        for node, e in zip(doc["nodes"][1:], sorted(free), strict=True):  # RPC0, RPC1 in endpoint order
            node["devices"][0]["mem_mib"] = caps[e]
        hw = from_dict(doc)
        hw_devs = hw.accelerators()
        ours = make_plan([ServiceSpec("t", p, point.settings, "cpu-moe")], hw)
        fitt = ",".join(str(int(free[e] - caps[e])) for e in sorted(free))
        text = engine_run(fit, ours.main, ["-fitt", fitt])
        theirs = "cannot meet free memory target" not in text
        out.append({"factor": factor, "ours": ours.fits, "engine": theirs, "devices": [d.name.split("[")[0] for d in hw_devs]})
    return out


def run_grid(d: Path, points: list[Point]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    fit = registry.get().binary("fit")
    models: dict[str, ModelProfile] = {}
    sizes: dict[str, int] = {}
    for name in dict.fromkeys(pt.preset for pt in points):
        arch, dims = PRESETS[name]
        g = generate(d / f"{name}.gguf", arch, dims, mainline_recipe(name), shards=4, sparse=True)
        models[name], sizes[name] = load_profile(g.files[0]), g.tensor_bytes
    rows: list[dict[str, Any]] = []
    fits: list[dict[str, Any]] = []
    timing = {"points": 0, "seconds": 0.0}
    t0 = time.monotonic()
    for n_rpc in (0, 1, 2):
        with rpc_workers(fit.parent, n_rpc) as ends:
            for pt in [q for q in points if q.n_rpc == n_rpc]:
                hw = from_dict(loopback_hw(ends, mem_mib=1e7, cpu_ram_mib=1e8 if n_rpc else 24000))
                sp = make_plan([ServiceSpec("t", models[pt.preset], pt.settings, "cpu-moe")], hw).main
                text = engine_run(fit, sp, [])
                theirs = mainline_figures(text, {v: k for k, v in sp.hw.engine_names().items()})
                if not theirs:
                    rows.append({"preset": pt.preset, "rpc_devices": n_rpc, "ctx": pt.ctx, "ub": pt.ub, "error": text[-400:]})
                    continue
                rows.extend(compare_rows(pt, ledger_figures(sp), theirs))
                if n_rpc:
                    for v in verdicts(fit, models[pt.preset], pt, ends):
                        fits.append({"preset": pt.preset, "rpc_devices": n_rpc, "ctx": pt.ctx, "ub": pt.ub, **v})
                else:  # CPU only: the host verdict (llama-fit-params checks host memory when there is no device)
                    cpu_fits = make_plan([ServiceSpec("t", models[pt.preset], pt.settings, "cpu-moe")], hw).fits
                    fits.append({"preset": pt.preset, "rpc_devices": 0, "ctx": pt.ctx, "ub": pt.ub, "factor": None,
                                 "ours": cpu_fits, "engine": "cannot meet free memory target" not in text})
                timing["points"] += 1
    timing["seconds"] = round(time.monotonic() - t0, 1)
    return rows, fits, {"sizes": sizes, **timing}


def summarize(rows: list[dict[str, Any]], fits: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "error" not in r]
    out: dict[str, Any] = {"device_rows": len(ok), "failed_points": len(rows) - len(ok)}
    for what, tol in TOL.items():
        for label, sel in (("accelerators", [r for r in ok if r["device"] != "CPU"]), ("host", [r for r in ok if r["device"] == "CPU"])):
            errs = [abs(r[f"{what}_err"]) for r in sel if r[f"{what}_meas"] > 0 or r[f"{what}_pred"] > SLACK_MIB]
            out[f"{what}_within_{tol:.1%}_{label}"] = round(sum(e <= tol for e in errs) / max(len(errs), 1), 3)
    worst = sorted(ok, key=lambda r: -abs(r["compute_err"]))[:8]
    out["worst_compute"] = [{k: r[k] for k in ("preset", "rpc_devices", "ctx", "ub", "cache", "fa", "device", "compute_pred",
                                               "compute_meas", "compute_err")} for r in worst]
    judged = [f for f in fits if "ours" in f]
    out["verdicts"] = len(judged)
    out["verdicts_differing"] = [f for f in judged if f["ours"] != f["engine"]]
    out["verdicts_skipped"] = len(fits) - len(judged)
    return out


def write(results: Path, rows: list[dict[str, Any]], fits: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    summary = summarize(rows, fits)
    (results / "fullscale.json").write_text(json.dumps({"summary": summary, "meta": meta, "rows": rows, "verdicts": fits},
                                                       indent=1) + "\n")
    lines = ["# Ledger vs llama-fit-params at full scale (MiB)", "",
             "Generated by `make bench` (`python benchmarks/run.py fullscale`): sparse replicas of the presets in their "
             "mainline recipes, planned with `cpu-moe` (layers on the loopback RPC devices, experts on the CPU; CPU only "
             "when there is none), projected by `llama-fit-params -lv 4` with the plan's arguments.", "",
             f"{meta['points']} points in {meta['seconds']} s. Tolerances: model {TOL['model']:.1%}, KV {TOL['context']:.0%}, "
             f"compute {TOL['compute']:.0%} (or 1 MiB: the engine prints whole MiB).", "",
             "## Summary", ""]
    for k, v in summary.items():
        if k not in ("worst_compute", "verdicts_differing"):
            lines.append(f"- {k}: {v}")
    lines.append(f"- verdicts differing from llama-fit-params: {len(summary['verdicts_differing'])}")
    for f in summary["verdicts_differing"]:
        lines.append(f"  - {f}")
    lines += ["", "Worst compute points:", "", "| preset | rpc | ctx | ub | cache | fa | device | pred | meas | err |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["worst_compute"]:
        lines.append("| " + " | ".join(str(r[k]) for k in ("preset", "rpc_devices", "ctx", "ub", "cache", "fa", "device",
                                                            "compute_pred", "compute_meas")) + f" | {r['compute_err']:+.1%} |")
    lines += ["", "## Every point", "",
              "| preset | rpc | ctx | ub | cache | fa | device | model pred | model meas | ctx pred | ctx meas | compute pred | compute meas | compute err |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['preset']} | {r['rpc_devices']} | {r['ctx']} | {r['ub']} | error | | | | | | | | | |")
            continue
        lines.append("| " + " | ".join(str(r[k]) for k in ("preset", "rpc_devices", "ctx", "ub", "cache", "fa", "device",
                                                            "model_pred", "model_meas", "context_pred", "context_meas",
                                                            "compute_pred", "compute_meas")) + f" | {r['compute_err']:+.1%} |")
    (results / "fullscale.md").write_text("\n".join(lines) + "\n")
    return summary


def main(results: Path) -> None:
    presets = list(PRESETS)
    points = sample_points(presets, {n: PRESETS[n][1].n_ctx_train for n in presets})
    with tempfile.TemporaryDirectory() as tmp:
        rows, fits, meta = run_grid(Path(tmp), points)
    summary = write(results, rows, fits, meta)
    print(json.dumps({k: v for k, v in summary.items() if k != "worst_compute"}, indent=1, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "results")
