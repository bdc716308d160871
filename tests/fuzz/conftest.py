"""The fuzzers keep moetune's file cache (hardware files and model profiles, keyed by content) in a
temporary directory: thousands of generated inputs must not land in the user's cache."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fuzz_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-cache")


@pytest.fixture(autouse=True)
def _own_cache(fuzz_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOETUNE_CACHE_DIR", str(fuzz_cache))
