"""`moetune tune` on this machine's testbed (tests/tune_testbed.py): against an exhaustively
measured grid, from a cold start and after a calibration on two runs; and what it must never do
(launch a plan the ledger rejects, stop at a launch that fails, launch twice what it measured)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from moetune.app.plan import PlanRequest
from moetune.app.plan import plan as plan_files
from moetune.bench.analysis.stats import SLOWER, difference
from moetune.plan.settings import Settings
from moetune.run.prepare import read_plan
from moetune.store.db import ResultsDB
from tests.engine_harness import free_port
from tests.helpers import run_cli
from tests.tune_testbed import (
    CALIBRATE_ON,
    TRY,
    WORKLOAD,
    launch_sigma,
    make_testbed,
    measure_grid,
    plan_grid,
    pooled,
    run_ids,
)

pytestmark = pytest.mark.server


def close_to(best: list[float], reached: list[float], sigma: float) -> bool:
    """Within 3% of the grid's best, or statistically indistinguishable from it: by the comparison
    rule on the samples, or within the launch-to-launch noise (each side pools two launches, so
    their log difference has spread ``sigma``). The band is 99% (2.576 sigma), not 95%: the test
    makes two such checks per run, and at 95% a tuner that always reached the best would still fail
    about one CI run in ten (seen: a gap of 0.146 against a 95% band of 0.140)."""
    gap = math.log(statistics.median(best) / statistics.median(reached))
    return (
        gap <= math.log(1 / 0.97)
        or difference(best, reached, higher_is_better=True).verdict != SLOWER
        or gap <= 2.576 * sigma
    )


def test_tune_reaches_the_grid_best_in_five_launches_cold_and_three_calibrated(bin_dir: Path, tmp_path: Path) -> None:
    model, hw = make_testbed(tmp_path)
    port = free_port()
    grid_db = tmp_path / "grid.db"
    launches = measure_grid(plan_grid(tmp_path, model, hw, port), [grid_db, tmp_path / "grid2.db"])
    grid, sigma = pooled(launches), launch_sigma(launches)
    assert len(grid) == 16 and all(len(v) == 6 for v in grid.values())
    # the band below widens with the machine's noise (0.1 on this machine when quiet; 0.33 measured
    # while other jobs loaded it); past 0.5 nothing could be judged
    assert sigma < 0.5
    best = max(grid, key=lambda k: statistics.median(grid[k]))
    tune = [
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
        "--json",
        "--max-pp-loss",
        "100",
        "--confirm",
        "2",
    ]  # the question is TG alone; the two best launched twice (a whole launch runs fast or slow on
    # this machine; without the round, one CI run ended at a candidate 0.69x the grid's best)

    # from nothing: the baseline is the slowest corner (every expert on the CPU, one thread)
    cold_db, out = tmp_path / "cold.db", tmp_path / "best.json"
    r = run_cli(*tune, "--budget", "5", "--db", str(cold_db), "-o", str(out))
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert 1 < doc["launches"] <= 5 and doc["baseline"]["label"] == "cpu-moe t1 ub512 fa"
    # the configuration reached, as the grid measured it (two launches; its own launch in the search
    # is one more draw of the same noise)
    reached = doc["best_candidate"]["label"]
    assert close_to(grid[best], grid[reached], sigma), (
        reached,
        best,
        {k: round(statistics.median(v)) for k, v in grid.items()},
    )
    launched = [c for c in doc["candidates"] if c["launched"]]
    assert len(launched) == doc["launches"] and all(c["measured"] for c in launched)
    assert {c["label"] for c in doc["candidates"]} == set(grid)  # the search space is the grid
    spec, plan = read_plan(out)  # the winner is a plan `moetune launch` and `moetune bench` take
    assert plan["label"] == doc["best"]["label"] and spec.servers()[0].argv

    # calibrated on two runs of the grid: three launches
    ids = run_ids(grid_db)
    # --force: stored even where the machine's noise states an uncertainty past the built-in one
    r = run_cli("calibrate", str(ids[CALIBRATE_ON[0]]), str(ids[CALIBRATE_ON[1]]), "--db", str(grid_db), "--force")
    assert r.exit_code == 0, r.stderr
    warm_db = tmp_path / "warm.db"
    r = run_cli(*tune, "--budget", "3", "--db", str(warm_db))
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["launches"] <= 3
    reached = doc["best_candidate"]["label"]
    assert close_to(grid[best], grid[reached], sigma), (
        reached,
        best,
        {k: round(statistics.median(v)) for k, v in grid.items()},
    )


def test_tune_skips_what_does_not_fit_records_a_failed_launch_and_resumes(bin_dir: Path, tmp_path: Path) -> None:
    # -ub 65536 without flash attention wants ~145 GiB of compute buffer on the RPC worker: the
    # hardware file claims 200 GB there, so the ledger lets it through and the worker's allocation
    # fails at launch; the host is given just enough RAM for `auto` at that ubatch, not for cpu-moe
    # (no prompt cache: it would take what the host has left, and the RAM given is the point here)
    model, hw = make_testbed(tmp_path, rpc_mem_mib=200000, cpu_ram_mib=100000)
    s = Settings(ctx=65536, batch=65536, ubatch=65536, flash_attn=False, threads=1, cache_ram_mib=0)
    auto_cpu = next(
        led
        for led in plan_files(PlanRequest(hw=str(hw), model=str(model), strategy="auto", settings=s)).plan.ledgers
        if led.device == "CPU"
    )
    doc = yaml.safe_load(hw.read_text())
    doc["nodes"][0]["cpu"]["ram_mib"] = auto_cpu.used_mib - auto_cpu.capacity_mib + 100000 + 25
    hw.write_text(yaml.safe_dump(doc))
    args = [
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--ctx",
        "65536",
        "-b",
        "65536",
        "-ub",
        "65536",
        "--no-flash-attn",
        "--cache-ram",
        "0",
        "-t",
        "1",
        "--try-strategy",
        "auto,cpu-moe",
        "--try-ubatch",
        "65536,256",
        "--try-fa",
        "off",
        "--try-threads",
        "1",
        "--try-cache",
        "f16/f16",
        "--try-repack",
        "off",
        *WORKLOAD,
        "--port",
        str(free_port()),
        "--budget",
        "4",
        "--db",
        str(tmp_path / "t.db"),
        "--json",
    ]
    r = run_cli(*args)
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    by = {c["label"]: c for c in out["candidates"]}
    assert (
        by["cpu-moe t1 ub65536 no-fa"]["verdict"].startswith("does not fit")
        and not by["cpu-moe t1 ub65536 no-fa"]["launched"]
    )
    base = by["auto t1 ub65536 no-fa"]
    assert base["launched"] and base["measured"] is None
    assert base["verdict"].startswith("failed: ") and "out of memory" in base["verdict"]
    assert out["best_candidate"]["label"] in ("auto t1 ub256 no-fa", "cpu-moe t1 ub256 no-fa")
    assert out["best_candidate"]["tg_tok_s"]["median"] > 0
    n = len(run_ids(tmp_path / "t.db"))
    again = run_cli(*args)  # resumed: nothing measured or failed is launched again
    assert again.exit_code == 0, again.stderr
    assert "resuming tune" in again.stderr and "launch " not in again.stderr.replace("launches", "")
    assert json.loads(again.stdout)["launches"] == out["launches"] and len(run_ids(tmp_path / "t.db")) == n


def test_a_two_device_layer_set_in_try_strategy_is_one_candidate_launched_on_both_devices(
    bin_dir: Path, tmp_path: Path
) -> None:
    # issue #23: the comma list of the reference's syntax used to split inside the layer set
    model, hw = make_testbed(tmp_path, rpc_devices=2)
    layer_set = "layers:RPC0=0-3,RPC1=4-7"
    db = tmp_path / "t.db"
    r = run_cli(
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--strategy",
        "cpu-moe",
        "-t",
        "1",
        "-ub",
        "128",
        "--try-strategy",
        f"cpu-moe,{layer_set}",
        "--try-threads",
        "1",
        "--try-ubatch",
        "128",
        "--try-fa",
        "on",
        "--try-cache",
        "f16/f16",
        "--try-repack",
        "off",
        *WORKLOAD,
        "--port",
        str(free_port()),
        "--budget",
        "2",
        "--db",
        str(db),
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    assert "skipped" not in r.stderr
    doc = json.loads(r.stdout)
    labels = [c["label"] for c in doc["candidates"]]
    assert labels == ["cpu-moe t1 ub128 fa", f"{layer_set} t1 ub128 fa"]
    assert doc["launches"] == 2 and all(c["launched"] and c["measured"] for c in doc["candidates"])
    workers = yaml.safe_load(hw.read_text())["nodes"][1:]
    ends = [f"127.0.0.1:{n['rpc_port']}" for n in workers]
    with ResultsDB.open(db) as h:
        (run,) = [x for x in h.runs() if x.label == labels[1]]
        plan = h.run(run.id).meta.plan
    assert plan is not None
    (svc,) = plan["services"]
    on = {layer["index"]: set(layer["experts"].values()) for layer in svc["layers"]}
    assert all(on[i] == {f"RPC0[{ends[0]}]"} for i in range(4)), on
    assert all(on[i] == {f"RPC0[{ends[1]}]"} for i in range(4, 8)), on
    assert svc["argv"][svc["argv"].index("--rpc") + 1] == ",".join(ends)
    assert [p["name"] for p in plan["launch"]["processes"] if p["role"] == "rpc"] == ["rpc0", "rpc1"]


def test_a_baseline_that_fails_to_launch_is_never_the_best(bin_dir: Path, tmp_path: Path) -> None:
    # as above: the RPC worker cannot allocate the compute buffer of -ub 65536 without flash attention
    model, hw = make_testbed(tmp_path, rpc_mem_mib=200000, cpu_ram_mib=100000)
    out = tmp_path / "best.json"
    args = [
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--ctx",
        "65536",
        "-b",
        "65536",
        "-ub",
        "65536",
        "--no-flash-attn",
        "-t",
        "1",
        "--try-strategy",
        "auto",
        "--try-ubatch",
        "65536",
        "--try-fa",
        "off",
        "--try-threads",
        "1",
        "--try-cache",
        "f16/f16",
        "--try-repack",
        "off",
        *WORKLOAD,
        "--port",
        str(free_port()),
        "--budget",
        "1",
        "--db",
        str(tmp_path / "t.db"),
        "-o",
        str(out),
    ]
    r = run_cli(*args, "--json")
    assert r.exit_code == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["best"] is None and doc["plan"] is None
    (base,) = doc["candidates"]
    assert base["launched"] and base["measured"] is None and base["verdict"].startswith("failed: ")
    assert "no configuration was measured" in r.stderr and not out.exists()
    again = run_cli(*args)  # resumed (the failure is not retried): the table says so too
    assert again.exit_code == 1
    assert "best: none (no configuration was measured)" in again.stdout and "resuming tune" in again.stderr
    assert "launch 1/1" not in again.stderr
