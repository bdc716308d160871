"""`make demo`: moetune's main job end to end on a generated model, in about a minute.

1. generate a small random-weight MoE model (qwen3moe, 8 layers) into ./demo-out/
2. inspect it
3. plan it for this machine, launch it with moetune, ask one question, print the server's own
   timings, stop it
4. plan three expert placements with `moetune plan`, a loopback RPC worker standing in for a
   small GPU (RPC0, 80 MiB): experts all on the CPU (cpu-moe), the first four layers' experts
   on the CPU (n-cpu-moe:4), and the optimizer's choice (auto); sweep them: each plan is
   launched, benchmarked and stopped in turn, and the sweep ends with the comparison table and
   a plot (demo-out/compare.png)
5. run the same sweep command again: it is complete, so every plan is skipped
6. calibrate the speed model on the three runs (each kept its plan's prediction beside what it
   measured), and write the HTML report of the three (demo-out/report.html)
7. quality: `moetune quality` runs llama-perplexity with each plan's own flags and reports the
   other two placements' KL divergence and top-1 agreement against the baseline's logits (a
   placement change alone should leave the answers the same)

Everything the demo writes stays in ./demo-out/ (its data directory included: launches, the
calibration); the engine build is cached outside the repository.

On this testbed the differences come from backend switches: every CPU <-> RPC0 boundary is a
round trip over loopback TCP per token, so placements with fewer splits decode faster.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/engine_harness.py
from tests.engine_harness import free_port

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "demo-out"
MOETUNE = [sys.executable, "-m", "moetune"]
QUESTION = (
    "Write a JSON object with 5 fields describing a software project. Include name, language, version, "
    "description, and license."
)
STRATEGIES = [  # label, moetune plan --strategy
    ("cpu-moe", "cpu-moe"),
    ("n-cpu-moe 4", "n-cpu-moe:4"),
    ("auto (fills RPC0)", "auto"),
]
PLAN_ARGS = ["--ctx", "1024", "--threads", "1"]
BENCH = [
    "-w",
    "reference",
    "--max-tokens",
    "64",
    "--ignore-eos",
    "-r",
    "5",
    "--depth",
    "0,512",
    "--pp-tokens",
    "128",
    "--tg-tokens",
    "32",
]


def step(title: str) -> None:
    print(f"\n\033[1m== {title}\033[0m", flush=True)


def moetune(*args: str, check: bool = True) -> int:
    print("$ moetune " + " ".join(shlex.quote(a) for a in args), flush=True)
    rc = subprocess.run([*MOETUNE, *args], cwd=ROOT).returncode
    if check and rc != 0:
        sys.exit(f"demo: `moetune {args[0]}` failed with exit code {rc}")
    return rc


def ask_one_question(model: Path) -> None:
    """Plan the model for this machine alone, launch it with moetune (waits for /health), ask one
    question, print the server's own timings, stop it in order."""
    hw = OUT / "hw-this-machine.yaml"
    hw.write_text(
        yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16384, "ram_bw_gbs": 20}}]})
    )
    plan = OUT / "serve-plan.json"
    moetune(
        "plan",
        str(model.relative_to(ROOT)),
        "--hw",
        str(hw.relative_to(ROOT)),
        *PLAN_ARGS,
        "--port",
        str(free_port()),
        "-o",
        str(plan.relative_to(ROOT)),
        "--format",
        "argv",
    )
    launch = ["launch", str(plan.relative_to(ROOT)), "--detach", "--json"]
    print("$ moetune " + " ".join(launch), flush=True)
    r = subprocess.run([*MOETUNE, *launch], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"demo: launch failed:\n{r.stderr}")
    run = json.loads(r.stdout)
    print(json.dumps(run))
    url = run["url"]
    try:
        body = {
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 64,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        print(f"$ curl {url}/v1/chat/completions -d '{json.dumps(body)[:80]}...'", flush=True)
        resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
        answer = resp["choices"][0]["message"]["content"]
        t = resp["timings"]
        print(f"answer (random weights, so garbage): {answer[:60]!r}...")
        print(
            f"server timings: prompt {t['prompt_n']} tokens in {t['prompt_ms']:.1f} ms "
            f"({t['prompt_n'] / t['prompt_ms'] * 1000:.1f} tokens/s), "
            f"generated {t['predicted_n']} tokens in {t['predicted_ms']:.1f} ms "
            f"({t['predicted_n'] / t['predicted_ms'] * 1000:.1f} tokens/s), cached {t.get('cache_n', 0)}"
        )
    finally:
        moetune("stop", str(run["run"]))


def measure_attention() -> dict[str, float]:
    """This CPU's attention kernels (`moetune hw attention --write`), for the plans' hardware files."""
    hw = OUT / "hw-attention.yaml"
    hw.write_text(
        yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16384, "ram_bw_gbs": 20}}]})
    )
    moetune("hw", "attention", str(hw.relative_to(ROOT)), "--write")
    speed: dict[str, float] = yaml.safe_load(hw.read_text())["nodes"][0]["cpu"]["speed"]
    return speed


