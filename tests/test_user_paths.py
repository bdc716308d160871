"""Every path the user names is checked before use: a directory, a FIFO (which would block a
read), a loop of symbolic links, a missing file or shard give one line and exit 2, never a
traceback or a hang."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from tests.helpers import run_cli


@pytest.fixture
def bad(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "dir.gguf"
    d.mkdir()
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    (tmp_path / "a.gguf").symlink_to(tmp_path / "b.gguf")
    (tmp_path / "b.gguf").symlink_to(tmp_path / "a.gguf")
    return {
        "directory": d,
        "FIFO": fifo,
        "loop of symbolic links": tmp_path / "a.gguf",
        "no such": tmp_path / "missing.gguf",
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["directory", "FIFO", "loop of symbolic links", "no such"])
def test_every_named_path_is_checked_before_use(bad: dict[str, Path], tmp_path: Path, what: str) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe"), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(
        yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}}]})
    )
    p = str(bad[what])
    for args in (
        ["inspect", p],
        ["plan", p, "--hw", str(hw)],
        ["plan", str(model), "--hw", p],
        ["launch", p],
        ["plan", "--layout", p, "--hw", str(hw)],
        ["bench", p] if what != "no such" else ["launch", p],
    ):
        r = run_cli(*args)
        assert r.exit_code == 2, (args, r.stderr)
        first = r.stderr.strip().splitlines()[0]
        assert first.startswith(f"Error: {p}") and what in first and "Traceback" not in r.stderr, (args, r.stderr)


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    files = generate(tmp_path / "s.gguf", "qwen3moe", small_dims("qwen3moe"), "f16", shards=3).files
    files[1].unlink()
    r = run_cli("inspect", str(files[0]))
    assert r.exit_code == 2 and "missing shard" in r.stderr and files[1].name in r.stderr
