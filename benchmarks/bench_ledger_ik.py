"""The ledger against the real ik_llama.cpp server: plans rendered for the ik build moetune makes,
started until the buffers are reserved, predicted vs measured model, KV and compute buffers per
device. Writes results/ledger-ik.md and results/ledger-ik.json. (The fit grid behind the ik
compute model is benchmarks/measure_buffers_ik.py.)"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from tests.engine_harness import loopback_hw, reserve_log, rpc_workers, strip_endpoint

from moetune.engine import registry
from moetune.engine.command import service_argv
from moetune.engine.facts import probe
from moetune.engine.logs import parse_log
from moetune.hardware.inventory import from_dict
from moetune.kinds import EngineKind
from moetune.model.archs import ARCHS, small_dims
from moetune.model.profile import load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.run.verify import IK_RESERVED

SETTINGS = [(4096, 512, "f16"), (16384, 1024, "q8_0"), (2048, 256, "f16"), (32768, 2048, "q8_0")]
STRATEGIES = [("all-gpu", 1), ("cpu-moe", 1), ("cpu-moe", 0), ("n-cpu-moe:2", 2), ("all-gpu", 2)]


def main(results: Path) -> None:
    ik = registry.builtin(EngineKind.IK)
    server = ik.binary("server")
    facts = {"ik": probe(server, EngineKind.IK)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            dims = replace(small_dims(arch, True), n_vocab=2048)
            p = load_profile(generate(Path(tmp) / f"{arch}.gguf", arch, dims, "f16").files[0])
            for ctx, ub, ct in SETTINGS:
                for strategy, n_rpc in STRATEGIES:
                    with rpc_workers(server.parent, 2, binary="rpc-server") as ends:
                        s = replace(
                            Settings(ctx=ctx, ubatch=ub, batch=max(ub, 2048), ctk=ct, ctv=ct), engine=EngineKind.IK
                        )
                        plan = make_plan(
                            [ServiceSpec(name="t", model=p, settings=s, strategy=strategy, engine="ik")],
                            from_dict(loopback_hw(ends[:n_rpc])),
                        )
                        sp = plan.main
                        ok, log = reserve_log(
                            server, strip_endpoint(service_argv(sp, facts)), timeout=120, marker=IK_RESERVED
                        )
                    bufs = parse_log(log).device_buffers() if ok else {}
                    items = {(d, i.what): i.mib for d, its in sp.memory.items.items() for i in its}
                    for d in ["CPU", *(a.name for a in plan.hw.accelerators())]:
                        b = bufs.get(d)
                        rows.append(
                            {
                                "arch": arch,
                                "ctx": ctx,
                                "ub": ub,
                                "ct": ct,
                                "strategy": strategy,
                                "rpc": n_rpc,
                                "device": d.split("[")[0],
                                "ok": ok,
                                "model_pred": round(items.get((d, "weights"), 0.0), 2),
                                "model_meas": b.model_mib if b else None,
                                "kv_pred": round(items.get((d, "kv"), 0.0), 2),
                                "kv_meas": b.kv_mib if b else None,
                                "compute_pred": round(items.get((d, "compute"), 0.0), 2),
                                "compute_meas": b.compute_mib if b else None,
                            }
                        )
            print(arch, sum(r["ok"] for r in rows), len(rows), flush=True)

    def share(sel: list[dict], key: str, tol: float) -> float | None:
        vals = [r for r in sel if r["ok"] and r[f"{key}_meas"] is not None and r[f"{key}_meas"] > 0.05]
        if not vals:
            return None
        return round(
            sum(abs(r[f"{key}_pred"] - r[f"{key}_meas"]) <= tol * r[f"{key}_meas"] + 0.02 for r in vals) / len(vals), 3
        )

    single = [r for r in rows if (r["rpc"] <= 1 and r["device"] != "CPU") or r["rpc"] == 0]
    summary = {
        "points": len(rows),
        "failed_starts": sum(not r["ok"] for r in rows),
        "model_within_0.5pct": share(rows, "model", 0.005),
        "kv_within_1pct": share(rows, "kv", 0.01),
        "compute_within_10pct_all": share(rows, "compute", 0.10),
        "compute_within_10pct_single_device": share(single, "compute", 0.10),
        "compute_within_10pct_single_device_by_arch": {
            a: share([r for r in single if r["arch"] == a], "compute", 0.10) for a in ARCHS
        },
        "compute_median_abs_err": round(
            statistics.median(
                abs(r["compute_pred"] - r["compute_meas"]) / r["compute_meas"]
                for r in rows
                if r["ok"] and r["compute_meas"]
            ),
            3,
        ),
    }
    (results / "ledger-ik.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    lines = [
        "# Ledger against ik_llama.cpp: predicted vs measured (MiB)",
        "",
        "Generated by `make bench` (benchmarks/bench_ledger_ik.py): the ik llama-server `moetune engine install "
        "--kind ik_llama.cpp` builds, on generated models, loopback ik rpc-servers, flash attention on "
        "(ik's default).",
        "",
        "Summary: " + json.dumps(summary),
        "",
        "| arch | ctx | ub | cache | strategy | rpc | device | model pred | model meas | kv pred | kv meas | "
        "compute pred | compute meas |",
        "|" + "---|" * 13,
    ]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                str(r[k])
                for k in (
                    "arch",
                    "ctx",
                    "ub",
                    "ct",
                    "strategy",
                    "rpc",
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
    (results / "ledger-ik.md").write_text("\n".join(lines) + "\n")
