"""`hw probe` reads every nvidia-smi answer without failing (captured outputs; the GPUs themselves
cannot be here, so nvidia-smi's text stands in for them)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from moetune.hardware.inventory import Inventory, from_dict, to_dict
from moetune.hardware.probe import UNIFIED_CPU_SHARE, local_node, parse_gpus
from tests.helpers import run_cli

RAM = 122_000.0  # MiB, a DGX Spark's MemTotal is about this

# (what nvidia-smi printed, [(name, mem_mib, bw_gbs, link_gbs)], unified, notes expected)
CASES = [
    (
        "0, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887, 5, 16\n"
        "1, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887, 5, 16\n",
        [("CUDA0", 97887, 1790, 50.4), ("CUDA1", 97887, 1790, 50.4)],
        False,
        0,
    ),
    ("0, NVIDIA H200, 143771, 5, 16\n", [("CUDA0", 143771, 4800, 50.4)], False, 0),
    ("0, NVIDIA GB10, [N/A], [N/A], [N/A]\n", [("CUDA0", round(RAM * (1 - UNIFIED_CPU_SHARE)), 273, 200)], True, 1),
    (
        "0, NVIDIA GB10, [Not Supported], [Not Supported], [Not Supported]\n",
        [("CUDA0", round(RAM * (1 - UNIFIED_CPU_SHARE)), 273, 200)],
        True,
        1,
    ),
    ("0, NVIDIA H100 PCIe, 81559, [N/A], [N/A]\n", [("CUDA0", 81559, 3350, 25.0)], False, 1),
    # a discrete GPU whose size is unknown is left out (a 0 MiB device is not a valid file)
    (
        "0, NVIDIA H100 PCIe, [N/A], 5, 16\n1, NVIDIA H100 PCIe, 81559, 5, 16\n",
        [("CUDA1", 81559, 3350, 50.4)],
        False,
        1,
    ),
    ("0, NVIDIA A100-SXM4-80GB\n", [], False, 1),  # missing columns
    ("0, Mystery Accelerator, 24576, 4, 16\n", [("CUDA0", 24576, 500, 25.2)], False, 1),
    # an integrated GPU moetune does not know (no memory and no PCIe link of its own): unified
    ("0, NVIDIA Thor, [N/A], [N/A], [N/A]\n", [("CUDA0", round(RAM * (1 - UNIFIED_CPU_SHARE)), 500, 25.0)], True, 3),
    # two unified GPUs split the shared memory, never count it twice
    (
        "0, NVIDIA GB10, [N/A], [N/A], [N/A]\n1, NVIDIA GB10, [N/A], [N/A], [N/A]\n",
        [
            ("CUDA0", round(RAM * (1 - UNIFIED_CPU_SHARE) / 2), 273, 200),
            ("CUDA1", round(RAM * (1 - UNIFIED_CPU_SHARE) / 2), 273, 200),
        ],
        True,
        2,
    ),
    ("0, NVIDIA H200, 143771 MiB, 5, 16\n", [("CUDA0", 143771, 4800, 50.4)], False, 0),  # units left in
    ("", [], False, 0),
    ("No devices were found\n", [], False, 1),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", [], False, 1),
    (
        "0, NVIDIA H200, inf, 5, 16\n0, , -5, x, y\n1, NVIDIA H200, 143771, x, y\n",
        [("CUDA1", 143771, 4800, 25.0)],
        False,
        3,
    ),
]


@pytest.mark.parametrize(("text", "want", "unified", "n_notes"), CASES)
def test_every_answer_parses(text: str, want: list[tuple[str, int, float, float]], unified: bool, n_notes: int) -> None:
    got = parse_gpus(text, RAM)
    assert [(d.name, d.mem_mib, d.bw_gbs, d.link_gbs) for d in got.devices] == want
    assert got.unified == unified
    assert len(got.notes) == n_notes, got.notes


@pytest.mark.parametrize(("text", "want", "unified", "n_notes"), CASES)
def test_every_answer_makes_a_valid_file_counting_memory_once(
    text: str, want: object, unified: bool, n_notes: int
) -> None:
    got = parse_gpus(text, RAM)
    node = local_node(got, RAM, 20, 273.0)
    again = from_dict(yaml.safe_load(yaml.safe_dump(to_dict(Inventory((node,), name="probed")))))
    assert again.nodes[0] == node
    assert node.ram_mib + sum(d.mem_mib for d in node.devices if unified) <= RAM + len(node.devices)


def test_gb10_is_one_device_with_the_unified_memory() -> None:
    got = parse_gpus("0, NVIDIA GB10, [N/A], [N/A], [N/A]\n", 131072.0)
    # as examples/dgx-spark-x2.yaml declares the same machine: 112 GiB to the GPU, 16 GiB kept for the CPU
    assert [d.mem_mib for d in got.devices] == [114688]
    assert "unified" in got.notes[0]


def _fake_smi(tmp_path: Path, text: str, rc: int = 0) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    smi = d / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\nexit {rc}\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return d


@pytest.mark.parametrize(
    ("text", "rc"),
    [
        ("0, NVIDIA GB10, [N/A], [N/A], [N/A]\n", 0),
        ("0, NVIDIA H100 PCIe, [N/A], 5, 16\n", 0),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9),
        (
            "0, NVIDIA H200, 143771, 5, 16\nUnable to determine the device handle "
            "for GPU1: 0000:41:00.0: Unknown Error\n",
            15,
        ),
    ],
)
def test_probe_command_warns_and_writes_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, rc: int
) -> None:
    """The real command, with a stand-in nvidia-smi on PATH (no GPU here): exit 0, warnings on
    stderr, a YAML that `hw show` accepts."""
    monkeypatch.setenv("PATH", f"{_fake_smi(tmp_path, text, rc)}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "hw.yaml"
    r = run_cli("hw", "probe", "--no-measure", "-o", str(out))
    assert r.exit_code == 0, r.stderr
    assert "warning:" in r.stderr
    doc = yaml.safe_load(out.read_text())
    devices = doc["nodes"][0].get("devices") or []
    assert len(devices) == (1 if "GB10" in text or "H200" in text else 0)
    if rc:
        assert f"nvidia-smi failed (exit {rc})" in r.stderr
    assert run_cli("hw", "show", str(out)).exit_code == 0
