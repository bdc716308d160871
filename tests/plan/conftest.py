from __future__ import annotations

from pathlib import Path

import pytest

from moetune.model.archs import PRESET_RECIPES, PRESETS
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
