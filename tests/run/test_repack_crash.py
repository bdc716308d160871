"""The engine crashing at load with repacked CPU weights: `launch` and `doctor` name it
(``repack_crash``) and give the plan's remedy, ``--repack off``.

On an AVX-512 CPU with AMX the mainline build 11434 segfaults (exit 139) while it repacks a
quantized model's weights (issue #25; DESIGN.md section 5). The real crash is tested where it
happens; elsewhere the test says so and skips. The fixture ``cut_repack_crash.mainline.log`` is a
real load of this machine with repacking on (a q4_0 model, its CPU_REPACK buffer logged), cut
where such a crash ends the log: after the buffer sizes, while the weights are read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from moetune.engine.logs import parse_log
from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from moetune.run import diagnose
from moetune.run.doctor import examine
from moetune.run.sources import file_source
from tests.helpers import free_port, run_cli

FIX = Path(__file__).parents[1] / "fixtures" / "logs"
CUT = FIX / "cut_repack_crash.mainline.log"


@pytest.mark.parametrize("code", [139, -11])
def test_a_segfault_after_a_repack_buffer_is_named(code: int) -> None:
    d = diagnose.server_exit("main", parse_log(CUT.read_text()), code, loading=True)
    assert d.cause == diagnose.REPACK_CRASH
    assert "crashed at load with repacked CPU weights" in d.message and "CPU_REPACK" in d.message
    assert "--repack off" in d.hint
    assert any("CPU_REPACK model buffer size" in e.text for e in d.evidence)


def test_other_exits_are_not_called_a_repack_crash() -> None:
    log = parse_log(CUT.read_text())
    assert diagnose.server_exit("main", log, 1, loading=True).cause == diagnose.EXITED_DURING_LOAD
    without = parse_log("".join(x for x in CUT.read_text().splitlines(keepends=True) if "REPACK" not in x))
    assert diagnose.server_exit("main", without, 139, loading=True).cause == diagnose.EXITED_DURING_LOAD
    oom = parse_log((FIX / "real_oom_compute_cpu.mainline.log").read_text())
    assert diagnose.server_exit("main", oom, 139, loading=True).cause == diagnose.OUT_OF_MEMORY


def test_doctor_names_it_in_a_log_and_in_a_run() -> None:
    (f,) = examine([file_source(CUT)])  # a log alone: it ends while loading, after the repack buffer
    assert f.code == "repack_crash" and "--repack off" in f.remedy
    (g,) = examine([replace(file_source(CUT), exit_code=139)])  # a run's record: the exit code too
    assert g.code == "repack_crash" and "exit 139, a segmentation fault" in g.title
    assert examine([replace(file_source(CUT), exit_code=0)]) == []


def test_the_real_crash_where_this_cpu_has_it(bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantized model (q4_0 experts for CPU_REPACK, q8_0 elsewhere for AMX) planned with repacking on."""
    model = generate(
        tmp_path / "m.gguf",
        "qwen3moe",
        small_dims("qwen3moe"),
        "ffn_up_exps=q4_0,ffn_gate_exps=q4_0,ffn_down_exps=q4_0,other=q8_0",
    ).files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(
        yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}}]})
    )
    plan = tmp_path / "plan.json"
    r = run_cli(
        "plan",
        str(model),
        "--hw",
        str(hw),
        "--ctx",
        "1024",
        "--repack",
        "on",
        "--port",
        str(free_port()),
        "-o",
        str(plan),
    )
    assert r.exit_code == 0, r.stderr
    assert "-nr" not in json.loads(plan.read_text())["argv"]
    r = run_cli("launch", str(plan), "--detach", "--json")
    if r.exit_code == 0:
        run_cli("stop", json.loads(r.stdout)["run"])
        pytest.skip("repacking does not crash the engine on this CPU (the crash needs an AVX-512 CPU with AMX)")
    assert "crashed at load with repacked CPU weights" in r.stderr and "--repack off" in r.stderr, r.stderr
    found = json.loads(run_cli("doctor", "latest", "--json").stdout)
    assert [f["code"] for f in found] == ["repack_crash"]
