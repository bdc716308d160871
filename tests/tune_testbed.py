"""The tuning testbed (tests/test_tune.py and benchmarks/bench_tune.py): a generated MoE model,
this machine's CPU plus one loopback ggml-rpc-server device, the grid of plan options the tuner
searches, and the grid measured exhaustively with `moetune plan` and `moetune sweep`."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import replace
from pathlib import Path

import yaml

from moetune.bench.analysis.single import bench_metrics
from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from moetune.plan.tune import Candidate
from moetune.store.db import ResultsDB
from tests.engine_harness import free_port
from tests.helpers import run_cli

STRATEGIES = ("auto", "cpu-moe")
THREADS = (1, 2)
UBATCHES = (128, 512)
FLASH_ATTN = (True, False)
TRY = [
    "--try-strategy",
    ",".join(STRATEGIES),
    "--try-threads",
    ",".join(map(str, THREADS)),
    "--try-ubatch",
    ",".join(map(str, UBATCHES)),
    "--try-fa",
    "on,off",
    "--try-cache",
    "f16/f16",
    "--try-repack",
    "off",
    "--repack",
    "off",
]  # repacking crashes at load on an AMX CPU (DESIGN.md section 5)
# every engine axis tune turns on a CPU, repacking included (it crashes only on an AMX CPU): the
# benchmarks' search (benchmarks/bench_speed_axes.py, bench_referee.py)
TRY_EVERY_AXIS = [
    "--try-threads",
    ",".join(map(str, THREADS)),
    "--try-ubatch",
    ",".join(map(str, UBATCHES)),
    "--try-fa",
    "on,off",
    "--try-cache",
    "f16/f16,q8_0/q8_0",
    "--try-repack",
    "off,on",
]
WORKLOAD = ["--depth", "0", "--pp-tokens", "256", "--tg-tokens", "64", "-r", "3", "--warmup", "1"]
WORKLOAD_NAME = "d0"
# the two grid runs a calibration is made from: two placements, two thread counts (two runs of one
# placement cannot tell a graph split's cost from the fixed cost per token)
CALIBRATE_ON = ("cpu-moe t1 ub512 fa", "auto t2 ub128 no-fa")


def make_testbed(
    d: Path, *, rpc_mem_mib: float = 16000, cpu_ram_mib: float = 16000, rpc_devices: int = 1
) -> tuple[Path, Path]:
    """The model (8 MoE layers, 16 experts, q8_0, 58 MiB) and a hardware file: 2 cores, and
    ``rpc_devices`` RPC workers (their CPU backends: RPC0, RPC1, ...) on free loopback ports."""
    model = d / "tune-model.gguf"
    if not model.exists():
        generate(model, "qwen3moe", replace(small_dims("qwen3moe", True), n_layer=8), "q8_0")
    hw = d / "tune-hw.yaml"
    hw.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": "local", "cpu": {"cores": 2, "ram_mib": cpu_ram_mib, "ram_bw_gbs": 20}},
                    *(
                        {
                            "name": f"w{i}",
                            "link_addr": "127.0.0.1",
                            "rpc_port": free_port(),
                            "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20},
                            "devices": [{"name": "CPU", "kind": "cpu", "mem_mib": rpc_mem_mib, "bw_gbs": 20}],
                        }
                        for i in range(rpc_devices)
                    ),
                ]
            }
        )
    )
    return model, hw


def grid() -> list[Candidate]:
    return [
        Candidate(strategy=st, threads=t, ubatch=ub, batch=2048, flash_attn=fa)
        for st, t, ub, fa in itertools.product(STRATEGIES, THREADS, UBATCHES, FLASH_ATTN)
    ]


def plan_grid(d: Path, model: Path, hw: Path, port: int) -> Path:
    """Every grid point as a plan file (`moetune plan`), and the sweep file that lists them."""
    plans = []
    for c in grid():
        out = d / f"grid-{len(plans)}.json"
        args = [
            "plan",
            str(model),
            "--hw",
            str(hw),
            "--strategy",
            c.strategy,
            "-t",
            str(c.threads),
            "-ub",
            str(c.ubatch),
            "--repack",
            "off",
            "--port",
            str(port),
            "-o",
            str(out),
            "--json",
            "--ctk",
            c.ctk,
            "--ctv",
            c.ctv,
        ]
        r = run_cli(
            *args, "--flash-attn", "on" if c.flash_attn else "off"
        )  # as the candidate says, not the plan's pick
        assert r.exit_code == 0, r.stderr
        plans.append({"label": c.label, "plan": out.name})
    sweep = d / "grid.yaml"
    sweep.write_text(yaml.safe_dump({"name": "tune grid", "plans": plans}))
    return sweep


def measure_grid(sweep: Path, dbs: list[Path]) -> dict[str, list[list[float]]]:
    """Every grid point launched and measured once per history in ``dbs``: its TG samples, one
    list per launch. On this shared 2-core machine one launch's runs agree within a few percent
    while two launches of the same plan can differ by 15-25%, so a grid point is judged by
    several launches."""
    out: dict[str, list[list[float]]] = {}
    for db in dbs:
        r = run_cli("sweep", str(sweep), *WORKLOAD, "--db", str(db), "--json")
        assert r.exit_code == 0, r.stderr
        for label, v in tg_values(db).items():
            out.setdefault(label, []).append(v)
    return out


def pooled(grid: dict[str, list[list[float]]]) -> dict[str, list[float]]:
    return {k: [x for launch in v for x in launch] for k, v in grid.items()}


def launch_sigma(grid: dict[str, list[list[float]]]) -> float:
    """The spread of one launch's median (log scale), from the differences between two launches
    of each grid point: d = log(m1/m2) ~ N(0, 2 sigma^2), whose median |d| is 0.954 sigma."""
    ds = sorted(abs(math.log(statistics.median(v[0]) / statistics.median(v[1]))) for v in grid.values() if len(v) > 1)
    return ds[len(ds) // 2] / 0.954 if ds else 0.0


def tg_values(db: Path) -> dict[str, list[float]]:
    """Measured TG samples of every completed run in a history, by label."""
    out = {}
    with ResultsDB.open(db) as h:
        for run in h.runs():
            m = bench_metrics(h.samples(run.id)).get(f"tg:{WORKLOAD_NAME}")
            if m is not None:
                out[run.label] = list(m.values)
    return out


def run_ids(db: Path) -> dict[str, int]:
    with ResultsDB.open(db) as h:
        return {r.label: r.id for r in h.runs()}
