"""`moetune hw probe|example` for scripts (--json), and `plan` pointing at them when --hw is missing."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from moetune.hardware import inventory
from tests.helpers import run_cli


def test_hw_probe_json_is_the_hardware_file_s_document(tmp_path: Path) -> None:
    r = run_cli("hw", "probe", "--no-measure", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["nodes"][0]["cpu"]["cores"] >= 1
    hw = tmp_path / "hw.json"
    hw.write_text(r.stdout)  # YAML reads JSON: the output is a usable hardware file
    assert inventory.load(str(hw)).devices()
    r = run_cli("hw", "probe", "--no-measure", "--json", "-o", str(tmp_path / "hw.yaml"))
    assert r.exit_code == 0 and json.loads(r.stdout)["nodes"][0]["cpu"]["cores"] == doc["nodes"][0]["cpu"]["cores"]
    assert yaml.safe_load((tmp_path / "hw.yaml").read_text())["nodes"][0]["name"] == doc["nodes"][0]["name"]


def test_hw_example_json_lists_and_prints_examples() -> None:
    r = run_cli("hw", "example", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout) == inventory.examples()
    assert "rtx-pro-6000x2" in json.loads(r.stdout)
    r = run_cli("hw", "example", "rtx-pro-6000x2", "--json")
    assert r.exit_code == 0
    text = run_cli("hw", "example", "rtx-pro-6000x2").stdout
    assert json.loads(r.stdout) == yaml.safe_load(text)


def test_plan_without_hw_says_how_to_describe_the_hardware() -> None:
    r = run_cli("plan", "model.gguf")
    assert r.exit_code == 2
    lines = r.stderr.splitlines()
    assert lines[0] == "Error: missing option --hw: the hardware to plan for"
    assert "moetune hw probe" in lines[1] and "moetune hw example" in lines[1]