def write_plans(model: Path, speed: dict[str, float]) -> Path:
    """One plan per strategy, made by `moetune plan`: the hardware is this machine plus a loopback
    ggml-rpc-server worker whose device (RPC0) holds 80 MiB, standing in for a small GPU. Each
    plan's launch section starts the worker first and stops it last."""
    plans = OUT / "plans"
    plans.mkdir(exist_ok=True)
    entries = []
    for label, strategy in STRATEGIES:
        rport = free_port()  # a fresh port per plan: a worker's port may linger after it stops
        hw = plans / f"hw-{rport}.yaml"
        hw.write_text(
            yaml.safe_dump(
                {
                    "name": "demo-loopback-rpc",
                    "nodes": [  # one name: one calibration
                        {"name": "local", "cpu": {"cores": 2, "ram_mib": 16384, "ram_bw_gbs": 20, "speed": speed}},
                        {
                            "name": "rpc-worker",
                            "link_addr": "127.0.0.1",
                            "rpc_port": rport,
                            "cpu": {"cores": 2, "ram_mib": 16384, "ram_bw_gbs": 20},
                            "devices": [{"name": "CPU", "kind": "cpu", "mem_mib": 80, "bw_gbs": 20}],
                        },
                    ],
                },
                sort_keys=False,
            )
        )
        name = strategy.replace(":", "-") + ".json"
        show = ["--format", "table"] if strategy == "auto" else ["--format", "argv"]
        moetune(
            "plan",
            str(model.relative_to(ROOT)),
            "--hw",
            str(hw.relative_to(ROOT)),
            "--strategy",
            strategy,
            *PLAN_ARGS,
            "--port",
            str(free_port()),
            "-o",
            str((plans / name).relative_to(ROOT)),
            *show,
        )
        entries.append({"label": label, "plan": name})
    sweep = plans / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump({"name": "demo placements", "baseline": STRATEGIES[0][0], "plans": entries}, sort_keys=False)
    )
    return sweep


def main() -> None:
    t0 = time.monotonic()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir()
    os.environ["MOETUNE_DATA_DIR"] = str(OUT / "data")  # the demo's launches and calibration stay in demo-out
    model = OUT / "model.gguf"
    db = OUT / "results.sqlite"

    step("1. generate a small MoE model (random weights, real layout)")
    moetune("testmodel", str(model.relative_to(ROOT)), "--layers", "8", "--embd", "512", "--expert-ff", "512")

    step("2. inspect it")
    moetune("inspect", str(model.relative_to(ROOT)))

    step("3. plan it, launch it, ask one question, stop it")
    ask_one_question(model)

    step("4. measure this CPU's attention kernels, plan three expert placements on it, sweep them, compare")
    sweep = write_plans(model, measure_attention())
    print(f"plans: {', '.join(str(p.relative_to(ROOT)) for p in sorted(sweep.parent.glob('*.json')))}")
    plot = OUT / "compare.png"
    args = [
        "sweep",
        str(sweep.relative_to(ROOT)),
        *BENCH,
        "--plot",
        str(plot.relative_to(ROOT)),
        "--db",
        str(db.relative_to(ROOT)),
    ]
    moetune(*args)

    step("5. the same command again resumes the sweep: every plan is complete, so none is re-run")
    again = [*args[:2], *BENCH, "--db", str(db.relative_to(ROOT)), "--json"]
    print("$ moetune " + " ".join(shlex.quote(a) for a in again), flush=True)
    doc = json.loads(subprocess.run([*MOETUNE, *again], cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    for p in doc["plans"]:
        print(f"  {p['label']}: {p['status']} (run {p['run']})")

    step("history")
    moetune("results", "list", "--db", str(db.relative_to(ROOT)))

    step("6. calibrate the speed model on what the three runs measured, then the report of the three")
    # on a busy machine calibrate leaves the contended runs out and may have nothing left to fit
    # (exit 2, saying so): the demo goes on, with the built-in constants
    moetune("calibrate", "--db", str(db.relative_to(ROOT)), check=False)
    report = OUT / "report.html"
    moetune(
        "report",
        *(str(p["run"]) for p in doc["plans"]),
        "-o",
        str(report.relative_to(ROOT)),
        "--db",
        str(db.relative_to(ROOT)),
    )

    step("7. quality: do the faster placements change the answers? KL divergence from the baseline's logits")
    plans = [sweep.parent / (strategy.replace(":", "-") + ".json") for _, strategy in STRATEGIES]
    moetune(
        "quality",
        *(str(p.relative_to(ROOT)) for p in plans),
        "--ctx",
        "128",
        "--chunks",
        "6",
        "--db",
        str(db.relative_to(ROOT)),
    )
    print(
        f"\ndemo done in {time.monotonic() - t0:.0f} s; plot: {plot.relative_to(ROOT)}; "
        f"report: {report.relative_to(ROOT)}; results: {db.relative_to(ROOT)} "
        f"(moetune results show RUN --db {db.relative_to(ROOT)})"
    )


if __name__ == "__main__":
    main()
