"""The stored speed grids re-scored against the speed model as it is now, in about a minute and
with no new measurement (issue #25): each grid `speed_axes` measured (``results/speed_axes_grids/``,
runs A to F: per configuration, its TG and PP launch by launch, and the attention constants the
probe measured that day) is predicted again from the plans of the grid's 48 configurations, with
the built-in constants under that day's probe, and after calibrating on seeded pairs of single
launches of two placements, fitted freely and with the probe's terms held (what `calibrate` does
on a hardware file with measured terms).

Beside the scores, each axis's effect as measured and as the model predicts it (the geometric
mean, over the grid's pairs of configurations differing in that axis alone, of their TG ratio):
where the model's ratio sits on the wrong side of the measured one in every grid, the model is
missing a term, not noise. Writes results/speed_axes_rescore.json and .md. A change to the
speed model can be tried here against six days of measurements before a 10-minute grid confirms it.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.bench_speed_axes import (  # noqa: E402
    ATTENTION_HELD,
    DEPTH,
    GRIDS,
    gmean,
    grid,
    label,
    median_of,
    plan_grid,
    scores,
)
from tests.engine_harness import free_port  # noqa: E402
from tests.tune_testbed import make_testbed  # noqa: E402

from moetune.plan.calibrate import Observation, fit, predict_tg  # noqa: E402
from moetune.plan.speed import SpeedConstants, Work, decode_context  # noqa: E402

PROMPT, GENERATED = 256, 128  # the grids' workload: --pp-tokens 256 --tg-tokens 128 at DEPTH
PAIRS = 30  # calibrations per grid (a seeded sample of the pairs of two placements' launches)
# each axis: the field of a configuration's label it changes, from -> to; a filter on the others
AXES: dict[str, tuple[int, str, str, tuple[int, str] | None]] = {
    "threads 2 / 1": (1, "t1", "t2", None),
    "ubatch 512 / 128": (2, "ub128", "ub512", None),
    "cpu-moe / auto": (0, "auto", "cpu-moe", None),
    "flash attention off / on (f16 cache)": (3, "fa", "no-fa", (4, "f16")),
    "q8_0 / f16 cache (flash attention)": (4, "f16", "q8_0", (3, "fa")),
    "repack on / off": (5, "", "repack", None),
}


def fields(name: str) -> list[str]:
    parts = name.split()
    return [*parts[:5], "repack" if len(parts) > 5 else ""]


def works(d: Path) -> dict[str, Work]:
    """The work of every configuration of the grid, from its plan on a fresh testbed."""
    model, hw = make_testbed(d, rpc_devices=0)
    plan_grid(d, model, hw, free_port())
    return {
        label(*cfg): Work.from_json(json.loads((d / f"g{i}.json").read_text())["services"][0]["predicted"]["work"])
        for i, cfg in enumerate(grid())
    }


def observation(w: Work, run: int, tg: float | None, pp: float | None) -> Observation:
    return Observation(
        run=run,
        work=w,
        depth=DEPTH,
        measured_tg=tg,
        measured_pp=pp,
        prompt_tokens=PROMPT,
        tg_depth=decode_context(DEPTH, PROMPT, GENERATED),
    )


def axis_effects(per: dict[str, dict[str, Any]], predicted: dict[str, float]) -> dict[str, dict[str, float]]:
    """Each axis's TG ratio, measured and predicted (geometric means over the pairs it tells apart)."""
    out = {}
    by_fields = {tuple(fields(n)): n for n in per}
    for axis, (i, a, b, only) in AXES.items():
        meas, pred = [], []
        for f, n in by_fields.items():
            if f[i] != a or (only is not None and f[only[0]] != only[1]):
                continue
            other = by_fields.get((*f[:i], b, *f[i + 1 :]))
            if other is not None:
                meas.append(per[other]["measured_tg"] / per[n]["measured_tg"])
                pred.append(predicted[other] / predicted[n])
        out[axis] = {"measured": round(gmean(meas), 3), "model": round(gmean(pred), 3)}
    return out


def rescore(doc: dict[str, Any], w: dict[str, Work]) -> dict[str, Any]:
    per = doc["per_configuration"]
    k = SpeedConstants.from_json({**asdict(SpeedConstants()), **doc["probe_constants"]})
    names = list(per)
    truth = [observation(w[n], j, per[n]["measured_tg"], per[n]["measured_pp"]) for j, n in enumerate(names)]
    out: dict[str, Any] = {
        "run": doc["run"],
        "built_in": scores(truth, SpeedConstants()),
        "with_measured_attention": scores(truth, k),
        "axes": axis_effects(per, {n: predict_tg(o, k) for n, o in zip(names, truth, strict=True)}),
    }
    n_pass = min(len(v.get("tg_by_pass") or []) for v in per.values())
    if n_pass == 0:  # run A stored its means alone: no single launches to calibrate on
        return out
    launches = [(j, p) for j in range(len(names)) for p in range(n_pass)]
    two = [(a, b) for a, b in itertools.combinations(launches, 2) if fields(names[a[0]])[0] != fields(names[b[0]])[0]]
    free_scores, held_scores = [], []
    for a, b in random.Random(0).sample(two, min(PAIRS, len(two))):
        pair = [
            observation(w[names[j]], r, per[names[j]]["tg_by_pass"][p], per[names[j]]["pp_by_pass"][p])
            for r, (j, p) in enumerate((a, b))
        ]
        rest = [o for j, o in enumerate(truth) if j not in (a[0], b[0])]
        free_scores.append(scores(rest, fit(pair, k)))
        held_scores.append(scores(rest, fit(pair, k, names=ATTENTION_HELD)))

    out["calibrated_free"] = median_of(free_scores)
    out["calibrated_held"] = median_of(held_scores)
    return out


def main(results: Path) -> None:
    docs = [json.loads(f.read_text()) for f in sorted((results / GRIDS).glob("*.json"))]
    with tempfile.TemporaryDirectory() as tmp:
        w = works(Path(tmp))
    rows = [rescore(doc, w) for doc in docs]
    (results / "speed_axes_rescore.json").write_text(json.dumps(rows, indent=2) + "\n")

    def cell(r: dict[str, Any], key: str, metric: str) -> str:
        v = r.get(key, {}).get(metric)
        return "–" if v is None else (f"{v}%" if metric.endswith("pct") else f"{v:.3f}")

    lines = [
        "# The stored speed grids re-scored (`python benchmarks/run.py speed_axes_rescore`)",
        "",
        "TG median error / TG rank correlation, per stored grid, with the model as it is now. "
        f"Calibrated: the median over {PAIRS} seeded pairs of single launches of two placements, scored on the rest.",
        "",
        "| run | built-in | + measured attention | calibrated, free | calibrated, attention held |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | "
            + " | ".join(
                f"{cell(r, key, 'tg_median_abs_pct')} / {cell(r, key, 'tg_spearman')}"
                for key in ("built_in", "with_measured_attention", "calibrated_free", "calibrated_held")
            )
            + " |"
        )
    lines += ["", "Each axis's TG ratio, measured / predicted with that day's measured attention:", ""]
    lines += ["| axis | " + " | ".join(r["run"] for r in rows) + " |", "|---|" + "---|" * len(rows)]
    for axis in AXES:
        lines.append(
            f"| {axis} | "
            + " | ".join(f"{r['axes'][axis]['measured']:.2f} / {r['axes'][axis]['model']:.2f}" for r in rows)
            + " |"
        )
    (results / "speed_axes_rescore.md").write_text("\n".join(lines) + "\n")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main(HERE / "results")
