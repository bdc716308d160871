"""The speed model against published measurements (issue #25, "priors from published rigs").

The table shipped with moetune (src/moetune/plan/priors/published.yaml: single-stream TG/PP of MoE
models with CPU-resident experts, each row with its source, hardware, engine, quant and command) is
turned into the speed model's work, row by row (a sparse replica of the row's preset in a recipe
approximating the published file, the rig as a hardware file, the command as a strategy and
settings), and predicted three ways: with the guesses the constants had before the table
(``priors.GUESSES``), with the shipped constants (``SpeedConstants()``, rounded from the fit on every
fitted row), and held out (each rig by the fit on the other rigs' rows: leave-one-rig-out). The
references' rows (../shared/reference/000) are in no fit.

Pure computation: no engine runs, so the machine's load does not change the numbers (it is
reported anyway). Writes results/priors.md and results/priors.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from moetune.plan import priors  # noqa: E402
from moetune.plan.speed import SpeedConstants  # noqa: E402
from moetune.planfiles import preset_profile, published_priors  # noqa: E402

COMMAND = "python benchmarks/run.py priors"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def _med(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}%"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _rig_words(rig: priors.Rig, used: int) -> str:
    gpus = ", ".join(g.name.removeprefix("NVIDIA ").removeprefix("GeForce ") for g in rig.gpus[:used]) or "no GPU"
    return f"{rig.cpu} ({rig.cores} cores, {rig.memory.channels}ch {rig.memory.kind}, {rig.memory.bw_gbs:g} GB/s peak) + {gpus}"


def build(workdir: Path) -> tuple[priors.Table, priors.Report]:
    table = published_priors()
    profiles = {(r.preset, r.quant_recipe): preset_profile(r.preset, r.quant_recipe, workdir) for r in table.rows}
    return table, priors.report(table, priors.observations(table, profiles))


def summary(rep: priors.Report) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for which in ("guessed", "shipped", "held_out"):
        out[which] = {
            part: asdict(rep.errors(which, reference=part == "references")) for part in ("fitted_rows", "references")
        }
    return out


def to_json(table: priors.Table, rep: priors.Report, load: tuple[float, float], seconds: float) -> dict[str, Any]:
    by = {name: {p.row: p for p in getattr(rep, name)} for name in ("guessed", "shipped", "held_out")}
    rows = []
    for r in table.rows:
        rows.append(
            {
                "id": r.id,
                "rig": r.rig,
                "source": r.source,
                "engine": r.engine,
                "tool": r.tool,
                "model": r.model,
                "quant": r.quant,
                "preset": r.preset,
                "recipe": r.quant_recipe,
                "placement": r.placement,
                "threads": r.threads,
                "command": r.command,
                "reference": r.reference,
                "fit": priors.fitted(r),
                "depth": r.depth,
                "measured": {"tg": r.tg_tok_s, "pp": r.pp_tok_s},
                **{
                    name: {
                        "tg": round(by[name][r.id].tg, 3),
                        "pp": None if by[name][r.id].pp is None else round(by[name][r.id].pp or 0.0, 3),
                        "tg_err_pct": round(by[name][r.id].tg_err_pct, 2),
                        "pp_err_pct": None
                        if by[name][r.id].pp_err_pct is None
                        else round(by[name][r.id].pp_err_pct or 0.0, 2),
                    }
                    for name in by
                },
            }
        )
    return {
        "command": COMMAND,
        "seconds": round(seconds, 2),
        "load_average": {"start": round(load[0], 2), "end": round(load[1], 2)},
        "rigs": len(table.rigs),
        "rows": len(table.rows),
        "fitted_rows": sum(1 for r in table.rows if priors.fitted(r)),
        "errors_median_abs_pct": summary(rep),
        "constants": {
            n: {
                "guess": getattr(priors.GUESSES, n),
                "refit": round(getattr(rep.refit, n), 4),
                "shipped": getattr(SpeedConstants(), n),
            }
            for n in priors.ADOPTED
        },
        "leave_one_rig_out": [
            {"rig": ro.rig, "fitted_on": list(ro.fitted_on), **asdict(priors.Errors.of(ro.predictions))}
            for ro in rep.rig_outs
        ],
        "table": rows,
    }


def to_md(table: priors.Table, rep: priors.Report, doc: dict[str, Any]) -> str:
    s = doc["errors_median_abs_pct"]
    lines = [
        "# Priors: the speed model against published measurements",
        "",
        f"`{COMMAND}` ({doc['seconds']:.1f} s, pure computation: no engine runs; load average "
        f"{doc['load_average']['start']:.2f} at the start, {doc['load_average']['end']:.2f} at the end).",
        "",
        f"The table shipped with moetune, `src/moetune/plan/priors/published.yaml`: {doc['rows']} published "
        f"single-stream rows on {doc['rigs']} rigs ({doc['fitted_rows']} rows in the fits: not the references' "
        "rows, not the rows marked `fit: false`). Each row predicted with the constants' guesses before the "
        "table, with the shipped constants (rounded from the fit on every fitted row, from the guesses), and "
        "held out (its rig predicted by the fit on the other rigs' rows: leave-one-rig-out). Fit: "
        "`moetune calibrate`'s own (`plan.calibrate.fit`), moving only the constants these rows see.",
        "",
        "## Median absolute error",
        "",
        "| constants | TG, fitted rows | PP, fitted rows | TG, references' rows | PP, references' rows |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {"guessed": "guesses (before the table)", "shipped": "shipped (built-in)", "held_out": "leave-one-rig-out"}
    for k, label in names.items():
        f, ref = s[k]["fitted_rows"], s[k]["references"]
        lines.append(f"| {label} | {_med(f['tg'])} | {_med(f['pp'])} | {_med(ref['tg'])} | {_med(ref['pp'])} |")
    lines += [
        "",
        "The references' rows are held out of every fit: their leave-one-rig-out line is the fit on "
        "every other rig's rows (the refit below).",
        "",
        "## Constants",
        "",
        "| constant | guess | refit | shipped |",
        "|---|---:|---:|---:|",
    ]
    for n, v in doc["constants"].items():
        lines.append(f"| `{n}` | {v['guess']:g} | {v['refit']:g} | {v['shipped']:g} |")
    lines += [
        "",
        "## Leave-one-rig-out, per rig",
        "",
        "| rig | rows | TG | PP | fitted on |",
        "|---|---:|---:|---:|---|",
    ]
    for ro in doc["leave_one_rig_out"]:
        lines.append(
            f"| {ro['rig']} | {ro['rows']} | {_med(ro['tg'])} | {_med(ro['pp'])} | {len(ro['fitted_on'])} rigs |"
        )
    lines += [
        "",
        "## Rows",
        "",
        "TG and PP in tok/s; the errors are predicted against measured. Placement and threads as the "
        "command gave them (the full command in priors.json and the table).",
        "",
        "| row | model, quant | rig | engine, tool | placement, -t | measured TG (PP) | guesses | shipped | held out |",
        "|---|---|---|---|---|---:|---:|---:|---:|",
    ]
    by = {name: {p.row: p for p in getattr(rep, name)} for name in ("guessed", "shipped", "held_out")}
    for r in table.rows:
        mark = " (reference)" if r.reference else ("" if r.fit else " (not fitted)")
        cells = []
        for name in ("guessed", "shipped", "held_out"):
            p = by[name][r.id]
            cells.append(f"{_num(p.tg)} {_pct(p.tg_err_pct)} ({_num(p.pp)} {_pct(p.pp_err_pct)})")
        lines.append(
            f"| {r.id}{mark} | {r.model} {r.quant} | {_rig_words(table.rig(r.rig), r.gpus_used)} | "
            f"{r.engine} {r.tool} | {r.placement} -t {r.threads} | {r.tg_tok_s:g} ({_num(r.pp_tok_s)}) | "
            + " | ".join(cells)
            + " |"
        )
    lines += ["", "## Sources", ""]
    for r in table.rows:
        lines.append(f"- {r.id}: {r.source}" + (f" ({r.copy})" if r.copy else ""))
    return "\n".join(lines) + "\n"


def main(results: Path) -> None:
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        table, rep = build(Path(tmp))
    doc = to_json(table, rep, (load0, os.getloadavg()[0]), time.monotonic() - t0)
    (results / "priors.json").write_text(json.dumps(doc, indent=1) + "\n")
    (results / "priors.md").write_text(to_md(table, rep, doc))
    s = doc["errors_median_abs_pct"]
    print(
        f"priors: {doc['rows']} rows, {doc['rigs']} rigs; TG median error, references' rows: "
        f"guesses {_med(s['guessed']['references']['tg'])}, shipped {_med(s['shipped']['references']['tg'])}; "
        f"leave-one-rig-out over the fitted rows: TG {_med(s['held_out']['fitted_rows']['tg'])}, "
        f"PP {_med(s['held_out']['fitted_rows']['pp'])}"
    )


if __name__ == "__main__":
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    main(out)
