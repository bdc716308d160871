"""`plan --verify`: the engine's own dry run (llama-fit-params; ik_llama.cpp's --dry-run) for the
plan's exact command, beside the ledger; disagreements named; no verdict where nothing can run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from moetune.run.verify import Figures, Verification, compare, verify_json
from tests.engine_harness import loopback_hw, rpc_workers
from tests.helpers import run_cli


def test_compare_names_what_differs_beyond_the_tolerances() -> None:
    ours = [Figures("RPC0[a:1]", 100.0, 50.0, 20.0), Figures("CPU", 10.0, 0.0, 5.0)]
    same = [Figures("RPC0[a:1]", 100.4, 50.4, 21.9), Figures("CPU", 10.0, 0.0, 5.4)]
    assert compare(ours, same, 0.02) == []
    off = [Figures("RPC0[a:1]", 101.0, 50.0, 23.0)]
    said = compare(ours, off, 0.02)
    assert said[0].startswith("RPC0[a:1] model: plan 100.0 MiB, engine 101.0 MiB") and "compute" in said[1]
    assert said[2] == "CPU: the engine reports no buffer there"
    assert compare(ours, off, 1.0)[0].startswith("RPC0[a:1] compute")  # whole-MiB tables: 1 MiB of slack


def test_without_a_dry_run_the_verdict_is_null() -> None:
    doc = verify_json([Verification(service="main", tool=None, why="the engine is not built here")])
    assert doc["agree"] is None and doc["why"] == "the engine is not built here" and doc["devices"] == []


@pytest.mark.server
@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
@pytest.mark.parametrize("strategy", ["cpu-moe", "all-gpu"])
def test_the_engine_agrees_with_the_plan(
    engine: str, strategy: str, bin_dir: Path, ik_bin_dir: Path, tmp_path: Path
) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0]
    workers = bin_dir if engine == "llama.cpp" else ik_bin_dir
    binary = "ggml-rpc-server" if engine == "llama.cpp" else "rpc-server"
    with rpc_workers(workers, 1, binary=binary) as ends:
        hw = tmp_path / "hw.yaml"
        hw.write_text(yaml.safe_dump(loopback_hw(ends)))
        r = run_cli(
            "plan",
            str(model),
            "--hw",
            str(hw),
            "--engine",
            engine,
            "--strategy",
            strategy,
            "--ctx",
            "8192",
            "--verify",
            "--json",
        )
        assert r.exit_code == 0, r.stderr
        v = json.loads(r.stdout)["verify"]
        assert v["tool"] == ("llama-fit-params" if engine == "llama.cpp" else "llama-server"), v
        assert v["agree"] is True, v["disagreements"]
        names = {d["name"] for d in v["devices"]}
        assert "CPU" in names and any(n.startswith("RPC0") for n in names)
        rpc = next(d for d in v["devices"] if d["name"].startswith("RPC0"))
        assert rpc["context_mib"] > 0 and rpc["compute_mib"] > 0 and (rpc["model_mib"] > 0)
        text = run_cli("plan", str(model), "--hw", str(hw), "--engine", engine, "--strategy", strategy, "--verify")
        assert "the engine's own allocation" in text.stdout and "differs" not in text.stdout


@pytest.mark.server
def test_a_plan_for_hardware_this_machine_lacks_is_not_verified(bin_dir: Path, tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe"), "f16").files[0]
    r = run_cli("plan", str(model), "--hw", "rtx-pro-6000", "--verify", "--json")
    v = json.loads(r.stdout)["verify"]
    assert r.exit_code == 0 and v["agree"] is None and "CUDA0" in v["why"], v


def test_a_plan_document_gives_the_same_subjects_as_the_plan(tmp_path: Path) -> None:
    from moetune.app.plan import PlanRequest
    from moetune.app.plan import plan as plan_files
    from moetune.plan.settings import Settings
    from moetune.run.verify import doc_subjects, subject

    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump(loopback_hw(["127.0.0.1:50990", "127.0.0.1:50991"])))
    planned = plan_files(PlanRequest(hw=str(hw), model=model, strategy="cpu-moe", settings=Settings(ctx=8192)))
    (from_doc,) = doc_subjects(json.loads(json.dumps(planned.doc)))
    direct = subject(planned.plan.main, planned.doc["services"][0]["argv"])
    assert from_doc.names == direct.names == {"RPC0": "RPC0[127.0.0.1:50990]", "RPC1": "RPC0[127.0.0.1:50991]"}
    assert [f.device for f in from_doc.ledger] == [f.device for f in direct.ledger]
    for a, b in zip(from_doc.ledger, direct.ledger, strict=True):  # the document rounds to 0.01 MiB
        assert (a.model_mib, a.context_mib, a.compute_mib) == pytest.approx(
            (b.model_mib, b.context_mib, b.compute_mib), abs=0.1
        )
    assert from_doc.argv == direct.argv and from_doc.engine == planned.doc["launch"]["processes"][-1]["engine"]


@pytest.mark.server
def test_launch_verify_runs_the_dry_run_once_the_workers_listen(bin_dir: Path, tmp_path: Path) -> None:
    from tests.engine_harness import free_port

    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump(loopback_hw([f"127.0.0.1:{free_port()}"])))  # the launch starts the worker
    plan = tmp_path / "p.json"
    assert (
        run_cli(
            "plan",
            str(model),
            "--hw",
            str(hw),
            "--strategy",
            "cpu-moe",
            "--ctx",
            "8192",
            "--port",
            str(free_port()),
            "-o",
            str(plan),
        ).exit_code
        == 0
    )
    r = run_cli("launch", str(plan), "--verify", "--detach", "--json")
    try:
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        v = doc["verify"]
        assert v["tool"] == "llama-fit-params" and v["agree"] is True, v
        assert any(d["name"].startswith("RPC0") and d["compute_mib"] > 0 for d in v["devices"])
    finally:
        run_cli("stop", "--all")
