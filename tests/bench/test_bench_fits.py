"""`bench`, `serve-bench` and `sweep` start a plan's servers only when the plan says it fits, as
`launch` does (without its --force)."""

from __future__ import annotations

from pathlib import Path

import yaml

from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from moetune.paths import runs_dir
from tests.helpers import run_cli


def test_a_plan_that_does_not_fit_is_not_benchmarked(tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe"), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 8, "ram_bw_gbs": 20}}]}))
    plan = tmp_path / "plan.json"
    assert run_cli("plan", str(model), "--hw", str(hw), "-o", str(plan)).exit_code == 0
    for cmd in (["bench", str(plan)], ["serve-bench", str(plan)]):
        r = run_cli(*cmd)
        assert r.exit_code == 2, (cmd, r.stderr)
        assert "does not fit" in r.stderr and "CPU is short by" in r.stderr, r.stderr
    r = run_cli("sweep", str(plan))  # a sweep goes on past a plan that fails, and says none completed
    assert r.exit_code == 1 and "does not fit" in r.stderr and "no plan of the sweep completed" in r.stderr
    assert not runs_dir().exists() or not any(runs_dir().iterdir())  # nothing was started
