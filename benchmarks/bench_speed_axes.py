"""The speed model against the engine over the axes `tune` turns (issue #25): an exhaustive grid on
the tuning testbed's model (tests/tune_testbed.py, this machine's 2 cores and no RPC device) of
placement (auto | cpu-moe) x threads (1 | 2) x -ub (128 | 512) x attention (flash attention on
with an f16 cache, off, on with a q8_0 cache) x CPU weight repacking (off | on), measured at depth
512 by `moetune sweep`, three times (``MOETUNE_AXES_PASSES``): every other pass in the reverse
order, each configuration's truth the geometric mean of its launches (on this VM a whole launch
runs fast or slow: one pass alone scattered configurations identical in TG by 1.5x), and the
passes' own scatter reported beside, with the most a perfect model could score against their mean.

First `moetune hw attention --write` measures this CPU's attention kernels into the testbed's
hardware file (llama-bench on a generated model of the testbed's shapes, half a minute): every
plan of the grid starts from them. Reports the Spearman rank correlation (ties ranked alike) of
predicted and measured TG and PP with the built-in constants, with the measured attention terms,
and after calibrating on pairs of grid runs of two placements (predicting the rest: median
absolute errors and rank correlation, median over the pairs; a calibration reads two single
launches, the rest is judged against both passes); and `moetune tune --budget 3`
after calibrating on two runs, against the grid's best, alone and with `--confirm 2` (its two
best launched again), by the ratio of the geometric means and by `compare`'s verdict on the two
configurations' launches. Targets from the issue: TG median error <= 10%, PP <= 15%, TG rank
correlation >= 0.8 after calibrating on 2 runs; tune within 3% (or "same") of the grid's best.

Writes results/speed_axes.json and results/speed_axes.md. The machine is shared: the benchmark
reports the load average it started and ended with, and a grid measured beside other work says
so, not the model.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.engine_harness import free_port  # noqa: E402
from tests.helpers import run_cli  # noqa: E402
from tests.tune_testbed import TRY_EVERY_AXIS, make_testbed  # noqa: E402

from moetune.bench.analysis.stats import difference  # noqa: E402
from moetune.hardware import CPU_SPEED_KEYS  # noqa: E402
from moetune.hardware.inventory import load  # noqa: E402
from moetune.plan.calibrate import FITTED, Observation, fit, predict_pp, predict_tg  # noqa: E402
from moetune.plan.speed import SpeedConstants, base_constants  # noqa: E402
from moetune.store.db import ResultsDB  # noqa: E402
from moetune.tune.history import gather  # noqa: E402

DEPTH = 512
WORKLOAD = ["--depth", str(DEPTH), "--pp-tokens", "256", "--tg-tokens", "128", "-r", "3", "--warmup", "1"]
ATTENTION = ((True, "f16"), (False, "f16"), (True, "q8_0"))  # flash attention, cache type of K and V
# the grid measured this many times, every other pass in the reverse order
PASSES = int(os.environ.get("MOETUNE_AXES_PASSES", "3"))
GRIDS = "speed_axes_grids"  # under results/: every run's grid, for speed_axes_rescore
# what a calibration fits on a hardware file with measured attention terms (`calibrate` holds them)
ATTENTION_HELD = tuple(n for n in FITTED if n not in CPU_SPEED_KEYS)
MAX_PAIRS = 60  # calibrations on pairs of runs (a seeded sample of them, each a fit)
QUIET_LOAD = 1.5
# the two grid runs a calibration is made from: two placements, two thread counts
CALIBRATE_ON = (
    "cpu-moe t1 ub512 fa f16",
    "auto t2 ub128 no-fa f16",
)  # a load average above it on 2 cores: other work competes with the engine's threads


Config = tuple[str, int, int, bool, str, bool]  # strategy, threads, ubatch, flash attention, cache, repack


def grid() -> list[Config]:
    return [
        (st, t, ub, fa, c, rp)
        for st, t, ub, (fa, c), rp in itertools.product(
            ("auto", "cpu-moe"), (1, 2), (128, 512), ATTENTION, (False, True)
        )
    ]


def label(st: str, t: int, ub: int, fa: bool, c: str, rp: bool) -> str:
    return f"{st} t{t} ub{ub} {'fa' if fa else 'no-fa'} {c}{' repack' if rp else ''}"


def ranks(x: list[float]) -> np.ndarray:
    """Ranks from 0, tied values sharing their mean rank (a speed model that predicts two
    configurations alike claims no order between them)."""
    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="stable")
    r = np.empty(len(a))
    r[order] = np.arange(len(a), dtype=float)
    for v in np.unique(a):
        same = a == v
        r[same] = r[same].mean()
    return r


def spearman(a: list[float], b: list[float]) -> float:
    if len(a) <= 2:
        return float("nan")
    ra, rb = ranks(a), ranks([round(x, 6) for x in b])
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def plan_grid(d: Path, model: Path, hw: Path, port: int) -> Path:
    plans = []
    for i, (st, t, ub, fa, c, rp) in enumerate(grid()):
        out = d / f"g{i}.json"
        r = run_cli(
            "plan",
            str(model),
            "--hw",
            str(hw),
            "--strategy",
            st,
            "-t",
            str(t),
            "-ub",
            str(ub),
            "--flash-attn",
            "on" if fa else "off",
            "--ctk",
            c,
            "--ctv",
            c,
            "--repack",
            "on" if rp else "off",
            "--port",
            str(port),
            "-o",
            str(out),
            "--json",
        )
        if r.exit_code != 0:
            raise RuntimeError(r.stderr)
        plans.append({"label": label(st, t, ub, fa, c, rp), "plan": out.name})
    sweep = d / "grid.yaml"
    sweep.write_text(yaml.safe_dump({"name": "speed axes", "plans": plans}))
    return sweep


def reversed_grid(sweep: Path) -> Path:
    doc = yaml.safe_load(sweep.read_text())
    out = sweep.with_name("grid-reversed.yaml")
    out.write_text(yaml.safe_dump({**doc, "plans": doc["plans"][::-1]}))
    return out


def gmean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def pooled(
    obs: list[Observation], labels: dict[int, str], by_pass: dict[str, dict[str, list[float]]]
) -> dict[str, Observation]:
    """One observation per configuration: its first run's, measuring the geometric mean of its runs
    (``by_pass``: :func:`passes` of TG and PP)."""
    first: dict[str, Observation] = {}
    for o in sorted(obs, key=lambda o: o.run):
        first.setdefault(labels[o.run], o)

    def mean(what: str, name: str) -> float | None:
        v = by_pass[what].get(name)
        return gmean(v) if v else None

    return {
        name: dataclasses.replace(o, measured_tg=mean("tg", name), measured_pp=mean("pp", name))
        for name, o in first.items()
    }


def passes(obs: list[Observation], labels: dict[int, str], what: str) -> dict[str, list[float]]:
    """Each configuration's measurements of ``what`` (``measured_tg``, ``measured_pp``), pass by pass."""
    by: dict[str, list[float]] = {}
    for o in sorted(obs, key=lambda o: o.run):
        if (v := getattr(o, what)) is not None:
            by.setdefault(labels[o.run], []).append(v)
    return by


