"""Planner benchmarks.

1. Time to plan the GLM-5.1-sized replica over 2 GPUs + CPU with a two-worker layout (goal: under
   200 ms), in-process, median of 20.
2. moetune plan vs llama-fit-params on a GLM-5.1-sized replica written with mainline types (the
   same fit question), side by side.
3. The ledger against llama-server's own accounting over a grid of models, settings and
   placements (CPU + loopback RPC devices): every predicted and measured buffer, to
   results/ledger.md and results/ledger.json.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moetune.engine import registry
from moetune.engine.command import service_argv
from moetune.engine.logs import parse_log
from moetune.hardware.inventory import from_dict, load
from moetune.model.archs import ARCHS, PRESET_RECIPES, PRESETS, Dims, mainline_recipe, small_dims
from moetune.model.profile import load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/engine_harness.py
from tests.engine_harness import loopback_hw, reserve_log, rpc_workers, strip_endpoint

ROOT = Path(__file__).resolve().parent.parent
MAINLINE_GLM = mainline_recipe("glm-5.1")


def _median_ms(fn: object, n: int = 20) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def plan_timing(d: Path) -> dict[str, object]:
    arch, dims = PRESETS["glm-5.1"]
    glm = load_profile(
        generate(d / "GLM-5.1.gguf", arch, dims, PRESET_RECIPES["glm-5.1"], shards=8, sparse=True).files[0]
    )
    coder = load_profile(
        generate(
            d / "coder.gguf",
            "qwen35moe",
            Dims(
                n_layer=48,
                n_embd=2048,
                n_head=16,
                n_head_kv=2,
                head_dim=256,
                n_expert=512,
                n_expert_used=10,
                n_ff_exp=512,
                full_attention_interval=4,
            ),
            "ffn_gate_exps=q4_0,ffn_up_exps=q4_0,ffn_down_exps=q4_0,other=q8_0",
            sparse=True,
        ).files[0]
    )
    hw = load("rtx-pro-6000x2")
    worker = Settings(ctx=2 * 131072, slots=2, ctk="q8_0", ctv="q8_0")
    services = [
        ServiceSpec(
            name="grandpa",
            model=glm,
            settings=Settings(ctx=32768, ctk="q8_0", ctv="q8_0", batch=4096, ubatch=4096),
            strategy="auto",
        ),
        ServiceSpec(name="coder1", model=coder, settings=worker, strategy="all-gpu", port=8081, devices=("CUDA0",)),
        ServiceSpec(name="coder2", model=coder, settings=worker, strategy="all-gpu", port=8082, devices=("CUDA1",)),
    ]
    layout_ms = _median_ms(lambda: make_plan(services, hw))
    single_ms = _median_ms(lambda: make_plan([services[0]], hw))
    p = make_plan(services, hw)
    return {
        "layout_plan_ms": round(layout_ms, 1),
        "single_plan_ms": round(single_ms, 1),
        "goal_ms": 200,
        "layout_fits": p.fits,
        "grandpa_tg_tok_s": round(p.main.prediction.tg_tok_s, 2),
    }


def fit_params_side_by_side(d: Path) -> dict[str, object]:
    arch, dims = PRESETS["glm-5.1"]
    g = generate(d / "GLM-mainline.gguf", arch, dims, MAINLINE_GLM, shards=8, sparse=True)
    fit = registry.get().binary("fit")
    # -nr: CPU weight repacking aborts graph scheduling for glm-dsa on this CPU (DESIGN.md section 5)
    cmd = [str(fit), "-m", str(g.files[0]), "-c", "32768", "-ctk", "q8_0", "-ctv", "q8_0", "-fitp", "on", "-nr"]
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        ts.append(time.perf_counter() - t0)
    prof = load_profile(g.files[0])
    hw = from_dict({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 24000, "ram_bw_gbs": 20}}]})
    s = Settings(ctx=32768, ctk="q8_0", ctv="q8_0")
    ours = _median_ms(
        lambda: (
            load_profile(g.files[0]),
            make_plan([ServiceSpec(name="m", model=prof, settings=s, strategy="cpu-moe")], hw),
        ),
        5,
    )
    return {
        "llama_fit_params_s": round(statistics.median(ts), 3),
        "llama_fit_params_rc": r.returncode,
        "llama_fit_params_projection": r.stdout.strip().splitlines()[-2:],
        "moetune_inspect_and_plan_ms": round(ours, 1),
        "command": " ".join(cmd[1:]),
    }


CASES = [
    (arch, wide, ctx, ub, ct, strat, n_rpc)
    for arch in ("qwen3moe", "glm4moe", "deepseek2", "qwen35moe", "glm-dsa")
    for wide in (False, True)
    for ctx, ub in ((2048, 512), (8192, 256), (16384, 1024))
    for ct in ("f16",)
    for strat, n_rpc in (("all-gpu", 1), ("cpu-moe", 1), ("n-cpu-moe:2", 2), ("cpu-moe", 0))
]


def ledger_table(d: Path) -> list[dict[str, object]]:
    server = registry.get().binary("server")
    rows: list[dict[str, object]] = []
    models = {}
    for arch in ARCHS:
        for wide in (False, True):
            models[(arch, wide)] = load_profile(
                generate(d / f"{arch}-{int(wide)}.gguf", arch, small_dims(arch, wide), "f16").files[0]
            )
    for arch, wide, ctx, ub, ct, strat, n_rpc in CASES:
        with rpc_workers(server.parent, n_rpc) as ends:
            hw = from_dict(loopback_hw(ends))
            s = Settings(ctx=ctx, ubatch=ub, batch=max(ub, 2048), ctk=ct, ctv=ct)
            sp = make_plan([ServiceSpec(name="t", model=models[(arch, wide)], settings=s, strategy=strat)], hw).main
            ok, log = reserve_log(server, [*strip_endpoint(service_argv(sp)), "-lv", "4"], timeout=120)
            if not ok:
                rows.append({"case": [arch, wide, ctx, ub, ct, strat, n_rpc], "error": log[-300:]})
                continue
            parsed = parse_log(log).device_buffers()
            items = {(dev, i.what): i.mib for dev, its in sp.memory.items.items() for i in its}
            for dev in [a.name for a in hw.accelerators()] + ["CPU"]:
                got = parsed.get(dev)
                if got is None:
                    continue
                pred_model = (
                    sum(sp.memory.mapped_span_mib.values()) if dev == "CPU" else items.get((dev, "weights"), 0.0)
                )
                got_model = parsed["CPU_Mapped"].model_mib if dev == "CPU" and "CPU_Mapped" in parsed else got.model_mib
                rows.append(
                    {
                        "arch": arch + ("-w" if wide else ""),
                        "ctx": ctx,
                        "ub": ub,
                        "strategy": strat,
                        "rpc_devices": n_rpc,
                        "device": dev.split("[")[0],
                        "model_pred": round(pred_model, 2),
                        "model_meas": got_model,
                        "kv_pred": round(items.get((dev, "kv"), 0.0), 2),
                        "kv_meas": round(got.kv_mib + got.rs_mib, 2),
                        "compute_pred": round(items.get((dev, "compute"), 0.0), 2),
                        "compute_meas": got.compute_mib,
                    }
                )
    return rows


def _err(p: float, m: float) -> float:
    return (p - m) / m if m else 0.0


def write_ledger(results: Path, rows: list[dict[str, object]]) -> dict[str, object]:
    ok = [r for r in rows if "error" not in r]
    comp = [abs(_err(float(r["compute_pred"]), float(r["compute_meas"]))) for r in ok if float(r["compute_meas"]) >= 1]  # type: ignore[arg-type]
    single = [
        abs(_err(float(r["compute_pred"]), float(r["compute_meas"])))
        for r in ok  # type: ignore[arg-type]
        if float(r["compute_meas"]) >= 1 and r["rpc_devices"] != 2 and r["device"] != "CPU"
    ]  # type: ignore[arg-type]
    model = [abs(_err(float(r["model_pred"]), float(r["model_meas"]))) for r in ok if float(r["model_meas"]) > 0.05]  # type: ignore[arg-type]
    kv = [abs(_err(float(r["kv_pred"]), float(r["kv_meas"]))) for r in ok if float(r["kv_meas"]) > 0]  # type: ignore[arg-type]
    summary = {
        "points": len(ok),
        "failed_starts": len(rows) - len(ok),
        "model_within_0.5pct": round(sum(e <= 0.005 for e in model) / max(len(model), 1), 3),
        "kv_within_1pct": round(sum(e <= 0.01 for e in kv) / max(len(kv), 1), 3),
        "compute_within_10pct_all": round(sum(e <= 0.10 for e in comp) / max(len(comp), 1), 3),
        "compute_within_10pct_single_accelerator": round(sum(e <= 0.10 for e in single) / max(len(single), 1), 3),
        "compute_median_abs_err": round(statistics.median(comp), 3) if comp else None,
    }
    (results / "ledger.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    lines = [
        "# Ledger: predicted vs measured (MiB)",
        "",
        "Generated by `make bench` (benchmarks/bench_plan.py): llama-server -lv 4 on generated models, loopback RPC devices.",
        "",
        "Summary: " + ", ".join(f"{k} = {v}" for k, v in summary.items()),
        "",
        "| arch | ctx | ub | strategy | rpc | device | model pred | model meas | kv pred | kv meas | compute pred | compute meas |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ok:
        lines.append(
            "| "
            + " | ".join(
                str(r[k])
                for k in (
                    "arch",
                    "ctx",
                    "ub",
                    "strategy",
                    "rpc_devices",
                    "device",
                    "model_pred",
                    "model_meas",
                    "kv_pred",
                    "kv_meas",
                    "compute_pred",
                    "compute_meas",
                )
            )
            + " |"
        )
    (results / "ledger.md").write_text("\n".join(lines) + "\n")
    return summary


def main(results: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        timing = plan_timing(d)
        side = fit_params_side_by_side(d)
        summary = write_ledger(results, ledger_table(d))
    doc = {"plan_timing": timing, "fit_params_side_by_side": side, "ledger_summary": summary}
    (results / "plan.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "results")
