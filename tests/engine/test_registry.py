"""`moetune engine add|list|remove` as a user runs them: registered engines come and go, their files
stay; the build moetune made is deleted only when asked with --purge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.engine.install import build_for
from moetune.paths import cache_dir
from tests.helpers import run_cli


@pytest.fixture
def own_build(tmp_path: Path) -> Path:
    d = tmp_path / "ik" / "bin"
    d.mkdir(parents=True)
    (d / "llama-server").write_text("#!/bin/sh\n")
    return d


def _names() -> list[str]:
    r = run_cli("engine", "list", "--json")
    assert r.exit_code == 0, r.stderr
    return [e["name"] for e in json.loads(r.stdout)]


def test_remove_forgets_a_registered_engine_and_leaves_its_files(own_build: Path) -> None:
    assert run_cli("engine", "add", "ik", "--kind", "ik_llama.cpp", "--bin-dir", str(own_build)).exit_code == 0
    assert run_cli("engine", "add", "ik-podman", "--kind", "ik_llama.cpp", "--image", "ik:latest",
                   "--runtime", "podman").exit_code == 0
    assert {"ik", "ik-podman"} <= set(_names())
    r = run_cli("engine", "remove", "ik")
    assert r.exit_code == 0, r.stderr
    assert "removed ik (ik_llama.cpp)" in r.stdout and str(own_build) in r.stdout
    assert (own_build / "llama-server").exists()
    assert "ik" not in _names() and "ik-podman" in _names()
    doc = json.loads(run_cli("engine", "remove", "ik-podman", "--json").stdout)
    assert doc == {"name": "ik-podman", "kind": "ik_llama.cpp", "builtin": False, "purged": None, "freed_bytes": 0}
    r = run_cli("plan", "--engine", "ik", "x.gguf", "--hw", "rtx-pro-6000")  # gone for planning too
    assert r.exit_code == 2 and "no engine named 'ik'" in r.stderr


def test_remove_an_unknown_engine_is_one_line_and_exit_2() -> None:
    r = run_cli("engine", "remove", "nope")
    assert r.exit_code == 2
    assert r.stderr.splitlines()[0] == "Error: no registered engine named 'nope'"
    assert "moetune engine list" in r.stderr


def test_the_built_in_build_is_deleted_only_with_purge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOETUNE_CACHE_DIR", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache"  # never the shared build the other tests use
    b = build_for()
    b.bin_dir.mkdir(parents=True)
    (b.bin_dir / "llama-server").write_bytes(b"x" * 4096)
    r = run_cli("engine", "remove", b.name)
    assert r.exit_code == 2
    assert "is the build moetune made" in r.stderr and "--purge" in r.stderr
    assert b.bin_dir.exists()
    r = run_cli("engine", "remove", b.name, "--purge", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["builtin"] and doc["purged"] == str(b.dir) and doc["freed_bytes"] == 4096
    assert not b.dir.exists()
    r = run_cli("engine", "remove", b.name, "--purge")
    assert r.exit_code == 0 and "nothing to delete" in r.stdout
