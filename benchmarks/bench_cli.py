"""Whole-process wall time of the command line, beside llama-fit-params on the same files.

Commands, each a fresh process with bytecode caching on (every command runs once before timing):
`moetune --help`, `moetune inspect --json` and a CPU-only `moetune plan --json` of the 8-shard
GLM-5.1-sized replica written with mainline types (so llama-fit-params can read it too), and
`llama-fit-params` answering the same fit question. Runs are interleaved round by round, the order
rotating each round, so that load from other processes falls on every command alike; the plan /
fit-params ratio is taken per round (paired), then its median.

Goals (issue 10): --help <= 0.3 s, inspect <= 0.5 s, plan <= 0.5 x llama-fit-params.
Writes results/cli.json and results/cli.md.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moetune.engine import registry
from moetune.model.archs import PRESETS, mainline_recipe
from moetune.model.testmodel import generate

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 9
# GLM-5.1's published recipe with mainline types in place of ik_llama.cpp's (as bench_plan.py)
MAINLINE_GLM = mainline_recipe("glm-5.1")
CPU_HW = """\
name: cpu-only
nodes:
  - name: local
    cpu: {cores: 2, ram_mib: 24000, ram_bw_gbs: 20}
"""
CTX = "32768"
GOALS = {"help_s": 0.3, "inspect_s": 0.5, "plan_over_fit_params": 0.5}


def moetune_argv() -> list[str]:
    script = Path(sys.executable).parent / "moetune"
    return [str(script)] if script.exists() else [sys.executable, "-m", "moetune"]


def commands(d: Path) -> dict[str, list[str]]:
    arch, dims = PRESETS["glm-5.1"]
    shard = generate(d / "GLM-5.1-mainline.gguf", arch, dims, MAINLINE_GLM, shards=8, sparse=True).files[0]
    hw = d / "cpu-only.yaml"
    hw.write_text(CPU_HW)
    m = moetune_argv()
    fit = registry.get().binary("fit")
    # -nr: CPU weight repacking aborts graph scheduling for glm-dsa on this CPU (as bench_plan.py)
    return {
        "help": [*m, "--help"],
        "inspect": [*m, "inspect", str(shard), "--json"],
        "plan": [*m, "plan", str(shard), "--hw", str(hw), "--ctx", CTX, "--ctk", "q8_0", "--ctv", "q8_0", "--json"],
        "fit_params": [str(fit), "-m", str(shard), "-c", CTX, "-ctk", "q8_0", "-ctv", "q8_0", "-fitp", "on", "-nr"],
    }


def wall_s(argv: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # caching on, as the goal says
    t0 = time.perf_counter()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300, env=env)
    t = time.perf_counter() - t0
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}")
    return t


def measure(cmds: dict[str, list[str]], rounds: int = ROUNDS) -> dict[str, list[float]]:
    for argv in cmds.values():  # warm: bytecode written, files in the page cache
        wall_s(argv)
    names = list(cmds)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(rounds):
        for n in names[i % len(names) :] + names[: i % len(names)]:
            times[n].append(wall_s(cmds[n]))
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, object]:
    med = {n: round(statistics.median(ts), 3) for n, ts in times.items()}
    ratios = [p / f for p, f in zip(times["plan"], times["fit_params"], strict=True)]
    ratio = round(statistics.median(ratios), 2)
    return {
        "median_s": med,
        "min_s": {n: round(min(ts), 3) for n, ts in times.items()},
        "plan_over_fit_params": ratio,
        "goals": GOALS,
        "meets": {
            "help_s": med["help"] <= GOALS["help_s"],
            "inspect_s": med["inspect"] <= GOALS["inspect_s"],
            "plan_over_fit_params": ratio <= GOALS["plan_over_fit_params"],
        },
        "samples_s": {n: [round(t, 4) for t in ts] for n, ts in times.items()},
    }


def write(results: Path, doc: dict[str, object], cmds: dict[str, list[str]]) -> None:
    (results / "cli.json").write_text(json.dumps(doc, indent=2) + "\n")
    med, mins, meets = doc["median_s"], doc["min_s"], doc["meets"]
    assert isinstance(med, dict) and isinstance(mins, dict) and isinstance(meets, dict)
    goal = {
        "help": f"<= {GOALS['help_s']} s",
        "inspect": f"<= {GOALS['inspect_s']} s",
        "plan": f"<= {GOALS['plan_over_fit_params']} x fit-params",
        "fit_params": "",
    }
    ok = {"help": meets["help_s"], "inspect": meets["inspect_s"], "plan": meets["plan_over_fit_params"]}
    lines = [
        "# Command-line wall time",
        "",
        f"Whole processes, {ROUNDS} interleaved rounds after one warm run each, on the 8-shard sparse "
        "GLM-5.1-sized replica (mainline types), CPU-only hardware, ctx 32768, q8_0 cache. "
        f"plan / llama-fit-params (median of paired rounds): **{doc['plan_over_fit_params']}**.",
        "",
        "| command | median s | min s | goal | met |",
        "|---|---|---|---|---|",
    ]
    for n, argv in cmds.items():
        shown = " ".join(Path(a).name if "/" in a else a for a in argv)
        met = "" if n not in ok else ("yes" if ok[n] else "no")
        lines.append(f"| `{shown}` | {med[n]} | {mins[n]} | {goal[n]} | {met} |")
    (results / "cli.md").write_text("\n".join(lines) + "\n")


def main(results: Path) -> None:
    d = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    try:
        cmds = commands(d)
        doc = summarize(measure(cmds))
        doc["commands"] = {n: " ".join(argv) for n, argv in cmds.items()}
        write(results, doc, cmds)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(json.dumps({k: doc[k] for k in ("median_s", "plan_over_fit_params", "meets")}, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "results")
