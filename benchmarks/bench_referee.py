"""tune's winner against the engine run with no flags, judged by an independent referee (issue #25's
acceptance): `moetune tune --budget 3` on the tuning testbed (tests/tune_testbed.py, this
machine's 2 cores, no RPC device; the search spans threads, -ub, flash attention, the cache type
and repacking, at depth 512 with a 256-token prompt), after `moetune hw attention --write` has
measured this CPU's attention kernels; then llama-bench, not moetune, measures the winner's flags
and no flags at all in interleaved rounds (each round runs both, so drifting load falls on both
alike), at depth 0 and at the workload's depth, TG and PP.

Reports each configuration's median over the rounds and the winner/defaults ratios with the
rounds' spread. Targets: TG at least the defaults' at both depths; PP within tune's
--max-pp-loss (10%). Writes results/referee.json and results/referee.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.engine_harness import free_port  # noqa: E402
from tests.helpers import run_cli  # noqa: E402
from tests.tune_testbed import TRY_EVERY_AXIS, make_testbed  # noqa: E402

from moetune.bench.analysis.stats import bootstrap_ci  # noqa: E402
from moetune.engine import registry  # noqa: E402

DEPTH = 512
WORKLOAD = ["--depth", str(DEPTH), "--pp-tokens", "256", "--tg-tokens", "64", "-r", "2", "--warmup", "1"]
ROUNDS = 9
MAX_PP_LOSS = 0.10


def bench_flags(label: str) -> list[str]:
    """A tune candidate's label (``cpu-moe t2 ub512 fa kq8_0-vq8_0 repack``) as llama-bench flags
    (the placement is the CPU's either way on this testbed)."""
    parts = label.split()
    flags = ["--repack", "1" if "repack" in parts else "0"]
    for p in parts[1:]:
        if p.startswith("t") and p[1:].isdigit():
            flags += ["-t", p[1:]]
        elif p.startswith("ub"):
            flags += ["-ub", p[2:]]
        elif p in ("fa", "no-fa"):
            flags += ["-fa", "on" if p == "fa" else "off"]
        elif p.startswith("k") and "-v" in p:
            k, v = p[1:].split("-v")
            flags += ["-ctk", k, "-ctv", v]
    return flags


def one_round(binary: Path, model: Path, flags: list[str]) -> dict[str, float]:
    out = subprocess.run(
        [str(binary), "-m", str(model), "-o", "json", "-p", "256", "-n", "64", "-d", f"0,{DEPTH}", "-r", "1", *flags],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return {f"{'pp' if t['n_prompt'] else 'tg'}_d{t['n_depth']}": float(t["avg_ts"]) for t in json.loads(out)}


def _verdict(ratios: list[float], tolerance: float) -> str:
    """The winner against the defaults from the per-round ratios: "faster" or "slower" where the
    rounds' 95% bootstrap interval of the median ratio lies above 1 or below 1 - ``tolerance``,
    else "same" (within noise, or within the tolerated loss)."""
    lo, hi = bootstrap_ci(ratios, conf=0.95)
    return "faster" if lo > 1 else "slower" if hi < 1 - tolerance else "same"


def main(results: Path) -> None:
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.environ["MOETUNE_DATA_DIR"] = str(d / "data")
        model, hw = make_testbed(d, rpc_devices=0)
        pr = run_cli("hw", "attention", str(hw), "--write", "--json")
        if pr.exit_code != 0:
            raise RuntimeError(pr.stderr)
        t0 = time.monotonic()
        tr = run_cli(
            "tune",
            str(model),
            "--hw",
            str(hw),
            *TRY_EVERY_AXIS,
            *WORKLOAD,
            "--port",
            str(free_port()),
            "--budget",
            "3",
            "--db",
            str(d / "tune.db"),
            "--json",
        )
        if tr.exit_code != 0:
            raise RuntimeError(tr.stderr)
        tune_s = time.monotonic() - t0
        doc = json.loads(tr.stdout)
        winner = doc["best"]["label"]
        binary = registry.get(None).binary("bench")
        configs = {"no flags (the engine's defaults)": [], f"tune's winner ({winner})": bench_flags(winner)}
        rounds: dict[str, list[dict[str, float]]] = {k: [] for k in configs}
        for _ in range(ROUNDS):
            for name, flags in configs.items():
                rounds[name].append(one_round(binary, model, flags))
    keys = sorted(rounds[next(iter(rounds))][0])
    med = {n: {k: statistics.median(r[k] for r in rs) for k in keys} for n, rs in rounds.items()}
    base, win = (med[n] for n in configs)
    # per-round ratios (a round measures both back to back): their median and range
    ratios = {k: sorted(w[k] / b[k] for b, w in zip(*(rounds[n] for n in configs), strict=True)) for k in keys}
    verdict = {k: _verdict(ratios[k], tolerance=MAX_PP_LOSS if k.startswith("pp") else 0.0) for k in keys}
    out: dict[str, Any] = {
        "workload": " ".join(WORKLOAD),
        "tune_s": round(tune_s, 1),
        "tune_launches": doc["launches"],
        "winner": winner,
        "attention_probe": json.loads(pr.stdout)["constants"],
        "rounds": ROUNDS,
        "median_tok_s": {n: {k: round(v, 1) for k, v in m.items()} for n, m in med.items()},
        "ratio_median": {k: round(statistics.median(v), 3) for k, v in ratios.items()},
        "ratio_range": {k: [round(v[0], 3), round(v[-1], 3)] for k, v in ratios.items()},
        "verdict": verdict,
        "load_average_before_after": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
    }
    (results / "referee.json").write_text(json.dumps(out, indent=2))
    names = list(configs)
    lines = [
        "# tune's winner against the engine's defaults, by llama-bench",
        "",
        f"`python benchmarks/run.py referee`: `moetune tune --budget 3` {' '.join(WORKLOAD)} on the tuning testbed "
        f"({out['tune_s']} s, {out['tune_launches']} launches) after `moetune hw attention --write`; then "
        f"llama-bench -p 256 -n 64 -d 0,{DEPTH}, {ROUNDS} interleaved rounds of both. Load average "
        f"{out['load_average_before_after'][0]} before, {out['load_average_before_after'][1]} after.",
        "",
        f"| test | {names[0]} | {names[1]} | winner / defaults (median, range over rounds) | verdict |",
        "|---|---:|---:|---:|---|",
    ]
    for k in keys:
        lo, hi = out["ratio_range"][k]
        lines.append(f"| {k} | {base[k]:.1f} | {win[k]:.1f} | {out['ratio_median'][k]} ({lo}-{hi}) | {verdict[k]} |")
    lines += [
        "",
        "Verdict per test (95% bootstrap interval of the median per-round ratio; PP may lose up to "
        f"{MAX_PP_LOSS:.0%}, tune's --max-pp-loss): "
        + ", ".join(f"{k} **{v}**" for k, v in verdict.items())
        + ". The target: no TG test slower, no PP test slower than the tolerated loss.",
    ]
    (results / "referee.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(HERE / "results")
