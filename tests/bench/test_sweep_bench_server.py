"""`moetune bench PLAN --sweep` with the real ik_llama.cpp: the plan's RPC worker started through
the launcher, llama-sweep-bench run with the plan's own flags, its rows stored as depth workloads
that `compare` lines up with each other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from moetune.store.db import ResultsDB
from tests.engine_harness import free_port, loopback_hw
from tests.helpers import run_cli

pytestmark = pytest.mark.server


def test_sweep_bench_measures_a_plan_at_every_depth(
    ik_bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump(loopback_hw([f"127.0.0.1:{free_port()}"])))
    plans = []
    for strategy in ("cpu-moe", "all-gpu"):
        plan = tmp_path / f"{strategy}.json"
        r = run_cli(
            "plan",
            str(model),
            "--hw",
            str(hw),
            "--engine",
            "ik_llama.cpp",
            "--strategy",
            strategy,
            "--ctx",
            "1024",
            "-ub",
            "256",
            "-b",
            "256",
            "-o",
            str(plan),
            "--json",
        )
        assert r.exit_code == 0, r.stderr
        plans.append(plan)
    ids = []
    monkeypatch.setenv("MOETUNE_METRICS_INTERVAL", "0.1")
    for plan in plans:
        r = run_cli("bench", str(plan), "--sweep", "--sweep-ctx", "768", "--tg-tokens", "16", "--json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert list(doc["workloads"]) == ["d0", "d256", "d512"]  # a ubatch per step up to the depth asked
        assert all(
            w["tg"]["n"] == 1 and w["tg"]["median"] > 0 and w["pp"]["median"] > 0 for w in doc["workloads"].values()
        )
        assert "RPC workers up: rpc0" in r.stderr
        ids.append(str(doc["run"]["id"]))
        with ResultsDB.open() as db:
            run = db.run(doc["run"]["id"])
            assert run.meta.details["backend"] == "llama-sweep-bench"
            assert run.meta.engine_build.startswith("ik_llama.cpp (moetune build")  # type: ignore[union-attr]
            argv = run.meta.details["sweep_argv"]
            assert "--rpc" in argv and argv[argv.index("-c") + 1] == "768" and "--port" not in argv
            # the machine while it ran: the RPC worker from its launch, llama-sweep-bench once started
            names = {p["name"] for m in db.metrics(run.id) for p in m["procs"]}
            assert names <= {"rpc0", "llama-sweep-bench"} and "rpc0" in names
    r = run_cli("compare", *ids, "--json")
    assert r.exit_code == 0, r.stderr
    assert "tg:d512" in r.stdout


def test_sweep_needs_an_engine_that_has_it(bin_dir: Path, tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe"), "f16").files[0]
    plan = tmp_path / "p.json"
    assert run_cli("plan", str(model), "--hw", "rtx-pro-6000", "-o", str(plan)).exit_code == 0
    r = run_cli("bench", str(plan), "--sweep")
    assert r.exit_code == 2 and "llama-sweep-bench" in r.stderr and "--engine ik_llama.cpp" in r.stderr
