"""Tune and calibration on this machine's testbed (tests/tune_testbed.py): 16 configurations
(placement auto | cpu-moe, 1 | 2 threads, -ub 128 | 512, flash attention on | off) of a generated
MoE model on the CPU plus one loopback ggml-rpc-server device, measured exhaustively.

1. Prediction error before and after calibration: for every pair of grid configurations, the speed
   model is fitted on the pair and predicts the other 14 (median absolute error of TG and PP); the
   built-in constants' error on the same configurations beside it.
2. Launches: `moetune tune` from the slowest corner (cpu-moe, one thread) with a budget of 5, and
   after `moetune calibrate` on two grid runs with a budget of 3, against the grid's best.

Writes results/tune.json and results/tune.md.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.engine_harness import free_port  # noqa: E402
from tests.helpers import run_cli  # noqa: E402
from tests.tune_testbed import (  # noqa: E402
    CALIBRATE_ON,
    TRY,
    WORKLOAD,
    launch_sigma,
    make_testbed,
    measure_grid,
    plan_grid,
    pooled,
    run_ids,
    tg_values,
)

from moetune.bench.analysis.single import bench_metrics  # noqa: E402
from moetune.bench.analysis.stats import difference  # noqa: E402
from moetune.plan.calibrate import NOISE_FLOOR_PCT, Observation, fit, predict_pp, predict_tg  # noqa: E402
from moetune.plan.speed import SpeedConstants  # noqa: E402
from moetune.store.db import ResultsDB  # noqa: E402
from moetune.tune.history import gather  # noqa: E402


def _err(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas * 100.0


def _errors(obs: list[Observation], k: SpeedConstants) -> tuple[float, float]:
    tg = [_err(predict_tg(o, k), o.measured_tg) for o in obs if o.measured_tg]
    pp = [_err(predict_pp(o, k), o.measured_pp) for o in obs if o.measured_pp]
    return statistics.median(tg), statistics.median(pp)


# the model before its RPC wake-up term and its noise-sized prior: a run's work without host threads
# (the term then never applies) and a prior weight of 1e-5 (a doubling for a 0.2% gain)
OLD_PRIOR_NOISE_PCT = 100 * math.expm1(math.sqrt(1e-5) * math.log(2))
VARIANTS: dict[str, tuple[bool, float]] = {  # name: (work keeps the host's threads, noise_pct of the prior)
    "this model": (True, NOISE_FLOOR_PCT),
    "without the RPC wake-up term": (False, NOISE_FLOOR_PCT),
    "prior weight 1e-5": (True, OLD_PRIOR_NOISE_PCT),
    "both (the model before)": (False, OLD_PRIOR_NOISE_PCT),
}


def prediction_errors(db: Path, grid: dict[str, list[float]]) -> dict[str, Any]:
    """Each grid point's work (from its first launch's run) against its TG and PP over both launches."""
    with ResultsDB.open(db) as h:
        ((_, obs),) = gather(h).items()
        labels = {r.id: r.label for r in h.runs()}
        pp = {r.label: bench_metrics(h.samples(r.id))["pp:d0"].values for r in h.runs()}
    by_run = {
        o.run: replace(
            o, measured_tg=statistics.median(grid[labels[o.run]]), measured_pp=statistics.median(pp[labels[o.run]])
        )
        for o in obs
    }
    before = _errors(list(by_run.values()), SpeedConstants())
    out: dict[str, Any] = {
        "runs": len(by_run),
        "before": {"tg_median_abs_pct": round(before[0], 1), "pp_median_abs_pct": round(before[1], 1)},
    }
    for name, (threads, noise) in VARIANTS.items():
        runs = by_run if threads else {r: replace(o, work=replace(o.work, host_threads=0)) for r, o in by_run.items()}
        pairs = _pair_errors(runs, labels, noise)
        two = [p for p in pairs if len({x.split()[0] for x in p["pair"]}) == 2]
        one = [p for p in pairs if len({x.split()[0] for x in p["pair"]}) == 1]
        stats = {
            "after_pairs": _pair_stats(pairs),
            "after_pairs_of_two_placements": _pair_stats(two),
            "after_pairs_of_one_placement": _pair_stats(one),
        }
        if name == "this model":
            out.update(stats, pairs=pairs)
        out.setdefault("variants", {})[name] = stats
    return out


def _pair_errors(by_run: dict[int, Observation], labels: dict[int, str], noise_pct: float) -> list[dict[str, Any]]:
    pairs = []
    for a, b in itertools.combinations(sorted(by_run), 2):
        k = fit([by_run[a], by_run[b]], noise_pct=noise_pct)
        tg, pp = _errors([o for r, o in by_run.items() if r not in (a, b)], k)
        pairs.append(
            {"pair": [labels[a], labels[b]], "tg_median_abs_pct": round(tg, 1), "pp_median_abs_pct": round(pp, 1)}
        )
    return pairs


def _pair_stats(pairs: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "n": len(pairs),
        "tg_median_abs_pct": round(statistics.median(p["tg_median_abs_pct"] for p in pairs), 1),
        "pp_median_abs_pct": round(statistics.median(p["pp_median_abs_pct"] for p in pairs), 1),
        "tg_worst_pct": max(p["tg_median_abs_pct"] for p in pairs),
        "pp_worst_pct": max(p["pp_median_abs_pct"] for p in pairs),
    }


def tune_run(
    model: Path, hw: Path, port: int, db: Path, budget: int, grid: dict[str, list[float]], sigma: float
) -> dict[str, object]:
    t0 = time.monotonic()
    r = run_cli(
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--strategy",
        "cpu-moe",
        "-t",
        "1",
        *TRY,
        *WORKLOAD,
        "--port",
        str(port),
        "--budget",
        str(budget),
        "--db",
        str(db),
        "--json",
    )
    if r.exit_code != 0:
        raise RuntimeError(r.stderr)
    doc = json.loads(r.stdout)
    best_label = max(grid, key=lambda k: statistics.median(grid[k]))
    found = doc["best_candidate"]["label"]  # the search's reach (the engine defaults are not in the grid)
    reached = grid[found]  # as the grid measured it
    d = difference(grid[best_label], reached, higher_is_better=True)
    return {
        "budget": budget,
        "launches": doc["launches"],
        "stopped": doc["stopped"],
        "wall_s": round(time.monotonic() - t0, 1),
        "best": found,
        "defaults_win": doc["defaults_win"],
        "best_tg": round(statistics.median(reached), 1),
        "best_tg_in_search": round(statistics.median(tg_values(db)[found]), 1),
        "grid_best": best_label,
        "grid_best_tg": round(statistics.median(grid[best_label]), 1),
        "ratio_to_grid_best": round(statistics.median(reached) / statistics.median(grid[best_label]), 3),
        "verdict_vs_grid_best": d.verdict,
        "within_launch_noise": math.log(statistics.median(grid[best_label]) / statistics.median(reached))
        <= 1.96 * sigma,
        "tried": [c["label"] for c in doc["candidates"] if c["launched"]],
    }


def main(results: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.environ["MOETUNE_DATA_DIR"] = str(d / "data")
        model, hw = make_testbed(d)
        port = free_port()
        grid_db = d / "grid.db"
        t0 = time.monotonic()
        launches = measure_grid(plan_grid(d, model, hw, port), [grid_db, d / "grid2.db"])
        grid_s = time.monotonic() - t0
        grid, sigma = pooled(launches), launch_sigma(launches)
        errors = prediction_errors(grid_db, grid)
        cold = tune_run(model, hw, port, d / "cold.db", 5, grid, sigma)
        ids = run_ids(grid_db)
        r = run_cli("calibrate", str(ids[CALIBRATE_ON[0]]), str(ids[CALIBRATE_ON[1]]), "--db", str(grid_db))
        if r.exit_code != 0:
            raise RuntimeError(r.stderr)
        warm = tune_run(model, hw, port, d / "warm.db", 3, grid, sigma)
    doc = {
        "grid": {
            "configurations": len(grid),
            "wall_s": round(grid_s, 1),
            "launch_sigma_log": round(sigma, 3),
            "tg_median": {k: round(statistics.median(v), 1) for k, v in sorted(grid.items())},
        },
        "prediction": errors,
        "tune_cold": cold,
        "tune_calibrated": warm,
    }
    (results / "tune.json").write_text(json.dumps(doc, indent=2))
    lines = [
        "# tune and calibration on the testbed",
        "",
        "`python benchmarks/run.py tune` (`make bench` runs it with the others): 16 configurations of a generated",
        "MoE model (8 layers, 16 experts, q8_0) on this machine's 2 cores plus one loopback ggml-rpc-server device,",
        "each launched twice by `moetune sweep` and measured 3 times per launch after 1 warm-up (PP 256 tokens,",
        "TG 64 tokens); a configuration's figure pools both launches (two launches of one plan differ by",
        "15-25% on this shared machine, far more than the runs within one launch).",
        "",
        "## Grid (TG tokens/s, median)",
        "",
        "| configuration | TG |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v} |" for k, v in doc["grid"]["tg_median"].items()]  # type: ignore[union-attr]
    e = errors
    lines += [
        "",
        "## Prediction error on the grid",
        "",
        f"Built-in constants: TG {e['before']['tg_median_abs_pct']}%, PP {e['before']['pp_median_abs_pct']}% "
        "median absolute error.",
        "",
        "Calibrated on two configurations, predicting the other 14 (median over the pairs of each pair's "
        "median error; worst pair):",
        "",
        "| pairs | n | TG | PP | TG worst | PP worst |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, key in (
        ("all", "after_pairs"),
        ("two placements", "after_pairs_of_two_placements"),
        ("one placement", "after_pairs_of_one_placement"),
    ):
        st = e[key]
        lines.append(
            f"| {name} | {st['n']} | {st['tg_median_abs_pct']}% | {st['pp_median_abs_pct']}% | "
            f"{st['tg_worst_pct']}% | {st['pp_worst_pct']}% |"
        )
    lines += [
        "",
        "The same pairs fitted by the model without what this version added (one run, one grid):",
        "",
        "| model | TG, any two | PP, any two | TG, two placements | TG, one placement |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, st in e["variants"].items():
        lines.append(
            f"| {name} | {st['after_pairs']['tg_median_abs_pct']}% | {st['after_pairs']['pp_median_abs_pct']}% | "
            f"{st['after_pairs_of_two_placements']['tg_median_abs_pct']}% | "
            f"{st['after_pairs_of_one_placement']['tg_median_abs_pct']}% |"
        )
    lines += [
        "",
        "The RPC wake-up term: with one host thread no thread of ggml's pool polls while the host waits for",
        "an RPC reply, and each of cpu-moe's 17 hops a token wakes a sleeping core (`rpc_wake_us`).",
        "",
        "## Launches",
        "",
        "| run | budget | launches | best found | its TG (grid) | grid best | its TG | ratio | vs grid best | within launch noise |",
        "|---|---:|---:|---|---:|---|---:|---:|---|---|",
    ]
    for name, t in (("cold start", cold), ("after calibrating on 2 runs", warm)):
        lines.append(
            f"| {name} | {t['budget']} | {t['launches']} | {t['best']} | {t['best_tg']} | {t['grid_best']} | "
            f"{t['grid_best_tg']} | {t['ratio_to_grid_best']} | {t['verdict_vs_grid_best']} | "
            f"{'yes' if t['within_launch_noise'] else 'no'} |"
        )
    lines += [
        "",
        f"The exhaustive grid took {2 * len(grid)} launches ({doc['grid']['wall_s']} s). A search is judged by",
        "the grid's measurement of the configuration it reached: `vs grid best` is the comparison rule of",
        "`compare` on the pooled samples; `within launch noise`: the gap is under 1.96 sigma, sigma being",
        f"the spread of one launch's median measured from the grid's two launches per point ({sigma:.3f} in log).",
        "",
        "Prediction errors are against each configuration's median over both launches.",
    ]
    (results / "tune.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(HERE / "results")
