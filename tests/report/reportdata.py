"""Report inputs made to order: a plan document, a filled results history (two bench runs of a
plan, a serve-bench run) with machine snapshots written the way the sampler writes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moetune.kinds import RunKind
from moetune.monitor.snapshot import GpuSample, HostSample, ProcSample, Snapshot
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta
from tests.bench.synth import run_samples

T0 = 1.8e9  # the synthetic samples' t_unix_s
GIB = 1 << 30


def plan_doc(cpu_layers: tuple[int, ...] = (3,), n_layer: int = 6, label: str | None = None) -> dict[str, Any]:
    """A plan as `moetune plan -o` writes it (the parts the page reads): two devices, layer 0
    dense, the experts of ``cpu_layers`` on the CPU and the rest on CUDA0."""
    layers = []
    for i in range(n_layer):
        experts = (
            {}
            if i == 0
            else {k: "CPU" if i in cpu_layers else "CUDA0" for k in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}
        )
        layers.append(
            {
                "index": i,
                "kind": "dense" if i == 0 else "moe",
                "device": "CUDA0",
                "experts": experts,
                "expert_mib": 0.0 if i == 0 else 300.0,
            }
        )
    doc: dict[str, Any] = {
        "schema_version": 1,
        "fits": True,
        "devices": [
            {
                "name": "CUDA0",
                "kind": "gpu",
                "capacity_mib": 24000.0,
                "used_mib": 20000.0,
                "free_mib": 4000.0,
                "items": [
                    {"what": "weights", "mib": 12000.0, "service": "main"},
                    {"what": "kv", "mib": 6000.0, "service": "main"},
                    {"what": "compute", "mib": 2000.0, "service": "main"},
                ],
            },
            {
                "name": "CPU",
                "kind": "cpu",
                "capacity_mib": 64000.0,
                "used_mib": 3000.0,
                "free_mib": 61000.0,
                "items": [{"what": "weights", "mib": 3000.0, "service": "main"}],
            },
        ],
        "shortfalls": [],
        "warnings": [],
        "predicted": {"tg_tok_s": 42.0, "pp_tok_s": 900.0},
        "argv": ["llama-server", "-m", "/m.gguf"],
        "shell": "#!/bin/sh\nexec llama-server -m /m.gguf -ngl 999\n",
        "services": [
            {
                "name": "main",
                "model": "/m.gguf",
                "arch": "qwen3moe",
                "strategy": "auto",
                "settings": {
                    "ctx": 4096,
                    "slots": 1,
                    "batch": 2048,
                    "ubatch": 512,
                    "ctk": "f16",
                    "ctv": "f16",
                    "flash_attn": True,
                    "engine": "llama.cpp",
                },
                "layers": layers,
                "tensor_split": [],
                "override_rules": [],
                "predicted": {
                    "tg_tok_s": 42.0,
                    "pp_tok_s": 900.0,
                    "graph_splits": 3,
                    "rpc_hops": 0,
                    "per_device": [{"device": "CPU", "read_mib_per_token": 10.0, "decode_ms": 5.0, "bw_gbs": 20.0}],
                },
                "notes": [],
            }
        ],
        "hardware": "test-rig",
    }
    if label:
        doc["label"] = label
    return doc


def serve_sample(c: int, i: int, *, ttft: float, itl: float, tokens: int = 8) -> dict[str, Any]:
    t_send = 100.0 + i
    first = t_send + ttft
    chunks = [[first + k * itl, 1, 1, 0] for k in range(tokens)]
    return {
        "concurrency": c,
        "rate": None,
        "t_sched": t_send,
        "t_slot": t_send,
        "t_send": t_send,
        "t_end": chunks[-1][0] + 0.001,
        "chunks": chunks,
        "error": None,
        "usage": {"prompt_tokens": 16, "completion_tokens": tokens},
        "timings": None,
        "max_tokens": tokens,
        "prompt_tokens": 16,
        "retries": [],
        "count_source": "usage",
    }


def snapshot(t: float, phase: str | None, *, cpu: float = 50.0, rss_gib: float = 3.0, gpu: bool = True) -> Snapshot:
    return Snapshot(
        t=t,
        host=HostSample(cpu_pct=(cpu, cpu / 2), mem_total_bytes=64 * GIB, mem_used_bytes=int(10 * GIB), load1=1.0),
        procs=(
            ProcSample(
                name="main", role="server", node="local", pid=4242, cpu_pct=cpu * 1.5, rss_bytes=int(rss_gib * GIB)
            ),
        ),
        gpus=(GpuSample(index=0, name="RTX", util_pct=cpu, mem_used_bytes=20 * GIB, mem_total_bytes=24 * GIB),)
        if gpu
        else (),
        servers={"main": {"llamacpp:requests_processing": 1.0}},
        load={"requests_in_flight": 1.0},
        phase=phase,
    )


def fill_history(path: Path, *, label_a: str = "cpu-moe", label_b: str = "head+tail") -> dict[str, int]:
    """Two bench runs of the plan (B faster), one serve-bench run at c=1,2,4; snapshots for A."""
    ids: dict[str, int] = {}
    with ResultsDB.open(path) as db:
        for label, tg in ((label_a, 18.84), (label_b, 21.75)):
            meta = RunMeta(
                kind=RunKind.BENCH,
                argv=("moetune", "bench", "plan.json"),
                engine_build="b1",
                plan=plan_doc(label="the plan"),
            )
            rid = db.create_run(meta, label=label, target="plan.json")
            for s in run_samples([tg * f for f in (0.999, 1.0, 1.001, 0.998, 1.002)]):
                db.add_sample(rid, s)
            for s in run_samples([tg * 0.9] * 3, workload="d4096", depth=4096, expect_cached=4096, cache_n=4096):
                db.add_sample(rid, {**s, "t_unix_s": T0 + 10})
            db.finish_run(rid)
            ids[label] = rid
        a = ids[label_a]
        for k in range(12):
            db.add_metrics(a, T0 + k, snapshot(T0 + k, "short-json" if k < 6 else "d4096", cpu=20.0 + 5 * k).to_json())
        meta = RunMeta(kind=RunKind.SERVE_BENCH, argv=("moetune", "serve-bench"), details={"workload": {}})
        sid = db.create_run(meta, label="serve", target="http://127.0.0.1:8080")
        for c in (1, 2, 4):
            for i in range(6):
                db.add_sample(sid, serve_sample(c, i, ttft=0.05 * c * (1 + i / 20), itl=0.01 * (1 + c / 4)))
        db.finish_run(sid)
        ids["serve"] = sid
    return ids
