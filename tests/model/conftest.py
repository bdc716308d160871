"""Models served over HTTP: a directory of generated GGUF files laid out as a small hub, and a loopback
server over it per test (tests/gguf_http.py), fresh so that each test's switches and log are its own."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from moetune.model.archs import PRESET_RECIPES, PRESETS, Dims
from moetune.model.testmodel import generate
from tests.gguf_http import Hub, serve

REPO = "owner/GLM-5.1-GGUF"
GLM_DIR = f"{REPO}/IQ3_KS"


@pytest.fixture(scope="session")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``REPO``: the GLM-5.1 replica (8 sparse shards) in IQ3_KS/, a small single-file model, a
    projector and a README; beside it a model with a big vocabulary, a split model missing a shard,
    a text file and an empty file."""
    root = tmp_path_factory.mktemp("hub")
    for d in (GLM_DIR, "split"):
        (root / d).mkdir(parents=True)
    arch, dims = PRESETS["glm-5.1"]
    generate(root / GLM_DIR / "GLM-5.1-IQ3_KS.gguf", arch, dims, PRESET_RECIPES["glm-5.1"], shards=8, sparse=True)
    tiny = generate(root / REPO / "tiny-Q8_0.gguf", "qwen3moe", Dims(n_layer=2), "q8_0").files[0]
    shutil.copy(tiny, root / REPO / "mmproj-F16.gguf")
    (root / REPO / "README.md").write_text("# GLM-5.1 GGUF\n")
    generate(root / "vocab.gguf", "qwen3moe", Dims(n_layer=2, n_vocab=6000), sparse=True)
    split = generate(root / "split" / "m.gguf", "qwen3moe", Dims(n_layer=3), shards=3, sparse=True)
    split.files[2].unlink()
    (root / "notes.txt").write_text("not a model, but long enough to have a header's worth of bytes\n" * 4)
    (root / "empty.gguf").write_bytes(b"")
    return root


@pytest.fixture
def hub(hub_root: Path) -> Iterator[Hub]:
    with serve(Hub(hub_root, repos={REPO: hub_root / REPO})) as h:
        yield h


def glm_shard(root: Path, no: int) -> Path:
    return root / GLM_DIR / f"GLM-5.1-IQ3_KS-{no:05d}-of-00008.gguf"
