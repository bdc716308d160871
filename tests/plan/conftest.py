from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from moetune.model.archs import PRESET_RECIPES, PRESETS, small_dims
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate


@pytest.fixture(scope="session")
def glm51(tmp_path_factory: pytest.TempPathFactory) -> ModelProfile:
    """The GLM-5.1-sized sparse replica (8 shards, the reference recipe)."""
    d = tmp_path_factory.mktemp("glm51")
    arch, dims = PRESETS["glm-5.1"]
    g = generate(d / "GLM-5.1-IQ3_KS.gguf", arch, dims, PRESET_RECIPES["glm-5.1"], shards=8, sparse=True)
    return load_profile(g.files[0])


def hw_yaml(tmp: Path, text: str) -> Path:
    p = tmp / "hw.yaml"
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def axes_bed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The speed model's engine-axes testbed: an 8-layer q8_0 qwen3moe and a 2-core CPU host."""
    d = tmp_path_factory.mktemp("axes")
    model = generate(d / "m.gguf", "qwen3moe", replace(small_dims("qwen3moe", True), n_layer=8), "q8_0").files[0]
    return model, hw_yaml(d, "nodes:\n- name: local\n  cpu: {cores: 2, ram_mib: 16000, ram_bw_gbs: 20}\n")