def launch_scatter(by: dict[str, list[float]]) -> dict[str, float | None]:
    """How far two launches of one configuration lie apart on this machine: the median over
    configurations of |ln(pass 1 / pass 2)| as a percent; the rank correlation of one pass with
    another (the mean over pairs of passes: what a perfect model would score against one pass);
    and the most a perfect model can score against the mean of the passes (``ceiling``: the square
    root of that mean's reliability, Spearman-Brown from the one-pass correlation)."""
    n = min((len(v) for v in by.values()), default=0)
    full = [v[:n] for v in by.values()]
    if n < 2:
        return {"median_pct": None, "spearman": None, "ceiling": None}
    logs = [abs(math.log(v[0] / v[1])) for v in full]
    r = statistics.fmean(
        spearman([v[i] for v in full], [v[j] for v in full]) for i, j in itertools.combinations(range(n), 2)
    )
    reliability = n * r / (1 + (n - 1) * r) if r > 0 else 0.0
    return {
        "median_pct": round((math.exp(statistics.median(logs)) - 1) * 100, 1),
        "spearman": round(r, 3),
        "ceiling": round(math.sqrt(reliability), 3),
    }


def launch_verdict(by: dict[str, list[float]], name: str, best: str) -> str | None:
    """``name`` against the grid's ``best`` by `compare`'s rule, on their launches' TG (one figure
    a pass): "same" where the passes cannot tell them apart."""
    if len(by.get(name, [])) < 2 or len(by.get(best, [])) < 2:
        return None
    d = difference(by[best], by[name], higher_is_better=True)
    return f"{d.verdict} (x{d.ratio:.3f} of the medians, 95% CI x{d.ratio_ci_low:.3f}-x{d.ratio_ci_high:.3f})"


