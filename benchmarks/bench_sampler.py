"""What watching costs: the sampler (moetune.monitor) against a real llama-server with --metrics on
a generated MoE model.

1. Overhead: the sampler thread's own CPU time over 30 s at the default 1 Hz, watching the
   server's process, the host and the server's /metrics, as a share of one core (goal: under 1%);
   and the cost of one sample.
2. Effect on the benchmark: single-stream TG of the same server (a generated model of about
   0.8 GB, so that a token takes milliseconds of real work), measured in blocks with the sampler
   on (1 Hz) and off in ABBA order (drift cancels), compared with the benchmark's own statistics
   (the change and its 95% interval; goal: no significant difference).

Writes results/sampler.json and results/sampler.md.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.helpers import engine_bin_dir, llama_server  # noqa: E402

from moetune.bench.analysis.single import bench_metrics  # noqa: E402
from moetune.bench.analysis.stats import difference  # noqa: E402
from moetune.bench.single.runner import BenchOptions, bench  # noqa: E402
from moetune.bench.single.workloads import expand  # noqa: E402
from moetune.model.archs import Dims  # noqa: E402
from moetune.model.testmodel import generate  # noqa: E402
from moetune.monitor.sampler import RunMonitor, Sampler, Watch  # noqa: E402
from moetune.procfs import read_proc_stat  # noqa: E402
from moetune.store.db import ResultsDB  # noqa: E402

OVERHEAD_S = 30.0
ORDER = ("on", "off", "off", "on", "off", "on", "on", "off")  # each block a bench run of REPEATS
REPEATS = 4


def _watch(pid: int, url: str) -> list[Watch]:
    st = read_proc_stat(pid)
    return [
        Watch(
            name="server",
            role="server",
            pid=pid,
            start_ticks=st.start_ticks if st else None,
            metrics_url=f"{url}/metrics",
        )
    ]


def main(results: Path) -> None:
    bin_dir = engine_bin_dir()
    assert bin_dir is not None, "llama.cpp is not built: make engine"
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.environ["MOETUNE_DATA_DIR"] = str(d / "data")
        model = d / "m.gguf"
        generate(model, "qwen3moe", Dims(n_layer=8, n_embd=1024, n_head=8, head_dim=128, n_ff_exp=1024), "f16")
        with llama_server(bin_dir, model, d / "s.log", "-nr", "-c", "2048", "-t", "1", "--metrics") as srv:
            watches = _watch(srv.proc.pid, srv.url)
            s = Sampler(watches=lambda: watches, interval_s=1.0).start()
            t0 = time.monotonic()
            time.sleep(OVERHEAD_S)
            s.stop()
            wall = time.monotonic() - t0
            overhead = {
                "seconds": round(wall, 1),
                "samples": s.count,
                "cpu_seconds": round(s.cpu_seconds, 4),
                "pct_of_one_core": round(100 * s.cpu_seconds / wall, 3),
                "ms_per_sample": round(1000 * s.cpu_seconds / max(1, s.count), 2),
                "server_metrics_scraped": bool(s.latest and s.latest.servers),
            }
            print(f"sampler: {overhead}", flush=True)

            w = expand([], [], depths=[0], pp_tokens=64, tg_tokens=64)
            blocks = []
            tg: dict[str, list[float]] = {"on": [], "off": []}
            with ResultsDB.open(d / "r.db") as db:
                for mode in ORDER:
                    mon = RunMonitor(lambda: watches, interval_s=1.0 if mode == "on" else 0.0)
                    with mon:
                        rid = bench(db, srv.url, w, BenchOptions(repeats=REPEATS, warmup=1), label=mode, monitor=mon)
                    m = bench_metrics(db.samples(rid))
                    tg[mode] += list(m["tg:d0"].values)
                    blocks.append((mode, round(statistics.median(m["tg:d0"].values), 2)))
                    print(f"  {mode}: TG {blocks[-1][1]} tok/s", flush=True)
    diff = difference(tg["off"], tg["on"], higher_is_better=True)
    effect: dict[str, Any] = {
        "workload": w[0].name,
        "blocks": blocks,
        "repeats": REPEATS,
        "tg_off_median": round(statistics.median(tg["off"]), 2),
        "tg_on_median": round(statistics.median(tg["on"]), 2),
        "difference": {
            "ratio": round(diff.ratio, 4),
            "ci": [round(diff.ratio_ci_low, 4), round(diff.ratio_ci_high, 4)],
            "verdict": diff.verdict,
        },
    }
    doc = {"overhead": overhead, "effect": effect}
    (results / "sampler.json").write_text(json.dumps(doc, indent=2, default=str))
    (results / "sampler.md").write_text(
        "# Sampler overhead (`make bench`, benchmarks/bench_sampler.py)\n\n"
        f"Sampler at 1 Hz watching a llama-server (its process, the host, its /metrics) for "
        f"{overhead['seconds']} s: {overhead['samples']} samples, {overhead['cpu_seconds']} s of CPU, "
        f"**{overhead['pct_of_one_core']}% of one core** ({overhead['ms_per_sample']} ms per sample; goal < 1%).\n\n"
        f"TG ({effect['workload']}, 64 tokens) in {len(ORDER)} runs of {REPEATS} in ABBA order: sampler off "
        f"{effect['tg_off_median']} tok/s, on {effect['tg_on_median']} tok/s: ratio {diff.ratio:.3f} "
        f"(95% CI {diff.ratio_ci_low:.3f}-{diff.ratio_ci_high:.3f}), verdict: {diff.verdict}.\n"
    )
    print(json.dumps(doc, indent=2, default=str))
