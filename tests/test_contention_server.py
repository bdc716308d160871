"""A benchmark and a tune beside a real CPU hog, with the real mainline engine on a generated model:
the run is flagged contended and names the hog, `calibrate` leaves it out, `tune` stops with exit
code 3 naming it, and with --wait-quiet waits for it to end, then goes on.

The suite turns the threshold off for every other test (tests/conftest.py: the machine is shared);
these set it back to the default."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from tests.helpers import free_port, run_cli
from tests.test_contention import hogs, kill, threshold_above_the_background

pytestmark = pytest.mark.server
# measures about 0.07 s: judged over the 3 s ending at its end (contention.MIN_JUDGED_S), the hogs'
# seconds before it included (over the run alone, the woken engine takes the cores from them)
FAST = ("--depth", "0", "--pp-tokens", "64", "--tg-tokens", "16", "-r", "2", "--warmup", "0")


@pytest.fixture
def testbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    monkeypatch.setenv("MOETUNE_MAX_FOREIGN_CORES", "0.5")
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe"), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(
        yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}}]})
    )
    yield model, hw


def test_a_bench_beside_a_hog_is_contended_names_it_and_calibrate_leaves_it_out(
    bin_dir: Path, testbed: tuple[Path, Path], tmp_path: Path
) -> None:
    model, hw = testbed
    plan = tmp_path / "p.json"
    assert (
        run_cli(
            "plan", str(model), "--hw", str(hw), "--ctx", "1024", "--port", str(free_port()), "-o", str(plan)
        ).exit_code
        == 0
    )
    hog = hogs(2)
    try:
        r = run_cli("bench", str(plan), *FAST, "--json")
    finally:
        kill(hog)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    rid = str(doc["run"]["id"])
    c = doc["flags"]["contention"]
    assert doc["run"]["contended"] and doc["flags"]["contended"] and c["foreign_cores"] > 0.5, c
    assert c["engine_cores"] > 0 and c["seconds"] > 0.5  # the run's 0.07 s and the seconds before it
    named = {t["comm"]: t for t in c["top"]}
    assert "cpu-hog" in named and set(named["cpu-hog"]["pids"]) <= {h.pid for h in hog}, c["top"]

    listed = run_cli("results", "list")
    assert "contended" in listed.stdout
    shown = run_cli("results", "show", rid)
    assert "warning: contended: foreign load" in shown.stderr and "cpu-hog (pid" in shown.stderr
    assert "CPU while measuring: the engine" in shown.stdout
    compared = run_cli("compare", rid, rid, "--json")
    assert json.loads(compared.stdout)["run_flags"][rid][0] == "contended"
    assert "p [contended" in run_cli("compare", rid, rid).stdout  # the marker beside its label

    left = run_cli("calibrate")
    assert left.exit_code == 2 and "left out 1 contended run" in left.stderr and "cpu-hog" in left.stderr
    assert "--include-contended" in left.stderr
    kept = run_cli("calibrate", "--include-contended", "--json")
    assert kept.exit_code == 0, kept.stderr
    entry = json.loads(kept.stdout)
    assert entry["runs"] == 1 and entry["applied"] and entry["placements"] == 1
    # the plan says which calibration it uses
    planned = run_cli("plan", str(model), "--hw", str(hw), "--ctx", "1024", "--port", str(free_port()), "--json")
    pdoc = json.loads(planned.stdout)
    assert pdoc["speed_calibration"]["runs"] == 1 and pdoc["speed_calibration"]["placements"] == 1
    assert pdoc["speed_uncertainty"]["source"] == "calibration"
    text = run_cli("plan", str(model), "--hw", str(hw), "--ctx", "1024", "--port", str(free_port())).stdout
    assert "from 1 runs over 1 placements" in text and "stated uncertainty TG +/-" in text


def test_tune_beside_a_hog_stops_with_exit_3_or_waits_with_wait_quiet(
    bin_dir: Path, testbed: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, hw = testbed
    tune = [
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--ctx",
        "1024",
        "--budget",
        "1",
        *FAST,
        "--port",
        str(free_port()),
        "--db",
        str(tmp_path / "t.db"),
    ]
    hog = hogs(2)
    try:
        r = run_cli(*tune)
    finally:
        kill(hog)
    assert r.exit_code == 3, (r.stdout, r.stderr)
    assert "too busy to rank candidates" in r.stderr and "cpu-hog (pids" in r.stderr and "--wait-quiet" in r.stderr
    assert "launch 1/1" not in r.stderr  # nothing was launched

    threshold_above_the_background(monkeypatch)
    hog = hogs(2)
    timer = threading.Timer(3.0, kill, [hog])
    timer.start()
    try:
        r = run_cli(*tune, "--wait-quiet", "90", "--json")
    finally:
        timer.cancel()
        kill(hog)
    assert r.exit_code == 0, r.stderr
    assert "waiting for the machine to go quiet" in r.stderr and "the machine is quiet" in r.stderr
    assert json.loads(r.stdout)["launches"] == 1