def scores(obs: list[Observation], k: SpeedConstants) -> dict[str, float]:
    tg = [(predict_tg(o, k), o.measured_tg) for o in obs if o.measured_tg]
    pp = [(predict_pp(o, k), o.measured_pp) for o in obs if o.measured_pp]
    return {
        "tg_median_abs_pct": round(statistics.median(abs(p - m) / m * 100 for p, m in tg), 1),
        "pp_median_abs_pct": round(statistics.median(abs(p - m) / m * 100 for p, m in pp), 1),
        "tg_spearman": round(spearman(*map(list, zip(*tg, strict=True))), 3),
        "pp_spearman": round(spearman(*map(list, zip(*pp, strict=True))), 3),
    }


def median_of(ps: list[dict[str, Any]]) -> dict[str, float]:
    """Each score's median over calibrations (their ``pair`` left out)."""
    return {key: round(statistics.median(p[key] for p in ps), 3) for key in ps[0] if key != "pair"}


def store_grid(d: Path, out: dict[str, Any]) -> Path:
    """The grid's measurements kept beside the earlier runs' under the next letter (A, B, ...), for
    `speed_axes_rescore` to score every later version of the model against."""
    d.mkdir(parents=True, exist_ok=True)
    letters = sorted(f.stem for f in d.glob("*.json"))
    run = chr(ord(letters[-1]) + 1) if letters else "A"
    keep = ("measured_tg", "measured_pp", "tg_by_pass", "pp_by_pass")
    doc = {
        "run": run,
        "workload": out["workload"],
        "passes": out["passes"],
        "load_average_before_after": out["load_average_before_after"],
        "probe_constants": out["probe"]["constants"],
        "per_configuration": {n: {k: v[k] for k in keep} for n, v in out["per_configuration"].items()},
    }
    f = d / f"{run}.json"
    f.write_text(json.dumps(doc, indent=1) + "\n")
    return f


