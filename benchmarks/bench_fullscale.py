"""The ledger against llama.cpp's own dry run at the published models' full size.

Sparse header-exact replicas of the presets (``moetune testmodel --preset NAME --sparse``, each in
its mainline recipe) are planned by moetune and projected by ``llama-fit-params -lv 4`` with the
plan's exact arguments: its first ``memory breakdown`` gives model, context and compute per device.
CPU only, and one or two loopback ``ggml-rpc-server`` devices holding the layers with every expert
on the CPU (``cpu-moe``); a sample of ctx 4k/32k/128k (capped at the model's trained context),
ubatch 512/2048/8192, cache f16/q8_0 and flash attention on/off, so the grid runs in a few minutes.

What is compared: llama-fit-params reserves the logits of every ubatch token (``llama_context``'s
default ``n_outputs_max = n_batch``), llama-server one token's per slot (``server_output_limits``),
so the ledger's side is its dry-run compute figure (``ServiceMemory.dry_run_compute_mib``, the same
replay with every token an output), not the server's it plans with. A few points then check the
server's figure against llama-server's own reserve at full size (``SERVER_POINTS``): only
qwen3-coder-next there, whose non-expert weights (2 GiB) the loopback workers can hold on this
machine (llama-server, unlike the dry run, allocates and uploads them).

Fit verdicts: llama-fit-params exits 0 when every device (without devices: the host) meets its
free-memory target and 1 otherwise (``common/fit.cpp``, ``common_params_fit_impl``: with ``-ngl`` or
``-ot`` set it gives up instead of changing them). The verdict is read from that exit status, not
from the log: the log is written by a worker thread of a logger the program leaks on purpose
(``common/log.cpp``, ``common_log_main``), so ``exit(1)`` can drop its last lines, the ``cannot meet
free memory target`` line included, and with two or more devices that line appears only when the
devices' sum is short, not when one device is. The 14 verdicts that differed in the first grid
came from these two causes and from per-device capacities that changed the layer split (below).

For every accelerator point, the devices are all given the same capacity, 0.93 and 1.07 times the
largest per-device need of the plan (emulated with ``-fitt``: the device's free memory minus the
capacity, as tests/plan/test_fit_params.py does); equal capacities keep the layer split, which
follows the capacities, the one whose need was measured. moetune's verdict on the accelerators,
taken with the compute buffers llama-fit-params projects (``fits_as_projected``), is compared with
the engine's. The host is left out there: llama-fit-params does not check host memory
when devices exist. Without devices it compares the host's model + context + compute with the
machine's total RAM (not its free RAM: ``ggml_backend_cpu_device_get_memory`` reports the total as
free on Linux) minus the target (default 1024 MiB); CPU-only points are planned on that RAM with
that head-room, so the two verdicts answer the same question (none of these models fits this
machine: a weak check, but a check of the rule's inputs).

Writes results/fullscale.md and results/fullscale.json.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from moetune.engine import registry
from moetune.engine.argv import strip_flags
from moetune.engine.command import service_argv
from moetune.engine.logs import parse_log
from moetune.hardware.inventory import from_dict
from moetune.model.archs import PRESETS, mainline_recipe
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import Plan, ServicePlan, ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.run.verify import Figures, ledger_figures, mainline_figures

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/engine_harness.py
from tests.engine_harness import loopback_hw, reserve_log, rpc_workers, strip_endpoint

ROOT = Path(__file__).resolve().parent.parent
TOL = {"model": 0.005, "context": 0.01, "compute": 0.10}
SLACK_MIB = 1.0  # llama-fit-params prints whole MiB
CTXS = (4096, 32768, 131072)
UBS = (512, 2048, 8192)
CACHES = ("f16", "q8_0")
# (preset, rpc devices, ctx, ubatch, cache, slots): llama-server's own reserve at full size
# -nr, as before plans followed the engine's repacking default: with repacking on (mainline's
# default) 10 CPU-only verdicts differed from llama-fit-params and llama-server's reserve at full
# size did not come (issue #25, left open)
REPACK = False
SERVER_POINTS = (("qwen3-coder-next", 1, 131072, 8192, "q8_0", 1), ("qwen3-coder-next", 2, 65536, 2048, "f16", 4))


class Point(NamedTuple):  # a NamedTuple: run.py loads benches without registering their module
    preset: str
    n_rpc: int
    ctx: int
    ub: int
    cache: str
    fa: bool

    def settings(self, p: ModelProfile) -> Settings:
        """The point's settings for a model: a quantized V cache needs flash attention, and an MLA
        model's K and V caches share one type (its V is a view of K), so without flash attention
        an MLA model's cache is f16."""
        ck = "f16" if p.is_mla and not self.fa else self.cache
        return Settings(
            ctx=self.ctx,
            ubatch=self.ub,
            batch=max(self.ub, 2048),
            ctk=ck,
            ctv=ck if self.fa else "f16",
            flash_attn=self.fa,
            repack=REPACK,
        )


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
                out.append(
                    Point(
                        preset, n_rpc, ctxs[k % len(ctxs)], UBS[(k // 2) % len(UBS)], CACHES[k % 2], (k // 3) % 4 != 3
                    )
                )
                k += 1
    return out


class EngineRun(NamedTuple):
    rc: int
    text: str

    @property
    def fits(self) -> bool:
        """llama-fit-params' verdict: its exit status (see the module's docstring for why not its log)."""
        return self.rc == 0


def engine_run(fit: Path, sp: ServicePlan, extra: list[str]) -> EngineRun:
    cmd = [str(fit), *strip_flags(service_argv(sp)), "-lv", "4", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return EngineRun(r.returncode, r.stdout + r.stderr)


def host_ram_mib() -> float:
    """The RAM llama-fit-params checks a CPU-only plan against: the machine's total
    (``sysconf(_SC_PHYS_PAGES) * page size``, what ``ggml_backend_cpu_device_get_memory`` reports)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20


def _err(pred: float, meas: float) -> float:
    return 0.0 if abs(pred - meas) <= SLACK_MIB else (pred - meas) / max(meas, 1e-9)


def compare_rows(p: Point, cache: str, ours: list[Figures], theirs: list[Figures]) -> list[dict[str, Any]]:
    by = {f.device: f for f in theirs}
    rows = []
    for f in ours:
        e = by.get(f.device)
        if e is None:
            continue
        row: dict[str, Any] = {
            "preset": p.preset,
            "rpc_devices": p.n_rpc,
            "ctx": p.ctx,
            "ub": p.ub,
            "cache": cache,
            "fa": p.fa,
            "device": f.device.split("[")[0],
        }
        for what in TOL:
            a, b = getattr(f, f"{what}_mib"), getattr(e, f"{what}_mib")
            row[f"{what}_pred"], row[f"{what}_meas"], row[f"{what}_err"] = (
                round(a, 1),
                round(b, 1),
                round(_err(a, b), 4),
            )
        rows.append(row)
    return rows


_FREE = re.compile(r"- (RPC\d+) \([^)]*\) \| +\d+ = +(\d+) \+")


def verdicts(fit: Path, p: ModelProfile, point: Point, ends: list[str]) -> list[dict[str, Any]]:
    """moetune's and llama-fit-params' verdict with every device given 0.93x and 1.07x the plan's
    largest per-device need (equal capacities keep the plan's layer split)."""
    hw_big = from_dict(loopback_hw(ends, mem_mib=1e7, cpu_ram_mib=1e8))
    sp = make_plan([ServiceSpec(name="t", model=p, settings=point.settings(p), strategy="cpu-moe")], hw_big).main
    free = {m[1]: int(m[2]) for m in _FREE.finditer(engine_run(fit, sp, []).text)}
    need = max(
        f.model_mib + f.context_mib + f.compute_mib for f in ledger_figures(sp, dry_run=True) if f.device != "CPU"
    )
    out = []
    for factor in (0.93, 1.07):
        cap = need * factor
        if any(cap > f for f in free.values()):
            out.append({"factor": factor, "skipped": "a device would need more than the host has free"})
            continue
        hw = from_dict(loopback_hw(ends, mem_mib=cap, cpu_ram_mib=1e8))
        ours = make_plan([ServiceSpec(name="t", model=p, settings=point.settings(p), strategy="cpu-moe")], hw)
        assert ours.main.placement == sp.placement, "equal capacities keep the layer split"
        fitt = ",".join(str(int(free[e] - cap)) for e in sorted(free))  # RPC0, RPC1 in endpoint order
        theirs = engine_run(fit, ours.main, ["-fitt", fitt])
        out.append(
            {
                "factor": factor,
                "ours": fits_as_projected(ours, accelerators=True),
                "engine": theirs.fits,
                "devices": [d.name.split("[")[0] for d in hw.accelerators()],
            }
        )
    return out


def fits_as_projected(plan: Plan, accelerators: bool) -> bool:
    """The plan's verdict (every item, its margin included, within each device's capacity) with the
    compute buffers llama-fit-params projects: it reserves the logits of every ubatch token where
    llama-server, whose buffers the plan holds, reserves one per slot. On the accelerators, or on
    the host alone."""
    dry = plan.main.memory.dry_run_compute_mib
    for led in plan.ledgers:
        if (led.device == "CPU") == accelerators:
            continue
        used = led.used_mib - sum(i.mib for i in led.items if i.what == "compute") + dry.get(led.device, 0.0)
        if used > led.capacity_mib + 1e-6:
            return False
    return True


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
                hw = from_dict(loopback_hw(ends, mem_mib=1e7, cpu_ram_mib=1e8 if n_rpc else host_ram_mib()))
                s = pt.settings(models[pt.preset])
                if not n_rpc:  # the engine's default target (-fitt 1024) as the host's head-room
                    s = replace(s, host_margin_mib=1024.0)
                plan = make_plan([ServiceSpec(name="t", model=models[pt.preset], settings=s, strategy="cpu-moe")], hw)
                run = engine_run(fit, plan.main, [])
                theirs = mainline_figures(run.text, {v: k for k, v in plan.main.hw.engine_names().items()})
                if not theirs:
                    rows.append(
                        {
                            "preset": pt.preset,
                            "rpc_devices": n_rpc,
                            "ctx": pt.ctx,
                            "ub": pt.ub,
                            "error": run.text[-400:],
                        }
                    )
                    continue
                rows.extend(compare_rows(pt, s.ctk, ledger_figures(plan.main, dry_run=True), theirs))
                if n_rpc:
                    for v in verdicts(fit, models[pt.preset], pt, ends):
                        fits.append({"preset": pt.preset, "rpc_devices": n_rpc, "ctx": pt.ctx, "ub": pt.ub, **v})
                else:  # CPU only: the host verdict (llama-fit-params checks host memory when there is no device)
                    fits.append(
                        {
                            "preset": pt.preset,
                            "rpc_devices": 0,
                            "ctx": pt.ctx,
                            "ub": pt.ub,
                            "factor": None,
                            "ours": fits_as_projected(plan, accelerators=False),
                            "engine": run.fits,
                        }
                    )
                timing["points"] += 1
    timing["seconds"] = round(time.monotonic() - t0, 1)
    return rows, fits, {"sizes": sizes, **timing}


def server_rows(d: Path) -> list[dict[str, Any]]:
    """The plan's compute buffers (llama-server's case) against llama-server's own reserve."""
    server = registry.get().binary("server")
    rows: list[dict[str, Any]] = []
    for preset, n_rpc, ctx, ub, cache, slots in SERVER_POINTS:
        arch, dims = PRESETS[preset]
        g = generate(d / f"{preset}.gguf", arch, dims, mainline_recipe(preset), shards=4, sparse=True)
        p = load_profile(g.files[0])
        s = Settings(ctx=ctx, ubatch=ub, batch=max(ub, 2048), ctk=cache, ctv=cache, slots=slots, repack=REPACK)
        with rpc_workers(server.parent, n_rpc) as ends:
            sp = make_plan(
                [ServiceSpec(name="t", model=p, settings=s, strategy="cpu-moe")], from_dict(loopback_hw(ends, 1e7, 1e8))
            ).main
            ok, log = reserve_log(server, [*strip_endpoint(service_argv(sp)), "-lv", "4"], timeout=600)
        theirs = parse_log(log).device_buffers() if ok else {}
        for dev, items in sp.memory.items.items():
            pred = sum(i.mib for i in items if i.what == "compute")
            meas = theirs[dev].compute_mib if dev in theirs else float("nan")
            rows.append(
                {
                    "preset": preset,
                    "rpc_devices": n_rpc,
                    "ctx": ctx,
                    "ub": ub,
                    "cache": cache,
                    "slots": slots,
                    "device": dev.split("[")[0],
                    "compute_pred": round(pred, 1),
                    "compute_meas": round(meas, 1),
                    "compute_err": round(_err(pred, meas), 4),
                }
            )
    return rows


def summarize(rows: list[dict[str, Any]], fits: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "error" not in r]
    out: dict[str, Any] = {"device_rows": len(ok), "failed_points": len(rows) - len(ok)}
    for what, tol in TOL.items():
        for label, sel in (
            ("accelerators", [r for r in ok if r["device"] != "CPU"]),
            ("host", [r for r in ok if r["device"] == "CPU"]),
        ):
            errs = [abs(r[f"{what}_err"]) for r in sel if r[f"{what}_meas"] > 0 or r[f"{what}_pred"] > SLACK_MIB]
            out[f"{what}_within_{tol:.1%}_{label}"] = round(sum(e <= tol for e in errs) / max(len(errs), 1), 3)
            if what == "compute":
                out[f"compute_max_abs_err_{label}"] = round(max(errs, default=0.0), 4)
    worst = sorted(ok, key=lambda r: -abs(r["compute_err"]))[:8]
    out["worst_compute"] = [
        {
            k: r[k]
            for k in (
                "preset",
                "rpc_devices",
                "ctx",
                "ub",
                "cache",
                "fa",
                "device",
                "compute_pred",
                "compute_meas",
                "compute_err",
            )
        }
        for r in worst
    ]
    judged = [f for f in fits if "ours" in f]
    out["verdicts"] = len(judged)
    out["verdicts_differing"] = [f for f in judged if f["ours"] != f["engine"]]
    out["verdicts_skipped"] = len(fits) - len(judged)
    return out


def write(
    results: Path,
    rows: list[dict[str, Any]],
    fits: list[dict[str, Any]],
    meta: dict[str, Any],
    served: list[dict[str, Any]],
) -> dict[str, Any]:
    summary = summarize(rows, fits)
    summary["server_compute_within_10.0%"] = round(
        sum(abs(r["compute_err"]) <= TOL["compute"] for r in served) / max(len(served), 1), 3
    )
    (results / "fullscale.json").write_text(
        json.dumps({"summary": summary, "meta": meta, "rows": rows, "verdicts": fits, "server_rows": served}, indent=1)
        + "\n"
    )
    lines = [
        "# Ledger vs llama-fit-params at full scale (MiB)",
        "",
        "Generated by `make bench` (`python benchmarks/run.py fullscale`): sparse replicas of the presets in their "
        "mainline recipes, planned with `cpu-moe` (layers on the loopback RPC devices, experts on the CPU; CPU only "
        "when there is none), projected by `llama-fit-params -lv 4` with the plan's arguments. The compute figures "
        "are the plan's dry-run ones: llama-fit-params reserves the logits of every ubatch token, llama-server one "
        "per slot (its own reserve is checked below).",
        "",
        f"{meta['points']} points in {meta['seconds']} s. Tolerances: model {TOL['model']:.1%}, KV {TOL['context']:.0%}, "
        f"compute {TOL['compute']:.0%} (or 1 MiB: the engine prints whole MiB).",
        "",
        "## Summary",
        "",
    ]
    for k, v in summary.items():
        if k not in ("worst_compute", "verdicts_differing"):
            lines.append(f"- {k}: {v}")
    lines.append(f"- verdicts differing from llama-fit-params: {len(summary['verdicts_differing'])}")
    for f in summary["verdicts_differing"]:
        lines.append(f"  - {f}")
    lines += [
        "",
        "Worst compute points:",
        "",
        "| preset | rpc | ctx | ub | cache | fa | device | pred | meas | err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["worst_compute"]:
        lines.append(
            "| "
            + " | ".join(
                str(r[k])
                for k in ("preset", "rpc_devices", "ctx", "ub", "cache", "fa", "device", "compute_pred", "compute_meas")
            )
            + f" | {r['compute_err']:+.1%} |"
        )
    lines += [
        "",
        "## llama-server's own reserve",
        "",
        "The plan's compute buffers (llama-server reserves one output token per slot) against the server's log, "
        "at full size.",
        "",
        "| preset | rpc | ctx | ub | cache | slots | device | pred | meas | err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in served:
        lines.append(
            "| "
            + " | ".join(
                str(r[k])
                for k in (
                    "preset",
                    "rpc_devices",
                    "ctx",
                    "ub",
                    "cache",
                    "slots",
                    "device",
                    "compute_pred",
                    "compute_meas",
                )
            )
            + f" | {r['compute_err']:+.1%} |"
        )
    lines += [
        "",
        "## Every point",
        "",
        "| preset | rpc | ctx | ub | cache | fa | device | model pred | model meas | ctx pred | ctx meas | compute pred | compute meas | compute err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['preset']} | {r['rpc_devices']} | {r['ctx']} | {r['ub']} | error | | | | | | | | | |")
            continue
        lines.append(
            "| "
            + " | ".join(
                str(r[k])
                for k in (
                    "preset",
                    "rpc_devices",
                    "ctx",
                    "ub",
                    "cache",
                    "fa",
                    "device",
                    "model_pred",
                    "model_meas",
                    "context_pred",
                    "context_meas",
                    "compute_pred",
                    "compute_meas",
                )
            )
            + f" | {r['compute_err']:+.1%} |"
        )
    (results / "fullscale.md").write_text("\n".join(lines) + "\n")
    return summary


def main(results: Path) -> None:
    presets = list(PRESETS)
    points = sample_points(presets, {n: PRESETS[n][1].n_ctx_train for n in presets})
    with tempfile.TemporaryDirectory() as tmp:
        rows, fits, meta = run_grid(Path(tmp), points)
        served = server_rows(Path(tmp))
    summary = write(results, rows, fits, meta, served)
    print(json.dumps({k: v for k, v in summary.items() if k != "worst_compute"}, indent=1, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "results")
