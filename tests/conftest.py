"""Shared fixtures: moetune's data directory points into a temporary one for every test; the
engine build (cache) is shared, since building llama.cpp takes minutes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import engine_bin_dir


@pytest.fixture(autouse=True)
def moetune_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("moetune-data")
    monkeypatch.setenv("MOETUNE_DATA_DIR", str(home))
    yield home


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    d = engine_bin_dir()
    if d is None:
        pytest.fail("llama.cpp is not built: run `make test` (it runs `moetune engine install` first)")
    return d


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the session's generated models share."""
    return tmp_path_factory.mktemp("models")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root for ip netns")
        for item in items:
            if "netns" in item.keywords:
                item.add_marker(skip)
