"""Drift injected, paired against unpaired: two identical plans (the same server, two labels) of a
generated MoE model, measured while a CPU hog (two busy loops per core of this machine)
starts halfway through.

1. A plain sweep, all of A then all of B: the hog starts as B is launched, so the unpaired rule
   sees B slower, though nothing differs but the machine.
2. An interleaved sweep (``--interleave launches``, 4 rounds): the hog starts with round 3. The
   paired rule, round by round, should call them the same; the unpaired rule on the same samples
   pooled is shown beside it.
3. The same with ``--interleave batches`` (both servers up, batches alternating).

Goal: the paired verdict is "same" in 2 and 3 while the plain sweep's unpaired verdict in 1 is not.
Writes results/interleave.json and results/interleave.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.bench.servers import write_plan  # noqa: E402
from tests.helpers import engine_bin_dir  # noqa: E402

from moetune.bench.single.interleave import run_interleaved  # noqa: E402
from moetune.bench.single.runner import BenchOptions  # noqa: E402
from moetune.bench.single.sweep import load_sweep, run_sweep  # noqa: E402
from moetune.bench.single.workloads import expand  # noqa: E402
from moetune.model.archs import Dims  # noqa: E402
from moetune.model.testmodel import generate  # noqa: E402
from moetune.report.compare import compare, load  # noqa: E402
from moetune.report.paired import load_sweep as load_paired  # noqa: E402
from moetune.store.db import ResultsDB  # noqa: E402

ROUNDS, REPEATS = 4, 6
HOG_PER_CORE = 4
MAX_TOKENS = 128
METRIC = "tg:short-json"


class Hog:
    """Busy loops, HOG_PER_CORE per core, started on cue and stopped at the end (by their own pids)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started_at: float | None = None

    def start(self) -> None:
        if not self.procs:
            n = HOG_PER_CORE * (os.cpu_count() or 2)
            self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
            self.started_at = time.time()

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait()
        self.procs = []


@contextmanager
def hog_on(cue: Callable[[str], bool]) -> Iterator[tuple[Hog, Callable[[str], None]]]:
    hog = Hog()

    def status(s: str) -> None:
        print("   " + s, flush=True)
        if cue(s):
            hog.start()

    try:
        yield hog, status
    finally:
        hog.stop()


def nth(text: str, n: int) -> Callable[[str], bool]:
    seen = [0]

    def cue(s: str) -> bool:
        if text in s:
            seen[0] += 1
        return seen[0] >= n

    return cue


def _row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in rows if r["metric"] == METRIC)