def main(results: Path) -> None:
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.environ["MOETUNE_DATA_DIR"] = str(d / "data")
        model, hw = make_testbed(d, rpc_devices=0)
        t0 = time.monotonic()
        pr = run_cli("hw", "attention", str(hw), "--write", "--json")
        if pr.exit_code != 0:
            raise RuntimeError(pr.stderr)
        probe = json.loads(pr.stdout)
        probe_s = time.monotonic() - t0
        port = free_port()
        db = d / "grid.db"
        t0 = time.monotonic()
        sweep = plan_grid(d, model, hw, port)
        for i in range(PASSES):
            order = sweep if i % 2 == 0 else reversed_grid(sweep)
            r = run_cli("sweep", str(order), *WORKLOAD, "--sweep-id", f"speed-axes-{i + 1}", "--db", str(db), "--json")
            if r.exit_code != 0:
                raise RuntimeError(r.stderr)
        grid_s = time.monotonic() - t0
        with ResultsDB.open(db) as h:
            ((_, obs),) = gather(h).items()
            labels = {run.id: run.label for run in h.runs()}
        obs = [o for o in obs if o.depth == DEPTH] or obs
        by_run = {o.run: o for o in obs}
        by_pass = {what: passes(obs, labels, f"measured_{what}") for what in ("tg", "pp")}
        truth = pooled(obs, labels, by_pass)  # per configuration, over the passes
        scatter = {
            "tg": launch_scatter(by_pass["tg"]),
            "pp": launch_scatter(by_pass["pp"]),
        }
        k0 = SpeedConstants()
        kb = base_constants(load(hw))
        before = scores(list(truth.values()), k0)
        probed = scores(list(truth.values()), kb)
        two = [
            (a, b)
            for a, b in itertools.combinations(sorted(by_run), 2)
            if labels[a].split()[0] != labels[b].split()[0]  # two placements
        ]
        pairs, held_pairs, plan_pairs = [], [], []
        for a, b in random.Random(0).sample(two, min(MAX_PAIRS, len(two))):
            k = fit([by_run[a], by_run[b]], kb)
            rest = [o for name, o in truth.items() if name not in (labels[a], labels[b])]
            pairs.append({"pair": [labels[a], labels[b]], **scores(rest, k)})
            # what a plan on the file uses: the fit, its attention terms replaced by the file's
            plan_pairs.append(scores(rest, base_constants(load(hw), k)))
            # the fit with the file's attention terms held where they are
            held_pairs.append(scores(rest, fit([by_run[a], by_run[b]], kb, names=ATTENTION_HELD)))

        after, after_plan, after_held = median_of(pairs), median_of(plan_pairs), median_of(held_pairs)
        measured = {name: round(o.measured_tg or 0.0, 1) for name, o in truth.items()}
        per_config = {
            name: {
                "measured_tg": round(o.measured_tg or 0.0, 1),
                "predicted_tg": round(predict_tg(o, k0), 1),
                "probed_tg": round(predict_tg(o, kb), 1),
                "measured_pp": round(o.measured_pp or 0.0, 1),
                "predicted_pp": round(predict_pp(o, k0), 1),
                "probed_pp": round(predict_pp(o, kb), 1),
                "tg_by_pass": [round(v, 1) for v in by_pass["tg"].get(name, [])],
                "pp_by_pass": [round(v, 1) for v in by_pass["pp"].get(name, [])],
            }
            for name, o in truth.items()
        }
        best = max(measured, key=lambda x: measured[x])
        # tune after calibrating on two runs of two placements (the tests' pair)
        ids = {v: k for k, v in sorted(labels.items(), reverse=True)}  # a label's first run (the first pass)
        cal = run_cli("calibrate", *(str(ids[x]) for x in CALIBRATE_ON), "--db", str(db), "--json", "--force")

        def tune_once(name: str, *extra: str) -> dict[str, Any]:
            t1 = time.monotonic()
            tr = run_cli(
                "tune",
                str(model),
                "--hw",
                str(hw),
                "--strategy",
                "cpu-moe",
                "-t",
                "1",
                "--try-strategy",
                "auto,cpu-moe",
                *TRY_EVERY_AXIS,
                *WORKLOAD,
                "--port",
                str(port),
                "--budget",
                "3",
                *extra,
                "--db",
                str(d / f"{name}.db"),
                "--json",
            )
            got: dict[str, Any] = {
                "calibrated_on": list(CALIBRATE_ON) if cal.exit_code == 0 else None,
                "options": ["--budget", "3", *extra],
                "exit_code": tr.exit_code,
                "wall_s": round(time.monotonic() - t1, 1),
            }
            if tr.exit_code == 0:
                doc = json.loads(tr.stdout)
                found = doc["best_candidate"]["label"]  # the search's reach (the engine defaults are not in the grid)
                got.update(
                    launches=doc["launches"],
                    confirmed=doc["confirmed"],
                    best=found,
                    grid_best=best,
                    ratio_to_grid_best=round(measured.get(_grid_label(found), 0.0) / measured[best], 3),
                    verdict_vs_grid_best=launch_verdict(by_pass["tg"], _grid_label(found), best),
                )
            return got

        tune = tune_once("tune")
        # the same search, its two best launched again (--confirm 2: not counted in the budget)
        tune_confirmed = tune_once("tune-confirm", "--confirm", "2")
    out = {
        "workload": " ".join(WORKLOAD),
        "configurations": len(measured),
        "probe_s": round(probe_s, 1),
        "probe": probe,
        "grid_wall_s": round(grid_s, 1),
        "passes": PASSES,
        "launch_scatter": scatter,
        "load_average_before_after": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
        "measured_tg": measured,
        "per_configuration": per_config,
        "before": before,
        "with_measured_attention": probed,
        "after_two_placements": after,
        "after_two_placements_as_planned": after_plan,
        "after_two_placements_attention_held": after_held,
        "pairs": pairs,
        "tune": tune,
        "tune_confirmed": tune_confirmed,
    }
    (results / "speed_axes.json").write_text(json.dumps(out, indent=2))
    store_grid(results / GRIDS, out)
    row = "| {} | {tg_median_abs_pct}% | {pp_median_abs_pct}% | {tg_spearman} | {pp_spearman} |"
    lines = [
        "# speed model over the engine axes (flash attention, cache type, repacking, threads, ubatch)",
        "",
        "`python benchmarks/run.py speed_axes`: " + str(len(measured)) + " configurations of the tuning "
        f"testbed's model on this machine's {os.cpu_count()} cores, `moetune sweep` {' '.join(WORKLOAD)}, "
        f"{PASSES} passes (every other one in the reverse order; a configuration's figure is the geometric mean "
        f"of its launches) ({out['grid_wall_s']} s); load average {out['load_average_before_after'][0]} before, "
        f"{out['load_average_before_after'][1]} after. `moetune hw attention --write` first ({out['probe_s']} s): "
        + ", ".join(f"{k}={v}" for k, v in probe["constants"].items())
        + ".",
        "",
        *(
            [
                f"**Contended**: the load average passed {QUIET_LOAD} on {os.cpu_count()} cores; these numbers "
                "measure the other work on the machine, not the model. Rerun on a quiet machine.",
                "",
            ]
            if out["load_average_before_after"][0] > QUIET_LOAD  # after: the grid's own engines
            else []
        ),
        "| constants | TG median error | PP median error | TG rank corr. | PP rank corr. |",
        "|---|---:|---:|---:|---:|",
        row.format("built-in", **before),
        row.format("built-in + this CPU's measured attention (`hw attention`)", **probed),
        row.format(
            f"calibrated on 2 runs of two placements (median of {len(pairs)} pairs, the rest predicted)", **after
        ),
        row.format("the same, as a plan on the file uses it (its attention terms the file's)", **after_plan),
        row.format("calibrated with the file's attention terms held", **after_held),
        "",
        "Targets (issue #25): TG <= 10%, PP <= 15%, TG rank correlation >= 0.8 after calibration.",
        "",
        f"Two launches of one configuration lie apart by a median of {scatter['tg']['median_pct']}% in TG and "
        f"{scatter['pp']['median_pct']}% in PP on this machine (|ln(pass 1 / pass 2)| over the configurations), "
        f"and pass 1 ranks like pass 2 at {scatter['tg']['spearman']} in TG, {scatter['pp']['spearman']} in PP "
        f"(what a perfect model would score against one pass; against the mean of the {PASSES} passes, at most "
        f"{scatter['tg']['ceiling']} in TG and {scatter['pp']['ceiling']} in PP): a "
        "calibration reads two single launches, so its error cannot fall far below that.",
        "",
        f"tune (budget 3, from cpu-moe t1, after calibrating on {' and '.join(CALIBRATE_ON)}): {json.dumps(tune)}",
        "",
        f"the same with --confirm 2 (its two best launched again, judged on both): {json.dumps(tune_confirmed)}",
        "",
        "| configuration | TG tok/s | built-in | measured attention | PP tok/s | built-in | measured attention |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {k} | {v['measured_tg']} | {v['predicted_tg']} | {v['probed_tg']} | {v['measured_pp']} | "
        f"{v['predicted_pp']} | {v['probed_pp']} |"
        for k, v in sorted(per_config.items())
    ]
    (results / "speed_axes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _grid_label(tune_label: str) -> str:
    """A tune candidate's label (``auto t2 ub512 fa kq8_0-vq8_0 repack``) as this grid names it."""
    parts = tune_label.split()
    cache = next((p[1:].split("-v")[0] for p in parts if p.startswith("k")), "f16")
    return " ".join([*parts[:4], cache, *(["repack"] if "repack" in parts else [])])


if __name__ == "__main__":
    main(HERE / "results")
