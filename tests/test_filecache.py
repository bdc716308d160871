"""The derived-file cache: a hardware file validated once and a model's profile built once are read
back as they were, a changed file is read afresh, and each kind keeps its newest entries only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from moetune import filecache
from moetune.errors import InputError
from moetune.hardware import inventory
from moetune.model.archs import small_dims
from moetune.model.testmodel import generate


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MOETUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_hardware_file_is_validated_once_and_again_when_it_changes(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hw = tmp_path / "hw.yaml"
    doc = {
        "nodes": [
            {
                "name": "local",
                "cpu": {"cores": 8, "ram_mib": 64000, "ram_bw_gbs": 80},
                "devices": [{"name": "CUDA0", "kind": "gpu", "mem_mib": 24000, "bw_gbs": 900, "tflops": 80}],
            },
            {
                "name": "w",
                "link_addr": "10.0.0.2",
                "cpu": {"cores": 4, "ram_mib": 32000, "ram_bw_gbs": 40},
                "devices": [{"name": "CUDA0", "kind": "gpu", "mem_mib": 12000, "bw_gbs": 500}],
            },
        ]
    }
    hw.write_text(yaml.safe_dump(doc))
    first = inventory.load(hw)
    assert len(list((cache / "hardware").iterdir())) == 1

    def no_validation(*a: object, **k: object) -> None:
        raise AssertionError("validated again")

    monkeypatch.setattr(inventory, "from_dict", no_validation)
    again = inventory.load(hw)
    assert again == first and again.source == str(hw) and again.accelerators() == first.accelerators()
    monkeypatch.undo()
    doc["nodes"][0]["devices"][0]["mem_mib"] = -1
    hw.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match="mem_mib"):
        inventory.load(hw)  # a changed file is validated afresh


def test_each_kind_keeps_its_newest_entries(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filecache, "KEEP", 3)
    for i in range(5):
        filecache.put("k", f"e{i}", b"x")
        os.utime(cache / "k" / f"e{i}", ns=(i * 10**9, i * 10**9))
    filecache.put("k", "e5", b"y")
    assert sorted(q.name for q in (cache / "k").iterdir()) == ["e3", "e4", "e5"]
    assert filecache.get("k", "e5") == b"y" and filecache.get("k", "e0") is None


def test_a_profile_is_built_once_and_spelled_as_the_command_spells_it(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moetune.model import profile

    files = generate(tmp_path / "s.gguf", "qwen3moe", small_dims("qwen3moe"), "f16", shards=2).files
    first = profile.load_profile(files[0])
    monkeypatch.setattr(profile, "read_model_files", lambda *a: (_ for _ in ()).throw(AssertionError("read")))
    monkeypatch.chdir(tmp_path)
    again = profile.load_profile(files[1].name)  # another shard, a relative spelling
    assert again.tensors == first.tensors and again.metadata == first.metadata
    assert again.files == (Path(files[0].name), Path(files[1].name))
    monkeypatch.undo()
    generate(tmp_path / "s.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16", shards=2)
    assert profile.load_profile(files[0]).tensors != first.tensors  # a rewritten shard is read afresh