def main(results: Path) -> None:
    assert engine_bin_dir() is not None, "llama.cpp is not built: make engine"
    out: dict[str, Any] = {
        "rounds": ROUNDS,
        "repeats": REPEATS,
        "metric": METRIC,
        "cores": os.cpu_count(),
        "hog_loops": HOG_PER_CORE * (os.cpu_count() or 2),
        "max_tokens": MAX_TOKENS,
        "load_before": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.environ["MOETUNE_DATA_DIR"] = str(d / "data")
        model = d / "m.gguf"
        generate(model, "qwen3moe", Dims(n_layer=8, n_embd=512, n_ff_exp=512), "f16")
        a = write_plan(d / "a.json", model, label="A")
        b = write_plan(d / "b.json", model, label="B")  # the same server: only the port differs
        spec = load_sweep([a, b])
        workloads = expand(
            ["short-json"],
            [],
            thinking=None,
            max_tokens=MAX_TOKENS,
            ignore_eos=True,
            depths=[],
            pp_tokens=512,
            tg_tokens=128,
        )
        with ResultsDB.open(d / "r.sqlite") as db:
            print("1. plain sweep, the hog from B's launch", flush=True)
            with hog_on(nth("main: starting", 2)) as (_, status):
                sid, outcomes = run_sweep(
                    db, spec, workloads, BenchOptions(repeats=ROUNDS * REPEATS, warmup=1), status=status
                )
            runs = load(db, [db.run(o.run) for o in outcomes if o.run is not None])
            c = compare(runs[0], runs[1:])
            out["plain"] = {"sweep": sid, "unpaired": _row([r.to_json() for r in c.rows])}
            for mode in ("launches", "batches"):
                print(f"{2 if mode == 'launches' else 3}. interleaved ({mode}), the hog from round 3", flush=True)
                with hog_on(nth(f"round 3/{ROUNDS}", 1)) as (_, status):
                    res = run_interleaved(
                        db,
                        spec,
                        workloads,
                        BenchOptions(repeats=REPEATS, warmup=1),
                        mode=mode,
                        rounds=ROUNDS,
                        status=status,
                    )
                pc = load_paired(db, res.sweep)
                row = _row(pc.to_json()["rows"])
                out[mode] = {
                    "sweep": res.sweep,
                    "launches": res.launches,
                    "launch_s": res.launch_s,
                    "wall_s": res.wall_s,
                    "per_round": [c["ratio"] for c in row["per_round"]],
                    "baseline_medians": [c["baseline_median"] for c in row["per_round"]],
                    "paired": {
                        k: row[k] for k in ("change_pct", "change_ci_low_pct", "change_ci_high_pct", "verdict", "noisy")
                    },
                    "unpaired": row["unpaired"],
                }
    out["load_after"] = os.getloadavg()[0]
    out["goal_met"] = out["plain"]["unpaired"]["verdict"] != "same" and all(
        out[m]["paired"]["verdict"] == "same" for m in ("launches", "batches")
    )
    (results / "interleave.json").write_text(json.dumps(out, indent=2) + "\n")
    (results / "interleave.md").write_text(markdown(out))
    print(markdown(out))


def _fmt(x: dict[str, Any]) -> str:
    noisy = " (noisy)" if x.get("noisy") else ""
    return (
        f"{x['change_pct']:+.1f}% [{x['change_ci_low_pct']:+.1f}, {x['change_ci_high_pct']:+.1f}] {x['verdict']}{noisy}"
    )


def markdown(o: dict[str, Any]) -> str:
    p = o["plain"]
    lines = [
        "# Drift injected: paired against unpaired",
        "",
        f"Two identical plans (A and B: the same llama-server, `-t 1`, on a generated qwen3moe model), TG of "
        f"`short-json` ({o['max_tokens']} tokens); a CPU hog ({o['hog_loops']} busy loops on {o['cores']} cores) "
        "starts halfway. "
        f"{o['rounds']} rounds of {o['repeats']} requests per plan, or {o['rounds'] * o['repeats']} requests per plan "
        "in the plain sweep. B against A, change [95% CI] and verdict:",
        "",
        "| how | order | paired | unpaired (pooled) | B/A per round |",
        "|---|---|---|---|---|",
        f"| plain sweep | A×{o['rounds'] * o['repeats']}, then B (the hog) | – | {_fmt(p['unpaired'])} | – |",
    ]
    for mode in ("launches", "batches"):
        m = o[mode]
        lines.append(
            f"| interleave {mode} | A B, B A, A B (hog), B A (hog) | {_fmt(m['paired'])} | "
            f"{_fmt(m['unpaired'])} | {' '.join(f'{r:.3f}' for r in m['per_round'])} |"
        )
    lines += [
        "",
        "A's median TG per round (the hog's effect): "
        + "; ".join(
            f"{mode} " + ", ".join(f"{x:.0f}" for x in o[mode]["baseline_medians"]) for mode in ("launches", "batches")
        ),
        "",
        f"Launches: {o['launches']['launches']} ({o['launches']['launch_s']:.1f} s of "
        f"{o['launches']['wall_s']:.1f} s) with launches, {o['batches']['launches']} "
        f"({o['batches']['launch_s']:.1f} s of {o['batches']['wall_s']:.1f} s) with batches.",
        "",
        f"Load average (1 min) {o['load_before']:.1f} before, {o['load_after']:.1f} after: other "
        "programs shared the machine.",
        "",
        "Reading: in the plain sweep every request of B ran under the hog and none of A's did, so the "
        "unpaired rule sees the machine's change as B's. In the interleaved sweeps each round saw the hog on "
        "both plans or on neither, so the per-round ratios stay near 1 on average; how far they scatter "
        f"(here {min(r for m in ('launches', 'batches') for r in o[m]['per_round']):.2f} to "
        f"{max(r for m in ('launches', 'batches') for r in o[m]['per_round']):.2f}) is the run-to-run noise "
        "of this machine, which sets the width of the paired interval.",
        "",
        f'Goal (plain sweep not "same", both paired verdicts "same"): {"met" if o["goal_met"] else "NOT met"}.',
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main(HERE / "results")
